/*
 * zerod-bench.c — the benchmark zerod is judged by (issue 5, section 5).
 *
 * One run measures, in this order and on the same machine state: the floors
 * (memcpy and STREAM triad bandwidth, an AF_UNIX ping-pong, the plain-C fused
 * reference pass: floors.c), then a real zerod with real trainer processes
 * (the iteration time of the job the flags describe, the daemon's RssAnon
 * while it is active, and the tiny-bucket handoff latency: jobs.c), and with
 * --vs-torch the torch anchor (tools/bench/torch_anchor.py: DDP +
 * ZeroRedundancyOptimizer over gloo), and with --torch-zerod also the real
 * zerod.torch.ZerodOptimizer end to end in the anchor's run (DDP with the
 * same model and buckets, its comm hook into a zerod the anchor starts), so
 * what the Python package adds is measured too, and with --torch-plain DDP +
 * plain torch.optim (default, foreach, gradient_as_bucket_view) beside them.
 * The job runs two kinds per iteration (jobs.c): the hand-over alone, and
 * the fill overlapped with the hand-over, whose median minus the fill's is
 * the figure accounted as torch's (zerod_comparable_ms). The caches are
 * emptied before every timed region unless --warm. It prints a table, or
 * with --json one JSON object; docs/PERFORMANCE.md says what every value
 * means. --gpu prints only the GPU rows (gpu.c), each either measured or
 * "not run" with the reason.
 *
 * --daemons N (N >= 2, only where gloo is built) instead starts N daemons on
 * loopback, spreads the ranks over them (node k: ranks [k*R/N, (k+1)*R/N)),
 * runs the same job across them through a rendezvous on a free loopback
 * port, and then the anchor, independent of zerod: torch.distributed's
 * all_reduce over gloo of the same buckets between N processes
 * (torch_anchor.py --allreduce-only; gloo_iter_ms), and beside it gloo
 * through zerod's own shim (gloo_raw.c; gloo_shim_iter_ms). What it reports,
 * per iteration (median):
 *   bytes        = params x 4, the gradient bytes of all buckets;
 *   algbw_zerod  = bytes / zerod's iteration time, the slowest rank's
 *                  first zc_bucket_ready() to its step done: this includes
 *                  the local reduce, the optimizer step and the write-back,
 *                  so it understates the network part;
 *   algbw_gloo   = bytes / the time of torch's gloo all_reduce of every bucket;
 *   busbw        = algbw x 2(n-1)/n, n = nodes (nccl-tests' all-reduce);
 *   vs_gloo      = busbw_zerod / busbw_gloo;
 *   algbw_net    = the daemons' own cross-node all-reduce: the bytes over
 *                  the time their gloo backend spent all-reducing them
 *                  (exchange, fold, gather: coll/netstats.h), read from
 *                  each daemon's metrics (zeroctl metrics) after the run;
 *                  the slowest daemon's. It runs while the trainers hand
 *                  over buckets and the optimizer steps, as in training;
 *   vs_gloo_net  = busbw_net / busbw_gloo: the all-reduce against gloo's;
 *   step_bucket_ref_ms, step_all_ref_ms = the optimizer step of one bucket
 *                  and of every bucket, measured in this process in the same
 *                  run, without zerod: the fused reference (floors.c) of one
 *                  rank, its sum a copy, over bucket_numel and over params
 *                  elements, on every CPU, with warm caches (its fastest, so
 *                  the anchors below are the strictest);
 *   vs_gloo_plus_step = zerod's iteration over gloo_iter_ms + the step that
 *                  cannot hide behind the wire: one bucket's interleaved
 *                  (the last bucket's step comes after every all-reduce),
 *                  every bucket's at_end (issue 25 §3: targets 1.15, 1.1).
 * With --tls[=R] the same job again, in R alternating rounds (plain first in
 * even rounds, last in odd ones), on daemons that hold one TLS identity (a
 * zerod trusts its own certificate: `zeroctl keygen DIR/node`, its
 * fingerprint in DIR/node.peers; --tls-key, --tls-cert, --tls-peers), so
 * the tensors between them cross TLS 1.3 (issue 24):
 *   tls_*        = that job with --tls-ktls=no (OpenSSL encrypts), and
 *   tls_ktls_*   = with --tls-ktls=yes (the default), run only where the
 *                  kernel has its tls module (a TCP_ULP "tls" probe on a
 *                  loopback connection); ktls_active says whether the
 *                  daemons said they handed the keys to the kernel (null:
 *                  they did not say), and is false where the kernel cannot;
 *   tls_vs_plain_net = tls_algbw_net / algbw_net (target >= 0.7);
 *   openssl_aes256gcm_MBps = `openssl speed -elapsed -evp aes-256-gcm`'s
 *                  16 KiB figure on one core, in this run (TLS 1.3's
 *                  first suite is TLS_AES_256_GCM_SHA384);
 *   tls_bytes_vs_openssl = tls_busbw_net (the bytes each daemon sends,
 *                  encrypted, per second of its all-reduce) over it
 *                  (target >= 0.5: within 2x);
 *   tls_seal_cpu_GBps = the bytes the TLS mesh sealed and opened over the
 *                  CPU time of its calls (zerod_tls_mesh_*: the records and
 *                  the sockets' system calls, not the waits), the slowest
 *                  daemon's: what one core moves through TLS while it
 *                  works, which two daemons sharing this machine's cores
 *                  do not show in wall time; tls_seal_cpu_vs_openssl = it
 *                  over openssl speed's figure (sealing alone, no socket).
 * The floors, the handoff and the torch anchor are not run in this mode.
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "bench.h"

#ifndef ZEROD_BUILD_BIN
#define ZEROD_BUILD_BIN "zerod"
#endif
#ifndef ZEROCTL_BUILD_BIN
#define ZEROCTL_BUILD_BIN "zeroctl"
#endif
#ifndef TORCH_ANCHOR
#define TORCH_ANCHOR "tools/bench/torch_anchor.py"
#endif
#ifndef LIBZEROCLIENT_BUILD
#define LIBZEROCLIENT_BUILD "libzeroclient.so.1"
#endif
#ifndef ZEROD_PYTHON_DIR
#define ZEROD_PYTHON_DIR "client/python"
#endif

int64_t bench_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

double bench_quantile(double *v, size_t n, double q)
{
	if (n == 0)
		return NAN;
	qsort(v, n, sizeof(*v), cmp_double);
	return v[(size_t)(q * (double)(n - 1) + 0.5)];
}

unsigned bench_state_floats(const struct bench_cfg *cfg)
{
	if (cfg->optim == ZC_OPT_SGD)
		return cfg->hp.momentum != 0;
	return cfg->hp.amsgrad ? 3 : 2;
}

/* ---- options ---- */

static const char *const optim_name[] = {
	[ZC_OPT_SGD] = "sgd",
	[ZC_OPT_ADAM] = "adam",
	[ZC_OPT_ADAMW] = "adamw",
};

struct opts {
	struct bench_cfg cfg;
	uint64_t bucket_bytes;
	bool json, vs_torch, torch_zerod, torch_plain;
	bool gpu; /* --gpu: the GPU rows instead (gpu.c) */
	int recovery; /* --recovery [ROUNDS]: a trainer's death, memory vs disk (recovery.c) */
	bool shared_params; /* --shared-params: the job again, sharing one parameter buffer */
	const char *python, *anchor;
};

/* "25M", "12.5M", "4096", "1G": decimal suffixes K, M, G. */
static int parse_size(const char *s, uint64_t *ret)
{
	char *end;
	double v = strtod(s, &end);
	double mul = 1;

	if (end == s || v < 0)
		return -EINVAL;
	if (*end == 'K' || *end == 'k')
		mul = 1e3;
	else if (*end == 'M' || *end == 'm')
		mul = 1e6;
	else if (*end == 'G' || *end == 'g')
		mul = 1e9;
	if (mul != 1)
		end++;
	if (*end || v * mul > 1e15)
		return -EINVAL;
	*ret = (uint64_t)llround(v * mul);
	return 0;
}

static int parse_int(const char *s, long lo, long hi, long *ret)
{
	char *end;
	long v = strtol(s, &end, 10);

	if (end == s || *end || v < lo || v > hi)
		return -EINVAL;
	*ret = v;
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: zerod-bench [options]\n"
		"  --params N         fp32 parameters (K/M/G, decimal; default 25M)\n"
		"  --buckets N        split them into N equal buckets, or\n"
		"  --bucket-size B    buckets of B bytes (default 25M, as DDP's bucket_cap)\n"
		"  --ranks R          trainer processes (default 2, or N with --daemons N)\n"
		"  --daemons N        N >= 2 daemons on loopback, vs raw gloo (needs gloo)\n"
		"  --tls[=R]          --daemons: the job also on daemons with a TLS identity\n"
		"                     (tensors over TLS 1.3; also --tls-ktls=yes where the\n"
		"                     kernel has kTLS), R alternating rounds (default 1),\n"
		"                     and openssl speed's AES-256-GCM on one core beside it\n"
		"  --optim O          sgd|adam|adamw (default adam)\n"
		"  --shard S          bucket|slice (default bucket)\n"
		"  --step S           interleaved|at_end (default interleaved)\n"
		"  --iters N          timed iterations (default 20)\n"
		"  --warmup N         untimed iterations first (default 3)\n"
		"  --handoff-iters N  tiny-bucket iterations for the handoff (default 2000)\n"
		"  --threads N        threads of the fused reference and triad (default: CPUs)\n"
		"  --memcpy-size B    bytes memcpy copies (default 256M)\n"
		"  --zerod PATH       the daemon (default $ZEROD_BIN, else the build's)\n"
		"  --vs-torch         also run the torch anchor (needs python3-torch)\n"
		"  --torch-zerod      --vs-torch, and ZerodOptimizer end to end beside it\n"
		"  --torch-plain      --vs-torch, and DDP + plain torch.optim (default, foreach,\n"
		"                     gradient_as_bucket_view) beside it\n"
		"  --python PATH      interpreter for it (default /usr/bin/python3)\n"
		"  --torch-script P   the anchor script (default the source tree's)\n"
		"  --json             print one JSON object instead of a table\n"
		"  --warm             do not empty the caches before each timed region\n"
		"  --no-overlap       without the overlapped kind (fill + hand-over) of the job\n"
		"  --recovery[=R]     only the cost of a trainer's death (R alternating rounds,\n"
		"                     default 3): through zerod's memory vs zc_checkpoint +\n"
		"                     zc_restore from disk\n"
		"  --gpu              only the GPU rows (NCCL busbw, Adam kernel, CUDA handoff,\n"
		"                     DDP on CUDA; --python a torch with CUDA); without a\n"
		"                     device each says why it did not run\n"
		"  --checkpoint-every N  zc_checkpoint() after every N timed iterations, timed\n"
		"                     apart from them: how long training stalls (default 0);\n"
		"                     the stall (such an iteration over one without) against\n"
		"                     a memcpy of the bytes a checkpoint stages\n"
		"  --checkpoint-dir D where (default a temporary directory, removed after)\n"
		"  --checkpoint-sync  time zc_checkpoint() + zc_checkpoint_wait() (every rank):\n"
		"                     the stall of a write on the training path, to compare\n"
		"  --shared-params    a second job beside it whose ranks share one parameter\n"
		"                     buffer (ZC_BUFFERS_SHARED_PARAMS), the two taking turns\n"
		"                     an iteration each: zerod_shared_iter_ms and its ratios;\n"
		"                     state_bytes then counts both jobs' state\n");
}

