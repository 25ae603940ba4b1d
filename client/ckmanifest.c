/*
 * ckmanifest.c — a checkpoint's manifest read back: its parser (every line
 * checked, the checksum first), the match of what it lists with a plan's
 * segments, and the iteration of a directory's current checkpoint.
 *
 * Runs on the caller's thread (zc_restore, zc_checkpoint_wait).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bufs.h"
#include "internal.h"
#include "plan.h"
#include "zeroclient.h"
#include "ckpt.h"

/* The checksum line of a manifest's text, and the text before it checked
 * against it: 0 with the text cut there, or ZC_ECKPT with the reason. */
static int manifest_checksum(char *text, const char *fn)
{
	char *sum = strstr(text, "checksum ");
	unsigned char h[CKPT_HASH_BYTES], want[CKPT_HASH_BYTES];

	while (sum && sum != text && sum[-1] != '\n')
		sum = strstr(sum + 1, "checksum ");
	if (!sum || ckpt_unhex(sum + 9, want) < 0)
		return client_err_set(ZC_ECKPT,
				      "%s: the manifest has no checksum line: partial or not "
				      "a checkpoint",
				      fn);
	crypto_generichash(h, sizeof(h), (const unsigned char *)text, (size_t)(sum - text), NULL,
			   0);
	if (sodium_memcmp(h, want, sizeof(h)) != 0)
		return client_err_set(ZC_ECKPT,
				      "%s: the manifest's checksum does not match its contents "
				      "(corrupt)",
				      fn);
	*sum = '\0';
	return 0;
}

/* What parsing a manifest has seen so far. */
struct mparse {
	unsigned version, ngroups_seen, nsegs_seen;
	bool file_seen;
};

/* A file line: name, x bytes, checksum hx. 0, or ZC_ECKPT with the reason. */
static int manifest_file(const char *name, uint64_t x, const char *hx, struct manifest *m,
			 struct mparse *st, const char *fn)
{
	char wname[32];

	if (st->version == CKPT_VERSION_NODES) {
		if (!m->files && m->nodes >= 1 && m->nodes <= CKPT_MAX_NODES)
			m->files = calloc(m->nodes, sizeof(*m->files));
		if (!m->files || m->nfiles >= m->nodes)
			return client_err_set(ZC_ECKPT, "%s: manifest: file %s beyond its %u nodes",
					      fn, name, m->nodes);
		snprintf(wname, sizeof(wname), "node-%u.zck", m->nfiles);
		if (strcmp(name, wname) != 0 || ckpt_unhex(hx, m->files[m->nfiles].hash) < 0)
			return client_err_set(ZC_ECKPT, "%s: manifest: file %s where %s belongs",
					      fn, name, wname);
		m->files[m->nfiles++].bytes = x;
		st->file_seen = m->nfiles == m->nodes;
	} else {
		if (strcmp(name, CKPT_DATA) != 0 || ckpt_unhex(hx, m->data_hash) < 0)
			return client_err_set(ZC_ECKPT, "%s: manifest: unknown file %s", fn, name);
		m->data_bytes = x;
		st->file_seen = true;
	}
	return 0;
}

/* One line of a manifest (its newline cut): 0, -ENOMEM, or ZC_ECKPT with
 * the reason. */
