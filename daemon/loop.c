/*
 * loop.c — zmq_poll over a small table of watches. The table is rebuilt
 * lazily: removals only mark a watch dead, so callbacks may remove watches
 * (their own included) while the loop walks the table.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <zmq.h>

#include "loop.h"

struct watch {
	int fd;
	void *zsock;
	loop_cb cb;
	void *userdata;
	bool dead;
};

struct loop {
	struct watch *w;
	zmq_pollitem_t *items;
	size_t n, cap;
	bool quit;
};

int loop_new(struct loop **ret)
{
	struct loop *l = calloc(1, sizeof(*l));

	if (!l)
		return -ENOMEM;
	*ret = l;
	return 0;
}

void loop_free(struct loop *l)
{
	if (!l)
		return;
	free(l->w);
	free(l->items);
	free(l);
}

static int loop_add(struct loop *l, int fd, void *zsock, loop_cb cb, void *userdata)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 16;
		struct watch *w = realloc(l->w, cap * sizeof(*w));
		if (!w)
			return -ENOMEM;
		l->w = w;
		zmq_pollitem_t *items = realloc(l->items, cap * sizeof(*items));
		if (!items)
			return -ENOMEM;
		l->items = items;
		l->cap = cap;
	}
	l->w[l->n++] = (struct watch){.fd = fd, .zsock = zsock, .cb = cb, .userdata = userdata};
	return 0;
}

int loop_add_fd(struct loop *l, int fd, loop_cb cb, void *userdata)
{
	return loop_add(l, fd, NULL, cb, userdata);
}

int loop_add_zsock(struct loop *l, void *zsock, loop_cb cb, void *userdata)
{
	return loop_add(l, -1, zsock, cb, userdata);
}

void loop_remove_fd(struct loop *l, int fd)
{
	for (size_t i = 0; i < l->n; i++)
		if (!l->w[i].zsock && l->w[i].fd == fd)
			l->w[i].dead = true;
}

void loop_quit(struct loop *l)
{
	l->quit = true;
}

static void loop_compact(struct loop *l)
{
	size_t k = 0;

	for (size_t i = 0; i < l->n; i++)
		if (!l->w[i].dead)
			l->w[k++] = l->w[i];
	l->n = k;
}

int loop_run(struct loop *l)
{
	while (!l->quit) {
		size_t n;
		int r;

		loop_compact(l);
		n = l->n;
		for (size_t i = 0; i < n; i++)
			l->items[i] = (zmq_pollitem_t){
				.socket = l->w[i].zsock, .fd = l->w[i].fd, .events = ZMQ_POLLIN};
		r = zmq_poll(l->items, (int)n, -1);
		if (r < 0) {
			if (zmq_errno() == EINTR)
				continue;
			return -zmq_errno();
		}
		for (size_t i = 0; i < n && !l->quit; i++)
			if ((l->items[i].revents & ZMQ_POLLIN) && !l->w[i].dead)
				l->w[i].cb(l, l->w[i].userdata);
	}
	return 0;
}
