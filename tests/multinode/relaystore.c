/* relaystore.c — see relaystore.h. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "filestore.h"
#include "net/rdzvwire.h"
#include "relaystore.h"

#define MAXREL 8

/* ---------------------------------------------------------- relay --- */

struct relay {
	int lfd, to, rec;
	enum relay_mode mode;
	int frame; /* RELAY_FLIP/RELAY_REPLAY: which client frame of connection 0 */
	pthread_t th;
};

/* What one direction of one connection has seen: the frame parser. */
struct dir {
	uint8_t hdr[5];
	int have, frames;
	bool counts; /* this record is a data record: it counts as a frame */
	uint32_t left;
	uint8_t *save; /* RELAY_REPLAY: the frame being repeated */
	size_t saved;
};

static bool write_all(int fd, const uint8_t *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w <= 0)
			return false;
		p += w;
		n -= (size_t)w;
	}
	return true;
}

/* Forward got bytes of buf to `to`, changing frame r->frame on the way. */
static bool forward(struct relay *r, struct dir *d, uint8_t *buf, ssize_t got, int to)
{
	ssize_t from = 0;

	for (ssize_t k = 0; k < got; k++) {
		bool end = false;
		if (d->left == 0) {
			d->hdr[d->have++] = buf[k];
			if (d->have == 5) {
				d->left = (uint32_t)d->hdr[3] << 8 | d->hdr[4];
				d->have = 0;
				d->counts = d->hdr[0] == 23 && d->left >= RELAY_DATA_RECORD;
				d->frames += d->counts;
				d->saved = 0;
			}
		} else {
			end = --d->left == 0;
		}
		if (!d->counts || d->frames != r->frame)
			continue;
		if (r->mode == RELAY_REPLAY) {
			if (!d->save)
				d->save = malloc(8u << 20);
			if (d->saved < (8u << 20))
				d->save[d->saved++] = buf[k];
			if (end) {
				if (!write_all(to, buf + from, (size_t)(k + 1 - from)))
					return false;
				from = k + 1;
				/* the whole record again, header first */
				uint8_t h[5];
				memcpy(h, d->hdr, 5);
				if (!write_all(to, h, 5) || !write_all(to, d->save, d->saved))
					return false;
				d->frames++; /* once */
			}
		} else if (end && r->mode == RELAY_FLIP) {
			buf[k] ^= 0x01;
			d->frames++;
		}
	}
	return write_all(to, buf + from, (size_t)(got - from));
}

