/*
 * loop.h — the daemon's event loop: one thread, zmq_poll over ZeroMQ sockets
 * and plain fds (eventfd, signalfd, timerfd, pidfds). Callbacks run on the
 * loop thread and must never block.
 */
#ifndef ZEROD_LOOP_H
#define ZEROD_LOOP_H

struct loop;

/* Called when fd (or zsock) is readable. */
typedef void (*loop_cb)(struct loop *l, void *userdata);

int loop_new(struct loop **ret);
void loop_free(struct loop *l);

/* Watch a plain fd / a ZeroMQ socket for input. The key (fd or zsock) must be
 * unique; loop_remove() with the same key stops watching, also from inside a
 * callback. */
int loop_add_fd(struct loop *l, int fd, loop_cb cb, void *userdata);
int loop_add_zsock(struct loop *l, void *zsock, loop_cb cb, void *userdata);
void loop_remove_fd(struct loop *l, int fd);

/* Run until loop_quit(); returns 0, or a negative code if zmq_poll fails. */
int loop_run(struct loop *l);
void loop_quit(struct loop *l);

#endif
