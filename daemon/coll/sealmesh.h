/*
 * sealmesh.h — the mesh of coll/mesh.h over TCP with TLS 1.3 on every
 * connection (net/tls.h): the daemons' certificates authenticate both ends
 * of each connection and TLS's records encrypt and authenticate the data
 * both ways. coll/gloo.c takes it instead of gloo's plain TCP when this
 * daemon has a TLS identity. The wire format and the threat model are in
 * sealmesh.c's opening comment.
 */
#ifndef ZEROD_COLL_SEALMESH_H
#define ZEROD_COLL_SEALMESH_H

#include <stdbool.h>

#include "coll/mesh.h"

/* open() needs cfg->tls; cfg->ktls asks for kernel TLS. The process must
 * ignore SIGPIPE (zerod does): OpenSSL writes to the sockets with write(). */
extern const struct coll_mesh_ops coll_sealmesh_ops;

/* Whether the kernel encrypts what this mesh sends (send) or decrypts what
 * it receives (!send) on every one of its connections: kernel TLS asked
 * for (cfg->ktls) and taken by the kernel. False where the kernel has no
 * tls module, and always without cfg->ktls. Only for a mesh that
 * coll_sealmesh_ops opened; any thread, once open returned. */
bool coll_sealmesh_ktls(const struct coll_mesh *m, bool send);

#endif