enum {
	OPT_PARAMS = 256,
	OPT_BUCKETS,
	OPT_BUCKET_SIZE,
	OPT_RANKS,
	OPT_OPTIM,
	OPT_SHARD,
	OPT_STEP,
	OPT_ITERS,
	OPT_WARMUP,
	OPT_HANDOFF,
	OPT_THREADS,
	OPT_MEMCPY,
	OPT_ZEROD,
	OPT_VS_TORCH,
	OPT_PYTHON,
	OPT_SCRIPT,
	OPT_JSON,
	OPT_HELP,
	OPT_DAEMONS,
	OPT_TORCH_ZEROD,
	OPT_CKPT_EVERY,
	OPT_CKPT_DIR,
	OPT_CKPT_SYNC,
	OPT_SHARED,
	OPT_TLS,
	OPT_TORCH_PLAIN,
	OPT_WARM,
	OPT_NO_OVERLAP,
	OPT_GPU,
	OPT_RECOVERY,
};

static const struct option longopts[] = {
	{"params", required_argument, NULL, OPT_PARAMS},
	{"buckets", required_argument, NULL, OPT_BUCKETS},
	{"bucket-size", required_argument, NULL, OPT_BUCKET_SIZE},
	{"ranks", required_argument, NULL, OPT_RANKS},
	{"optim", required_argument, NULL, OPT_OPTIM},
	{"shard", required_argument, NULL, OPT_SHARD},
	{"step", required_argument, NULL, OPT_STEP},
	{"iters", required_argument, NULL, OPT_ITERS},
	{"warmup", required_argument, NULL, OPT_WARMUP},
	{"handoff-iters", required_argument, NULL, OPT_HANDOFF},
	{"threads", required_argument, NULL, OPT_THREADS},
	{"memcpy-size", required_argument, NULL, OPT_MEMCPY},
	{"zerod", required_argument, NULL, OPT_ZEROD},
	{"vs-torch", no_argument, NULL, OPT_VS_TORCH},
	{"python", required_argument, NULL, OPT_PYTHON},
	{"torch-script", required_argument, NULL, OPT_SCRIPT},
	{"json", no_argument, NULL, OPT_JSON},
	{"help", no_argument, NULL, OPT_HELP},
	{"daemons", required_argument, NULL, OPT_DAEMONS},
	{"torch-zerod", no_argument, NULL, OPT_TORCH_ZEROD},
	{"checkpoint-every", required_argument, NULL, OPT_CKPT_EVERY},
	{"checkpoint-dir", required_argument, NULL, OPT_CKPT_DIR},
	{"checkpoint-sync", no_argument, NULL, OPT_CKPT_SYNC},
	{"shared-params", no_argument, NULL, OPT_SHARED},
	{"tls", optional_argument, NULL, OPT_TLS},
	{"torch-plain", no_argument, NULL, OPT_TORCH_PLAIN},
	{"warm", no_argument, NULL, OPT_WARM},
	{"no-overlap", no_argument, NULL, OPT_NO_OVERLAP},
	{"gpu", no_argument, NULL, OPT_GPU},
	{"recovery", optional_argument, NULL, OPT_RECOVERY},
	{0},
};

static int parse_args(int argc, char **argv, struct opts *o)
{
	struct bench_cfg *cfg = &o->cfg;
	uint64_t buckets = 0, v;
	bool ranks_set = false;
	long n;
	int opt, r = 0;

	*cfg = (struct bench_cfg){
		.params = 25000000,
		.ranks = 2,
		.optim = ZC_OPT_ADAM,
		.shard = ZC_SHARD_BUCKET,
		.step = ZC_STEP_INTERLEAVED,
		.hp = ZC_PARAM_GROUP_INIT,
		.iters = 20,
		.warmup = 3,
		.handoff_iters = 2000,
		.memcpy_bytes = 256u << 20,
		.overlap = true,
		.cold = true,
	};
	o->bucket_bytes = 25000000;
	o->python = "/usr/bin/python3";
	o->anchor = TORCH_ANCHOR;
	cfg->zerod = getenv("ZEROD_BIN") ? getenv("ZEROD_BIN") : ZEROD_BUILD_BIN;
	n = sysconf(_SC_NPROCESSORS_ONLN);
	cfg->threads = n > 0 ? (unsigned)n : 1;
	while (r == 0 && (opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (opt) {
		case OPT_PARAMS:
			r = parse_size(optarg, &cfg->params);
			if (r == 0 && (cfg->params < 1 || cfg->params > (1ull << 32)))
				r = -EINVAL;
			break;
		case OPT_BUCKETS:
			r = parse_int(optarg, 1, 65536, &n);
			buckets = (uint64_t)n;
			break;
		case OPT_BUCKET_SIZE:
			r = parse_size(optarg, &o->bucket_bytes);
			if (r == 0 && o->bucket_bytes < sizeof(float))
				r = -EINVAL;
			buckets = 0;
			break;
		case OPT_RANKS:
			r = parse_int(optarg, 1, 64, &n);
			cfg->ranks = (uint32_t)n;
			ranks_set = true;
			break;
		case OPT_DAEMONS:
			r = parse_int(optarg, 2, 16, &n);
			cfg->daemons = (uint32_t)n;
			break;
		case OPT_CKPT_EVERY:
			r = parse_int(optarg, 0, 1000000, &n);
			cfg->checkpoint_every = n;
			break;
		case OPT_CKPT_DIR:
			cfg->checkpoint_dir = optarg;
			break;
		case OPT_CKPT_SYNC:
			cfg->checkpoint_sync = true;
			break;
		case OPT_SHARED:
			o->shared_params = true;
			break;
		case OPT_TLS:
			r = optarg ? parse_int(optarg, 1, TLS_ROUNDS_MAX, &n) : 0;
			cfg->tls = optarg ? (int)n : 1;
			break;
		case OPT_TORCH_PLAIN:
			o->vs_torch = o->torch_plain = true;
			break;
		case OPT_WARM:
			cfg->cold = false;
			break;
		case OPT_NO_OVERLAP:
			cfg->overlap = false;
			break;
		case OPT_GPU:
			o->gpu = true;
			break;
		case OPT_RECOVERY:
			o->recovery = optarg ? atoi(optarg) : 3;
			if (o->recovery < 1)
				return -EINVAL;
			break;
		case OPT_OPTIM:
			if (!strcmp(optarg, "sgd"))
				cfg->optim = ZC_OPT_SGD;
			else if (!strcmp(optarg, "adam"))
				cfg->optim = ZC_OPT_ADAM;
			else if (!strcmp(optarg, "adamw"))
				cfg->optim = ZC_OPT_ADAMW;
			else
				r = -EINVAL;
			break;
		case OPT_SHARD:
			cfg->shard = !strcmp(optarg, "bucket")  ? ZC_SHARD_BUCKET
				     : !strcmp(optarg, "slice") ? ZC_SHARD_SLICE
								: 0;
			r = cfg->shard ? 0 : -EINVAL;
			break;
		case OPT_STEP:
			cfg->step = !strcmp(optarg, "interleaved") ? ZC_STEP_INTERLEAVED
				    : !strcmp(optarg, "at_end")    ? ZC_STEP_AT_END
								   : 0;
			r = cfg->step ? 0 : -EINVAL;
			break;
		case OPT_ITERS:
			r = parse_int(optarg, 1, 100000, &n);
			cfg->iters = (int)n;
			break;
		case OPT_WARMUP:
			r = parse_int(optarg, 0, 100000, &n);
			cfg->warmup = (int)n;
			break;
		case OPT_HANDOFF:
			r = parse_int(optarg, 1, 1000000, &n);
			cfg->handoff_iters = (int)n;
			break;
		case OPT_THREADS:
			r = parse_int(optarg, 1, 256, &n);
			cfg->threads = (unsigned)n;
			break;
		case OPT_MEMCPY:
			r = parse_size(optarg, &v);
			cfg->memcpy_bytes = (size_t)v;
			if (r == 0 && v < 4096)
				r = -EINVAL;
			break;
		case OPT_ZEROD:
			cfg->zerod = optarg;
			break;
		case OPT_VS_TORCH:
			o->vs_torch = true;
			break;
		case OPT_TORCH_ZEROD:
			o->vs_torch = o->torch_zerod = true;
			break;
		case OPT_PYTHON:
			o->python = optarg;
			break;
		case OPT_SCRIPT:
			o->anchor = optarg;
			break;
		case OPT_JSON:
			o->json = true;
			break;
		case OPT_HELP:
			usage(stdout);
			exit(0);
		default:
			return -EINVAL;
		}
		if (r < 0)
			fprintf(stderr, "zerod-bench: bad value for --%s: %s\n",
				longopts[opt - OPT_PARAMS].name, optarg);
	}
	if (r == 0 && optind < argc) {
		fprintf(stderr, "zerod-bench: unexpected argument %s\n", argv[optind]);
		r = -EINVAL;
	}
	if (r < 0)
		return r;
	if (cfg->daemons && !ranks_set && cfg->daemons > cfg->ranks)
		cfg->ranks = cfg->daemons;
	if (cfg->tls && !cfg->daemons) {
		fprintf(stderr, "zerod-bench: --tls needs --daemons N\n");
		return -EINVAL;
	}
	if (cfg->daemons > cfg->ranks) {
		fprintf(stderr, "zerod-bench: --ranks must be at least --daemons\n");
		return -EINVAL;
	}
	if (cfg->optim == ZC_OPT_SGD)
		cfg->hp.momentum = 0.9;
	if (cfg->optim == ZC_OPT_ADAMW)
		cfg->hp.weight_decay = 0.01; /* torch's AdamW default */
	if (buckets == 0) {
		cfg->bucket_numel = o->bucket_bytes / sizeof(float);
		buckets = (cfg->params + cfg->bucket_numel - 1) / cfg->bucket_numel;
	} else {
		cfg->bucket_numel = (cfg->params + buckets - 1) / buckets;
		buckets = (cfg->params + cfg->bucket_numel - 1) / cfg->bucket_numel;
	}
	if (buckets > 65536) {
		fprintf(stderr, "zerod-bench: more than 65536 buckets\n");
		return -EINVAL;
	}
	cfg->nbuckets = (uint32_t)buckets;
	return 0;
}

/* ---- the torch anchor ---- */

struct torch_result {
	double iter_ms, synced_ms, compute_ms, params;
	/* --torch-zerod: DDP + ZerodOptimizer in the same run */
	double zerod_iter_ms, zerod_synced_ms, zerod_max_diff;
	/* --torch-zerod --shared-params: ZerodOptimizer(shared_params=True) too */
	double zerod_shared_iter_ms, zerod_shared_max_diff;
	/* --torch-plain: DDP + plain torch.optim, each minus the same no_sync */
	double plain_ms, plain_foreach_ms, plain_gabv_ms, plain_gabv_foreach_ms, plain_best_ms;
	char plain_best[32];
};

/* The number after "key": in a one-line JSON object, or NAN. */
static double json_number(const char *s, const char *key)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\":", key);
	p = strstr(s, pat);
	if (p && strncmp(p + strlen(pat), " null", 5) == 0)
		return NAN;
	return p ? strtod(p + strlen(pat), NULL) : NAN;
}

