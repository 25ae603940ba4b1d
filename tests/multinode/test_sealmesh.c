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
 *    with ZC_ECONNECT, naming the key;
 *  - strangers on node 0's mesh port before node 1 (garbage, a header that
 *    claims 4 GiB, silence): each refused, the mesh opens, results right.
 *
 * The executor's cases of test_gloo.c also run over the sealed mesh there
 * (its sealed_* cases); test_curve.c trains real zerods with CURVE.
 */
#include <dirent.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll/coll.h"
#include "common.h"
#include "base/pool.h"
#include "relaystore.h"
#include "testkeys.h"
#include "testlib.h"
#include "plan/zero.h"

#define NODE_T   20000 /* ms a forked node may take */
#define PATTERN  0x4b1d5eedu
#define PATTERN2 0x3c0ffee1u

/* ---------------------------------------------------------- nodes --- */

struct run {
	char dir[64];
	char prefix[2][64];
	char keydir[64];
	bool sealed;
	enum relay_mode mode;
	int frame;
	uint64_t n;
	const char *key[2];      /* each node's key pair's name */
	const char *trust[2][2]; /* the names of the keys each trusts */
	char pub[3][RDZV_CURVE_Z85_LEN + 1];
	int timeout_ms;
	bool refuse;         /* the open is to be refused */
	bool no_aes;         /* node 1 offers no AES-256-GCM: the data is in secretstream */
	int strangers;       /* connections to node 0's mesh port before node 1 comes */
	_Atomic int done[2]; /* nodes through each mesh's collectives */
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

/* Wait (10 s at most) until both nodes are through mesh `which`: a node's
 * relays are threads of its process, so neither may close its group and
 * leave while the other still reads what they forward. */
static void both_done(struct run *rn, int which)
{
	atomic_fetch_add(&rn->done[which], 1);
	for (int i = 0; i < 1000 && atomic_load(&rn->done[which]) < 2; i++)
		usleep(10000);
}

static void node_main(struct run *rn, uint32_t node)
{
	struct coll_store store = relaystore_new(rn->dir, rn->mode, rn->frame);
	struct rdzv_keys *keys = NULL;
	struct coll_group *g = NULL;
	struct pool *pool = NULL;
	float *grads[2] = {0}, *params[2] = {0};
	char err[256] = "";
	int r;

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
	if (rn->mode == RELAY_PLAIN) {
		CHECK(r == 0, "node %u: %s: %s", node, zc_strerror_name(r), err);
		both_done(rn, 0);
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
	both_done(rn, 1);
out:
	coll_gloo_ops.close(g);
	relaystore_free(&store);
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
/* Connections to node 0's mesh port (its address in the store), once it
 * is published: garbage, a frame header that claims 4 GiB, silence. They
 * stay open; -1 where one could not be made. */
static void strangers(struct run *rn, int *fds)
{
	char path[256], addr[64] = "";
	unsigned port = 0;
	FILE *f = NULL;

	/* the file store's name for PREFIX "sealmesh/0" ('/' made '_') */
	snprintf(path, sizeof(path), "%s/%ssealmesh/0", rn->dir, rn->prefix[0]);
	for (char *p = path + strlen(rn->dir) + 1; *p; p++)
		if (*p == '/')
			*p = '_';
	for (int i = 0; i < 1000 && !(f = fopen(path, "r")); i++)
		usleep(10000);
	if (f) {
		size_t n = fread(addr, 1, sizeof(addr) - 1, f);
		addr[n] = '\0';
		fclose(f);
	}
	for (int k = 0; k < rn->strangers; k++) {
		struct sockaddr_in sa = {.sin_family = AF_INET,
					 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
		static const uint8_t huge[4] = {0xff, 0xff, 0xff, 0xff};
		fds[k] = -1;
		if (sscanf(addr, "127.0.0.1:%u", &port) != 1)
			continue;
		sa.sin_port = htons((uint16_t)port);
		fds[k] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (connect(fds[k], (struct sockaddr *)&sa, sizeof(sa)) < 0) {
			close(fds[k]);
			fds[k] = -1;
			continue;
		}
		if (k % 3 == 0) {
			static const char junk[] = "GET / HTTP/1.0\r\n\r\n garbage";
			(void)!write(fds[k], junk, sizeof(junk) - 1);
		} else if (k % 3 == 1)
			(void)!write(fds[k], huge, sizeof(huge));
		/* k % 3 == 2: says nothing */
	}
}

static void run_nodes(struct run *rn, const char *tag)
{
	pid_t pid[2];
	int sfd[8];

	for (uint32_t j = 0; j < 2; j++) {
		if (j == 1 && rn->strangers)
			strangers(rn, sfd);
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
	for (int k = 0; k < rn->strangers; k++) {
		CHECK(sfd[k] >= 0, "stranger %d could not connect to node 0's mesh port", k);
		if (sfd[k] >= 0)
			close(sfd[k]);
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
	/* a bucket-mode REDUCE + BCAST over two nodes moves one all-reduce's
	 * bytes (each node sends the half it does not own once, and receives
	 * the other half's parameters once), not 1.5 of them (issue 25 §3) */
	CHECK(plain_bytes < 2 * sizeof(float) * rn->n + 4096,
	      "over gloo the relays carried %zu bytes, more than one all-reduce's %zu",
	      plain_bytes, 2 * sizeof(float) * rn->n);
	test_note("the relays carried %zu bytes over gloo (the pattern %d times), %zu sealed "
		  "(%d times)",
		  plain_bytes, plain, sealed_bytes, sealed);
}

/* Frame `frame` of connection 0's first direction changed or replayed. */
static void tampered(enum relay_mode mode, bool no_aes, int frame, const char *what)
{
	struct run *rn = run_new(true);
	char why0[300], why1[300], key1[64];
	int r0, r1;

	rn->mode = mode;
	rn->no_aes = no_aes;
	rn->frame = frame;
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
	/* after the Curve, CurveAuth and binding frames: the 2nd of data */
	tampered(RELAY_FLIP, false, 5, "one byte changed");
}

static void t_replay(void)
{
	/* and with node 1 offering no AES: the nodes agree on secretstream. A
	 * replay shows in the frame read after it: the 1st of data, which has
	 * others after it (with two nodes a bucket-mode REDUCE sends each way
	 * only what the owner node folds, so frame 5 can be the last) */
	tampered(RELAY_REPLAY, true, 4, "one frame replayed");
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

/* Three strangers on node 0's mesh port before node 1 connects: garbage,
 * a frame header claiming 4 GiB, silence. Node 0 refuses each (the silent
 * one after HANDSHAKE_MS) and the mesh opens; the collectives are right. */
static void t_strangers(void)
{
	struct run *rn = run_new(true);

	int64_t t0 = now_ms();

	rn->strangers = 3;
	rn->timeout_ms = test_timeout(15000);
	run_nodes(rn, "strangers first");
	test_note("the mesh opened and the collectives ran in %ld ms, past the strangers",
		  (long)(now_ms() - t0));
	run_free(rn);
}

static const struct test_case cases[] = {
	{"sealed_hides_the_tensors_gloo_does_not", t_wire, 60000},
	{"changed_byte_fails_naming_the_peer", t_flip, 60000},
	{"replayed_frame_fails_naming_the_peer", t_replay, 60000},
	{"untrusted_key_refused_both_ways", t_untrusted, 60000},
	{"strangers_on_the_mesh_port_refused", t_strangers, 60000},
};

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	return test_main(cases, ARRAY_SIZE(cases), argc, argv);
}
