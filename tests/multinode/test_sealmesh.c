/*
 * test_sealmesh.c — the tensors between nodes with CURVE (issue 11 §5):
 * coll/gloo.c over the sealed mesh (coll/sealmesh.c) and over gloo's plain
 * TCP, between two forked "nodes" on loopback, each with one rank. Each
 * node's store (a file store) hands it the other's addresses rewritten to
 * a TCP relay of its own (a thread), which records every byte both ways
 * and can change or repeat one frame the connecting node sends.
 *
 *  - the same all-reduce and broadcast over both meshes: results bit for
 *    bit as documented; a distinctive float pattern in the gradients is on
 *    the wire in plain text over gloo (so the check can fail), and nowhere
 *    over the sealed mesh, though the relay carried every byte of it;
 *  - one byte changed (AES-256-GCM), and one frame replayed (secretstream:
 *    node 1 offers no AES), on node 1's connection: node 0's collective
 *    fails with -EBADMSG and a reason naming node 1 and its key, node 1's
 *    fails naming node 0; a fresh mesh of the same two processes then
 *    works, bit for bit;
 *  - a key the other node does not trust, each way: the open is refused
 *    with ZC_ECONNECT, naming the key.
 *
 * The executor's cases of test_gloo.c also run over the sealed mesh there
 * (its sealed_* cases); test_curve.c trains real zerods with CURVE.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll/coll.h"
#include "common.h"
#include "filestore.h"
#include "pool.h"
#include "rdzvwire.h"
#include "testkeys.h"
#include "testlib.h"
#include "zero.h"

#define NODE_T   20000 /* ms a forked node may take */
#define PATTERN  0x4b1d5eedu
#define PATTERN2 0x3c0ffee1u
#define MAXREL   8

/* ---------------------------------------------------------- relay --- */

enum mode { M_NONE, M_FLIP, M_REPLAY };

struct relay {
	int lfd, to, rec;
	enum mode mode;
	int frame; /* M_FLIP/M_REPLAY: which client frame of connection 0 */
	pthread_t th;
};