static int manifest_line(const char *line, struct manifest *m, struct mparse *st, const char *fn)
{
	unsigned a, b, c, ng, nsegs;
	uint64_t id, numel, x;
	double step;
	char name[64], hx[2 * CKPT_HASH_BYTES + 1];

	if (sscanf(line, "zerod-checkpoint %u", &st->version) == 1) {
		if (st->version != CKPT_VERSION && st->version != CKPT_VERSION_NODES)
			return client_err_set(ZC_ECKPT,
					      "%s: format version %u; this library reads %d and %d",
					      fn, st->version, CKPT_VERSION, CKPT_VERSION_NODES);
		m->version = st->version;
	} else if (sscanf(line, "iteration %" SCNu64, &m->iteration) == 1 ||
		   sscanf(line, "world %u", &m->world) == 1 ||
		   sscanf(line, "nodes %u", &m->nodes) == 1 ||
		   sscanf(line, "plan_hash %" SCNx64, &m->plan_hash) == 1 ||
		   sscanf(line, "job %64s", m->job) == 1 ||
		   sscanf(line, "optimizer %31s", m->optimizer) == 1 ||
		   sscanf(line, "shard_mode %31s", m->shard) == 1 ||
		   sscanf(line, "step_mode %31s", m->step_mode) == 1) {
	} else if (sscanf(line, "groups %u", &ng) == 1) {
		if (m->group_momentum || ng > PLAN_MAX_GROUPS)
			return client_err_set(ZC_ECKPT, "%s: manifest: bad groups line", fn);
		m->ngroups = ng;
		m->group_momentum = calloc(ng ? ng : 1, 1);
		m->group_amsgrad = calloc(ng ? ng : 1, 1);
		if (!m->group_momentum || !m->group_amsgrad)
			return -ENOMEM;
	} else if (sscanf(line, "group %u momentum %u amsgrad %u", &a, &b, &c) == 3) {
		if (!m->group_momentum || a != st->ngroups_seen || a >= m->ngroups)
			return client_err_set(ZC_ECKPT, "%s: manifest: group %u out of order", fn,
					      a);
		m->group_momentum[a] = (uint8_t)b;
		m->group_amsgrad[a] = (uint8_t)c;
		st->ngroups_seen++;
	} else if (sscanf(line, "segments %u", &nsegs) == 1) {
		if (m->segs || nsegs > PLAN_MAX_SEGMENTS)
			return client_err_set(ZC_ECKPT, "%s: manifest: bad segments line", fn);
		m->nsegs = nsegs;
		m->segs = calloc(nsegs ? nsegs : 1, sizeof(*m->segs));
		if (!m->segs)
			return -ENOMEM;
	} else if (sscanf(line,
			  "segment %u param_id %" SCNu64 " numel %" SCNu64
			  " group %u present %u step %lf",
			  &a, &id, &numel, &b, &c, &step) == 6) {
		if (!m->segs || a != st->nsegs_seen || a >= m->nsegs || numel > PLAN_MAX_NUMEL)
			return client_err_set(ZC_ECKPT, "%s: manifest: segment %u out of order", fn,
					      a);
		m->segs[a] = (struct cseg){
			.param_id = id, .numel = numel, .group = b, .present = c, .step = step};
		st->nsegs_seen++;
	} else if (st->version == CKPT_VERSION_NODES &&
		   sscanf(line, "segment %u param_id %" SCNu64 " numel %" SCNu64 " group %u", &a,
			  &id, &numel, &b) == 4) {
		/* version 2: the keys and steps are in the node files */
		if (!m->segs || a != st->nsegs_seen || a >= m->nsegs || numel > PLAN_MAX_NUMEL)
			return client_err_set(ZC_ECKPT, "%s: manifest: segment %u out of order", fn,
					      a);
		m->segs[a] = (struct cseg){.param_id = id, .numel = numel, .group = b};
		st->nsegs_seen++;
	} else if (sscanf(line, "file %63s %" SCNu64 " %64s", name, &x, hx) == 3) {
		return manifest_file(name, x, hx, m, st, fn);
	} else {
		return client_err_set(ZC_ECKPT, "%s: manifest: a line it does not know: \"%.60s\"",
				      fn, line);
	}
	return 0;
}

/* Parse and check a manifest's text: 0, or ZC_ECKPT with the reason. */
static int parse_manifest(char *text, size_t len, struct manifest *m, const char *fn)
{
	struct mparse st = {0};
	char *line = text, *next;
	int r;

	r = manifest_checksum(text, fn);
	if (r < 0)
		return r;
	(void)len;
	for (; *line; line = next) {
		next = strchr(line, '\n');
		if (!next)
			return client_err_set(ZC_ECKPT, "%s: the manifest's last line is cut", fn);
		*next++ = '\0';
		r = manifest_line(line, m, &st, fn);
		if (r < 0)
			return r;
	}
	if (m->iteration > (1ull << 53))
		return client_err_set(ZC_ECKPT, "%s: manifest: iteration %" PRIu64 " is above 2^53",
				      fn, m->iteration);
	if (!st.version || !m->group_momentum || !m->segs || !st.file_seen ||
	    st.ngroups_seen != m->ngroups || st.nsegs_seen != m->nsegs || !m->world)
		return client_err_set(ZC_ECKPT, "%s: the manifest lacks %s", fn,
				      !st.version ? "its version line"
				      : !m->group_momentum || st.ngroups_seen != m->ngroups
					      ? "groups"
				      : !m->segs || st.nsegs_seen != m->nsegs ? "segments"
				      : !st.file_seen ? "a file line (one per node)"
						      : "the world");
	return 0;
}

/* Map each of the plan's segments (plan order) to the checkpoint's: by
 * param_id when every segment of both has one, else by position. Checks
 * that the parameters are the same: 0 or ZC_ECKPT naming the difference. */
