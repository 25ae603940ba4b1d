/*
 * notify.h — zerod and systemd: sd_notify() states (READY, STATUS, WATCHDOG,
 * RELOADING, STOPPING) and socket activation (a listening socket passed in
 * LISTEN_FDS). Without $NOTIFY_SOCKET every call is a no-op. Loop thread.
 */
#ifndef ZEROD_NOTIFY_H
#define ZEROD_NOTIFY_H

#include <stdbool.h>
#include <stdint.h>

struct notify {
	uint64_t watchdog_usec; /* WatchdogSec= (0: none) */
	int64_t next_ping_ms;   /* next WATCHDOG=1 / STATUS= */
	int interval_ms;        /* how often the timer comes */
	char status[256];       /* the last STATUS= sent */
	bool enabled;           /* $NOTIFY_SOCKET is set */
};

/* Read $NOTIFY_SOCKET and $WATCHDOG_USEC (for this pid only). */
void notify_init(struct notify *n);
void notify_ready(struct notify *n);
/* STATUS=text, if it changed since the last one. */
void notify_status(struct notify *n, const char *text);
/* RELOADING=1 with MONOTONIC_USEC=now; notify_ready() ends it. */
void notify_reloading(struct notify *n);
void notify_stopping(struct notify *n);
/* The timer: WATCHDOG=1 when it is due. Only the loop thread calls it, so a
 * loop that stops turning stops the pings and systemd restarts zerod. */
void notify_tick(struct notify *n, int64_t now_ms);
/* When notify_tick() wants to run next (INT64_MAX: never). */
int64_t notify_next(const struct notify *n);

/* The listening AF_UNIX stream socket systemd passed for path (socket
 * activation), or -ENOENT if none was passed; other passed fds are closed.
 * Call once, before any other thread starts (it unsets LISTEN_FDS). */
int notify_listen_fd(const char *path);

#endif
