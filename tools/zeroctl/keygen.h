/* keygen.h — zeroctl keygen (keygen.c). */
#ifndef ZEROCTL_KEYGEN_H
#define ZEROCTL_KEYGEN_H

#include <stdio.h>

/* Write PREFIX.key and PREFIX.pub; print the public key to out, errors to
 * err. Returns zeroctl's exit status. */
int zeroctl_keygen(const char *prefix, FILE *out, FILE *err);

#endif