int ckpt_match(const struct plan *p, const struct manifest *m, uint32_t *map, const char *fn)
{
	uint32_t n = ckpt_plan_nsegs(p);
	bool ids = true;

	if (strcmp(m->optimizer, plan_optimizer_name(p->optimizer)) != 0)
		return client_err_set(ZC_ECKPT,
				      "%s: the checkpoint is of optimizer %s, the plan's is %s", fn,
				      m->optimizer, plan_optimizer_name(p->optimizer));
	if (m->ngroups != p->ngroups)
		return client_err_set(ZC_ECKPT,
				      "%s: the checkpoint has %u parameter groups, the plan %u", fn,
				      m->ngroups, p->ngroups);
	for (uint32_t g = 0; g < p->ngroups; g++)
		if (m->group_momentum[g] != (p->groups[g].momentum != 0) ||
		    m->group_amsgrad[g] != (p->groups[g].amsgrad ? 1 : 0))
			return client_err_set(
				ZC_ECKPT,
				"%s: group %u: the checkpoint's has momentum %s and amsgrad "
				"%s, the plan's not: its state has other tensors",
				fn, g, m->group_momentum[g] ? "!= 0" : "0",
				m->group_amsgrad[g] ? "on" : "off");
	if (m->nsegs != n)
		return client_err_set(ZC_ECKPT, "%s: the checkpoint has %u segments, the plan %u",
				      fn, m->nsegs, n);
	for (uint32_t k = 0; k < n; k++) {
		uint32_t b, s;
		ids = ids && ckpt_plan_seg(p, k, &b, &s)->param_id != 0 && m->segs[k].param_id != 0;
	}
	for (uint32_t k = 0; k < n; k++) {
		uint32_t b, s, at = k;
		const struct zc_segment *seg = ckpt_plan_seg(p, k, &b, &s);
		if (ids) {
			for (at = 0; at < n && m->segs[at].param_id != seg->param_id; at++)
				;
			if (at == n)
				return client_err_set(
					ZC_ECKPT,
					"%s: buckets[%u].segments[%u]: param_id %" PRIu64
					" is not in the checkpoint",
					fn, b, s, seg->param_id);
		}
		if (m->segs[at].numel != seg->numel || m->segs[at].group != seg->group)
			return client_err_set(
				ZC_ECKPT,
				"%s: buckets[%u].segments[%u]: numel %" PRIu64
				" group %u, the checkpoint's segment %u (by %s): numel %" PRIu64
				" group %u",
				fn, b, s, seg->numel, seg->group, at, ids ? "param_id" : "position",
				m->segs[at].numel, m->segs[at].group);
		map[k] = at;
	}
	if (ids) /* two of the plan's segments on one of the checkpoint's */
		for (uint32_t k = 0; k < n; k++)
			for (uint32_t i = k + 1; i < n; i++)
				if (map[i] == map[k])
					return client_err_set(ZC_ECKPT,
							      "%s: param_id %" PRIu64 " twice", fn,
							      m->segs[map[k]].param_id);
	return 0;
}

int ckpt_read_manifest(int dirfd, const char *dir, struct manifest *m, const char *fn)
{
	char *text = NULL;
	size_t len = 0;
	mode_t mode = 0;
	int r = ckpt_read_file(dirfd, CKPT_MANIFEST, CKPT_MAX_MANIFEST, &text, &len, &mode);

	if (r < 0)
		return client_err_set(ZC_ECKPT, "%s: %s/%s: %s%s", fn, dir, CKPT_MANIFEST,
				      ckpt_read_why(r, mode),
				      r == -ENOENT ? " (no checkpoint, or one not finished)" : "");
	r = parse_manifest(text, len, m, fn);
	free(text);
	return r;
}

int ckpt_current_iteration(const char *dir, uint64_t *ret, const char *fn)
{
	struct manifest m = {0};
	char where[PATH_MAX];
	int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), gfd = -1, r;

	if (dirfd < 0)
		return client_err_set(ZC_ECKPT, "%s: %s: %s", fn, dir, strerror(errno));
	r = gen_open_current(dirfd, dir, &gfd, where, sizeof(where), fn);
	if (r >= 0)
		r = ckpt_read_manifest(gfd, where, &m, fn);
	if (r >= 0)
		*ret = m.iteration;
	manifest_free(&m);
	if (gfd >= 0)
		close(gfd);
	close(dirfd);
	return r;
}
