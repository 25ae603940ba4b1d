/*
 * raw.h — a client that speaks zerod's protocol without libzeroclient: a
 * bare DEALER socket and hand-made envelopes, for what a broken or hostile
 * client could send. Used in forked children (each makes its own ZeroMQ
 * context); failures are EXPECT()s, so they land in child_bad.
 */
#ifndef ZEROD_TEST_RAW_H
#define ZEROD_TEST_RAW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "plan.h"
#include "zerod.pb-c.h"
#include "zeroclient.h"

struct raw {
	void *ctx, *sock;
};

/* Connect to sock_path; rcvhwm > 0 caps what the socket reads ahead (a
 * peer that does not read). Replies are awaited 5 s. 0 or -1. */
int raw_open(struct raw *r, const char *sock_path, int rcvhwm);
void raw_close(struct raw *r);
void raw_send(struct raw *r, const Zerod__V1__Envelope *env);
void raw_send_bytes(struct raw *r, const void *buf, size_t len, int flags);
/* The next envelope, or NULL (and a failure) after 5 s. wire_free() it. */
Zerod__V1__Envelope *raw_recv(struct raw *r, const char *what);
/* The next reply must be Error{code} holding needle. */
void raw_expect_error(struct raw *r, int code, const char *needle, const char *what);
void raw_expect_body(struct raw *r, Zerod__V1__Envelope__BodyCase body, const char *what);

void raw_fill_hello(Zerod__V1__Hello *h, const char *job, uint32_t rank, uint32_t world);
/* Hello as rank 0 of a world-1 job; expects HelloOk. */
void raw_hello(struct raw *r, const char *job);
void raw_goodbye(struct raw *r);
void raw_bucket(struct raw *r, uint64_t it, uint32_t bucket);

/* A world-1 job's RegisterPlan: a 2-bucket SGD plan and shm objects of the
 * right size made here (names and sizes may be changed before sending). */
struct raw_reg {
	struct zc_param_group group;
	struct zc_segment segs[2];
	struct zc_bucket buckets[2];
	struct zc_plan zp;
	struct plan *p;
	Zerod__V1__Plan pb;
	Zerod__V1__ShmBuffers shm;
	Zerod__V1__RegisterPlan rp;
	Zerod__V1__Envelope env;
	char grad[96], param[96];
	uint64_t bytes;
};
int raw_reg_init(struct raw_reg *g, const char *tag);
void raw_reg_free(struct raw_reg *g);
/* A shm object of that size, mode 0600: 0 or -1. */
int raw_make_shm(const char *name, size_t bytes);

#endif
