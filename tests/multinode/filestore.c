/* filestore.c — see filestore.h. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "filestore.h"

/* dir/key with '/' in the key made '_' */
static int key_path(const char *dir, const char *key, char *buf, size_t len)
{
	int n = snprintf(buf, len, "%s/", dir);

	if (n < 0 || (size_t)n + strlen(key) + 1 > len)
		return -ENAMETOOLONG;
	for (const char *k = key; *k; k++)
		buf[n++] = *k == '/' ? '_' : *k;
	buf[n] = '\0';
	return 0;
}

static int fs_set(void *ctx, const char *key, const void *value, size_t len)
{
	char path[PATH_MAX], tmp[PATH_MAX + 32];
	int r = key_path(ctx, key, path, sizeof(path)), fd;

	if (r < 0)
		return r;
	snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if (write(fd, value, len) != (ssize_t)len) {
		r = -EIO;
		close(fd);
		unlink(tmp);
		return r;
	}
	close(fd);
	return rename(tmp, path) < 0 ? -errno : 0;
}

static int fs_get(void *ctx, const char *key, int timeout_ms, void **ret_value, size_t *ret_len)
{
	char path[PATH_MAX];
	int r = key_path(ctx, key, path, sizeof(path));
	int64_t end = now_ms() + timeout_ms;
	struct stat st;
	void *v;
	int fd;

	if (r < 0)
		return r;
	while ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
		if (errno != ENOENT)
			return -errno;
		if (now_ms() >= end)
			return -ETIMEDOUT;
		poll(NULL, 0, 5);
	}
	if (fstat(fd, &st) < 0 || !(v = malloc((size_t)st.st_size + 1))) {
		close(fd);
		return -ENOMEM;
	}
	if (read(fd, v, (size_t)st.st_size) != st.st_size) {
		free(v);
		close(fd);
		return -EIO;
	}
	close(fd);
	*ret_value = v;
	*ret_len = (size_t)st.st_size;
	return 0;
}

struct coll_store filestore_new(const char *dir)
{
	char *d = strdup(dir);

	if (!d)
		abort();
	return (struct coll_store){.ctx = d, .set = fs_set, .get = fs_get};
}

void filestore_free(struct coll_store *s)
{
	free(s->ctx);
	s->ctx = NULL;
}