static int run_torch(const struct opts *o, struct torch_result *ret)
{
	const struct bench_cfg *cfg = &o->cfg;
	char cmd[4096], extra[2048] = "", last[4096] = "";
	int r;

	if (o->torch_zerod)
		snprintf(extra, sizeof(extra), " --zerod '%s' --libzeroclient '%s' --pythonpath '%s'",
			 cfg->zerod, LIBZEROCLIENT_BUILD, ZEROD_PYTHON_DIR);
	if (o->torch_zerod && o->shared_params)
		strcat(extra, " --zerod-shared");
	if (o->torch_plain)
		strcat(extra, " --plain");
	snprintf(cmd, sizeof(cmd),
		 "'%s' '%s' --params %llu --layers %u --world %u --optim %s --lr %g "
		 "--momentum %g --weight-decay %g --iters %d --warmup %d%s",
		 o->python, o->anchor, (unsigned long long)cfg->params, cfg->nbuckets, cfg->ranks,
		 optim_name[cfg->optim], cfg->hp.lr, cfg->hp.momentum, cfg->hp.weight_decay,
		 cfg->iters, cfg->warmup, extra);
	if ((r = bench_last_json(cmd, last, sizeof(last))) < 0) {
		fprintf(stderr, "zerod-bench: the torch anchor failed (%s)\n", cmd);
		return r;
	}
	ret->iter_ms = json_number(last, "torch_iter_ms");
	ret->synced_ms = json_number(last, "torch_synced_ms");
	ret->compute_ms = json_number(last, "torch_compute_ms");
	ret->params = json_number(last, "torch_params");
	if (o->torch_plain) {
		const char *b = strstr(last, "\"torch_plain_best\": \"");
		ret->plain_ms = json_number(last, "torch_plain_iter_ms");
		ret->plain_foreach_ms = json_number(last, "torch_plain_foreach_iter_ms");
		ret->plain_gabv_ms = json_number(last, "torch_plain_gabv_iter_ms");
		ret->plain_gabv_foreach_ms = json_number(last, "torch_plain_gabv_foreach_iter_ms");
		ret->plain_best_ms = json_number(last, "torch_plain_best_ms");
		if (b)
			sscanf(b + strlen("\"torch_plain_best\": \""), "%31[a-z_]", ret->plain_best);
		if (isnan(ret->plain_best_ms))
			return -EIO;
	}
	if (o->torch_zerod) {
		ret->zerod_iter_ms = json_number(last, "torch_zerod_iter_ms");
		ret->zerod_synced_ms = json_number(last, "torch_zerod_synced_ms");
		ret->zerod_max_diff = json_number(last, "torch_zerod_max_diff");
		if (isnan(ret->zerod_iter_ms))
			return -EIO;
	}
	if (o->torch_zerod && o->shared_params) {
		ret->zerod_shared_iter_ms = json_number(last, "torch_zerod_shared_iter_ms");
		ret->zerod_shared_max_diff = json_number(last, "torch_zerod_shared_max_diff");
		if (isnan(ret->zerod_shared_iter_ms))
			return -EIO;
	}
	return isnan(ret->iter_ms) ? -EIO : 0;
}

/* ---- the report ---- */

struct results {
	double memcpy_gbps, triad_gbps, unix_rtt_us, unix_rtt_same_cpu_us, fused_ms, fused_min_ms,
		floor_ms, floor_bytes;
	/* the floor's two consistent countings (floors.c): no write-allocate
	 * over non-temporal triad, write-allocate over plain triad; floor_ms is
	 * the lower */
	double triad_nt_gbps, floor_nt_ms, floor_wa_ms, floor_wa_bytes;
	double loadavg_end; /* the 1-minute load average when the run ended */
	struct job_result job;
	/* --shared-params: the same job with one parameter buffer, and its floor */
	struct job_result shared;
	double floor_shared_ms, floor_shared_bytes;
	double handoff_p50_us, handoff_p99_us;
	struct torch_result torch;
	uint64_t state_bytes;
	double loadavg; /* 1-minute load average when the run began */
};

static double ratio(double a, double b)
{
	return isfinite(a) && isfinite(b) && b > 0 ? a / b : NAN;
}

/* A JSON number, or null for NAN. */
static void jnum(const char *key, double v, const char *fmt, bool last)
{
	printf("  \"%s\": ", key);
	if (isfinite(v))
		printf(fmt, v);
	else
		printf("null");
	printf(last ? "\n" : ",\n");
}

static void print_json(const struct opts *o, const struct results *x)
{
	const struct bench_cfg *c = &o->cfg;

	printf("{\n  \"schema\": \"zerod-bench/1\",\n");
	printf("  \"params\": %llu,\n  \"buckets\": %u,\n  \"bucket_numel\": %llu,\n",
	       (unsigned long long)c->params, c->nbuckets, (unsigned long long)c->bucket_numel);
	printf("  \"ranks\": %u,\n  \"optim\": \"%s\",\n  \"shard\": \"%s\",\n", c->ranks,
	       optim_name[c->optim], c->shard == ZC_SHARD_SLICE ? "slice" : "bucket");
	printf("  \"step\": \"%s\",\n  \"iters\": %d,\n  \"warmup\": %d,\n",
	       c->step == ZC_STEP_AT_END ? "at_end" : "interleaved", c->iters, c->warmup);
	printf("  \"handoff_iters\": %d,\n  \"threads\": %u,\n", c->handoff_iters, c->threads);
	printf("  \"cold\": %s,\n  \"overlap\": %s,\n", c->cold ? "true" : "false",
	       c->overlap ? "true" : "false");
	jnum("llc_bytes", (double)bench_llc_bytes(), "%.0f", false);
	jnum("loadavg", x->loadavg, "%.2f", false);
	jnum("loadavg_end", x->loadavg_end, "%.2f", false);
	jnum("zerod_iter_ms", x->job.iter_ms, "%.3f", false);
	jnum("zerod_iter_min_ms", x->job.iter_min_ms, "%.3f", false);
	jnum("zerod_fill_ms", x->job.fill_ms, "%.3f", false);
	jnum("zerod_overlap_ms", x->job.overlap_ms, "%.3f", false);
	jnum("zerod_comparable_ms", x->job.comparable_ms, "%.3f", false);
	jnum("zerod_cpu_ms", x->job.zerod_cpu_ms, "%.3f", false);
	jnum("zerod_overlap_cpu_ms", x->job.zerod_overlap_cpu_ms, "%.3f", false);
	jnum("comparable_vs_iter", ratio(x->job.comparable_ms, x->job.iter_ms), "%.3f", false);
	jnum("torch_plain_iter_ms", x->torch.plain_ms, "%.3f", false);
	jnum("torch_plain_foreach_iter_ms", x->torch.plain_foreach_ms, "%.3f", false);
	jnum("torch_plain_gabv_iter_ms", x->torch.plain_gabv_ms, "%.3f", false);
	jnum("torch_plain_gabv_foreach_iter_ms", x->torch.plain_gabv_foreach_ms, "%.3f", false);
	jnum("torch_plain_best_ms", x->torch.plain_best_ms, "%.3f", false);
	if (x->torch.plain_best[0])
		printf("  \"torch_plain_best\": \"%s\",\n", x->torch.plain_best);
	else
		printf("  \"torch_plain_best\": null,\n");
	jnum("torch_iter_ms", x->torch.iter_ms, "%.3f", false);
	jnum("torch_synced_ms", x->torch.synced_ms, "%.3f", false);
	jnum("torch_compute_ms", x->torch.compute_ms, "%.3f", false);
	jnum("torch_params", x->torch.params, "%.0f", false);
	jnum("torch_zerod_iter_ms", x->torch.zerod_iter_ms, "%.3f", false);
	jnum("torch_zerod_synced_ms", x->torch.zerod_synced_ms, "%.3f", false);
	jnum("torch_zerod_max_diff", x->torch.zerod_max_diff, "%.3g", false);
	jnum("torch_zerod_shared_iter_ms", x->torch.zerod_shared_iter_ms, "%.3f", false);
	jnum("torch_zerod_shared_max_diff", x->torch.zerod_shared_max_diff, "%.3g", false);
	jnum("torch_zerod_shared_vs_c_comparable",
	     ratio(x->torch.zerod_shared_iter_ms, x->shared.comparable_ms), "%.3f", false);
	jnum("fused_ref_ms", x->fused_ms, "%.3f", false);
	jnum("fused_ref_min_ms", x->fused_min_ms, "%.3f", false);
	jnum("floor_iter_ms", x->floor_ms, "%.3f", false);
	jnum("floor_bytes", x->floor_bytes, "%.0f", false);
	jnum("floor_nt_iter_ms", x->floor_nt_ms, "%.3f", false);
	jnum("floor_wa_iter_ms", x->floor_wa_ms, "%.3f", false);
	jnum("floor_wa_bytes", x->floor_wa_bytes, "%.0f", false);
	jnum("zerod_shared_iter_ms", x->shared.iter_ms, "%.3f", false);
	jnum("zerod_shared_iter_min_ms", x->shared.iter_min_ms, "%.3f", false);
	jnum("zerod_shared_fill_ms", x->shared.fill_ms, "%.3f", false);
	jnum("zerod_shared_overlap_ms", x->shared.overlap_ms, "%.3f", false);
	jnum("zerod_shared_comparable_ms", x->shared.comparable_ms, "%.3f", false);
	jnum("floor_shared_iter_ms", x->floor_shared_ms, "%.3f", false);
	jnum("floor_shared_bytes", x->floor_shared_bytes, "%.0f", false);
	jnum("handoff_p50_us", x->handoff_p50_us, "%.1f", false);
	jnum("handoff_p99_us", x->handoff_p99_us, "%.1f", false);
	jnum("unix_rtt_us", x->unix_rtt_us, "%.2f", false);
	jnum("unix_rtt_same_cpu_us", x->unix_rtt_same_cpu_us, "%.2f", false);
	jnum("memcpy_gbps", x->memcpy_gbps, "%.2f", false);
	jnum("triad_gbps", x->triad_gbps, "%.2f", false);
	jnum("triad_nt_gbps", x->triad_nt_gbps, "%.2f", false);
	if (x->job.checkpoints) {
		jnum("checkpoint_stall_ms", x->job.ckpt_ms, "%.3f", false);
		jnum("checkpoint_stall_max_ms", x->job.ckpt_max_ms, "%.3f", false);
		printf("  \"checkpoint_sync\": %s,\n", c->checkpoint_sync ? "true" : "false");
		jnum("ckpt_stall_ms", x->job.ckpt_stall_ms, "%.3f", false);
		jnum("ckpt_stall_max_ms", x->job.ckpt_stall_max_ms, "%.3f", false);
		jnum("ckpt_copy_ms", x->job.ckpt_copy_ms, "%.3f", false);
		jnum("ckpt_bytes", (double)x->job.ckpt_bytes, "%.0f", false);
		jnum("ckpt_stall_vs_copy", ratio(x->job.ckpt_stall_ms, x->job.ckpt_copy_ms), "%.3f",
		     false);
	}
	jnum("daemon_rss_anon_bytes", (double)x->job.rss_anon_bytes, "%.0f", false);
	jnum("state_bytes", (double)x->state_bytes, "%.0f", false);
	jnum("vs_torch", ratio(x->torch.iter_ms, x->job.iter_ms), "%.3f", false);
	jnum("vs_torch_zerod", ratio(x->torch.iter_ms, x->torch.zerod_iter_ms), "%.3f", false);
	jnum("torch_zerod_vs_c", ratio(x->torch.zerod_iter_ms, x->job.iter_ms), "%.3f", false);
	jnum("torch_zerod_vs_c_comparable",
	     ratio(x->torch.zerod_iter_ms, x->job.comparable_ms), "%.3f", false);
	jnum("vs_torch_comparable", ratio(x->torch.iter_ms, x->job.comparable_ms), "%.3f", false);
	jnum("plain_best_vs_torch_zerod", ratio(x->torch.plain_best_ms, x->torch.zerod_iter_ms),
	     "%.3f", false);
	jnum("vs_torch_shared_comparable", ratio(x->torch.iter_ms, x->shared.comparable_ms), "%.3f",
	     false);
	jnum("vs_fused", ratio(x->job.iter_ms, x->fused_ms), "%.3f", false);
	jnum("vs_floor", ratio(x->job.iter_ms, x->floor_ms), "%.3f", false);
	jnum("vs_torch_shared", ratio(x->torch.iter_ms, x->shared.iter_ms), "%.3f", false);
	jnum("vs_floor_shared", ratio(x->shared.iter_ms, x->floor_shared_ms), "%.3f", false);
	jnum("shared_vs_own", ratio(x->shared.iter_ms, x->job.iter_ms), "%.3f", false);
	jnum("handoff_vs_unix", ratio(x->handoff_p50_us, x->unix_rtt_us), "%.3f", false);
	jnum("handoff_vs_unix_same_cpu", ratio(x->handoff_p50_us, x->unix_rtt_same_cpu_us), "%.3f",
	     false);
	jnum("vs_floor_nt", ratio(x->job.iter_ms, x->floor_nt_ms), "%.3f", false);
	jnum("vs_floor_wa", ratio(x->job.iter_ms, x->floor_wa_ms), "%.3f", false);
	jnum("rss_vs_state", ratio((double)x->job.rss_anon_bytes, (double)x->state_bytes), "%.3f",
	     true);
	printf("}\n");
}

