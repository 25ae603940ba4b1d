/*
 * keygen.c — `zeroctl keygen [PREFIX]`: a CURVE key pair for zerod's
 * rendezvous between daemons (zerod --curve-secret-key, --curve-peers), made
 * by libzmq's zmq_curve_keypair, so the keys are ZeroMQ's Z85 ones. Writes
 * PREFIX.key (the secret key, mode 0600, never over an existing file) and
 * PREFIX.pub (the public key, for the other nodes' --curve-peers files), and
 * prints the public key. Needs no zerod.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "keygen.h"

static int write_new(const char *path, mode_t mode, const char *comment, const char *key)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
	char buf[256];
	int n, r = 0;

	if (fd < 0)
		return -errno;
	n = snprintf(buf, sizeof(buf), "# %s\n%s\n", comment, key);
	if (fchmod(fd, mode) < 0 || write(fd, buf, (size_t)n) != n || fsync(fd) < 0)
		r = errno ? -errno : -EIO;
	explicit_bzero(buf, sizeof(buf));
	if (close(fd) < 0 && !r)
		r = -errno;
	if (r < 0)
		unlink(path);
	return r;
}

int zeroctl_keygen(const char *prefix, FILE *out, FILE *err)
{
	char pub[41], sec[41], path[4096], pubpath[4096];
	int r;

	if (strlen(prefix) + 5 >= sizeof(path) || !*prefix) {
		fprintf(err, "zeroctl: keygen: a prefix of 1..%zu characters\n", sizeof(path) - 6);
		return 64;
	}
	if (zmq_curve_keypair(pub, sec) != 0) {
		fprintf(err, "zeroctl: keygen: this libzmq has no CURVE: %s\n",
			zmq_strerror(zmq_errno()));
		return 1;
	}
	snprintf(path, sizeof(path), "%s.key", prefix);
	snprintf(pubpath, sizeof(pubpath), "%s.pub", prefix);
	r = write_new(path, 0600,
		      "zerod CURVE secret key (zerod --curve-secret-key); keep it mode 0600", sec);
	explicit_bzero(sec, sizeof(sec));
	if (r < 0) {
		fprintf(err, "zeroctl: keygen: %s: %s\n", path, strerror(-r));
		return 1;
	}
	r = write_new(
		pubpath, 0644,
		"zerod CURVE public key: add this line to the other nodes' --curve-peers file",
		pub);
	if (r < 0) {
		fprintf(err, "zeroctl: keygen: %s: %s\n", pubpath, strerror(-r));
		unlink(path);
		return 1;
	}
	fprintf(out, "%s\n", pub);
	return 0;
}
