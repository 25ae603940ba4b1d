/*
 * notify.c — sd_notify(3) for zerod, through Debian's libsystemd. Owns the
 * watchdog's schedule and the last STATUS= line (sent only when it changes).
 *
 * WATCHDOG=1 is sent from the loop thread's timer and nowhere else: a loop
 * wedged in a callback misses its pings and systemd restarts the service.
 * sd_notify() is one sendmsg() of a datagram to systemd's socket, whose
 * receive queue systemd keeps large; it is the one write the loop makes
 * itself.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "ops/notify.h"

#define STATUS_INTERVAL_MS 5000 /* STATUS= is brought up to date this often */

void notify_init(struct notify *n)
{
	uint64_t usec = 0;
	const char *sock = getenv("NOTIFY_SOCKET");

	*n = (struct notify){.enabled = sock && *sock, .next_ping_ms = INT64_MAX};
	if (!n->enabled)
		return;
	/* WATCHDOG_PID must name us (systemd sets it); 0 unsets the variables */
	if (sd_watchdog_enabled(0, &usec) > 0)
		n->watchdog_usec = usec;
	n->interval_ms = STATUS_INTERVAL_MS;
	/* ping at half the interval, as sd_watchdog_enabled(3) advises */
	if (n->watchdog_usec && n->watchdog_usec / 2000 < (uint64_t)n->interval_ms)
		n->interval_ms = (int)(n->watchdog_usec / 2000 ? n->watchdog_usec / 2000 : 1);
}

static int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void notify_ready(struct notify *n)
{
	if (!n->enabled)
		return;
	sd_notify(0, n->watchdog_usec ? "READY=1\nWATCHDOG=1" : "READY=1");
	n->next_ping_ms = mono_ms() + n->interval_ms;
}

void notify_status(struct notify *n, const char *text)
{
	char msg[300];

	if (!n->enabled || strcmp(text, n->status) == 0)
		return;
	snprintf(n->status, sizeof(n->status), "%s", text);
	snprintf(msg, sizeof(msg), "STATUS=%s", n->status);
	sd_notify(0, msg);
}

void notify_reloading(struct notify *n)
{
	struct timespec ts;
	char msg[96];

	if (!n->enabled)
		return;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	snprintf(msg, sizeof(msg), "RELOADING=1\nMONOTONIC_USEC=%llu",
		 (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000);
	sd_notify(0, msg);
}

void notify_stopping(struct notify *n)
{
	if (!n->enabled)
		return;
	sd_notify(0, "STOPPING=1");
	n->next_ping_ms = n->watchdog_usec ? n->next_ping_ms : INT64_MAX;
}

void notify_tick(struct notify *n, int64_t now)
{
	if (!n->enabled || now < n->next_ping_ms)
		return;
	if (n->watchdog_usec)
		sd_notify(0, "WATCHDOG=1");
	n->next_ping_ms = now + n->interval_ms;
}

int64_t notify_next(const struct notify *n)
{
	return n->enabled ? n->next_ping_ms : INT64_MAX;
}

int notify_listen_fd(const char *path)
{
	int n = sd_listen_fds(1), found = -ENOENT;

	for (int fd = SD_LISTEN_FDS_START; n > 0 && fd < SD_LISTEN_FDS_START + n; fd++) {
		if (found < 0 && sd_is_socket_unix(fd, SOCK_STREAM, 1, path, 0) > 0)
			found = fd;
		else
			close(fd); /* not one zerod knows what to do with */
	}
	return found;
}