static void *relay_main(void *arg)
{
	struct relay *r = arg;
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	struct pollfd p[1 + 16];
	struct dir dirs[16];
	int n = 0, conns = 0;

	memset(dirs, 0, sizeof(dirs));
	p[0] = (struct pollfd){.fd = r->lfd, .events = POLLIN};
	for (;;) {
		if (poll(p, (nfds_t)(1 + n), -1) < 0)
			return NULL;
		if ((p[0].revents & POLLIN) && n < 16) {
			int a = accept(r->lfd, NULL, NULL), b = socket(AF_INET, SOCK_STREAM, 0);
			sa.sin_port = htons((uint16_t)r->to);
			if (a >= 0 && b >= 0 &&
			    connect(b, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
				/* even: from the connecting side; odd: from the listener */
				p[1 + n++] = (struct pollfd){.fd = a, .events = POLLIN};
				p[1 + n++] = (struct pollfd){.fd = b, .events = POLLIN};
				conns++;
			} else {
				close(a);
				close(b);
			}
		}
		for (int i = 0; i < n; i++) {
			static __thread uint8_t buf[1 << 16];
			int peer = p[1 + (i ^ 1)].fd;
			ssize_t got;
			bool ok;
			if (p[1 + i].fd < 0 || !(p[1 + i].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			got = read(p[1 + i].fd, buf, sizeof(buf));
			if (got > 0)
				(void)!write(r->rec, buf, (size_t)got);
			if (got <= 0 || peer < 0)
				ok = false;
			else if (i == 0 && r->mode != RELAY_PLAIN)
				ok = forward(r, &dirs[i], buf, got, peer);
			else
				ok = write_all(peer, buf, (size_t)got);
			if (!ok && got <= 0) {
				/* an end closed: pass the close on, let the other
				 * direction drain what is in flight */
				shutdown(p[1 + i].fd, SHUT_RD);
				if (peer >= 0)
					shutdown(peer, SHUT_WR);
				p[1 + i].fd = -1;
			} else if (!ok) {
				/* the other end is gone: so is this connection */
				shutdown(p[1 + i].fd, SHUT_RDWR);
				if (peer >= 0)
					shutdown(peer, SHUT_RDWR);
				p[1 + i].fd = p[1 + (i ^ 1)].fd = -1;
			}
		}
	}
	(void)conns;
	return NULL;
}

static int swap16(int p)
{
	return (p & 0xff) << 8 | (p >> 8 & 0xff);
}

/* A relay to port `to` on a port that sorts against `self` as `to` does
 * (gloo's pairs pick who connects by comparing the addresses). */
static struct relay *relay_start(const char *dir, int to, int self, enum relay_mode mode, int frame)
{
	struct relay *r = calloc(1, sizeof(*r));
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	char path[512];
	int one = 1;

	r->to = to;
	r->mode = mode;
	r->frame = frame;
	r->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	setsockopt(r->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	for (int tries = 0;; tries++) {
		int port = 20000 + (int)((unsigned)rand() % 40000u);
		if (tries > 100000)
			abort();
		/* gloo compares the ports as they lie in memory (network
		 * order read as a host integer); agree both ways */
		if (self > 0 && ((port > self) != (to > self) ||
				 (swap16(port) > swap16(self)) != (swap16(to) > swap16(self))))
			continue;
		sa.sin_port = htons((uint16_t)port);
		if (bind(r->lfd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			break;
	}
	if (listen(r->lfd, 16) < 0)
		abort();
	snprintf(path, sizeof(path), "%s/relay.%d.%d.rec", dir, (int)getpid(), to);
	r->rec = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	pthread_create(&r->th, NULL, relay_main, r);
	return r;
}

static int relay_port(const struct relay *r)
{
	struct sockaddr_in sa;
	socklen_t len = sizeof(sa);

	getsockname(r->lfd, (struct sockaddr *)&sa, &len);
	return ntohs(sa.sin_port);
}

/* ---------------------------------------------------------- store --- */

/* A file store whose values, as read, point at relays: "127.0.0.1:PORT"
 * (the sealed mesh) or a sockaddr_in of 127.0.0.1 inside gloo's bytes. */
struct rstore {
	struct coll_store fs;
	const char *dir;
	enum relay_mode mode;
	int frame;
	int self; /* this node's port (gloo's, from its own value) */
	int to[MAXREL];
	struct relay *rel[MAXREL];
	int nrel;
	pthread_mutex_t mu;
};

static const uint8_t lo4[4] = {127, 0, 0, 1};

static int relay_for(struct rstore *s, int to)
{
	for (int i = 0; i < s->nrel; i++)
		if (s->to[i] == to)
			return relay_port(s->rel[i]);
	if (s->nrel == MAXREL)
		abort();
	/* only the first relay changes a frame: the first connection */
	s->rel[s->nrel] =
		relay_start(s->dir, to, s->self, s->nrel ? RELAY_PLAIN : s->mode, s->frame);
	s->to[s->nrel] = to;
	return relay_port(s->rel[s->nrel++]);
}

static int rs_set(void *ctx, const char *key, const void *value, size_t len)
{
	struct rstore *s = ctx;
	const uint8_t *v = value;

	for (size_t i = 0; i + 8 <= len && s->self == 0; i++)
		if (v[i] == AF_INET && v[i + 1] == 0 && memcmp(v + i + 4, lo4, 4) == 0)
			s->self = v[i + 2] << 8 | v[i + 3];
	return s->fs.set(s->fs.ctx, key, value, len);
}

static int rs_get(void *ctx, const char *key, int timeout_ms, void **ret_value, size_t *ret_len)
{
	struct rstore *s = ctx;
	int r = s->fs.get(s->fs.ctx, key, timeout_ms, ret_value, ret_len);
	unsigned port;
	char text[64];
	int end = 0;

	if (r < 0)
		return r;
	pthread_mutex_lock(&s->mu);
	uint8_t *v = *ret_value;
	size_t len = *ret_len;
	if (len < sizeof(text) && (memcpy(text, v, len), text[len] = '\0', 1) &&
	    sscanf(text, "127.0.0.1:%u%n", &port, &end) == 1 && (size_t)end == len) {
		int q = relay_for(s, (int)port);
		char *nv = malloc(32);
		snprintf(nv, 32, "127.0.0.1:%d", q);
		free(v);
		*ret_value = nv;
		*ret_len = strlen(nv);
	} else {
		for (size_t i = 0; i + 8 <= len; i++)
			if (v[i] == AF_INET && v[i + 1] == 0 && memcmp(v + i + 4, lo4, 4) == 0) {
				int q = relay_for(s, v[i + 2] << 8 | v[i + 3]);
				v[i + 2] = (uint8_t)(q >> 8);
				v[i + 3] = (uint8_t)q;
			}
	}
	pthread_mutex_unlock(&s->mu);
	return 0;
}

struct coll_store relaystore_new(const char *dir, enum relay_mode mode, int frame)
{
	struct rstore *s = calloc(1, sizeof(*s));

	if (!s)
		abort();
	s->dir = strdup(dir);
	s->mode = mode;
	s->frame = frame;
	s->fs = filestore_new(dir);
	pthread_mutex_init(&s->mu, NULL);
	return (struct coll_store){.ctx = s, .set = rs_set, .get = rs_get};
}

void relaystore_free(struct coll_store *cs)
{
	struct rstore *s = cs->ctx;

	if (!s)
		return;
	filestore_free(&s->fs);
	free((char *)s->dir);
	free(s);
	cs->ctx = NULL;
}