static void print_table(const struct opts *o, const struct results *x)
{
	const struct bench_cfg *c = &o->cfg;

	printf("zerod-bench: %.2fM params (%.1f MB) in %u buckets, %u ranks, %s, shard %s, "
	       "step %s\n%d iterations after %d warm-up, %u threads for the references\n",
	       (double)c->params / 1e6, 4.0 * (double)c->params / 1e6, c->nbuckets, c->ranks,
	       optim_name[c->optim], c->shard == ZC_SHARD_SLICE ? "slice" : "bucket",
	       c->step == ZC_STEP_AT_END ? "at_end" : "interleaved", c->iters, c->warmup,
	       c->threads);
	printf("load average %.2f when the run began\n\n", x->loadavg);
	printf("iteration, net of the trainers' gradient fill (median)\n");
	printf("  zerod                   %9.2f ms  (fastest %.2f ms)\n", x->job.iter_ms,
	       x->job.iter_min_ms);
	if (isfinite(x->job.comparable_ms))
		printf("  zerod, as torch counts  %9.2f ms  fill overlapped with the hand-over %.2f ms "
		       "- fill alone %.2f ms\n",
		       x->job.comparable_ms, x->job.overlap_ms, x->job.fill_ms);
	if (isfinite(x->torch.plain_best_ms))
		printf("  torch DDP + plain optim %9.2f ms  best: %s (default %.2f, foreach %.2f, "
		       "gabv %.2f, gabv+foreach %.2f)\n",
		       x->torch.plain_best_ms, x->torch.plain_best, x->torch.plain_ms,
		       x->torch.plain_foreach_ms, x->torch.plain_gabv_ms,
		       x->torch.plain_gabv_foreach_ms);
	if (isfinite(x->torch.iter_ms))
		printf("  torch DDP + ZeRO (gloo) %9.2f ms  %.2fx zerod's time "
		       "(%.2f synced - %.2f compute)\n",
		       x->torch.iter_ms, ratio(x->torch.iter_ms, x->job.iter_ms),
		       x->torch.synced_ms, x->torch.compute_ms);
	if (isfinite(x->torch.iter_ms) && isfinite(x->shared.iter_ms))
		printf("                                      %.2fx zerod's with shared parameters\n",
		       ratio(x->torch.iter_ms, x->shared.iter_ms));
	else
		printf("  torch DDP + ZeRO (gloo)         -     (--vs-torch)\n");
	if (isfinite(x->torch.zerod_iter_ms))
		printf("  DDP + ZerodOptimizer    %9.2f ms  torch DDP + ZeRO takes %.2fx this; "
		       "%.2fx the C trainers' (%.2f synced; max |diff| from torch's %.3g)\n",
		       x->torch.zerod_iter_ms, ratio(x->torch.iter_ms, x->torch.zerod_iter_ms),
		       ratio(x->torch.zerod_iter_ms, x->job.iter_ms), x->torch.zerod_synced_ms,
		       x->torch.zerod_max_diff);
	else
		printf("  DDP + ZerodOptimizer            -     (--torch-zerod)\n");
	printf("  fused C reference       %9.2f ms  zerod takes %.2fx this (fastest %.2f ms)\n",
	       x->fused_ms, ratio(x->job.iter_ms, x->fused_ms), x->fused_min_ms);
	printf("  bytes-moved floor       %9.2f ms  zerod %.2fx; the lower of\n", x->floor_ms,
	       ratio(x->job.iter_ms, x->floor_ms));
	printf("    no write-allocate     %9.2f ms  %.0f MB at non-temporal triad %.2f GB/s\n",
	       x->floor_nt_ms, x->floor_bytes / 1e6, x->triad_nt_gbps);
	printf("    write-allocate        %9.2f ms  %.0f MB at 4/3 of triad %.2f GB/s\n",
	       x->floor_wa_ms, x->floor_wa_bytes / 1e6, x->triad_gbps);
	if (isfinite(x->shared.iter_ms))
		printf("  zerod, shared params    %9.2f ms  (fastest %.2f ms) %.2fx the usual\n"
		       "  its bytes-moved floor   %9.2f ms  %.0f MB; zerod %.2fx\n",
		       x->shared.iter_ms, x->shared.iter_min_ms, ratio(x->shared.iter_ms, x->job.iter_ms),
		       x->floor_shared_ms, x->floor_shared_bytes / 1e6,
		       ratio(x->shared.iter_ms, x->floor_shared_ms));
	if (x->job.checkpoints)
		printf("  checkpoint stall        %9.2f ms  zc_checkpoint()%s, median of %d (slowest "
		       "%.2f ms)\n",
		       x->job.ckpt_ms, c->checkpoint_sync ? " + zc_checkpoint_wait()" : "",
		       x->job.checkpoints, x->job.ckpt_max_ms);
	if (x->job.checkpoints) {
		printf("  iteration + checkpoint  %9.2f ms  over one without, median (slowest "
		       "%.2f ms)\n",
		       x->job.ckpt_stall_ms, x->job.ckpt_stall_max_ms);
		printf("  staging copy floor      %9.2f ms  memcpy of %.1f MB into a warm buffer; "
		       "stall %.2fx this\n",
		       x->job.ckpt_copy_ms, (double)x->job.ckpt_bytes / 1e6,
		       ratio(x->job.ckpt_stall_ms, x->job.ckpt_copy_ms));
	}
	printf("handoff, zc_bucket_ready -> step done, 1 bucket of 16 elements\n");
	printf("  p50 / p99               %9.1f / %.1f us  p50 = %.2fx the AF_UNIX round trip "
	       "across two CPUs, %.2fx on one\n",
	       x->handoff_p50_us, x->handoff_p99_us, ratio(x->handoff_p50_us, x->unix_rtt_us),
	       ratio(x->handoff_p50_us, x->unix_rtt_same_cpu_us));
	printf("  AF_UNIX 64 B round trip %9.2f us  across two CPUs (%.2f us on one)\n",
	       x->unix_rtt_us, x->unix_rtt_same_cpu_us);
	printf("daemon memory with the job active\n");
	printf("  RssAnon                 %9.1f MB  %.2fx the optimizer state (%.1f MB)\n",
	       (double)x->job.rss_anon_bytes / 1e6,
	       ratio((double)x->job.rss_anon_bytes, (double)x->state_bytes),
	       (double)x->state_bytes / 1e6);
	printf("floors\n");
	printf("  memcpy (1 thread)       %9.2f GB/s\n", x->memcpy_gbps);
	printf("  STREAM triad (%u thr)    %9.2f GB/s\n", c->threads, x->triad_gbps);
}

/* ---- the run ---- */

static double loadavg(void)
{
	FILE *f = fopen("/proc/loadavg", "re");
	double v = NAN;

	if (f && fscanf(f, "%lf", &v) != 1)
		v = NAN;
	if (f)
		fclose(f);
	return v;
}

static void progress(const char *what)
{
	fprintf(stderr, "zerod-bench: %s\n", what);
}

static void dump_log(const struct bench_daemon *d)
{
	char line[1024];
	FILE *f = fopen(d->log, "re");

	while (f && fgets(line, sizeof(line), f))
		fprintf(stderr, "zerod: %s", line);
	if (f)
		fclose(f);
}

/* ---- --daemons N: the job across N daemons, and raw gloo ---- */

/* The value of counter `name` in daemon d's metrics (zeroctl metrics), or
 * NAN. */
