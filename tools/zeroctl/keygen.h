/* keygen.h — zeroctl keygen and zeroctl fingerprint (keygen.c). */
#ifndef ZEROCTL_KEYGEN_H
#define ZEROCTL_KEYGEN_H

#include <stdio.h>

/* Write PREFIX.key (an Ed25519 key) and PREFIX.crt (its self-signed
 * certificate); print the certificate's fingerprint to out, errors to err.
 * Returns zeroctl's exit status. */
int zeroctl_keygen(const char *prefix, FILE *out, FILE *err);

/* Print the fingerprint of the PEM certificate in the file path to out,
 * errors to err. Returns zeroctl's exit status. */
int zeroctl_fingerprint(const char *path, FILE *out, FILE *err);

#endif
