/*
 * zeroctl — the operator's command for zerod: status, inspect, metrics,
 * reload, trace. Speaks the control protocol (proto/zerod.proto, message
 * Ctl) over the daemon's control socket, <socket>.ctl, one request and one
 * reply per run; prints aligned tables for people or, with -o json, one JSON
 * document with a schema_version (tools/zeroctl/zeroctl.schema.json).
 *
 * Exit statuses (sysexits.h where one fits), documented in --help:
 *   0 ok, 1 degraded (or the verb failed), 64 usage, 69 daemon unreachable,
 *   76 protocol mismatch, 77 permission denied.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

#include "common.h"
#include "keygen.h"
#include "zerod.pb-c.h"

#define EXIT_DEGRADED    1
#define EXIT_USAGE       64
#define EXIT_UNAVAILABLE 69
#define EXIT_PROTOCOL    76
#define EXIT_NOPERM      77

#define SCHEMA_VERSION     1
#define DEFAULT_SOCKET     "/run/zerod/zerod.sock"
#define DEFAULT_TIMEOUT_MS 5000
#define HUMAN_OPS          32

typedef Zerod__V1__Ctl Ctl;

static struct {
	const char *socket;
	bool json;
	int timeout_ms;
	const char *verb;
	int ops; /* inspect: operations shown (human output) */
	bool wait; /* checkpoint: wait for the outcome */
} opt = {.timeout_ms = DEFAULT_TIMEOUT_MS, .ops = HUMAN_OPS};

/* checkpoint --wait: how long at most, and how often zerod is asked */
#define WAIT_MAX_MS  600000
#define WAIT_POLL_MS 100

static void usage(FILE *f)
{
	fprintf(f,
		"usage: zeroctl [--socket PATH] [-o table|json] [--timeout MS] VERB [ARGS]\n"
		"\n"
		"Operate zerod, the data-parallel ZeRO-1 optimizer daemon, over its control\n"
		"socket PATH.ctl (beside the trainers' socket PATH).\n"
		"\n"
		"Verbs:\n"
		"  status                     version, backends, devices, uptime; every job with\n"
		"                             its nodes, ranks, iteration, step rate and state\n"
		"  inspect JOB [--rank R] [--bucket B] [--uid U] [--ops N]\n"
		"                             the job's plan, bucket sizes and who owns which\n"
		"                             range; the last operations of its flight recorder\n"
		"                             with their timings (the last %d; -o json: all "
		"kept);\n"
		"                             for a stalled job, the ranks and buckets it waits\n"
		"                             for. --rank/--bucket keep only what concerns them;\n"
		"                             --uid names the user when several have a job JOB\n"
		"  metrics                    the metrics, Prometheus text format\n"
		"  reload                     read the config file again: applies what can change\n"
		"                             live, says what needs a restart; a file that does\n"
		"                             not parse is refused and the running config kept\n"
		"  trace on FILE              write a Chrome trace timeline (Perfetto,\n"
		"                             chrome://tracing) of every job's buckets to FILE,\n"
		"                             as zerod's user; a FILE zerod would write where\n"
		"                             you do not see it (its private /tmp) is refused\n"
		"  trace off                  stop it and complete the file\n"
		"  checkpoint JOB [DIR] [--uid U] [--wait]\n"
		"                             have the job's trainers write a checkpoint into DIR\n"
		"                             (default: zerod's checkpoint-dir/JOB, refused if "
		"the\n"
		"                             job's user cannot write it) at the next iteration\n"
		"                             boundary, if they poll zc_checkpoint_due(); says "
		"which\n"
		"                             iteration (one-node jobs). --wait: until the "
		"trainers\n"
		"                             report it written (exit 0) or failed (exit 1, why),\n"
		"                             at most 10 minutes\n"
		"  keygen [PREFIX]            a TLS identity for zerod's connections between\n"
		"                             daemons (zerod --tls-key PREFIX.key --tls-cert\n"
		"                             PREFIX.crt; the printed fingerprint goes into the\n"
		"                             other nodes' --tls-peers file): PREFIX.key, an\n"
		"                             Ed25519 key (mode 0600), and PREFIX.crt, its\n"
		"                             self-signed certificate, neither over an existing\n"
		"                             file (default PREFIX: zerod); needs no zerod\n"
		"  fingerprint CERT           the SHA-256 fingerprint of the PEM certificate in\n"
		"                             file CERT, as --tls-peers lists it; needs no zerod\n"
		"\n"
		"Options:\n"
		"  -s, --socket PATH    zerod's socket, as given to zerod --socket (default\n"
		"                       $ZEROD_SOCKET, else " DEFAULT_SOCKET ")\n"
		"  -o, --output FORMAT  table (default) or json: one document with\n"
		"                       \"schema_version\": %d and \"verb\"; errors too\n"
		"  -t, --timeout MS     wait this long for the answer (default %d)\n"
		"  -h, --help           this text\n"
		"      --version        zeroctl's version and control protocol\n"
		"\n"
		"Who may do what: root and zerod's own user may run every verb; members of\n"
		"zerod's group (zerod --group) may run status, inspect, metrics and\n"
		"checkpoint, on their own jobs only; nobody else reaches the socket.\n"
		"\n"
		"Exit status:\n"
		"   0  ok (status: no job failed or stalls)\n"
		"   1  degraded: a job failed or waited past stall-warn (status, inspect); or\n"
		"      the verb failed: reload refused the file, no such job, trace not possible\n"
		"  64  usage: a bad command line (or a request zerod calls malformed)\n"
		"  69  unavailable: no zerod at the socket, or no answer within the timeout\n"
		"  76  protocol: zerod speaks another control protocol (not %d)\n"
		"  77  permission denied: the socket or the verb is not for this user\n",
		HUMAN_OPS, SCHEMA_VERSION, DEFAULT_TIMEOUT_MS, ZEROD_CTL_VERSION);
}

/* ------------------------------------------------------------ JSON --- */

static void json_str(const char *s)
{
	putchar('"');
	for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
		if (*p == '"' || *p == '\\')
			printf("\\%c", *p);
		else if (*p == '\n')
			printf("\\n");
		else if (*p < 0x20 || *p == 0x7f)
			printf("\\u%04x", *p);
		else
			putchar(*p);
	}
	putchar('"');
}