static double daemon_metric(const struct bench_daemon *d, const char *name)
{
	const char *ctl = getenv("ZEROCTL_BIN") ? getenv("ZEROCTL_BIN") : ZEROCTL_BUILD_BIN;
	char cmd[512], line[512];
	size_t len = strlen(name);
	double v = NAN;
	FILE *f;

	snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' metrics 2>/dev/null", ctl, d->sock);
	f = popen(cmd, "r");
	if (!f)
		return NAN;
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, name, len) == 0 && line[len] == ' ')
			v = strtod(line + len + 1, NULL);
	pclose(f);
	return v;
}

/* A rate from each daemon's metrics, bytes over seconds (GB/s), the slowest
 * daemon's; NAN if one of them did not say. */
static double daemons_rate(const struct bench_daemon *d, uint32_t n, const char *bytes,
			   const char *seconds)
{
	double worst = INFINITY;

	for (uint32_t k = 0; k < n; k++) {
		double b = daemon_metric(&d[k], bytes), s = daemon_metric(&d[k], seconds);
		double bw = s > 0 && b > 0 ? b / (s * 1e9) : NAN;
		if (!isfinite(bw))
			return NAN;
		worst = bw < worst ? bw : worst;
	}
	return worst;
}

/* The gloo anchor independent of zerod: torch.distributed's all_reduce over
 * its gloo backend between N processes, the same buckets
 * (torch_anchor.py --allreduce-only): the median iteration in ms. */
static int run_torch_gloo(const struct opts *o, double *ret_ms)
{
	const struct bench_cfg *cfg = &o->cfg;
	char cmd[2048], last[4096] = "";
	int r;

	snprintf(cmd, sizeof(cmd),
		 "'%s' '%s' --allreduce-only --params %llu --layers %u --bucket-numel %llu "
		 "--world %u --iters %d --warmup %d",
		 o->python, o->anchor, (unsigned long long)cfg->params, cfg->nbuckets,
		 (unsigned long long)cfg->bucket_numel, cfg->daemons, cfg->iters, cfg->warmup);
	if ((r = bench_last_json(cmd, last, sizeof(last))) < 0)
		return r;
	*ret_ms = json_number(last, "torch_gloo_allreduce_ms");
	return isnan(*ret_ms) ? -EIO : 0;
}

/* The step without zerod, in this run: the fused reference of one rank
 * (its sum a copy) with warm caches, over one bucket (ms[0]) and over every
 * bucket (ms[1]). */
static int step_refs(const struct bench_cfg *cfg, double ms[2])
{
	struct bench_cfg one = *cfg;
	double fastest;
	int r;

	one.ranks = 1;
	one.cold = false;
	one.params = cfg->bucket_numel;
	if ((r = floor_fused_ms(&one, &ms[0], &fastest)) < 0)
		return r;
	one.params = cfg->params;
	return floor_fused_ms(&one, &ms[1], &fastest);
}

/* --tls: the rounds of the job plain and with TLS, and what they ran on. */
struct tls_report {
	int rounds;
	/* per round: the iteration (ms) and the daemons' own all-reduce (GB/s)
	 * of the plain job, with TLS (--tls-ktls=no), with --tls-ktls=yes */
	double plain_ms[TLS_ROUNDS_MAX], plain_net[TLS_ROUNDS_MAX];
	double tls_ms[TLS_ROUNDS_MAX], tls_net[TLS_ROUNDS_MAX];
	/* per round: the TLS job's mesh, bytes sealed and opened per CPU
	 * second (daemons_rate() of zerod_tls_mesh_*) */
	double tls_seal[TLS_ROUNDS_MAX];
	double ktls_ms[TLS_ROUNDS_MAX], ktls_net[TLS_ROUNDS_MAX];
	double tls_iter_ms, tls_algn, ktls_iter_ms, ktls_algn, tls_sealr; /* their medians */
	bool ktls_kernel; /* the kernel takes TCP_ULP "tls": the kTLS variant runs */
	int ktls_active;  /* the daemons said the kernel had the keys: 1, 0, -1 unknown */
	char ktls_note[256];
	char ident[160];    /* how the identity was made */
	double openssl_Bps; /* openssl speed's AES-256-GCM, 16 KiB blocks, one core */
	char openssl_note[200];
};

/* A JSON list of n numbers (null for NAN). */
static void jlist(const char *key, const double *v, int n)
{
	printf("  \"%s\": [", key);
	for (int i = 0; i < n; i++) {
		if (isfinite(v[i]))
			printf("%s%.3f", i ? ", " : "", v[i]);
		else
			printf("%snull", i ? ", " : "");
	}
	printf("],\n");
}

/* A JSON string (quotes and backslashes escaped; ours hold no control
 * characters). */
static void jstr(const char *key, const char *s)
{
	printf("  \"%s\": \"", key);
	for (; *s; s++)
		printf(*s == '"' || *s == '\\' ? "\\%c" : "%c", *s);
	printf("\",\n");
}

/* The TLS keys of --daemons --tls (f: busbw over algbw). */
static void print_tls_json(const struct tls_report *t, const struct job_result *job, double algn,
			   double f)
{
	double tls_bus = t->tls_algn * f;

	printf("  \"tls_rounds\": %d,\n", t->rounds);
	jstr("tls_identity", t->ident);
	jnum("tls_iter_ms", t->tls_iter_ms, "%.3f", false);
	jnum("tls_algbw_net", t->tls_algn, "%.3f", false);
	jnum("tls_busbw_net", tls_bus, "%.3f", false);
	jnum("tls_vs_plain", ratio(job->iter_ms, t->tls_iter_ms), "%.3f", false);
	jnum("tls_vs_plain_net", ratio(t->tls_algn, algn), "%.3f", false);
	jnum("tls_vs_plain_net_target", 0.7, "%.2f", false);
	jnum("tls_ktls_iter_ms", t->ktls_iter_ms, "%.3f", false);
	jnum("tls_ktls_algbw_net", t->ktls_algn, "%.3f", false);
	jnum("tls_ktls_vs_plain", ratio(job->iter_ms, t->ktls_iter_ms), "%.3f", false);
	jnum("tls_ktls_vs_plain_net", ratio(t->ktls_algn, algn), "%.3f", false);
	printf("  \"ktls_kernel\": %s,\n", t->ktls_kernel ? "true" : "false");
	printf("  \"ktls_active\": %s,\n", t->ktls_active < 0 ? "null"
					   : t->ktls_active   ? "true"
							      : "false");
	jstr("ktls_note", t->ktls_note);
	jnum("openssl_aes256gcm_MBps", t->openssl_Bps / 1e6, "%.1f", false);
	jstr("openssl_speed", t->openssl_note);
	jnum("tls_bytes_vs_openssl", ratio(tls_bus * 1e9, t->openssl_Bps), "%.3f", false);
	jnum("tls_bytes_vs_openssl_target", 0.5, "%.2f", false);
	jnum("tls_seal_cpu_GBps", t->tls_sealr, "%.3f", false);
	jnum("tls_seal_cpu_vs_openssl", ratio(t->tls_sealr * 1e9, t->openssl_Bps), "%.3f", false);
	jlist("tls_seal_cpu_GBps_rounds", t->tls_seal, t->rounds);
	jlist("plain_iter_ms_rounds", t->plain_ms, t->rounds);
	jlist("plain_algbw_net_rounds", t->plain_net, t->rounds);
	jlist("tls_iter_ms_rounds", t->tls_ms, t->rounds);
	jlist("tls_algbw_net_rounds", t->tls_net, t->rounds);
	if (t->ktls_kernel) {
		jlist("tls_ktls_iter_ms_rounds", t->ktls_ms, t->rounds);
		jlist("tls_ktls_algbw_net_rounds", t->ktls_net, t->rounds);
	}
}

/* The same as a table. */
static void print_tls_table(const struct tls_report *t, const struct job_result *job, double algn,
			    double f, double bytes)
{
	double algc = bytes / (t->tls_iter_ms * 1e6);

	printf("with TLS 1.3 between the daemons (%s; %d round%s, medians)\n", t->ident, t->rounds,
	       t->rounds == 1 ? "" : "s");
	printf("  zerod (whole iteration)  %9.2f ms  algbw %7.3f GB/s  busbw %7.3f GB/s\n",
	       t->tls_iter_ms, algc, algc * f);
	printf("  zerod's own all-reduce                 algbw %7.3f GB/s  busbw %7.3f GB/s\n",
	       t->tls_algn, t->tls_algn * f);
	printf("  TLS / plain  whole iteration %8.3f   all-reduce %9.3f  (target >= 0.70)\n",
	       ratio(job->iter_ms, t->tls_iter_ms), ratio(t->tls_algn, algn));
	if (t->ktls_kernel)
		printf("  --tls-ktls=yes           %9.2f ms  all-reduce algbw %7.3f GB/s, %.3f of "
		       "plain\n",
		       t->ktls_iter_ms, t->ktls_algn, ratio(t->ktls_algn, algn));
	printf("  kTLS: %s\n", t->ktls_note);
	printf("  openssl speed AES-256-GCM, 16 KiB, one core  %9.1f MB/s  (%s)\n",
	       t->openssl_Bps / 1e6, t->openssl_note);
	printf("  encrypted busbw / that   %9.3f  (target >= 0.50: within 2x)\n",
	       ratio(t->tls_algn * f * 1e9, t->openssl_Bps));
	printf("  sealed + opened per CPU second of the mesh's calls %7.3f GB/s, / that %.3f\n",
	       t->tls_sealr, ratio(t->tls_sealr * 1e9, t->openssl_Bps));
}

/* gloo_ms: torch's gloo all_reduce (the anchor; NAN where torch is not),
 * shim_ms: gloo through zerod's own shim (gloo_raw.c), step_ms: step_refs(),
 * tls: the --tls rounds (NULL without). */
