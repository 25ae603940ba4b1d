/*
 * errors.c — zc_strerror() and friends, generated from the one ZC_ERRORS list
 * in zeroclient.h. Shared by the client library and the daemon.
 */
#include <errno.h>
#include <string.h>

#include "zeroclient.h"
#include "common.h"

#ifdef HAVE_STRERRORNAME_NP
#define errno_name strerrorname_np
#else
/* glibc < 2.32: the names the daemon and the client return, at least. */
#define ERRNO_NAME(e)                                                                              \
	{                                                                                          \
		e, #e                                                                              \
	}
static const struct {
	int e;
	const char *name;
} errno_names[] = {
	ERRNO_NAME(EPERM),        ERRNO_NAME(ENOENT),       ERRNO_NAME(ESRCH),
	ERRNO_NAME(EINTR),        ERRNO_NAME(EIO),          ERRNO_NAME(EBADF),
	ERRNO_NAME(ECHILD),       ERRNO_NAME(EAGAIN),       ERRNO_NAME(ENOMEM),
	ERRNO_NAME(EACCES),       ERRNO_NAME(EFAULT),       ERRNO_NAME(EBUSY),
	ERRNO_NAME(EEXIST),       ERRNO_NAME(EINVAL),       ERRNO_NAME(ENFILE),
	ERRNO_NAME(EMFILE),       ERRNO_NAME(ENOSPC),       ERRNO_NAME(EPIPE),
	ERRNO_NAME(ERANGE),       ERRNO_NAME(ENAMETOOLONG), ERRNO_NAME(ENOSYS),
	ERRNO_NAME(EPROTO),       ERRNO_NAME(ENOTSOCK),     ERRNO_NAME(ENOTSUP),
	ERRNO_NAME(EADDRINUSE),   ERRNO_NAME(ECONNREFUSED), ERRNO_NAME(ECONNRESET),
	ERRNO_NAME(EHOSTUNREACH), ERRNO_NAME(ETIMEDOUT),
};

static const char *errno_name(int e)
{
	for (size_t i = 0; i < sizeof(errno_names) / sizeof(errno_names[0]); i++)
		if (errno_names[i].e == e)
			return errno_names[i].name;
	return NULL;
}
#endif

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

int zc_error_recoverable(int code)
{
	return code == ZC_ERANKLOST;
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
		const char *n = errno_name(-code);
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