static void json_head(void)
{
	printf("{\"schema_version\":%d,\"verb\":", SCHEMA_VERSION);
	json_str(opt.verb);
}

static double num(double v)
{
	return v == v ? v : 0; /* no NaN in JSON */
}

/* A failure: stderr for people; with -o json also a document on stdout. */
static int fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(int code, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, "zeroctl: %s\n", msg);
	if (opt.json) {
		json_head();
		printf(",\"error\":{\"exit_code\":%d,\"message\":", code);
		json_str(msg);
		printf("}}\n");
	}
	return code;
}

/* ------------------------------------------------------- transport --- */

/* The answer to req, or an exit status with the reason said. */
static int call(const Ctl *req, Ctl **ret)
{
	char path[sizeof(((struct sockaddr_un *)0)->sun_path) + 16], endpoint[sizeof(path) + 8];
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	void *ctx = NULL, *sock = NULL, *buf = NULL;
	int fd, r, zero = 0, code = 0, len;
	size_t n;
	zmq_pollitem_t pi;
	zmq_msg_t msg;
	Ctl *rep;

	len = snprintf(path, sizeof(path), "%s" ZEROD_CTL_SUFFIX, opt.socket);
	if (len >= (int)sizeof(sa.sun_path))
		return fail(EXIT_USAGE, "socket path %s is too long", path);
	/* A plain connect first: ZeroMQ would wait forever for a socket that
	 * is not there, and would not say that the kernel refused us. */
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return fail(EXIT_UNAVAILABLE, "socket: %s", strerror(errno));
	r = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ? -errno : 0;
	close(fd);
	if (r == -EACCES || r == -EPERM)
		return fail(EXIT_NOPERM, "%s: permission denied (root, zerod's user and members of "
			    "its group may use it)", path);
	if (r < 0)
		return fail(EXIT_UNAVAILABLE, "no zerod at %s: %s", path, strerror(-r));

	ctx = zmq_ctx_new();
	sock = ctx ? zmq_socket(ctx, ZMQ_DEALER) : NULL;
	if (!sock) {
		code = fail(EXIT_UNAVAILABLE, "ZeroMQ: %s", zmq_strerror(zmq_errno()));
		goto out;
	}
	zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof(zero));
	snprintf(endpoint, sizeof(endpoint), "ipc://%s", path);
	n = zerod__v1__ctl__get_packed_size(req);
	buf = malloc(n ? n : 1);
	if (!buf) {
		code = fail(EXIT_UNAVAILABLE, "out of memory");
		goto out;
	}
	zerod__v1__ctl__pack(req, buf);
	if (zmq_connect(sock, endpoint) < 0 || zmq_send(sock, buf, n, 0) < 0) {
		code = fail(EXIT_UNAVAILABLE, "%s: %s", endpoint, zmq_strerror(zmq_errno()));
		goto out;
	}
	pi = (zmq_pollitem_t){.socket = sock, .events = ZMQ_POLLIN};
	r = zmq_poll(&pi, 1, opt.timeout_ms);
	if (r <= 0) {
		code = fail(EXIT_UNAVAILABLE, "no answer from zerod at %s within %d ms", path,
			    opt.timeout_ms);
		goto out;
	}
	zmq_msg_init(&msg);
	if (zmq_msg_recv(&msg, sock, 0) < 0) {
		zmq_msg_close(&msg);
		code = fail(EXIT_UNAVAILABLE, "%s: %s", endpoint, zmq_strerror(zmq_errno()));
		goto out;
	}
	rep = zerod__v1__ctl__unpack(NULL, zmq_msg_size(&msg), zmq_msg_data(&msg));
	zmq_msg_close(&msg);
	if (!rep) {
		code = fail(EXIT_PROTOCOL, "the answer from %s is not a control reply zeroctl "
			    "(control protocol %d) understands", path, ZEROD_CTL_VERSION);
		goto out;
	}
	if (rep->version != ZEROD_CTL_VERSION) {
		code = fail(EXIT_PROTOCOL, "zerod speaks control protocol %u, zeroctl %d",
			    rep->version, ZEROD_CTL_VERSION);
		zerod__v1__ctl__free_unpacked(rep, NULL);
		goto out;
	}
	*ret = rep;
out:
	free(buf);
	if (sock)
		zmq_close(sock);
	if (ctx)
		zmq_ctx_term(ctx);
	return code;
}

/* The reply must be of kind want; an error reply becomes its exit status. */
static int expect(Ctl *rep, Zerod__V1__Ctl__BodyCase want)
{
	if (rep->body_case == want)
		return 0;
	if (rep->body_case != ZEROD__V1__CTL__BODY_ERROR)
		return fail(EXIT_PROTOCOL, "zerod answered %s with another kind of reply (%d)",
			    opt.verb, (int)rep->body_case);
	switch (rep->error->kind) {
	case ZEROD__V1__CTL_ERROR__KIND__DENIED:
		return fail(EXIT_NOPERM, "%s: permission denied: %s", opt.verb,
			    rep->error->message);
	case ZEROD__V1__CTL_ERROR__KIND__VERSION:
		return fail(EXIT_PROTOCOL, "%s", rep->error->message);
	case ZEROD__V1__CTL_ERROR__KIND__BAD_REQUEST:
		return fail(EXIT_USAGE, "%s: %s", opt.verb, rep->error->message);
	default:
		return fail(EXIT_DEGRADED, "%s: %s", opt.verb, rep->error->message);
	}
}

/* ---------------------------------------------------------- tables --- */

#define MAX_COLS 12

/* A table: rows of cells, printed with each column as wide as its widest
 * cell. Cells are copies; the last column is not padded. */
struct table {
	unsigned ncols, nrows, cap;
	char **cells;
};