static void print_daemons(const struct opts *o, const struct job_result *job, double gloo_ms,
			  double shim_ms, const double step_ms[2], double algn, double load,
			  const struct tls_report *tls)
{
	const struct bench_cfg *c = &o->cfg;
	double n = c->daemons, f = 2.0 * (n - 1) / n, bytes = 4.0 * (double)c->params;
	double algz = bytes / (job->iter_ms * 1e6), algg = bytes / (gloo_ms * 1e6);
	bool at_end = c->step == ZC_STEP_AT_END;
	double anchor = gloo_ms + step_ms[at_end ? 1 : 0], target = at_end ? 1.1 : 1.15;

	if (o->json) {
		printf("{\n  \"schema\": \"zerod-bench-daemons/1\",\n");
		printf("  \"daemons\": %u,\n  \"params\": %llu,\n  \"buckets\": %u,\n", c->daemons,
		       (unsigned long long)c->params, c->nbuckets);
		printf("  \"bucket_numel\": %llu,\n  \"ranks\": %u,\n  \"optim\": \"%s\",\n",
		       (unsigned long long)c->bucket_numel, c->ranks, optim_name[c->optim]);
		printf("  \"shard\": \"%s\",\n  \"step\": \"%s\",\n",
		       c->shard == ZC_SHARD_SLICE ? "slice" : "bucket",
		       c->step == ZC_STEP_AT_END ? "at_end" : "interleaved");
		printf("  \"iters\": %d,\n  \"warmup\": %d,\n", c->iters, c->warmup);
		jnum("loadavg", load, "%.2f", false);
		jnum("bytes", bytes, "%.0f", false);
		jnum("zerod_iter_ms", job->iter_ms, "%.3f", false);
		jnum("zerod_iter_min_ms", job->iter_min_ms, "%.3f", false);
		jnum("loadavg_end", loadavg(), "%.2f", false);
		jnum("gloo_iter_ms", gloo_ms, "%.3f", false);
		jnum("gloo_shim_iter_ms", shim_ms, "%.3f", false);
		jnum("step_bucket_ref_ms", step_ms[0], "%.3f", false);
		jnum("step_all_ref_ms", step_ms[1], "%.3f", false);
		jnum("gloo_plus_step_ms", anchor, "%.3f", false);
		jnum("vs_gloo_plus_step", ratio(job->iter_ms, anchor), "%.3f", false);
		jnum("vs_gloo_plus_step_target", target, "%.2f", false);
		printf("  \"gloo_anchor\": \"%s\",\n",
		       isfinite(gloo_ms) ? "torch.distributed all_reduce, backend gloo"
					 : "not run: no torch for the interpreter (--python)");
		jnum("algbw_zerod", algz, "%.3f", false);
		jnum("algbw_gloo", algg, "%.3f", false);
		jnum("busbw_zerod", algz * f, "%.3f", false);
		jnum("busbw_gloo", algg * f, "%.3f", false);
		jnum("vs_gloo", ratio(algz, algg), "%.3f", false);
		if (job->checkpoints) {
			jnum("checkpoint_stall_ms", job->ckpt_ms, "%.3f", false);
			jnum("checkpoint_stall_max_ms", job->ckpt_max_ms, "%.3f", false);
			printf("  \"checkpoint_sync\": %s,\n", c->checkpoint_sync ? "true" : "false");
			jnum("ckpt_stall_ms", job->ckpt_stall_ms, "%.3f", false);
			jnum("ckpt_stall_max_ms", job->ckpt_stall_max_ms, "%.3f", false);
			jnum("ckpt_copy_ms", job->ckpt_copy_ms, "%.3f", false);
			jnum("ckpt_bytes", (double)job->ckpt_bytes, "%.0f", false);
			jnum("ckpt_stall_vs_copy", ratio(job->ckpt_stall_ms, job->ckpt_copy_ms),
			     "%.3f", false);
		}
		jnum("algbw_net", algn, "%.3f", false);
		jnum("busbw_net", algn * f, "%.3f", false);
		if (tls)
			print_tls_json(tls, job, algn, f);
		jnum("vs_gloo_net", ratio(algn, algg), "%.3f", true);
		printf("}\n");
		return;
	}
	printf("zerod-bench: %u daemons on loopback, %.2fM params (%.1f MB) in %u buckets, "
	       "%u ranks, %s, shard %s, step %s\n%d iterations after %d warm-up\n\n",
	       c->daemons, (double)c->params / 1e6, bytes / 1e6, c->nbuckets, c->ranks,
	       optim_name[c->optim], c->shard == ZC_SHARD_SLICE ? "slice" : "bucket",
	       c->step == ZC_STEP_AT_END ? "at_end" : "interleaved", c->iters, c->warmup);
	printf("all-reduce of %.1f MB per iteration (median), busbw = algbw x 2(n-1)/n\n",
	       bytes / 1e6);
	printf("  zerod (whole iteration)  %9.2f ms  algbw %7.3f GB/s  busbw %7.3f GB/s\n",
	       job->iter_ms, algz, algz * f);
	printf("  torch gloo all_reduce    %9.2f ms  algbw %7.3f GB/s  busbw %7.3f GB/s\n", gloo_ms,
	       algg, algg * f);
	printf("  gloo via zerod's shim    %9.2f ms\n", shim_ms);
	printf("  step alone (reference)   %9.2f ms one bucket, %.2f ms all of them\n", step_ms[0],
	       step_ms[1]);
	printf("  zerod / (gloo + %s) %9.3f  (target %.2f)\n",
	       at_end ? "every bucket's step" : "one bucket's step", ratio(job->iter_ms, anchor),
	       target);
	printf("  zerod's own all-reduce                 algbw %7.3f GB/s  busbw %7.3f GB/s\n",
	       algn, algn * f);
	printf("  zerod / gloo  whole iteration %9.3f   all-reduce %9.3f\n", ratio(algz, algg),
	       ratio(algn, algg));
	if (tls)
		print_tls_table(tls, job, algn, f, bytes);
	if (!job->checkpoints)
		return;
	printf("checkpoints over %u daemons\n", c->daemons);
	printf("  checkpoint stall        %9.2f ms  zc_checkpoint()%s, median of %d (slowest "
	       "%.2f ms)\n",
	       job->ckpt_ms, c->checkpoint_sync ? " + zc_checkpoint_wait()" : "", job->checkpoints,
	       job->ckpt_max_ms);
	printf("  iteration + checkpoint  %9.2f ms  over one without, median (slowest %.2f ms)\n",
	       job->ckpt_stall_ms, job->ckpt_stall_max_ms);
	printf("  staging copy floor      %9.2f ms  memcpy of %.1f MB into a warm buffer; "
	       "stall %.2fx this\n",
	       job->ckpt_copy_ms, (double)job->ckpt_bytes / 1e6,
	       ratio(job->ckpt_stall_ms, job->ckpt_copy_ms));
}

/* What checkpoints into the temporary dir left (their generations,
 * docs/CHECKPOINT.md: directories of files), and the dir. */
static void ckpt_tmp_remove(const char *dir)
{
	char f[512], g[1024];
	DIR *d = opendir(dir), *sub;
	struct dirent *e, *x;

	while (d && (e = readdir(d))) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		snprintf(f, sizeof(f), "%s/%s", dir, e->d_name);
		if ((sub = opendir(f))) {
			while ((x = readdir(sub)))
				if (strcmp(x->d_name, ".") != 0 && strcmp(x->d_name, "..") != 0) {
					snprintf(g, sizeof(g), "%s/%s", f, x->d_name);
					unlink(g);
				}
			closedir(sub);
			rmdir(f);
		} else {
			unlink(f);
		}
	}
	if (d)
		closedir(d);
	rmdir(dir);
}

static const char *ckpt_tmp_make(struct bench_cfg *cfg)
{
	static char tmp[64];

	if (!cfg->checkpoint_every || cfg->checkpoint_dir)
		return NULL;
	snprintf(tmp, sizeof(tmp), "/tmp/zerod-bench-ckpt.XXXXXX"); /* once per run of the job */
	cfg->checkpoint_dir = mkdtemp(tmp) ? tmp : NULL;
	return cfg->checkpoint_dir;
}

/* ---- --tls: one TLS identity, the kernel's TLS, openssl speed ---- */

static const char *zeroctl_bin(void)
{
	return getenv("ZEROCTL_BIN") ? getenv("ZEROCTL_BIN") : ZEROCTL_BUILD_BIN;
}

/* The SHA-256 fingerprint of the certificate in PEM file path, 64 lowercase
 * hex digits (what tls-peers lists). 0 or -errno. */
static int cert_fingerprint(const char *path, char fp[65])
{
	FILE *f = fopen(path, "re");
	X509 *x = f ? PEM_read_X509(f, NULL, NULL, NULL) : NULL;
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned n = 0;
	int r = -EIO;

	if (!f)
		return -errno;
	if (x && X509_digest(x, EVP_sha256(), md, &n) == 1 && n == 32) {
		for (unsigned i = 0; i < n; i++)
			sprintf(fp + 2 * i, "%02x", md[i]);
		r = 0;
	}
	X509_free(x);
	fclose(f);
	return r;
}

static int write_pem(const char *path, mode_t mode, EVP_PKEY *key, X509 *cert)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
	FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
	int ok;

	if (!f) {
		if (fd >= 0)
			close(fd);
		return -errno;
	}
	ok = key ? PEM_write_PrivateKey(f, key, NULL, NULL, 0, NULL, NULL)
		 : PEM_write_X509(f, cert);
	return fclose(f) == 0 && ok ? 0 : -EIO;
}

/* What `zeroctl keygen PREFIX` makes, made here: an Ed25519 key in
 * PREFIX.key (0600) and its self-signed certificate in PREFIX.crt. */
static int identity_generate(const char *key_path, const char *cert_path)
{
	EVP_PKEY *key = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
	X509 *x = X509_new();
	X509_NAME *n = x ? X509_get_subject_name(x) : NULL;
	int r = -EIO;

	if (!key || !x)
		goto out;
	ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
	X509_gmtime_adj(X509_getm_notBefore(x), -3600);
	X509_gmtime_adj(X509_getm_notAfter(x), 86400L * 30);
	X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, (const unsigned char *)"zerod-bench", -1,
				   -1, 0);
	X509_set_issuer_name(x, n);
	if (X509_set_version(x, 2) != 1 || X509_set_pubkey(x, key) != 1 ||
	    X509_sign(x, key, NULL) <= 0)
		goto out;
	r = write_pem(key_path, 0600, key, NULL);
	if (r == 0)
		r = write_pem(cert_path, 0644, NULL, x);
out:
	X509_free(x);
	EVP_PKEY_free(key);
	return r;
}

/* One TLS identity every daemon holds (a zerod trusts its own certificate),
 * in a temporary directory: made by `zeroctl keygen DIR/node`, or, where
 * that zeroctl writes no DIR/node.crt (an older one), by the same OpenSSL
 * calls here; DIR/node.peers lists its fingerprint. The flags that give it
 * to zerod: args_tls with --tls-ktls=no, args_ktls with the default. */
struct tls_files {
	char dir[64], key[96], cert[96], peers[96], pub[96], fp[65];
	const char *args_tls[8], *args_ktls[8];
};

