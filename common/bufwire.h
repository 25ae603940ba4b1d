/*
 * bufwire.h — the record that hands a trainer's buffers to zerod: sent by
 * libzeroclient on a connection of its own to <socket>.fd (the AF_UNIX
 * SOCK_SEQPACKET socket the fast path's rings come through), with the
 * memfd(s) in SCM_RIGHTS; zerod answers with one reply and closes the
 * connection. The RegisterPlan that follows names the buffers by the
 * reply's serial (proto FdBuffers). See daemon/edge/fdbufs.c.
 */
#ifndef ZEROD_BUFWIRE_H
#define ZEROD_BUFWIRE_H

#include <stdint.h>

#define FDBUFS_MAGIC   0x7a66646275667321ull /* "zfdbufs!" */
#define FDBUFS_VERSION 1
/* The same record, one fd: a state round's staging (zc_get_state(),
 * zc_set_state(); StateStaging.fd_serial names it), from a registered
 * session. bytes: its length; grad_offset: where it starts in the fd
 * (param_offset unused). The reply is FDBUFS's. */
#define FDSTAGE_MAGIC 0x7a66647374616765ull /* "zfdstage" */

/* zerod's answer on either kind of connection to <socket>.fd (FDBUFS,
 * FDSTAGE or a ring's ATTACH) when it serves none: too many connections of
 * the caller's user or process wait unanswered there, or it sent nothing in
 * time. A struct fdbufs_reply with this magic (a ring_attach_reply has its
 * status and message at the same places); status is ZC_ELIMIT or
 * ZC_ETIMEDOUT, message says which and why. It may come before the client
 * sent anything, and the connection is closed after it. */
#define FDREFUSED_MAGIC 0x7a66647265667573ull /* "zfdrefus" */

/* One fd (grad and param in one memfd at two offsets) or two (grad, then
 * param). Offsets are multiples of the page size. */
struct fdbufs_offer {
	uint64_t magic;
	uint64_t token; /* the session's, from HelloOk */
	uint32_t version;
	uint32_t nfds;         /* 1 or 2: what SCM_RIGHTS carries */
	uint64_t bytes;        /* of each buffer: what the client's plan needs */
	uint64_t grad_offset;  /* into the first fd */
	uint64_t param_offset; /* into the last fd */
};

struct fdbufs_reply {
	uint64_t magic;
	uint64_t serial; /* names these buffers in RegisterPlan's FdBuffers */
	int32_t status;  /* 0, or a ZC_E... code / -errno */
	char message[236];
};

#endif
