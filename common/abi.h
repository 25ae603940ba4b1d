/*
 * abi.h — reading a caller's public struct by its own size (internal). The
 * rules are zeroclient.h's "ABI" section: fields wholly inside the caller's
 * `size` are the caller's, the others keep the defaults already in the
 * destination, and bytes past what this library knows must be zero.
 *
 * The caller's struct is read with memcpy at offsets, never through a
 * pointer to our (possibly larger) type: an older caller's struct is smaller
 * than ours, and reading past its end could fault.
 */
#ifndef ZEROD_ABI_H
#define ZEROD_ABI_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "zeroclient.h"

/* The size field every public struct starts with. */
static inline uint32_t abi_size(const void *src)
{
	uint32_t size;

	memcpy(&size, src, sizeof(size));
	return size;
}

/* 0; -EINVAL for a size below the size field itself (not initialised);
 * -E2BIG for a size over ZC_STRUCT_MAX_SIZE, or a nonzero byte at or past
 * `known` (our sizeof), which only a newer caller's field can put there. */
static inline int abi_check(const void *src, uint32_t size, size_t known)
{
	const unsigned char *p = src;

	if (size < sizeof(uint32_t))
		return -EINVAL;
	if (size > ZC_STRUCT_MAX_SIZE)
		return -E2BIG;
	for (size_t i = known; i < size; i++)
		if (p[i])
			return -E2BIG;
	return 0;
}

/* The reason for abi_check()'s r about `what` (a path: "groups[2]") of type
 * `type` ("zc_param_group"), whose size is `size`. */
static inline void abi_reason(int r, uint32_t size, const char *what, const char *type, char *err,
			      size_t errlen)
{
	if (r == -EINVAL)
		snprintf(err, errlen,
			 "%s.size is %u: not initialised (zc_%s_init() or its ZC_..._INIT)", what,
			 size, type);
	else if (size > ZC_STRUCT_MAX_SIZE)
		snprintf(err, errlen, "%s.size is %u, more than %d", what, size,
			 ZC_STRUCT_MAX_SIZE);
	else
		snprintf(err, errlen,
			 "%s: a struct %s of %u bytes sets fields this libzeroclient (%d) does "
			 "not know (built against a newer zeroclient.h?)",
			 what, type, size, ZC_VERSION);
}

/* dst->field = the caller's field, if it lies wholly inside the caller's size. */
#define ABI_TAKE(dst, src, size, field)                                                            \
	do {                                                                                       \
		size_t at_ = offsetof(__typeof__(*(dst)), field);                                  \
		if ((size_t)(size) >= at_ + sizeof((dst)->field))                                  \
			memcpy(&(dst)->field, (const char *)(src) + at_, sizeof((dst)->field));    \
	} while (0)

/* A bool field, normalised: any nonzero byte is true. */
#define ABI_TAKE_BOOL(dst, src, size, field)                                                       \
	do {                                                                                       \
		size_t at_ = offsetof(__typeof__(*(dst)), field);                                  \
		if ((size_t)(size) >= at_ + 1)                                                     \
			(dst)->field = ((const unsigned char *)(src))[at_] != 0;                   \
	} while (0)

/* The init functions' work: the defaults into the first `size` bytes of a
 * caller's struct, zeroes past ours, then the size. */
static inline int abi_init(void *dst, size_t size, const void *defaults, size_t ours)
{
	uint32_t sz = (uint32_t)size;

	if (!dst)
		return -EINVAL;
	if (size < sizeof(uint32_t))
		return -EINVAL;
	if (size > ZC_STRUCT_MAX_SIZE)
		return -E2BIG;
	memset(dst, 0, size);
	memcpy(dst, defaults, size < ours ? size : ours);
	memcpy(dst, &sz, sizeof(sz));
	return 0;
}

#endif