static int tls_files_make(struct tls_files *tf, char *how, size_t howlen)
{
	char cmd[512], line[256] = "", *p, *q;
	int r, st;
	FILE *f;

	snprintf(tf->dir, sizeof(tf->dir), "/tmp/zerod-bench-tls.XXXXXX");
	if (!mkdtemp(tf->dir))
		return -errno;
	snprintf(tf->key, sizeof(tf->key), "%s/node.key", tf->dir);
	snprintf(tf->cert, sizeof(tf->cert), "%s/node.crt", tf->dir);
	snprintf(tf->peers, sizeof(tf->peers), "%s/node.peers", tf->dir);
	snprintf(tf->pub, sizeof(tf->pub), "%s/node.pub", tf->dir);
	snprintf(cmd, sizeof(cmd), "'%s' keygen '%s/node' 2>/dev/null", zeroctl_bin(), tf->dir);
	f = popen(cmd, "r");
	if (f) {
		if (!fgets(line, sizeof(line), f))
			line[0] = 0;
		while (fgetc(f) != EOF)
			;
		st = pclose(f);
	} else {
		st = -1;
	}
	if (st == 0 && access(tf->key, R_OK) == 0 && cert_fingerprint(tf->cert, tf->fp) == 0) {
		/* what keygen printed: the fingerprint, colons allowed */
		for (p = q = line; *p; p++)
			if (*p != ':' && *p != '\n' && *p != ' ')
				*q++ = (char)(*p >= 'A' && *p <= 'F' ? *p - 'A' + 'a' : *p);
		*q = 0;
		if (strcmp(line, tf->fp) != 0)
			fprintf(stderr,
				"zerod-bench: zeroctl keygen printed \"%s\", not the certificate's "
				"SHA-256 fingerprint %s; the bench lists the latter\n",
				line, tf->fp);
		snprintf(how, howlen, "zeroctl keygen");
	} else {
		/* an older zeroctl (a CURVE key in node.key): made here instead */
		unlink(tf->key);
		unlink(tf->pub);
		unlink(tf->cert);
		r = identity_generate(tf->key, tf->cert);
		if (r == 0)
			r = cert_fingerprint(tf->cert, tf->fp);
		if (r < 0)
			return r;
		snprintf(how, howlen,
			 "Ed25519, self-signed, made by the bench: %s keygen wrote no PREFIX.crt",
			 st == 0 ? "this zeroctl's" : "zeroctl");
	}
	f = fopen(tf->peers, "we");
	if (!f)
		return -errno;
	fprintf(f, "# the bench's one identity: every daemon holds it\n%s\n", tf->fp);
	if (fclose(f) != 0)
		return -EIO;
	const char *a[] = {"--tls-key", tf->key, "--tls-cert", tf->cert, "--tls-peers", tf->peers};
	for (int i = 0; i < 6; i++)
		tf->args_tls[i] = tf->args_ktls[i] = a[i];
	tf->args_tls[6] = "--tls-ktls=no";
	tf->args_tls[7] = tf->args_ktls[6] = tf->args_ktls[7] = NULL;
	return 0;
}

static void tls_files_remove(struct tls_files *tf)
{
	unlink(tf->key);
	unlink(tf->cert);
	unlink(tf->peers);
	unlink(tf->pub);
	rmdir(tf->dir);
}

/* Whether this kernel can take a TLS connection's keys: TCP_ULP "tls" on
 * an established loopback connection (what OpenSSL's kTLS sets). why says
 * what it found. */
static bool kernel_tls(char *why, size_t len)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof(a);
	int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), c = -1, s = -1, e = 0;
	bool ok = false;

	if (l >= 0 && bind(l, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(l, 1) == 0 &&
	    getsockname(l, (struct sockaddr *)&a, &al) == 0 &&
	    (c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) >= 0 &&
	    connect(c, (struct sockaddr *)&a, sizeof(a)) == 0 &&
	    (s = accept4(l, NULL, NULL, SOCK_CLOEXEC)) >= 0) {
		ok = setsockopt(c, IPPROTO_TCP, TCP_ULP, "tls", sizeof("tls")) == 0;
		e = ok ? 0 : errno;
		snprintf(why, len,
			 ok ? "the kernel takes TCP_ULP \"tls\""
			    : "the kernel has no tls module (TCP_ULP \"tls\": %s): tls-ktls=yes "
			      "runs "
			      "OpenSSL's own code, as tls_iter_ms, so that variant is not run",
			 strerror(e));
	} else {
		snprintf(why, len, "no loopback connection to probe TCP_ULP \"tls\" on: %s",
			 strerror(errno));
	}
	if (s >= 0)
		close(s);
	if (c >= 0)
		close(c);
	if (l >= 0)
		close(l);
	return ok;
}

/* Whether daemon d's log says its mesh handed the TLS keys to the kernel:
 * 1, 0, or -1 where it does not say (the job's start line only says
 * "kernel TLS asked for"). */
static int log_ktls(const struct bench_daemon *d)
{
	char line[1024];
	FILE *f = fopen(d->log, "re");
	int v = -1;

	while (f && fgets(line, sizeof(line), f)) {
		if (!strstr(line, "kernel TLS") && !strstr(line, "kTLS"))
			continue;
		if (strstr(line, "asked for") && !strstr(line, "active") && !strstr(line, "in use"))
			continue;
		if (strstr(line, " not ") || strstr(line, " off") || strstr(line, "unavailable") ||
		    strstr(line, "without") || strstr(line, " no "))
			v = 0;
		else if (strstr(line, "active") || strstr(line, "in use") || strstr(line, " on"))
			v = 1;
	}
	if (f)
		fclose(f);
	return v;
}

/* Whether daemon d's log says the job's tensors crossed TLS 1.3 (the job's
 * start line, daemon/core/job.c). */
static bool log_tls(const struct bench_daemon *d)
{
	char line[1024];
	FILE *f = fopen(d->log, "re");
	bool v = false;

	while (f && fgets(line, sizeof(line), f))
		v = v || strstr(line, "tensors between nodes over TLS 1.3");
	if (f)
		fclose(f);
	return v;
}

/* `openssl speed -elapsed -evp aes-256-gcm` over 16 KiB blocks for a second,
 * one process: bytes per second in *ret_Bps (NAN if it did not run), and
 * note says which. */
static void openssl_speed(double *ret_Bps, char *note, size_t len)
{
	const char *bin = getenv("OPENSSL_BIN") ? getenv("OPENSSL_BIN") : "openssl";
	char cmd[512], line[512];
	FILE *f;
	int st;

	*ret_Bps = NAN;
	snprintf(cmd, sizeof(cmd),
		 "'%s' speed -elapsed -seconds 1 -bytes 16384 -mr -evp aes-256-gcm 2>/dev/null",
		 bin);
	f = popen(cmd, "r");
	if (!f) {
		snprintf(note, len, "not run: %s", strerror(errno));
		return;
	}
	while (fgets(line, sizeof(line), f)) {
		/* -mr: "+F:N:AES-256-GCM:BYTES_PER_S" (one column: -bytes 16384) */
		char *c = strrchr(line, ':');
		if (strncmp(line, "+F:", 3) == 0 && c)
			*ret_Bps = strtod(c + 1, NULL);
	}
	st = pclose(f);
	if (isfinite(*ret_Bps) && *ret_Bps > 0)
		snprintf(note, len,
			 "openssl speed -elapsed -seconds 1 -bytes 16384 -evp aes-256-gcm");
	else if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
		snprintf(note, len, "not run: no %s in PATH (tools/deps.sh installs openssl)", bin);
	else
		snprintf(note, len, "not run: %s speed printed no AES-256-GCM figure", bin);
	if (!(*ret_Bps > 0))
		*ret_Bps = NAN;
}

/* The job across cfg->daemons daemons started with extra flags (what: a
 * name for the progress line): its iterations, the daemons' own all-reduce
 * bandwidth in *ret_algn, and with ret_tls/ret_ktls what their logs said
 * (log_tls: every daemon's; log_ktls: -1 unless every daemon said). */
static int daemons_job(struct opts *o, const char *what, const char *const *extra,
		       struct job_result *job, double *ret_algn, double *ret_seal, bool *ret_tls,
		       int *ret_ktls, const char **ret_step)
{
	struct bench_cfg *cfg = &o->cfg;
	const char *ckpt_tmp = ckpt_tmp_make(cfg);
	struct bench_daemon d[16];
	char line[256];
	uint32_t k;
	int r = 0;

	*ret_step = "starting zerod";
	memset(d, 0, sizeof(d));
	for (k = 0; k < cfg->daemons && r == 0; k++) {
		r = daemon_start_args(&d[k], cfg->zerod, extra);
		if (r < 0)
			dump_log(&d[k]);
	}
	if (r == 0) {
		snprintf(line, sizeof(line), "zerod: iterations across daemons%s%s",
			 what ? ", " : "", what ? what : "");
		progress(line);
		*ret_step = "iterations";
		r = cfg->checkpoint_every && !cfg->checkpoint_dir
			    ? -errno
			    : job_iterations(d, cfg, job, NULL);
		if (ckpt_tmp) {
			ckpt_tmp_remove(ckpt_tmp);
			cfg->checkpoint_dir = NULL;
		}
		if (r < 0)
			for (k = 0; k < cfg->daemons; k++)
				dump_log(&d[k]);
		else
			/* the daemons' own cross-node all-reduces */
			*ret_algn = daemons_rate(d, cfg->daemons, "zerod_net_allreduce_bytes_total",
						 "zerod_net_allreduce_seconds_total");
		/* what the TLS mesh sealed and opened per second of its CPU */
		if (r == 0 && ret_seal)
			*ret_seal = daemons_rate(d, cfg->daemons, "zerod_tls_mesh_bytes_total",
						 "zerod_tls_mesh_cpu_seconds_total");
	}
	if (r == 0 && ret_tls) {
		*ret_tls = true;
		for (k = 0; k < cfg->daemons; k++)
			*ret_tls = *ret_tls && log_tls(&d[k]);
	}
	if (r == 0 && ret_ktls) {
		*ret_ktls = log_ktls(&d[0]);
		for (k = 1; k < cfg->daemons; k++) {
			int v = log_ktls(&d[k]);
			*ret_ktls = v < 0 || *ret_ktls < 0 ? -1 : v && *ret_ktls;
		}
	}
	for (k = 0; k < cfg->daemons; k++)
		if (daemon_stop(&d[k]) != 0 && r == 0) {
			*ret_step = "stopping zerod";
			r = -ECHILD;
		}
	return r;
}

static double median_of(const double *v, int n)
{
	double c[TLS_ROUNDS_MAX];

	memcpy(c, v, sizeof(*v) * (size_t)n);
	return bench_quantile(c, (size_t)n, 0.5);
}

/* --tls: cfg->tls rounds of the plain job (into *job and *algn: the first
 * round's result, its iteration and all-reduce the medians over the rounds)
 * and the job on daemons with the identity, alternating; then openssl
 * speed. */