static void table_row(struct table *t, ...)
{
	va_list ap;

	if (t->nrows == t->cap) {
		t->cap = t->cap ? 2 * t->cap : 16;
		t->cells = realloc(t->cells, (size_t)t->cap * t->ncols * sizeof(char *));
		if (!t->cells) {
			fprintf(stderr, "zeroctl: out of memory\n");
			exit(EXIT_DEGRADED);
		}
	}
	va_start(ap, t);
	for (unsigned c = 0; c < t->ncols; c++) {
		const char *s = va_arg(ap, const char *);
		t->cells[(size_t)t->nrows * t->ncols + c] = strdup(s ? s : "-");
	}
	va_end(ap);
	t->nrows++;
}

static void table_print(struct table *t)
{
	size_t w[MAX_COLS] = {0};

	for (unsigned r = 0; r < t->nrows; r++)
		for (unsigned c = 0; c < t->ncols; c++) {
			size_t n = strlen(t->cells[(size_t)r * t->ncols + c]);
			w[c] = n > w[c] ? n : w[c];
		}
	for (unsigned r = 0; r < t->nrows; r++) {
		for (unsigned c = 0; c < t->ncols; c++) {
			const char *s = t->cells[(size_t)r * t->ncols + c];
			if (c + 1 < t->ncols)
				printf("%-*s  ", (int)w[c], s);
			else
				printf("%s\n", s);
			free((void *)s);
		}
	}
	free(t->cells);
	t->cells = NULL;
	t->nrows = t->cap = 0;
}

static const char *fmt(char *buf, size_t len, const char *f, ...)
	__attribute__((format(printf, 3, 4)));
static const char *fmt(char *buf, size_t len, const char *f, ...)
{
	va_list ap;

	va_start(ap, f);
	vsnprintf(buf, len, f, ap);
	va_end(ap);
	return buf;
}

