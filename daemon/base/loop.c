/*
 * loop.c — epoll over watches that stay registered, and timers (redis ae.c
 * style: a short list, the sleep lasts until the nearest deadline). Owns the
 * epoll fd, the watches and the timers.
 *
 * ZeroMQ sockets are watched through ZMQ_FD, which is edge-like: it becomes
 * readable when the socket's state changes, not while messages wait, and only
 * reading ZMQ_EVENTS re-arms it. A send can consume the edge too. So before
 * every sleep the loop reads ZMQ_EVENTS of each socket, and one that still has
 * input is called again without sleeping (epoll_wait with timeout 0): the
 * other fds and the timers still get their turn between its batches.
 *
 * Watches removed inside a callback are only marked dead and freed after the
 * turn, since epoll may still hold their events for this turn.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <unistd.h>
#include <zmq.h>

#include "common.h"
#include "base/loop.h"

#define MAX_EVENTS 64

struct watch {
	int fd; /* the fd epoll watches: ZMQ_FD for a zsock */
	void *zsock;
	loop_cb cb;
	void *userdata;
	bool dead;
	struct watch *next;
};

struct loop_timer {
	struct loop *l;
	int64_t deadline;
	loop_cb cb;
	void *userdata;
	struct loop_timer *next;
};

struct loop {
	int epfd;
	struct watch *watches; /* all, the dead ones until the turn ends */
	struct loop_timer *timers;
	loop_cb prepare;
	void *prepare_data;
	bool quit;
};

int loop_new(struct loop **ret)
{
	struct loop *l = calloc(1, sizeof(*l));

	if (!l)
		return -ENOMEM;
	l->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (l->epfd < 0) {
		int r = -errno;
		free(l);
		return r;
	}
	*ret = l;
	return 0;
}

void loop_free(struct loop *l)
{
	if (!l)
		return;
	while (l->watches) {
		struct watch *w = l->watches;
		l->watches = w->next;
		free(w);
	}
	while (l->timers)
		loop_timer_free(l->timers);
	close(l->epfd);
	free(l);
}

static int loop_add(struct loop *l, int fd, void *zsock, loop_cb cb, void *userdata)
{
	struct watch *w = calloc(1, sizeof(*w));
	struct epoll_event ev = {.events = EPOLLIN};

	if (!w)
		return -ENOMEM;
	*w = (struct watch){.fd = fd, .zsock = zsock, .cb = cb, .userdata = userdata};
	ev.data.ptr = w;
	if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		int r = -errno;
		free(w);
		return r;
	}
	w->next = l->watches;
	l->watches = w;
	return 0;
}

int loop_add_fd(struct loop *l, int fd, loop_cb cb, void *userdata)
{
	return loop_add(l, fd, NULL, cb, userdata);
}

int loop_add_zsock(struct loop *l, void *zsock, loop_cb cb, void *userdata)
{
	size_t len = sizeof(int);
	int fd;

	if (zmq_getsockopt(zsock, ZMQ_FD, &fd, &len) < 0)
		return -zmq_errno();
	return loop_add(l, fd, zsock, cb, userdata);
}

void loop_remove_fd(struct loop *l, int fd)
{
	for (struct watch *w = l->watches; w; w = w->next)
		if (!w->zsock && w->fd == fd && !w->dead) {
			/* before the caller closes fd: epoll forgets it now */
			epoll_ctl(l->epfd, EPOLL_CTL_DEL, fd, NULL);
			w->dead = true;
		}
}

int loop_want_out(struct loop *l, int fd, bool on)
{
	for (struct watch *w = l->watches; w; w = w->next)
		if (!w->zsock && w->fd == fd && !w->dead) {
			struct epoll_event ev = {.events = EPOLLIN | (on ? EPOLLOUT : 0u),
						 .data.ptr = w};
			return epoll_ctl(l->epfd, EPOLL_CTL_MOD, fd, &ev) < 0 ? -errno : 0;
		}
	return -ENOENT;
}

int loop_timer_new(struct loop *l, loop_cb cb, void *userdata, struct loop_timer **ret)
{
	struct loop_timer *t = calloc(1, sizeof(*t));

	if (!t)
		return -ENOMEM;
	*t = (struct loop_timer){
		.l = l, .deadline = LOOP_NEVER, .cb = cb, .userdata = userdata, .next = l->timers};
	l->timers = t;
	*ret = t;
	return 0;
}

void loop_timer_set(struct loop_timer *t, int64_t deadline_ms)
{
	t->deadline = deadline_ms;
}

void loop_timer_free(struct loop_timer *t)
{
	if (!t)
		return;
	for (struct loop_timer **pp = &t->l->timers; *pp; pp = &(*pp)->next)
		if (*pp == t) {
			*pp = t->next;
			break;
		}
	free(t);
}

void loop_set_prepare(struct loop *l, loop_cb cb, void *userdata)
{
	l->prepare = cb;
	l->prepare_data = userdata;
}

void loop_quit(struct loop *l)
{
	l->quit = true;
}

static bool zsock_readable(void *zsock)
{
	int events = 0;
	size_t len = sizeof(events);

	return zmq_getsockopt(zsock, ZMQ_EVENTS, &events, &len) == 0 && (events & ZMQ_POLLIN);
}

static void free_dead(struct loop *l)
{
	for (struct watch **pp = &l->watches; *pp;) {
		struct watch *w = *pp;
		if (w->dead) {
			*pp = w->next;
			free(w);
		} else {
			pp = &w->next;
		}
	}
}

static void run_timers(struct loop *l)
{
	int64_t now = now_ms();
	bool again = true;

	/* a callback may free or add timers: start over after each */
	while (again && !l->quit) {
		again = false;
		for (struct loop_timer *t = l->timers; t; t = t->next)
			if (t->deadline <= now) {
				t->deadline = LOOP_NEVER;
				t->cb(l, t->userdata);
				again = true;
				break;
			}
	}
}

int loop_run(struct loop *l)
{
	struct epoll_event ev[MAX_EVENTS];

	while (!l->quit) {
		int64_t nearest = LOOP_NEVER;
		bool pending = false;
		int timeout = -1, n;

		if (l->prepare)
			l->prepare(l, l->prepare_data);
		/* input a callback left, or whose edge a send consumed */
		for (struct watch *w = l->watches; w; w = w->next)
			if (w->zsock && !w->dead && zsock_readable(w->zsock))
				pending = true;
		for (struct loop_timer *t = l->timers; t; t = t->next)
			nearest = MIN(nearest, t->deadline);
		if (pending) {
			timeout = 0;
		} else if (nearest != LOOP_NEVER) {
			int64_t left = nearest - now_ms();
			timeout = left <= 0 ? 0 : (int)MIN(left, (int64_t)1 << 30);
		}
		n = epoll_wait(l->epfd, ev, MAX_EVENTS, timeout);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		for (int i = 0; i < n && !l->quit; i++) {
			struct watch *w = ev[i].data.ptr;
			if (!w->dead && !w->zsock)
				w->cb(l, w->userdata);
		}
		/* every socket with input gets one batch per turn, whether its
		 * fd fired now or it had input left from before */
		for (struct watch *w = l->watches; w && !l->quit; w = w->next)
			if (w->zsock && !w->dead && zsock_readable(w->zsock))
				w->cb(l, w->userdata);
		run_timers(l);
		free_dead(l);
	}
	return 0;
}