/* What one direction of one connection has seen: the frame parser. */
struct dir {
	uint8_t hdr[4];
	int have, frames;
	uint32_t left;
	uint8_t *save; /* M_REPLAY: the frame being repeated */
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
			if (d->have == 4) {
				d->left = rdzv_frame_len(d->hdr);
				d->have = 0;
				d->frames++;
				d->saved = 0;
			}
		} else {
			end = --d->left == 0;
		}
		if (d->frames != r->frame)
			continue;
		if (r->mode == M_REPLAY) {
			if (!d->save)
				d->save = malloc(8u << 20);
			if (d->saved < (8u << 20))
				d->save[d->saved++] = buf[k];
			if (end) {
				if (!write_all(to, buf + from, (size_t)(k + 1 - from)))
					return false;
				from = k + 1;
				/* the whole frame again, header first */
				uint8_t h[4];
				memcpy(h, d->hdr, 4);
				if (!write_all(to, h, 4) || !write_all(to, d->save, d->saved))
					return false;
				d->frames++; /* once */
			}
		} else if (end && r->mode == M_FLIP) {
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
			else if (i == 0 && r->mode != M_NONE)
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
static struct relay *relay_start(const char *dir, int to, int self, enum mode mode, int frame)
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
	enum mode mode;
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
	s->rel[s->nrel] = relay_start(s->dir, to, s->self, s->nrel ? M_NONE : s->mode, s->frame);
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

/* ---------------------------------------------------------- nodes --- */

struct run {
	char dir[64];
	char prefix[2][64];
	char keydir[64];
	bool sealed;
	enum mode mode;
	int frame;
	uint64_t n;
	const char *key[2];      /* each node's key pair's name */
	const char *trust[2][2]; /* the names of the keys each trusts */
	char pub[3][RDZV_CURVE_Z85_LEN + 1];
	int timeout_ms;
	bool refuse; /* the open is to be refused */
	bool no_aes; /* node 1 offers no AES-256-GCM: the data is in secretstream */
};

static const char *const names[] = {"a", "b", "c"};

static const char *pub_of(struct run *rn, const char *name)
{
	for (int i = 0; i < 3; i++)
		if (strcmp(names[i], name) == 0)
			return rn->pub[i];
	return "";
}

static float fbits(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

static bool is_bits(float f, uint32_t u)
{
	uint32_t b;

	memcpy(&b, &f, sizeof(b));
	return b == u;
}

struct sync_req {
	struct coll_req req;
	int status;
};

/* gloo.c runs a request on the submitting thread and completes it there. */
static void sync_done(struct coll_req *req, int status)
{
	((struct sync_req *)req)->status = status;
}

/* One reduce and one broadcast of n elements (two ranges, rank 0 owns the
 * first half, rank 1 the second), checked: 0 or the first failure's code,
 * why in err. */
static int one_round(struct coll_group *g, float *grad, float *param, uint32_t node, uint64_t n,
		     char *err, size_t errlen)
{
	struct coll_range rg[2] = {{.owner = 0, .off = 0, .n = n / 2},
				   {.owner = 1, .off = n / 2, .n = n - n / 2}};

	for (uint64_t x = 0; x < n; x++) {
		bool mine = rg[node].off <= x && x < rg[node].off + rg[node].n;
		grad[x] = fbits(PATTERN);
		param[x] = mine ? fbits(PATTERN2) : 0.0f;
	}
	for (int k = 0; k < 2; k++) {
		struct sync_req w = {.status = 1};
		unsigned lane = k ? LANE_BCAST : LANE_REDUCE;
		w.req = (struct coll_req){.kind = k ? COLL_BCAST : COLL_REDUCE,
					  .mode = ZC_SHARD_BUCKET,
					  .lane = lane,
					  .ranges = rg,
					  .nranges = 2,
					  .done = sync_done};
		int r = coll_gloo_ops.submit(g, &w.req);
		if (r >= 0)
			r = w.status;
		if (r != 0) {
			snprintf(err, errlen, "%s", coll_gloo_ops.last_error(g, lane));
			return r;
		}
	}
	/* the average of two equal gradients is that gradient, bit for bit */
	for (uint64_t x = rg[node].off; x < rg[node].off + rg[node].n; x++)
		if (!is_bits(grad[x], PATTERN)) {
			snprintf(err, errlen, "grad[%llu] wrong", (unsigned long long)x);
			return -EIO;
		}
	for (uint64_t x = 0; x < n; x++)
		if (!is_bits(param[x], PATTERN2)) {
			snprintf(err, errlen, "param[%llu] wrong", (unsigned long long)x);
			return -EIO;
		}
	return 0;
}

/* Open node `node`'s group on mesh `which` of the run. */
static int open_group(struct run *rn, uint32_t node, int which, const struct coll_store *store,
		      const struct rdzv_keys *keys, struct pool *pool, float **grads,
		      float **params, struct coll_group **ret, char *err, size_t errlen)
{
	static const uint32_t node_of[2] = {0, 1};
	struct coll_net net = {
		.nnodes = 2,
		.node = node,
		.node_of = node_of,
		.host = "127.0.0.1",
		.prefix = rn->prefix[which],
		.store = store,
		.timeout_ms = (uint32_t)rn->timeout_ms,
		.keys = keys,
	};
	struct coll_config cc = {.world = 2,
				 .grads = grads,
				 .params = params,
				 .pool = pool,
				 .net = &net,
				 .err = err,
				 .errlen = errlen};
	return coll_gloo_ops.open(&cc, ret);
}

/* What node `node` got: its code and reason, for the case to check. */
static void tell(struct run *rn, uint32_t node, int r, const char *err)
{
	char path[256];
	FILE *f;

	snprintf(path, sizeof(path), "%s/why.%u", rn->dir, node);
	f = fopen(path, "w");
	if (f) {
		fprintf(f, "%d\n%s", r, err);
		fclose(f);
	}
	printf("# node %u: %s: %s\n", node, zc_strerror_name(r), err);
	fflush(stdout);
}

static void node_main(struct run *rn, uint32_t node)
{
	struct rstore st = {.dir = rn->dir, .mode = rn->mode, .frame = rn->frame};
	struct coll_store store = {.ctx = &st, .set = rs_set, .get = rs_get};
	struct rdzv_keys *keys = NULL;
	struct coll_group *g = NULL;
	struct pool *pool = NULL;
	float *grads[2] = {0}, *params[2] = {0};
	char err[256] = "";
	int r;

	pthread_mutex_init(&st.mu, NULL);
	st.fs = filestore_new(rn->dir);
	if (rn->no_aes && node == 1)
		setenv("ZEROD_SEALMESH_NO_AES", "1", 1);
	if (rn->sealed) {
		const char *trust[2] = {pub_of(rn, rn->trust[node][0]),
					pub_of(rn, rn->trust[node][1])};
		keys = testkeys_load(rn->keydir, rn->key[node], trust, 2);
		REQUIRE(keys, "node %u: keys", node);
	}
	REQUIRE(pool_new(1, &pool) == 0, "pool");
	grads[node] = calloc(rn->n, sizeof(float));
	params[node] = calloc(rn->n, sizeof(float));
	r = open_group(rn, node, 0, &store, keys, pool, grads, params, &g, err, sizeof(err));
	if (rn->refuse) {
		CHECK(r < 0, "node %u: the open was not refused", node);
		tell(rn, node, r, err);
		goto out;
	}
	REQUIRE(r == 0, "node %u: open: %d %s", node, r, err);
	r = one_round(g, grads[node], params[node], node, rn->n, err, sizeof(err));
	if (rn->mode == M_NONE) {
		CHECK(r == 0, "node %u: %s: %s", node, zc_strerror_name(r), err);
		goto out;
	}
	tell(rn, node, r, err);
	CHECK(r < 0, "node %u: the collective did not fail", node);
	/* the failed group goes; a new mesh between the same processes works */
	coll_gloo_ops.close(g);
	g = NULL;
	r = open_group(rn, node, 1, &store, keys, pool, grads, params, &g, err, sizeof(err));
	REQUIRE(r == 0, "node %u: the second open: %d %s", node, r, err);
	r = one_round(g, grads[node], params[node], node, rn->n, err, sizeof(err));
	CHECK(r == 0, "node %u: a fresh mesh after the failure: %s: %s", node, zc_strerror_name(r),
	      err);
out:
	coll_gloo_ops.close(g);
	pool_free(pool);
	rdzv_keys_free(keys);
	free(grads[node]);
	free(params[node]);
}

/* ----------------------------------------------------------- runs --- */

static void rm_dir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char path[512];

	while (d && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		unlink(path);
	}
	if (d)
		closedir(d);
	rmdir(dir);
}

static struct run *run_new(bool sealed)
{
	struct run *rn = test_shared(sizeof(*rn));

	memset(rn, 0, sizeof(*rn));
	snprintf(rn->dir, sizeof(rn->dir), "/tmp/zerod-seal-XXXXXX");
	snprintf(rn->keydir, sizeof(rn->keydir), "/tmp/zerod-sealkeys-XXXXXX");
	if (!mkdtemp(rn->dir) || !mkdtemp(rn->keydir))
		abort();
	for (int k = 0; k < 2; k++)
		snprintf(rn->prefix[k], sizeof(rn->prefix[k]), "run%d.%d/", (int)getpid(), k);
	rn->sealed = sealed;
	rn->n = 1u << 18; /* 1 MiB: several sealed frames each way */
	rn->timeout_ms = test_timeout(5000);
	rn->key[0] = "a", rn->key[1] = "b";
	rn->trust[0][0] = rn->trust[1][0] = "a";
	rn->trust[0][1] = rn->trust[1][1] = "b";
	for (int i = 0; i < 3; i++)
		if (testkeys_make(rn->keydir, names[i], rn->pub[i]) < 0)
			abort();
	return rn;
}

static void run_free(struct run *rn)
{
	rm_dir(rn->dir);
	rm_dir(rn->keydir);
}

/* Both nodes, to their end; CHECKs each. */
static void run_nodes(struct run *rn, const char *tag)
{
	pid_t pid[2];

	for (uint32_t j = 0; j < 2; j++) {
		fflush(stdout);
		pid[j] = fork();
		if (pid[j] == 0) {
			test_failed_ = 0;
			alarm(NODE_T / 1000 + 5);
			srand((unsigned)getpid());
			node_main(rn, j);
			fflush(stdout);
			_exit(test_failed_ ? 1 : 0);
		}
	}
	for (uint32_t j = 0; j < 2; j++) {
		int st = 0;
		waitpid(pid[j], &st, 0);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: node %u ended with %#x", tag, j,
		      st);
	}
}

