/*
 * testkeys.h — CURVE key pairs for tests of the sealed mesh, made with
 * libsodium as `zeroctl keygen` makes them, written as the files zerod
 * reads (--curve-secret-key, --curve-peers) and loaded by rdzvcurve.h.
 */
#ifndef ZEROD_TEST_TESTKEYS_H
#define ZEROD_TEST_TESTKEYS_H

#include "net/rdzvcurve.h"

/* A fresh pair: DIR/NAME.key (mode 0600) and its public key, Z85, in pub.
 * 0 or -errno. */
int testkeys_make(const char *dir, const char *name, char pub[RDZV_CURVE_Z85_LEN + 1]);

/* The keys of DIR/NAME.key trusting the n public keys given (written to
 * DIR/NAME.peers); NULL (with why on stdout) if they do not load. */
struct rdzv_keys *testkeys_load(const char *dir, const char *name, const char *const *trust, int n);

#endif
