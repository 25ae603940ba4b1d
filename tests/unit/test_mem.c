/*
 * test_mem.c — the host buffer backend's checks of a memfd (mem/shm.c,
 * MEM_FD), called as the daemon calls them: a sealed memfd of the owner's
 * maps, and what the daemon writes there the owner reads in its own
 * mapping; the owner check refuses a memfd whose creator is not the
 * trainer. The integration suite (test_buffers.c) makes a memfd of another
 * user only as root; here the trainer is another uid than the memfd's
 * creator by its description, so the check runs for every user.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "mem/mem.h"
#include "testlib.h"
#include "zeroclient.h"

#define BYTES 8192u

static int sealed_memfd(size_t bytes)
{
	int fd = memfd_create("test-mem", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	if (fd >= 0 && (ftruncate(fd, (off_t)bytes) < 0 ||
			fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0)) {
		close(fd);
		return -1;
	}
	return fd;
}

static int try_map(int fd, uid_t owner, uint64_t offset, struct mem_map **ret, char *err,
		   size_t errlen)
{
	struct mem_desc d = {
		.kind = MEM_FD, .fd = fd, .offset = offset, .bytes = BYTES, .owner = owner};

	*ret = NULL;
	return mem_shm_ops.map(&d, BYTES, ret, err, errlen);
}

static void t_own_memfd_maps(void)
{
	int fd = sealed_memfd(2 * BYTES);
	struct mem_map *m;
	char err[256] = "";
	float *mine;
	int r;

	REQUIRE(fd >= 0, "memfd");
	mine = mmap(NULL, BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, BYTES);
	REQUIRE(mine != MAP_FAILED, "mmap");
	r = try_map(fd, getuid(), BYTES, &m, err, sizeof(err));
	REQUIRE(r == 0, "map: %s: %s", zc_strerror_name(r), err);
	((float *)mem_shm_ops.ptr(m))[5] = 42.0f;
	CHECK(mine[5] == 42.0f, "the owner's mapping reads %g", mine[5]);
	mem_shm_ops.unmap(m);
	munmap(mine, BYTES);
	close(fd);
}

static void t_other_owner_refused(void)
{
	int fd = sealed_memfd(BYTES);
	struct mem_map *m;
	char err[256] = "", want[64];
	int r;

	REQUIRE(fd >= 0, "memfd");
	/* the trainer is uid + 1: the memfd (ours) is another user's to it */
	r = try_map(fd, getuid() + 1, 0, &m, err, sizeof(err));
	test_note("trainer uid %u -> %s: %s", (unsigned)getuid() + 1, zc_strerror_name(r), err);
	CHECK(r == ZC_EBUFFER && !m, "another user's memfd: %s", zc_strerror_name(r));
	snprintf(want, sizeof(want), "another user's buffer (uid %u)", (unsigned)getuid());
	CHECK(strstr(err, want), "the reason does not say \"%s\"", want);
	/* a trainer whose uid is unknown owns nothing */
	r = try_map(fd, (uid_t)-1, 0, &m, err, sizeof(err));
	CHECK(r == ZC_EBUFFER && !m, "unknown trainer uid: %s", zc_strerror_name(r));
	close(fd);
}

static void t_plan_size_mismatch_refused(void)
{
	int fd = sealed_memfd(BYTES);
	struct mem_desc d = {
		.kind = MEM_FD, .fd = fd, .offset = 0, .bytes = BYTES / 2, .owner = getuid()};
	struct mem_map *m = NULL;
	char err[256] = "";
	int r;

	REQUIRE(fd >= 0, "memfd");
	/* passed for a plan of BYTES / 2, registered with a plan of BYTES */
	r = mem_shm_ops.map(&d, BYTES, &m, err, sizeof(err));
	test_note("-> %s: %s", zc_strerror_name(r), err);
	CHECK(r == ZC_EBUFFER && !m && strstr(err, "the plan needs"), "%s", zc_strerror_name(r));
	close(fd);
}

static const struct test_case cases[] = {
	{"own_memfd_maps", t_own_memfd_maps},
	{"other_owner_refused", t_other_owner_refused},
	{"plan_size_mismatch_refused", t_plan_size_mismatch_refused},
};

TEST_MAIN(cases)