/* How often 4 elements of PATTERN in a row are in what the relays carried;
 * how many bytes they carried. */
static int on_wire(const struct run *rn, size_t *ret_bytes)
{
	uint32_t pat[4] = {PATTERN, PATTERN, PATTERN, PATTERN};
	DIR *d = opendir(rn->dir);
	struct dirent *e;
	int count = 0;

	*ret_bytes = 0;
	while (d && (e = readdir(d))) {
		char path[512];
		if (strncmp(e->d_name, "relay.", 6) != 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s", rn->dir, e->d_name);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		fseek(f, 0, SEEK_END);
		long len = ftell(f);
		rewind(f);
		char *buf = malloc((size_t)len + 1);
		if (fread(buf, 1, (size_t)len, f) == (size_t)len) {
			*ret_bytes += (size_t)len;
			for (char *p = buf;
			     (p = memmem(p, (size_t)(buf + len - p), pat, sizeof(pat)));
			     p += sizeof(pat))
				count++;
		}
		free(buf);
		fclose(f);
	}
	if (d)
		closedir(d);
	return count;
}

/* What node j got: its code, its reason in why. */
static int told(const struct run *rn, uint32_t j, char *why, size_t len)
{
	char path[512];
	int code = 0;
	FILE *f;

	snprintf(path, sizeof(path), "%s/why.%u", rn->dir, j);
	why[0] = '\0';
	f = fopen(path, "r");
	if (!f)
		return 0;
	if (fscanf(f, "%d\n", &code) != 1)
		code = 0;
	size_t n = fread(why, 1, len - 1, f);
	why[n] = '\0';
	fclose(f);
	return code;
}

/* ---------------------------------------------------------- cases --- */

static void t_wire(void)
{
	size_t plain_bytes, sealed_bytes;
	struct run *rn = run_new(false);
	int plain, sealed;

	run_nodes(rn, "gloo");
	plain = on_wire(rn, &plain_bytes);
	run_free(rn);
	rn = run_new(true);
	run_nodes(rn, "sealed");
	sealed = on_wire(rn, &sealed_bytes);
	run_free(rn);
	/* both runs checked their results bit for bit (one_round) */
	CHECK(plain > 1000, "over gloo the pattern is on the wire %d times (%zu bytes carried)",
	      plain, plain_bytes);
	CHECK(sealed == 0 && sealed_bytes > 2 * sizeof(float) * rn->n,
	      "over the sealed mesh the pattern is on the wire %d times (%zu bytes carried)",
	      sealed, sealed_bytes);
	test_note("the relays carried %zu bytes over gloo (the pattern %d times), %zu sealed "
		  "(%d times)",
		  plain_bytes, plain, sealed_bytes, sealed);
}

static void tampered(enum mode mode, bool no_aes, const char *what)
{
	struct run *rn = run_new(true);
	char why0[300], why1[300], key1[64];
	int r0, r1;

	rn->mode = mode;
	rn->no_aes = no_aes;
	rn->frame = 5; /* after the Curve, CurveAuth and binding frames: the 2nd of data */
	run_nodes(rn, what);
	r0 = told(rn, 0, why0, sizeof(why0));
	r1 = told(rn, 1, why1, sizeof(why1));
	snprintf(key1, sizeof(key1), "CURVE key %s", rn->pub[1]);
	CHECK(r0 == -EBADMSG && strstr(why0, "node 1") && strstr(why0, key1) &&
		      strstr(why0, "does not open"),
	      "%s: node 0 got %d \"%s\"", what, r0, why0);
	CHECK(r1 < 0 && strstr(why1, "node 0"), "%s: node 1 got %d \"%s\"", what, r1, why1);
	run_free(rn);
}

static void t_flip(void)
{
	tampered(M_FLIP, false, "one byte changed");
}

static void t_replay(void)
{
	/* and with node 1 offering no AES: the nodes agree on secretstream */
	tampered(M_REPLAY, true, "one frame replayed");
}

static void t_untrusted(void)
{
	struct run *rn = run_new(true);
	char why0[300], why1[300];
	int r0, r1;

	/* node 1 holds c, which node 0 does not trust */
	rn->refuse = true;
	rn->timeout_ms = test_timeout(1500);
	rn->key[1] = "c";
	rn->trust[1][1] = "c";
	run_nodes(rn, "node 1 untrusted");
	r0 = told(rn, 0, why0, sizeof(why0));
	r1 = told(rn, 1, why1, sizeof(why1));
	CHECK(r0 == ZC_ECONNECT && strstr(why0, rn->pub[2]) &&
		      strstr(why0, "not among the authorized keys"),
	      "node 0 got %d \"%s\"", r0, why0);
	CHECK(r1 == ZC_ECONNECT && strstr(why1, "node 0") && strstr(why1, "does not trust"),
	      "node 1 got %d \"%s\"", r1, why1);
	run_free(rn);

	/* node 0 holds c, which node 1 does not trust */
	rn = run_new(true);
	rn->refuse = true;
	rn->timeout_ms = test_timeout(1500);
	rn->key[0] = "c";
	rn->trust[0][0] = "c";
	run_nodes(rn, "node 0 untrusted");
	r1 = told(rn, 1, why1, sizeof(why1));
	CHECK(r1 == ZC_ECONNECT && strstr(why1, rn->pub[2]) &&
		      strstr(why1, "not among this node's authorized keys"),
	      "node 1 got %d \"%s\"", r1, why1);
	run_free(rn);
}

static const struct test_case cases[] = {
	{"sealed_hides_the_tensors_gloo_does_not", t_wire, 60000},
	{"changed_byte_fails_naming_the_peer", t_flip, 60000},
	{"replayed_frame_fails_naming_the_peer", t_replay, 60000},
	{"untrusted_key_refused_both_ways", t_untrusted, 60000},
};

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	return test_main(cases, ARRAY_SIZE(cases), argc, argv);
}
