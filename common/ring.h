/*
 * ring.h — the fast path's shared memory, as libzeroclient and zerod both
 * see it: one sealed memfd per client holding two single-producer,
 * single-consumer rings of 16-byte slots.
 *
 *   up   (client -> daemon): READY(iteration, bucket), MARK(k)
 *   down (daemon -> client): BUCKET_DONE(iteration, bucket), STEP_DONE(iteration), MARK(k)
 *
 * Indices are free-running uint32 counters; a slot lives at index & (n - 1).
 * The producer writes the slot, then publishes head (release); the consumer
 * reads head (acquire), the slots, then publishes tail (release). Each slot
 * carries the low bits of its own index in `tag`, so a slot the producer
 * never wrote (a torn head) is told from a real one.
 *
 * Doorbells: a consumer about to sleep sets `waiting` (then looks at head
 * once more); a producer that published and finds `waiting` set swaps it to
 * 0 and rings, once. While the consumer is busy nobody rings: a full
 * pipeline costs no system calls. Both sides use seq_cst for the two
 * store-then-load pairs, so at least one of them sees the other's store.
 *
 * MARK(k) orders the two channels: before the first slot it pushes after
 * sending its k-th ZeroMQ message (counted from the connection's first), a
 * producer pushes MARK(k), and a consumer passes MARK(k) only once it has
 * received that message. See daemon/edge/fastpath.c for why and how.
 *
 * Nothing in this memory is trusted by the daemon: the client may write any
 * byte of it at any time. zerod keeps its own copies of its indices and of
 * the ring sizes and validates every head, tail and slot it reads.
 */
#ifndef ZEROD_RING_H
#define ZEROD_RING_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RING_MAGIC   0x7a7266707a65726full /* "zerofpzr" */
#define RING_VERSION 1u

/* Ring sizes a daemon accepts (slots, powers of two). */
#define RING_MIN_SLOTS 16u
#define RING_MAX_SLOTS (1u << 19)

enum ring_kind {
	RING_READY = 1,       /* up: bucket `bucket` of `iteration` is ready */
	RING_BUCKET_DONE = 2, /* down: bucket `bucket` of `iteration` is reduced */
	RING_STEP_DONE = 3,   /* down: every update of `iteration` has landed */
	RING_MARK = 4,        /* both: `iteration` holds k, the ZeroMQ message it waits for */
};

/* tag = kind << 24 | (index & RING_SEQ_MASK) */
#define RING_SEQ_MASK 0xffffffu

struct ring_slot {
	uint64_t iteration;
	uint32_t bucket;
	uint32_t tag;
};

struct ring_ctl {
	alignas(64) _Atomic uint32_t head; /* the producer's */
	alignas(64) _Atomic uint32_t tail; /* the consumer's */
	_Atomic uint32_t waiting;          /* the consumer may sleep: ring the doorbell */
};

struct ring_shared {
	uint64_t magic;
	uint32_t version;
	uint32_t up_slots, down_slots;
	struct ring_ctl up, down;
	/* then struct ring_slot up[up_slots], down[down_slots] */
};

/* What the client sends on the fd channel to attach its ring, with the
 * memfd in SCM_RIGHTS, and what the daemon answers. */
#define RING_ATTACH_MAGIC 0x7a66706174746368ull /* "zfpattch" */

struct ring_attach {
	uint64_t magic;
	uint64_t token; /* the daemon's, from HelloOk */
	uint64_t zsent; /* ZeroMQ messages the client sent so far (Hello is 1) */
	uint32_t version;
	uint32_t up_slots, down_slots;
	uint32_t reserved;
};

struct ring_attach_reply {
	uint64_t magic;
	uint64_t zsent; /* ZeroMQ messages the daemon sent this session so far (HelloOk is 1) */
	int32_t status; /* 0, or a ZC_E... code / -errno */
	char message[236];
};

static inline size_t ring_bytes(uint32_t up_slots, uint32_t down_slots)
{
	return sizeof(struct ring_shared) +
	       ((size_t)up_slots + (size_t)down_slots) * sizeof(struct ring_slot);
}

static inline struct ring_slot *ring_up_slots(struct ring_shared *r)
{
	return (struct ring_slot *)(r + 1);
}

static inline struct ring_slot *ring_down_slots(struct ring_shared *r, uint32_t up_slots)
{
	return (struct ring_slot *)(r + 1) + up_slots;
}

static inline uint32_t ring_tag(enum ring_kind kind, uint32_t index)
{
	return (uint32_t)kind << 24 | (index & RING_SEQ_MASK);
}

static inline bool ring_slots_valid(uint32_t n)
{
	return n >= RING_MIN_SLOTS && n <= RING_MAX_SLOTS && (n & (n - 1)) == 0;
}

/* Ring sizes for a plan of nbuckets. A client cannot start an iteration
 * before the daemon took every bucket of the one before, nor before it read
 * that one's StepDone; a mark goes before a slot, at most one each. So `up`
 * holds an iteration of READY and their marks, `down` two iterations of
 * completions and their marks. */
static inline uint32_t ring_pow2(uint64_t n)
{
	uint32_t p = RING_MIN_SLOTS;

	while (p < n && p < RING_MAX_SLOTS)
		p <<= 1;
	return p;
}

static inline void ring_sizes(uint32_t nbuckets, uint32_t *ret_up, uint32_t *ret_down)
{
	*ret_up = ring_pow2(2 * (uint64_t)nbuckets + 64);
	*ret_down = ring_pow2(4 * ((uint64_t)nbuckets + 1) + 64);
}

#endif
