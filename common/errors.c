/*
 * errors.c — zc_strerror() and friends, generated from the one ZC_ERRORS list
 * in zeroclient.h. Shared by the client library and the daemon.
 */
#include <string.h>

#include "zeroclient.h"
#include "common.h"

const char *zc_strerror(int code)
{
	switch (code) {
#define ZC__ERROR_TEXT(name, value, text)                                                          \
	case ZC_##name:                                                                            \
		return text;
		ZC_ERRORS(ZC__ERROR_TEXT)
#undef ZC__ERROR_TEXT
	case 0:
		return "success";
	default:
		break;
	}
	if (code < 0 && code > -4096)
		return strerror(-code);
	return "unknown error";
}

const char *zc_strerror_name(int code)
{
	switch (code) {
#define ZC__ERROR_NAME(name, value, text)                                                          \
	case ZC_##name:                                                                            \
		return "ZC_" #name;
		ZC_ERRORS(ZC__ERROR_NAME)
#undef ZC__ERROR_NAME
	case 0:
		return "OK";
	default:
		break;
	}
	if (code < 0 && code > -4096) {
		const char *n = strerrorname_np(-code);
		return n ? n : "ZC_EUNKNOWN";
	}
	return "ZC_EUNKNOWN";
}

bool error_is_zc_code(int code)
{
	switch (code) {
#define ZC__ERROR_CASE(name, value, text) case ZC_##name:
		ZC_ERRORS(ZC__ERROR_CASE)
#undef ZC__ERROR_CASE
		return true;
	default:
		return false;
	}
}

bool job_id_valid(const char *id)
{
	size_t n = 0;

	if (!id)
		return false;
	for (; id[n]; n++) {
		char ch = id[n];
		bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
			  (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-';
		if (!ok || n >= ZEROD_JOB_ID_MAX)
			return false;
	}
	return n > 0;
}