static const char *bytes(char buf[32], uint64_t n)
{
	static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	double v = (double)n;
	int u = 0;

	while (v >= 1024 && u < 5)
		v /= 1024, u++;
	snprintf(buf, 32, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
	return buf;
}

static const char *duration(char buf[32], double s)
{
	if (s < 1e-3)
		snprintf(buf, 32, "%.0f us", s * 1e6);
	else if (s < 1)
		snprintf(buf, 32, "%.1f ms", s * 1e3);
	else if (s < 120)
		snprintf(buf, 32, "%.1f s", s);
	else if (s < 7200)
		snprintf(buf, 32, "%dm%02ds", (int)(s / 60), (int)s % 60);
	else
		snprintf(buf, 32, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
	return buf;
}

/* A job is degraded when it failed or waits past the daemon's stall-warn. */
static bool job_degraded(const Zerod__V1__CtlJob *j)
{
	return j->error || j->stalled;
}

/* ----------------------------------------------------------- verbs --- */

/* A job's last checkpoint (CtlCheckpoint), or null. */
static void json_ckpt(const Zerod__V1__CtlCheckpoint *k)
{
	if (!k) {
		printf("null");
		return;
	}
	printf("{\"state\":");
	json_str(k->state);
	printf(",\"iteration\":%" PRIu64 ",\"dir\":", k->iteration);
	json_str(k->dir);
	printf(",\"path\":");
	k->path ? json_str(k->path) : (void)printf("null");
	printf(",\"error\":");
	k->error ? json_str(k->error) : (void)printf("null");
	printf(",\"rank\":");
	k->has_rank ? printf("%u", k->rank) : printf("null");
	printf(",\"age_seconds\":%.3f}", k->age_ms / 1000.0);
}

/* The same for people, one line. */
static void print_ckpt(const char *job, const Zerod__V1__CtlCheckpoint *k)
{
	char b[32];

	if (strcmp(k->state, "asked") == 0)
		printf("job %s: checkpoint of iteration %" PRIu64 " into %s asked %s ago, not "
		       "reported yet\n",
		       job, k->iteration, k->dir, duration(b, k->age_ms / 1000.0));
	else if (strcmp(k->state, "done") == 0)
		printf("job %s: last checkpoint: iteration %" PRIu64 " written to %s (rank %u, %s "
		       "ago)\n",
		       job, k->iteration, k->path ? k->path : k->dir, k->rank,
		       duration(b, k->age_ms / 1000.0));
	else
		printf("job %s: last checkpoint: iteration %" PRIu64 " into %s FAILED (rank %u, %s "
		       "ago): %s\n",
		       job, k->iteration, k->dir, k->rank, duration(b, k->age_ms / 1000.0),
		       k->error ? k->error : "no reason given");
}

static void json_job(const Zerod__V1__CtlJob *j)
{
	printf("{\"id\":");
	json_str(j->id);
	printf(",\"uid\":%u,\"state\":", j->uid);
	json_str(j->state);
	printf(",\"world\":%u,\"local_ranks\":%u,\"nodes\":%u,\"connected\":%u,"
	       "\"iteration\":%" PRIu64 ",\"step_rate\":%.6g,\"age_seconds\":%.3f,"
	       "\"idle_seconds\":%.3f,\"waiting\":%s,\"stalled\":%s,\"waiting_for\":",
	       j->world, j->local_ranks, j->nodes, j->connected, j->iteration, num(j->step_rate),
	       j->age_ms / 1000.0, j->idle_ms / 1000.0, j->waiting ? "true" : "false",
	       j->stalled ? "true" : "false");
	if (j->waiting_for)
		json_str(j->waiting_for);
	else
		printf("null");
	printf(",\"error\":");
	if (j->error)
		json_str(j->error);
	else
		printf("null");
	printf(",\"rendezvous\":");
	if (j->rendezvous)
		json_str(j->rendezvous);
	else
		printf("null");
	printf(",\"rendezvous_serving\":%s,\"checkpoint\":", j->rendezvous_serving ? "true" : "false");
	json_ckpt(j->checkpoint);
	printf("}");
}

static int show_status(const Zerod__V1__StatusReply *st)
{
	char b1[64], b2[64], b3[64], b4[64], b5[64], b6[64];
	bool degraded = false;
	struct table t = {.ncols = 9};

	for (size_t i = 0; i < st->n_jobs; i++)
		degraded |= job_degraded(st->jobs[i]);
	if (opt.json) {
		json_head();
		printf(",\"status\":{\"version\":");
		json_str(st->version);
		printf(",\"protocol_version\":%u,\"backends\":", st->protocol_version);
		json_str(st->backends);
		printf(",\"devices\":[");
		for (size_t i = 0; i < st->n_devices; i++) {
			printf(i ? "," : "");
			json_str(st->devices[i]);
		}
		printf("],\"uptime_seconds\":%.3f,\"socket\":", num(st->uptime_seconds));
		json_str(st->socket);
		printf(",\"config\":");
		json_str(st->config);
		printf(",\"workers\":%u,\"sessions\":%u,\"connections\":%u,\"state_bytes\":%" PRIu64
		       ",\"max_state_bytes\":%" PRIu64 ",\"tracing\":%s,\"trace_file\":",
		       st->workers, st->sessions, st->connections, st->state_bytes,
		       st->max_state_bytes, st->tracing ? "true" : "false");
		if (st->trace_file)
			json_str(st->trace_file);
		else
			printf("null");
		printf(",\"rendezvous\":[");
		for (size_t i = 0; i < st->n_rendezvous; i++) {
			printf(i ? "," : "");
			json_str(st->rendezvous[i]);
		}
		printf("],\"degraded\":%s,\"jobs\":[", degraded ? "true" : "false");
		for (size_t i = 0; i < st->n_jobs; i++) {
			printf(i ? "," : "");
			json_job(st->jobs[i]);
		}
		printf("]}}\n");
		return degraded ? EXIT_DEGRADED : 0;
	}
	printf("zerod %s (protocol %u), backends %s, devices %s%s, up %s\n", st->version,
	       st->protocol_version, st->backends, st->n_devices ? st->devices[0] : "none",
	       st->n_devices > 1 ? ", ..." : "", duration(b1, st->uptime_seconds));
	printf("socket %s, config %s\n", st->socket, st->config[0] ? st->config : "(none)");
	printf("%u workers, %u trainers connected (%u connections), optimizer state %s of %s\n",
	       st->workers, st->sessions, st->connections, bytes(b2, st->state_bytes),
	       bytes(b3, st->max_state_bytes));
	printf("trace: %s%s\n", st->tracing ? "on, " : "off", st->tracing ? st->trace_file : "");
	if (st->n_rendezvous) {
		printf("rendezvous: serving");
		for (size_t i = 0; i < st->n_rendezvous; i++)
			printf("%s %s", i ? "," : "", st->rendezvous[i]);
		printf("\n");
	}
	if (!st->n_jobs) {
		printf("\nno jobs\n");
		return 0;
	}
	printf("\n");
	table_row(&t, "JOB", "UID", "STATE", "NODES", "RANKS", "ITERATION", "RATE", "IDLE",
		  "WAITING FOR");
	for (size_t i = 0; i < st->n_jobs; i++) {
		const Zerod__V1__CtlJob *j = st->jobs[i];
		char idle[32];
		table_row(&t, j->id, fmt(b1, sizeof(b1), "%u", j->uid), j->state,
			  fmt(b2, sizeof(b2), "%u", j->nodes),
			  fmt(b3, sizeof(b3), "%u/%u", j->connected, j->local_ranks),
			  fmt(b4, sizeof(b4), "%" PRIu64, j->iteration),
			  fmt(b5, sizeof(b5), "%.1f/s", j->step_rate),
			  duration(idle, j->idle_ms / 1000.0),
			  j->waiting ? j->waiting_for : fmt(b6, sizeof(b6), "-"));
	}
	table_print(&t);
	for (size_t i = 0; i < st->n_jobs; i++)
		if (st->jobs[i]->rendezvous)
			printf("job %s: rendezvous %s%s\n", st->jobs[i]->id,
			       st->jobs[i]->rendezvous,
			       st->jobs[i]->rendezvous_serving ? " (served here)" : "");
	for (size_t i = 0; i < st->n_jobs; i++)
		if (st->jobs[i]->error)
			printf("job %s failed: %s\n", st->jobs[i]->id, st->jobs[i]->error);
	for (size_t i = 0; i < st->n_jobs; i++)
		if (st->jobs[i]->checkpoint)
			print_ckpt(st->jobs[i]->id, st->jobs[i]->checkpoint);
	return degraded ? EXIT_DEGRADED : 0;
}

/* inspect's reply as JSON (zeroctl.schema.json). */
static void json_inspect(const Zerod__V1__InspectReply *in)
{
	const Zerod__V1__CtlJob *j = in->job;

	json_head();
	printf(",\"inspect\":{\"job\":");
	json_job(j);
	printf(",\"plan\":");
	if (in->optimizer) {
		printf("{\"optimizer\":");
		json_str(in->optimizer);
		printf(",\"shard_mode\":");
		json_str(in->shard_mode);
		printf(",\"step_mode\":");
		json_str(in->step_mode);
		printf(",\"hash\":\"%016" PRIx64 "\",\"elements\":%" PRIu64 "}",
		       in->plan_hash, in->total_elements);
	} else {
		printf("null");
	}
	printf(",\"backend\":");
	if (in->backend)
		json_str(in->backend);
	else
		printf("null");
	printf(",\"state_bytes\":%" PRIu64 ",\"ranks\":[", in->state_bytes);
	for (size_t i = 0; i < in->n_ranks; i++) {
		const Zerod__V1__CtlRank *r = in->ranks[i];
		printf("%s{\"rank\":%u,\"connected\":%s,\"pid\":", i ? "," : "", r->rank,
		       r->connected ? "true" : "false");
		if (r->has_pid)
			printf("%d", r->pid);
		else
			printf("null");
		printf(",\"registered\":%s,\"next_bucket\":%u,\"owned_elements\":%" PRIu64
		       "}",
		       r->registered ? "true" : "false", r->next_bucket, r->owned_elements);
	}
	printf("],\"buckets\":[");
	for (size_t i = 0; i < in->n_buckets; i++) {
		const Zerod__V1__CtlBucket *b = in->buckets[i];
		printf("%s{\"index\":%u,\"elements\":%" PRIu64 ",\"segments\":%u,"
		       "\"arrived\":%u,\"owners\":[",
		       i ? "," : "", b->index, b->numel, b->segments, b->arrived);
		for (size_t k = 0; k < b->n_units; k++)
			printf("%s{\"rank\":%u,\"offset\":%" PRIu64 ",\"elements\":%" PRIu64 "}",
			       k ? "," : "", b->units[k]->owner, b->units[k]->offset,
			       b->units[k]->numel);
		printf("]}");
	}
	printf("],\"ops_kept\":%u,\"ops\":[", in->ops_kept);
	for (size_t i = 0; i < in->n_ops; i++) {
		const Zerod__V1__CtlOp *o = in->ops[i];
		printf("%s{\"at_seconds\":%.6f,\"what\":", i ? "," : "", o->at_us / 1e6);
		json_str(o->what);
		printf(",\"iteration\":");
		o->has_iteration ? printf("%" PRIu64, o->iteration) : printf("null");
		printf(",\"bucket\":");
		o->has_bucket ? printf("%d", o->bucket) : printf("null");
		printf(",\"rank\":");
		o->has_rank ? printf("%d", o->rank) : printf("null");
		printf(",\"duration_seconds\":");
		o->has_duration_us ? printf("%.6f", o->duration_us / 1e6) : printf("null");
		printf(",\"detail\":");
		o->detail ? json_str(o->detail) : (void)printf("null");
		printf("}");
	}
	printf("]}}\n");
}

/* inspect's tables: the ranks, the buckets and their owners. */
static void inspect_tables(const Zerod__V1__InspectReply *in)
{
	const Zerod__V1__CtlJob *j = in->job;
	char b1[64], b2[64], b3[64], b4[64];
	struct table t = {.ncols = 6};

	printf("\n");
	table_row(&t, "RANK", "CONNECTED", "PID", "REGISTERED", "NEXT BUCKET", "OWNS");
	for (size_t i = 0; i < in->n_ranks; i++) {
		const Zerod__V1__CtlRank *r = in->ranks[i];
		table_row(&t, fmt(b1, sizeof(b1), "%u", r->rank), r->connected ? "yes" : "no",
			  r->has_pid ? fmt(b2, sizeof(b2), "%d", r->pid) : "-",
			  r->registered ? "yes" : "no", fmt(b3, sizeof(b3), "%u", r->next_bucket),
			  fmt(b4, sizeof(b4), "%" PRIu64 " elements", r->owned_elements));
	}
	table_print(&t);


	if (in->n_buckets) {
		t.ncols = 5;
		printf("\n");
		table_row(&t, "BUCKET", "ELEMENTS", "SEGMENTS", "ARRIVED", "OWNERS (rank:offset+len)");
		for (size_t i = 0; i < in->n_buckets; i++) {
			const Zerod__V1__CtlBucket *b = in->buckets[i];
			char owners[512] = "";
			size_t at = 0;
			for (size_t k = 0; k < b->n_units && at + 64 < sizeof(owners); k++)
				at += (size_t)snprintf(owners + at, sizeof(owners) - at,
						       "%s%u:%" PRIu64 "+%" PRIu64, k ? " " : "",
						       b->units[k]->owner, b->units[k]->offset,
						       b->units[k]->numel);
			table_row(&t, fmt(b1, sizeof(b1), "%u", b->index),
				  fmt(b2, sizeof(b2), "%" PRIu64, b->numel),
				  fmt(b3, sizeof(b3), "%u", b->segments),
				  fmt(b4, sizeof(b4), "%u/%u", b->arrived, j->local_ranks),
				  owners[0] ? owners : "-");
		}
		table_print(&t);
	}

}

/* inspect's flight recorder: the last --ops operations. */
static void inspect_ops(const Zerod__V1__InspectReply *in)
{
	char b1[64], b2[64], b3[64], b4[64], b5[64], b6[64];
	struct table t = {.ncols = 7};
	size_t first;

	first = in->n_ops > (size_t)opt.ops ? in->n_ops - (size_t)opt.ops : 0;
	if (first)
		printf("\nflight recorder: the last %zu of %zu operations (it keeps the last %u; "
		       "--ops N shows more)\n",
		       in->n_ops - first, in->n_ops, in->ops_kept);
	else
		printf("\nflight recorder: %zu operations (it keeps the last %u)\n", in->n_ops,
		       in->ops_kept);
	if (in->n_ops) {
		table_row(&t, "AT", "WHAT", "ITERATION", "BUCKET", "RANK", "TOOK", "DETAIL");
		for (size_t i = first; i < in->n_ops; i++) {
			const Zerod__V1__CtlOp *o = in->ops[i];
			table_row(&t, fmt(b1, sizeof(b1), "%.6f", o->at_us / 1e6), o->what,
				  o->has_iteration ? fmt(b2, sizeof(b2), "%" PRIu64, o->iteration)
						   : "-",
				  o->has_bucket ? fmt(b3, sizeof(b3), "%d", o->bucket) : "-",
				  o->has_rank ? fmt(b4, sizeof(b4), "%d", o->rank) : "-",
				  o->has_duration_us ? duration(b5, o->duration_us / 1e6) : "-",
				  o->detail ? o->detail : fmt(b6, sizeof(b6), "-"));
		}
		table_print(&t);
	}
}

static int show_inspect(const Zerod__V1__InspectReply *in)
{
	const Zerod__V1__CtlJob *j = in->job;
	char b1[64], b2[64];
	int code = job_degraded(j) ? EXIT_DEGRADED : 0;

	if (opt.json) {
		json_inspect(in);
		return code;
	}
	printf("job %s (uid %u): %s, iteration %" PRIu64 ", %u/%u ranks connected on %u node%s, "
	       "%.1f iterations/s\n",
	       j->id, j->uid, j->state, j->iteration, j->connected, j->local_ranks, j->nodes,
	       j->nodes == 1 ? "" : "s", j->step_rate);
	if (j->error)
		printf("failed: %s\n", j->error);
	if (j->waiting)
		printf("waiting %s for: %s\n", duration(b1, j->idle_ms / 1000.0), j->waiting_for);
	if (in->optimizer)
		printf("plan %016" PRIx64 ": %s, shard %s, step %s, %" PRIu64
		       " elements, backend %s, optimizer state %s\n",
		       in->plan_hash, in->optimizer, in->shard_mode, in->step_mode,
		       in->total_elements, in->backend ? in->backend : "-",
		       bytes(b2, in->state_bytes));
	else
		printf("plan: not registered yet\n");
	if (j->checkpoint)
		print_ckpt(j->id, j->checkpoint);

	inspect_tables(in);
	inspect_ops(in);
	return code;
}

static int show_metrics(const Zerod__V1__MetricsReply *m)
{
	if (opt.json) {
		json_head();
		printf(",\"metrics\":{\"format\":\"prometheus-text-0.0.4\",\"text\":");
		json_str(m->text);
		printf("}}\n");
	} else {
		fputs(m->text, stdout);
	}
	return 0;
}

static void json_list(char **s, size_t n)
{
	printf("[");
	for (size_t i = 0; i < n; i++) {
		printf(i ? "," : "");
		json_str(s[i]);
	}
	printf("]");
}

static int show_reload(const Zerod__V1__ReloadReply *r)
{
	if (opt.json) {
		json_head();
		printf(",\"reload\":{\"ok\":%s,\"config\":", r->ok ? "true" : "false");
		json_str(r->config);
		printf(",\"error\":");
		r->error ? json_str(r->error) : (void)printf("null");
		printf(",\"applied\":");
		json_list(r->applied, r->n_applied);
		printf(",\"needs_restart\":");
		json_list(r->needs_restart, r->n_needs_restart);
		printf("}}\n");
	}
	if (!r->ok) {
		fprintf(stderr, "zeroctl: reload refused: %s; zerod keeps its running config\n",
			r->error ? r->error : "?");
		return EXIT_DEGRADED;
	}
	if (opt.json)
		return 0;
	printf("reloaded %s: ", r->config[0] ? r->config : "(no config file)");
	if (!r->n_applied && !r->n_needs_restart)
		printf("nothing changed\n");
	else
		printf("%zu change%s applied, %zu need%s a restart\n", r->n_applied,
		       r->n_applied == 1 ? "" : "s", r->n_needs_restart,
		       r->n_needs_restart == 1 ? "s" : "");
	for (size_t i = 0; i < r->n_applied; i++)
		printf("  applied        %s\n", r->applied[i]);
	for (size_t i = 0; i < r->n_needs_restart; i++)
		printf("  needs restart  %s\n", r->needs_restart[i]);
	return 0;
}

/* A trace zerod writes where the caller cannot see it (zerod.service's
 * PrivateTmp=yes gives zerod a /tmp and /var/tmp of its own) is stopped and
 * refused: the operator would look for a file that never appears. */
static int trace_unseen(const Zerod__V1__TraceReply *tr)
{
	Zerod__V1__TraceRequest off = ZEROD__V1__TRACE_REQUEST__INIT;
	Ctl req = ZEROD__V1__CTL__INIT, *rep = NULL;
	struct stat st;
	bool json;

	if (!tr->on || !tr->has_dev || !tr->has_ino)
		return 0;
	if (stat(tr->file, &st) == 0 ? (uint64_t)st.st_dev == tr->dev &&
					       (uint64_t)st.st_ino == tr->ino
				     : errno != ENOENT && errno != ENOTDIR)
		return 0; /* the same file; or one we may not look at (not a sign) */
	req.version = ZEROD_CTL_VERSION;
	req.body_case = ZEROD__V1__CTL__BODY_TRACE_REQUEST;
	req.trace_request = &off;
	json = opt.json;
	opt.json = false; /* one document: the refusal below */
	if (call(&req, &rep) == 0)
		zerod__v1__ctl__free_unpacked(rep, NULL);
	opt.json = json;
	return fail(EXIT_DEGRADED,
		    "zerod opened %s in a filesystem of its own, where you do not see it "
		    "(zerod.service has PrivateTmp=yes: its /tmp and /var/tmp are not yours); "
		    "trace stopped: name a file in a directory you share with zerod, such as "
		    "/var/lib/zerod",
		    tr->file);
}

static int show_trace(const Zerod__V1__TraceReply *tr)
{
	int code = trace_unseen(tr);

	if (code)
		return code;
	if (opt.json) {
		json_head();
		printf(",\"trace\":{\"on\":%s,\"file\":", tr->on ? "true" : "false");
		json_str(tr->file);
		printf(",\"events\":%" PRIu64 "}}\n", tr->events);
	} else if (tr->on) {
		printf("tracing to %s (zeroctl trace off completes the file)\n", tr->file);
	} else {
		printf("trace stopped: %" PRIu64 " events in %s\n", tr->events, tr->file);
	}
	return 0;
}

/*
 * checkpoint --wait: ask zerod for the job (inspect) until the trainers
 * have reported the checkpoint of cr's iteration into cr's dir (its last
 * checkpoint is that one, done or failed): 0 with the reply in *ret (its
 * job's checkpoint the outcome), or an exit status said.
 */
static int wait_outcome(const Zerod__V1__CheckpointReply *cr, long uid, Ctl **ret)
{
	Zerod__V1__InspectRequest iq = ZEROD__V1__INSPECT_REQUEST__INIT;
	Ctl req = ZEROD__V1__CTL__INIT, *rep = NULL;
	int code;

	iq.job = cr->job;
	iq.has_uid = uid >= 0;
	iq.uid = (uint32_t)uid;
	iq.has_bucket = iq.has_rank = true;
	iq.bucket = iq.rank = INT32_MAX; /* none: only the job */
	req.version = ZEROD_CTL_VERSION;
	req.body_case = ZEROD__V1__CTL__BODY_INSPECT_REQUEST;
	req.inspect_request = &iq;
	for (int waited = 0;; waited += WAIT_POLL_MS) {
		const Zerod__V1__CtlJob *j;
		const Zerod__V1__CtlCheckpoint *k;
		if ((code = call(&req, &rep)) != 0)
			return code;
		if ((code = expect(rep, ZEROD__V1__CTL__BODY_INSPECT)) != 0) {
			zerod__v1__ctl__free_unpacked(rep, NULL);
			return code;
		}
		j = rep->inspect->job;
		k = j->checkpoint;
		if (k && k->iteration == cr->iteration && strcmp(k->dir, cr->dir) == 0 &&
		    strcmp(k->state, "asked") != 0) {
			*ret = rep;
			return 0;
		}
		if (j->error || strcmp(j->state, "active") != 0 || waited >= WAIT_MAX_MS) {
			code = fail(EXIT_DEGRADED,
				    "job %s: no outcome of the checkpoint of iteration %" PRIu64
				    " into %s %s",
				    cr->job, cr->iteration, cr->dir,
				    waited >= WAIT_MAX_MS ? "after 10 minutes"
				    : j->error	  ? "(the job failed)"
						  : "(the job is no longer active)");
			zerod__v1__ctl__free_unpacked(rep, NULL);
			return code;
		}
		zerod__v1__ctl__free_unpacked(rep, NULL);
		usleep(WAIT_POLL_MS * 1000);
	}
}

static int show_checkpoint(const Zerod__V1__CheckpointReply *cr, long uid)
{
	const Zerod__V1__CtlCheckpoint *k = NULL;
	Ctl *rep = NULL;
	int code = 0;

	if (!opt.json)
		printf("job %s: %u ranks told to checkpoint into %s when iteration %" PRIu64
		       " begins\n",
		       cr->job, cr->ranks, cr->dir, cr->iteration);
	if (opt.wait) {
		fflush(stdout);
		if ((code = wait_outcome(cr, uid, &rep)) != 0)
			return code;
		k = rep->inspect->job->checkpoint;
		code = strcmp(k->state, "done") == 0 ? 0 : EXIT_DEGRADED;
	}
	if (opt.json) {
		json_head();
		printf(",\"checkpoint\":{\"job\":");
		json_str(cr->job);
		printf(",\"dir\":");
		json_str(cr->dir);
		printf(",\"iteration\":%" PRIu64 ",\"ranks\":%u,\"outcome\":", cr->iteration,
		       cr->ranks);
		json_ckpt(k);
		printf("}}\n");
	} else if (k) {
		print_ckpt(cr->job, k);
	}
	if (rep)
		zerod__v1__ctl__free_unpacked(rep, NULL);
	return code;
}

/* FILE as the daemon must see it: absolute (its cwd is not ours). */
static int absolute(const char *file, char *out, size_t len)
{
	char dir[PATH_MAX], *copy1 = strdup(file), *copy2 = strdup(file);
	int r = 0;

	if (!copy1 || !copy2) {
		r = -ENOMEM;
	} else if (!realpath(dirname(copy1), dir)) {
		r = -errno;
	} else if (snprintf(out, len, "%s/%s", strcmp(dir, "/") ? dir : "", basename(copy2)) >=
		   (int)len) {
		r = -ENAMETOOLONG;
	}
	free(copy1);
	free(copy2);
	return r;
}

/* The numbers a verb may be narrowed by; -1: not given. */
struct narrow {
	long rank, bucket, uid;
};

/* The command line's options into opt and *n. Returns -1 to go on, else
 * the exit code (0 after --help or --version). */
static int parse_options(int argc, char **argv, struct narrow *n)
{
	static const struct option opts[] = {
		{"socket", required_argument, NULL, 's'},
		{"output", required_argument, NULL, 'o'},
		{"timeout", required_argument, NULL, 't'},
		{"rank", required_argument, NULL, 'r'},
		{"bucket", required_argument, NULL, 'b'},
		{"uid", required_argument, NULL, 'u'},
		{"ops", required_argument, NULL, 'n'},
		{"wait", no_argument, NULL, 'w'},
		{"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},
		{0},
	};
	int c;
	char *end;

	opt.socket = getenv("ZEROD_SOCKET");
	if (!opt.socket || !*opt.socket)
		opt.socket = DEFAULT_SOCKET;
	while ((c = getopt_long(argc, argv, "s:o:t:h", opts, NULL)) != -1) {
		switch (c) {
		case 's':
			opt.socket = optarg;
			break;
		case 'o':
			if (strcmp(optarg, "json") == 0)
				opt.json = true;
			else if (strcmp(optarg, "table") != 0)
				return fail(EXIT_USAGE, "-o %s: table or json", optarg);
			break;
		case 't':
			opt.timeout_ms = (int)strtol(optarg, &end, 10);
			if (*end || opt.timeout_ms <= 0)
				return fail(EXIT_USAGE, "--timeout %s: milliseconds > 0", optarg);
			break;
		case 'r':
		case 'b':
		case 'u':
		case 'n': {
			long v = strtol(optarg, &end, 10);
			if (*end || !*optarg || v < 0 || v > INT32_MAX)
				return fail(EXIT_USAGE, "%s: not a number >= 0", optarg);
			*(c == 'r' ? &n->rank : c == 'b' ? &n->bucket : &n->uid) = v;
			if (c == 'n')
				opt.ops = (int)v;
			break;
		}
		case 'w':
			opt.wait = true;
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("zeroctl %s (control protocol %d)\n", ZEROD_VERSION_STRING,
			       ZEROD_CTL_VERSION);
			return 0;
		default:
			usage(stderr);
			return EXIT_USAGE;
		}
	}
	return -1;
}

/* One request and the bodies it may point at, with the absolute path a
 * verb's FILE or DIR became. */
struct request {
	Ctl req;
	Zerod__V1__StatusRequest sq;
	Zerod__V1__InspectRequest iq;
	Zerod__V1__MetricsRequest mq;
	Zerod__V1__ReloadRequest rq;
	Zerod__V1__TraceRequest tq;
	Zerod__V1__CheckpointRequest cq;
	char file[PATH_MAX];
};

/* The verb at argv[optind] and its arguments into *q. Returns -1 to go on,
 * else the exit code. */
static int build_request(int argc, char **argv, const struct narrow *n, struct request *q)
{
	Ctl *req = &q->req;

	q->req.version = ZEROD_CTL_VERSION;
	if (strcmp(opt.verb, "status") == 0 && optind == argc) {
		req->body_case = ZEROD__V1__CTL__BODY_STATUS_REQUEST;
		req->status_request = &q->sq;
	} else if (strcmp(opt.verb, "inspect") == 0 && optind + 1 == argc) {
		q->iq.job = argv[optind];
		q->iq.has_rank = n->rank >= 0;
		q->iq.rank = (int32_t)n->rank;
		q->iq.has_bucket = n->bucket >= 0;
		q->iq.bucket = (int32_t)n->bucket;
		q->iq.has_uid = n->uid >= 0;
		q->iq.uid = (uint32_t)n->uid;
		req->body_case = ZEROD__V1__CTL__BODY_INSPECT_REQUEST;
		req->inspect_request = &q->iq;
	} else if (strcmp(opt.verb, "metrics") == 0 && optind == argc) {
		req->body_case = ZEROD__V1__CTL__BODY_METRICS_REQUEST;
		req->metrics_request = &q->mq;
	} else if (strcmp(opt.verb, "reload") == 0 && optind == argc) {
		req->body_case = ZEROD__V1__CTL__BODY_RELOAD_REQUEST;
		req->reload_request = &q->rq;
	} else if (strcmp(opt.verb, "checkpoint") == 0 && optind < argc && optind + 2 >= argc) {
		q->cq.job = argv[optind];
		q->cq.has_uid = n->uid >= 0;
		q->cq.uid = (uint32_t)n->uid;
		if (optind + 1 < argc) {
			int r = absolute(argv[optind + 1], q->file, sizeof(q->file));
			if (r < 0)
				return fail(EXIT_USAGE, "%s: %s", argv[optind + 1], strerror(-r));
			q->cq.dir = q->file;
		}
		req->body_case = ZEROD__V1__CTL__BODY_CHECKPOINT_REQUEST;
		req->checkpoint_request = &q->cq;
	} else if (strcmp(opt.verb, "trace") == 0 && optind < argc &&
		   ((strcmp(argv[optind], "on") == 0 && optind + 2 == argc) ||
		    (strcmp(argv[optind], "off") == 0 && optind + 1 == argc))) {
		q->tq.on = strcmp(argv[optind], "on") == 0;
		if (q->tq.on) {
			int r = absolute(argv[optind + 1], q->file, sizeof(q->file));
			if (r < 0)
				return fail(EXIT_USAGE, "%s: %s", argv[optind + 1], strerror(-r));
			q->tq.file = q->file;
		}
		req->body_case = ZEROD__V1__CTL__BODY_TRACE_REQUEST;
		req->trace_request = &q->tq;
	} else {
		fprintf(stderr, "zeroctl: %s: unknown verb or wrong arguments\n", opt.verb);
		usage(stderr);
		return opt.json ? fail(EXIT_USAGE, "%s: unknown verb or wrong arguments", opt.verb)
				: EXIT_USAGE;
	}
	if ((n->rank >= 0 || n->bucket >= 0 || n->uid >= 0) &&
	    req->body_case != ZEROD__V1__CTL__BODY_INSPECT_REQUEST &&
	    !(n->uid >= 0 && n->rank < 0 && n->bucket < 0 &&
	      req->body_case == ZEROD__V1__CTL__BODY_CHECKPOINT_REQUEST))
		return fail(EXIT_USAGE, "--rank, --bucket and --uid go with inspect (--uid with "
					"checkpoint too)");
	if (opt.wait && req->body_case != ZEROD__V1__CTL__BODY_CHECKPOINT_REQUEST)
		return fail(EXIT_USAGE, "--wait goes with checkpoint");
	return -1;
}

/* The reply to a request of kind `asked`, shown; the exit code. */
static int show_reply(Zerod__V1__Ctl__BodyCase asked, Ctl *rep, const struct narrow *n)
{
	int code;

	switch (asked) {
	case ZEROD__V1__CTL__BODY_STATUS_REQUEST:
		code = expect(rep, ZEROD__V1__CTL__BODY_STATUS);
		return code ? code : show_status(rep->status);
	case ZEROD__V1__CTL__BODY_INSPECT_REQUEST:
		code = expect(rep, ZEROD__V1__CTL__BODY_INSPECT);
		return code ? code : show_inspect(rep->inspect);
	case ZEROD__V1__CTL__BODY_METRICS_REQUEST:
		code = expect(rep, ZEROD__V1__CTL__BODY_METRICS);
		return code ? code : show_metrics(rep->metrics);
	case ZEROD__V1__CTL__BODY_RELOAD_REQUEST:
		code = expect(rep, ZEROD__V1__CTL__BODY_RELOAD);
		return code ? code : show_reload(rep->reload);
	case ZEROD__V1__CTL__BODY_CHECKPOINT_REQUEST:
		code = expect(rep, ZEROD__V1__CTL__BODY_CHECKPOINT);
		return code ? code : show_checkpoint(rep->checkpoint, n->uid);
	default:
		code = expect(rep, ZEROD__V1__CTL__BODY_TRACE);
		return code ? code : show_trace(rep->trace);
	}
}

int main(int argc, char **argv)
{
	static struct request q = {
		.req = ZEROD__V1__CTL__INIT,
		.sq = ZEROD__V1__STATUS_REQUEST__INIT,
		.iq = ZEROD__V1__INSPECT_REQUEST__INIT,
		.mq = ZEROD__V1__METRICS_REQUEST__INIT,
		.rq = ZEROD__V1__RELOAD_REQUEST__INIT,
		.tq = ZEROD__V1__TRACE_REQUEST__INIT,
		.cq = ZEROD__V1__CHECKPOINT_REQUEST__INIT,
	};
	struct narrow n = {-1, -1, -1};
	Ctl *rep = NULL;
	int code;

	if ((code = parse_options(argc, argv, &n)) >= 0)
		return code;
	if (optind >= argc) {
		usage(stderr);
		return EXIT_USAGE;
	}
	opt.verb = argv[optind++];
	if (strcmp(opt.verb, "keygen") == 0 && optind + 1 >= argc)
		return zeroctl_keygen(optind < argc ? argv[optind] : "zerod", stdout, stderr);
	if (strcmp(opt.verb, "fingerprint") == 0 && optind + 1 == argc)
		return zeroctl_fingerprint(argv[optind], stdout, stderr);
	if ((code = build_request(argc, argv, &n, &q)) >= 0)
		return code;
	code = call(&q.req, &rep);
	if (code)
		return code;
	code = show_reply(q.req.body_case, rep, &n);
	zerod__v1__ctl__free_unpacked(rep, NULL);
	return code;
}
