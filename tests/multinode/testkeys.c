/* testkeys.c — see testkeys.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>

#include "testkeys.h"

int testkeys_make(const char *dir, const char *name, char pub[RDZV_CURVE_Z85_LEN + 1])
{
	uint8_t pk[RDZV_CURVE_KEY_BYTES], sk[RDZV_CURVE_KEY_BYTES];
	char path[512], z85[RDZV_CURVE_Z85_LEN + 1];
	int fd, r = 0;

	if (sodium_init() < 0)
		return -EIO;
	crypto_box_keypair(pk, sk);
	rdzv_curve_z85_encode(pk, pub);
	rdzv_curve_z85_encode(sk, z85);
	snprintf(path, sizeof(path), "%s/%s.key", dir, name);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if (dprintf(fd, "%s\n", z85) != RDZV_CURVE_Z85_LEN + 1)
		r = -EIO;
	close(fd);
	sodium_memzero(sk, sizeof(sk));
	return r;
}

struct rdzv_keys *testkeys_load(const char *dir, const char *name, const char *const *trust, int n)
{
	char sec[512], peers[512], err[256] = "";
	struct rdzv_keys *k = NULL;
	FILE *f;

	snprintf(sec, sizeof(sec), "%s/%s.key", dir, name);
	snprintf(peers, sizeof(peers), "%s/%s.peers", dir, name);
	f = fopen(peers, "we");
	if (!f)
		return NULL;
	for (int i = 0; i < n; i++)
		fprintf(f, "%s\n", trust[i]);
	fclose(f);
	if (rdzv_keys_load(sec, peers, &k, err, sizeof(err)) < 0) {
		printf("# keys %s: %s\n", name, err);
		return NULL;
	}
	return k;
}
