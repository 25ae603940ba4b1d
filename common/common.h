/*
 * common.h — small helpers shared by libzeroclient and the daemon (internal;
 * nothing here is exported from the client library).
 */
#ifndef ZEROD_COMMON_H
#define ZEROD_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#define ZEROD_VERSION_STRING "0.1.0"

/* The control protocol (proto/zerod.proto, message Ctl) zeroctl and zerod
 * speak over <socket>.ctl; and the largest control request zerod reads. */
#define ZEROD_CTL_VERSION       1
#define ZEROD_CTL_SUFFIX        ".ctl"
#define ZEROD_CTL_REQUEST_BYTES 4096

/* Largest message either side accepts (ZMQ_MAXMSGSIZE). */
#define ZEROD_MAX_MSG_BYTES (32 * 1024 * 1024)

/* Messages queued per connection, each way (ZMQ_SNDHWM / ZMQ_RCVHWM): two
 * iterations of the largest plan (65536 buckets) and room for the rest, so a
 * send never fails with EAGAIN on a queue the protocol itself fills. */
#define ZEROD_QUEUE_MSGS (2 * 65536 + 4096)
/* ...except what zerod's ROUTER reads ahead of its loop (ZMQ_RCVHWM): the
 * loop reads every queue without pause, so a small one costs an honest
 * client nothing (its own send queue holds the rest), and it bounds what a
 * peer that floods without reading can make zerod hold. */
#define ZEROD_RECV_QUEUE_MSGS 1024

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define MIN(a, b)     ((a) < (b) ? (a) : (b))
#define MAX(a, b)     ((a) > (b) ? (a) : (b))

/* Hot loops are compiled for several x86-64 levels and the best one is picked
 * at load time (ifunc), so one binary is portable and still uses wide SIMD. */
#ifndef ZEROD_SIMD_CLONES
/* clang before 16 names a clone set's ifunc "f.ifunc", so calls from other
 * files do not link: no clones there (the fuzzing build, tools/fuzz.sh). */
#if defined(__x86_64__) && defined(__has_attribute) &&                                           \
	!(defined(__clang__) && __clang_major__ < 16)
#if __has_attribute(target_clones)
#define ZEROD_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#endif
#ifndef ZEROD_SIMD_CLONES
#define ZEROD_SIMD_CLONES
#endif

/* true for the ZC_E... codes of ZC_ERRORS (not -errno). */
bool error_is_zc_code(int code);

/* Monotonic clock in milliseconds. */
static inline int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* "1968 B", "64.0 KiB", "1.5 GiB": a size for people, in buf (16 bytes). */
static inline const char *fmt_bytes(char buf[16], uint64_t n)
{
	static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
	double v = (double)n;
	int u = 0;

	while (v >= 1024 && u < 6)
		v /= 1024, u++;
	snprintf(buf, 16, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
	return buf;
}

/* Job ids: 1..64 characters of [A-Za-z0-9._-]. */
#define ZEROD_JOB_ID_MAX 64
bool job_id_valid(const char *id);

/* Host buffers of rank `rank` of job `job` are POSIX shared memory objects
 * whose names start with "/zerod.<job>.r<rank>.<pid>.", pid as the trainer
 * knows itself: libzeroclient names them so, and the daemon finds by it what a
 * trainer that died before registering left behind. Returns snprintf's. */
static inline int shm_name_prefix(char *buf, size_t len, const char *job, uint32_t rank, int pid)
{
	return snprintf(buf, len, "/zerod.%.64s.r%u.%d.", job, rank, pid);
}

#endif
