/*
 * loop.h — the daemon's event loop: one thread, epoll over plain fds
 * (eventfd, signalfd, pidfds) and ZeroMQ sockets (their ZMQ_FD), registered
 * once; it sleeps until the nearest timer's deadline. Callbacks run on the
 * loop thread and must never block.
 */
#ifndef ZEROD_LOOP_H
#define ZEROD_LOOP_H

#include <stdbool.h>
#include <stdint.h>

#define LOOP_NEVER INT64_MAX

struct loop;
struct loop_timer;

/* Called when fd (or zsock) is readable, or when a timer is due. */
typedef void (*loop_cb)(struct loop *l, void *userdata);

int loop_new(struct loop **ret);
void loop_free(struct loop *l);

/* Watch a plain fd / a ZeroMQ socket for input. The key (fd or zsock) must be
 * unique; loop_remove_fd() with the same fd stops watching, also from inside
 * a callback. A zsock callback is called while ZMQ_EVENTS has ZMQ_POLLIN and
 * may take a bounded batch: what it leaves is offered again next turn, after
 * the other fds and timers had theirs. */
int loop_add_fd(struct loop *l, int fd, loop_cb cb, void *userdata);
int loop_add_zsock(struct loop *l, void *zsock, loop_cb cb, void *userdata);
void loop_remove_fd(struct loop *l, int fd);
/* Also call fd's callback when it is writable (on) or not any more (off):
 * a socket with output left over. 0, or -ENOENT if fd is not watched. */
int loop_want_out(struct loop *l, int fd, bool on);

/* A timer: cb runs once on the loop thread when its deadline (now_ms()
 * clock) has passed. loop_timer_set() arms or moves it (LOOP_NEVER
 * disarms). The caller owns it; free it with loop_timer_free() (NULL ok). */
int loop_timer_new(struct loop *l, loop_cb cb, void *userdata, struct loop_timer **ret);
void loop_timer_set(struct loop_timer *t, int64_t deadline_ms);
void loop_timer_free(struct loop_timer *t);

/* Called before every sleep (redis' beforeSleep): where deadlines that moved
 * during the turn are set again. */
void loop_set_prepare(struct loop *l, loop_cb cb, void *userdata);

/* Run until loop_quit(); returns 0, or a negative errno if epoll fails. */
int loop_run(struct loop *l);
void loop_quit(struct loop *l);

#endif