static int tls_rounds(struct opts *o, struct job_result *job, double *algn, struct tls_report *t,
		      const char **step)
{
	struct bench_cfg *cfg = &o->cfg;
	struct tls_files tf;
	struct job_result one;
	int r, ktls = -1;

	memset(t, 0, sizeof(*t));
	t->rounds = cfg->tls;
	t->tls_iter_ms = t->tls_algn = t->ktls_iter_ms = t->ktls_algn = NAN;
	for (int k = 0; k < TLS_ROUNDS_MAX; k++)
		t->plain_ms[k] = t->plain_net[k] = t->tls_ms[k] = t->tls_net[k] = t->ktls_ms[k] =
			t->ktls_net[k] = t->tls_seal[k] = NAN;
	t->ktls_kernel = kernel_tls(t->ktls_note, sizeof(t->ktls_note));
	t->ktls_active = t->ktls_kernel ? -1 : 0;
	*step = "the TLS identity (zeroctl keygen)";
	r = tls_files_make(&tf, t->ident, sizeof(t->ident));
	for (int k = 0; r == 0 && k < t->rounds; k++) {
		/* alternating: plain first in even rounds, last in odd ones */
		for (int v = 0; r == 0 && v < 3; v++) {
			int kind = k % 2 == 0 ? v : (v + 1) % 3; /* 0 plain, 1 TLS, 2 kTLS */
			char what[64];
			bool said = true;
			int kt = -1;

			if (kind == 2 && !t->ktls_kernel)
				continue;
			snprintf(what, sizeof(what), "%s (round %d/%d)",
				 kind == 0   ? "plain gloo"
				 : kind == 1 ? "TLS 1.3, --tls-ktls=no"
					     : "TLS 1.3, --tls-ktls=yes",
				 k + 1, t->rounds);
			one = (struct job_result){0};
			if (kind == 0) {
				r = daemons_job(o, what, NULL, k == 0 ? job : &one,
						&t->plain_net[k], NULL, NULL, NULL, step);
				t->plain_ms[k] = (k == 0 ? job : &one)->iter_ms;
				continue;
			}
			r = daemons_job(o, what, kind == 1 ? tf.args_tls : tf.args_ktls, &one,
					kind == 1 ? &t->tls_net[k] : &t->ktls_net[k],
					kind == 1 ? &t->tls_seal[k] : NULL, &said,
					kind == 2 ? &kt : NULL, step);
			(kind == 1 ? t->tls_ms : t->ktls_ms)[k] = one.iter_ms;
			if (r == 0 && !said) {
				fprintf(stderr,
					"zerod-bench: the daemons with --tls-key did not say "
					"their tensors crossed TLS 1.3 (the job's start line)\n");
				*step = "TLS between the daemons";
				r = -EPROTO;
			}
			if (kind == 2)
				ktls = k == 0 ? kt : (kt < 0 || ktls < 0 ? -1 : kt && ktls);
		}
	}
	tls_files_remove(&tf);
	if (r < 0)
		return r;
	job->iter_ms = median_of(t->plain_ms, t->rounds);
	*algn = median_of(t->plain_net, t->rounds);
	t->tls_iter_ms = median_of(t->tls_ms, t->rounds);
	t->tls_algn = median_of(t->tls_net, t->rounds);
	t->tls_sealr = median_of(t->tls_seal, t->rounds);
	if (t->ktls_kernel) {
		t->ktls_iter_ms = median_of(t->ktls_ms, t->rounds);
		t->ktls_algn = median_of(t->ktls_net, t->rounds);
		t->ktls_active = ktls;
		snprintf(t->ktls_note, sizeof(t->ktls_note), "%s",
			 ktls < 0 ? "the kernel takes TCP_ULP \"tls\", but the daemons' logs did "
				    "not say whether the mesh handed it the keys: unknown"
			 : ktls   ? "the kernel takes TCP_ULP \"tls\" and the daemons said their "
				    "mesh handed it the keys"
				  : "the kernel takes TCP_ULP \"tls\", but the daemons said their "
				    "mesh "
				    "did not hand it the keys");
	}
	progress("openssl speed -evp aes-256-gcm, one core");
	openssl_speed(&t->openssl_Bps, t->openssl_note, sizeof(t->openssl_note));
	return 0;
}

static int run_daemons(struct opts *o)
{
#ifdef ZEROD_BENCH_GLOO
	struct bench_cfg *cfg = &o->cfg;
	struct job_result job = {0};
	struct tls_report tls;
	double gloo_ms = NAN, shim_ms = NAN, algn = NAN, load = loadavg();
	double step_ms[2] = {NAN, NAN};
	const char *step = "starting zerod";
	int r;

	if (cfg->tls)
		r = tls_rounds(o, &job, &algn, &tls, &step);
	else
		r = daemons_job(o, NULL, NULL, &job, &algn, NULL, NULL, NULL, &step);
	if (r == 0) {
		progress("raw gloo all-reduce");
		step = "raw gloo";
		r = gloo_raw_allreduce(cfg->daemons, cfg, &shim_ms);
	}
	if (r == 0) {
		progress("the step alone: the fused reference, one bucket and all of them");
		step = "step reference";
		r = step_refs(cfg, step_ms);
	}
	if (r == 0) {
		progress("torch gloo all_reduce (the anchor)");
		if (run_torch_gloo(o, &gloo_ms) < 0) {
			fprintf(stderr,
				"zerod-bench: torch's gloo all_reduce did not run "
				"(no torch for %s?): gloo_iter_ms is null\n",
				o->python);
			gloo_ms = NAN;
		}
	}
	if (r < 0) {
		fprintf(stderr, "zerod-bench: %s: %s\n", step, zc_strerror(r));
		return 1;
	}
	print_daemons(o, &job, gloo_ms, shim_ms, step_ms, algn, load, cfg->tls ? &tls : NULL);
	return 0;
#else
	(void)o;
	(void)print_daemons;
	(void)run_torch_gloo;
	(void)step_refs;
	(void)tls_rounds;
	fprintf(stderr, "zerod-bench: --daemons is unavailable: zerod was built without gloo "
			"(libgloo-dev, -Dgloo)\n");
	return 2;
#endif
}

static int run(int argc, char **argv)
{
	struct opts o = {0};
	struct results x = {.torch = {NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN,
				      NAN, NAN, ""}};
	struct bench_daemon d = {0};
	struct bench_cfg *cfg = &o.cfg;
	const char *step = "", *ckpt_tmp = NULL;
	int r;

	if (argc == 7 && strcmp(argv[1], "--gpu-trainer") == 0) {
		/* one rank of --gpu's busbw job, exec'd by gpu.c: the defaults */
		char *none[] = {argv[0], NULL};
		return parse_args(1, none, &o) < 0 ? 2 : gpu_trainer_main(cfg, argv + 2);
	}
	r = parse_args(argc, argv, &o);
	if (r < 0) {
		usage(stderr);
		return 2;
	}
	if (o.gpu)
		return gpu_rows(cfg, o.json, o.python, o.anchor) < 0 ? 1 : 0;
	if (o.recovery)
		return bench_recovery(cfg, o.recovery, o.json) < 0 ? 1 : 0;
	if (cfg->daemons)
		return run_daemons(&o);
	x.state_bytes = 4ull * cfg->params * bench_state_floats(cfg);
	x.loadavg = loadavg();
	progress("floors: memcpy, triad, AF_UNIX round trip, fused reference");
	step = "memcpy";
	r = floor_memcpy_gbps(cfg->memcpy_bytes, &x.memcpy_gbps);
	if (r == 0) {
		/* Triad over as many bytes as an iteration moves, and each array
		 * at least twice the last-level cache, so that no pass runs from
		 * it; with plain and with non-temporal stores (floors.c). */
		size_t tb = (size_t)(floor_bytes_moved(cfg) / 3) & ~(size_t)63;
		size_t least = 2 * bench_llc_bytes();
		tb = tb > least ? tb : least;
		step = "triad";
		r = floor_triad_gbps(tb, cfg->threads, false, cfg->cold, &x.triad_gbps);
		if (r == 0)
			r = floor_triad_gbps(tb, cfg->threads, true, cfg->cold, &x.triad_nt_gbps);
	}
	if (r == 0) {
		/* Across two CPUs, as the handoff goes from trainer to daemon; on
		 * one CPU it is several times cheaper, and unpinned it is either. */
		int a, b;
		step = "AF_UNIX round trip";
		floor_two_cpus(&a, &b);
		r = floor_unix_rtt_us(10000, a, b >= 0 ? b : a, &x.unix_rtt_us);
		if (r == 0)
			r = floor_unix_rtt_us(10000, a, a, &x.unix_rtt_same_cpu_us);
	}
	if (r == 0) {
		step = "fused reference";
		r = floor_fused_ms(cfg, &x.fused_ms, &x.fused_min_ms);
	}
	if (r < 0)
		goto fail;
	x.floor_bytes = floor_bytes_moved(cfg);
	x.floor_wa_bytes = floor_bytes_moved_wa(cfg);
	x.floor_nt_ms = x.floor_bytes / x.triad_nt_gbps / 1e6;
	x.floor_wa_ms = x.floor_wa_bytes / (x.triad_gbps * 4.0 / 3.0) / 1e6;
	x.floor_ms = x.floor_nt_ms < x.floor_wa_ms ? x.floor_nt_ms : x.floor_wa_ms;
	x.shared.iter_ms = x.shared.iter_min_ms = x.floor_shared_ms = x.floor_shared_bytes = NAN;
	x.shared.fill_ms = x.shared.overlap_ms = x.shared.comparable_ms = NAN;
	if (o.shared_params) {
		x.state_bytes *= 2; /* the two jobs' (job_iterations) */
		x.floor_shared_bytes = floor_bytes_shared(cfg);
		/* nothing only written: both countings give these bytes; the
		 * lower of the two bandwidths' times */
		x.floor_shared_ms = x.floor_shared_bytes / x.triad_nt_gbps / 1e6;
		if (x.floor_shared_bytes / (x.triad_gbps * 4.0 / 3.0) / 1e6 < x.floor_shared_ms)
			x.floor_shared_ms = x.floor_shared_bytes / (x.triad_gbps * 4.0 / 3.0) / 1e6;
	}

	step = "starting zerod";
	r = daemon_start(&d, cfg->zerod);
	if (r == -ECHILD)
		fprintf(stderr, "zerod-bench: %s exited before it served (--zerod, $ZEROD_BIN)\n",
			cfg->zerod);
	if (r < 0) {
		dump_log(&d);
		daemon_stop(&d);
		goto fail;
	}
	progress("zerod: iterations");
	step = "iterations";
	ckpt_tmp = ckpt_tmp_make(cfg);
	r = cfg->checkpoint_every && !cfg->checkpoint_dir ? -errno
							  : job_iterations(&d, cfg, &x.job,
									   o.shared_params ? &x.shared
											   : NULL);
	if (ckpt_tmp)
		ckpt_tmp_remove(ckpt_tmp);
	if (r == 0) {
		progress("zerod: tiny-bucket handoff");
		step = "handoff";
		r = job_handoff(&d, cfg, &x.handoff_p50_us, &x.handoff_p99_us);
	}
	if (r < 0)
		dump_log(&d);
	if (daemon_stop(&d) != 0 && r == 0) {
		step = "stopping zerod";
		r = -ECHILD;
	}
	if (r < 0)
		goto fail;
	if (o.vs_torch) {
		progress("torch anchor");
		step = "torch anchor";
		r = run_torch(&o, &x.torch);
		if (r < 0)
			goto fail;
	}
	x.loadavg_end = loadavg();
	if (o.json)
		print_json(&o, &x);
	else
		print_table(&o, &x);
	return 0;
fail:
	fprintf(stderr, "zerod-bench: %s: %s\n", step, zc_strerror(r));
	return 1;
}

int main(int argc, char **argv)
{
	return run(argc, argv);
}
