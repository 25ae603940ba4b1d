/* keygen.h — zeroctl keygen and zeroctl fingerprint (keygen.c). */
#ifndef ZEROCTL_KEYGEN_H
#define ZEROCTL_KEYGEN_H

#include <stdio.h>

/* Write PREFIX.key and PREFIX.crt; print the certificate's fingerprint to
 * out, errors to err. Returns zeroctl's exit status. */
int zeroctl_keygen(const char *prefix, FILE *out, FILE *err);
/* Print the fingerprint of the PEM certificate in file cert. */
int zeroctl_fingerprint(const char *cert, FILE *out, FILE *err);

#endif
