/*
 * sealmesh.h — the mesh of coll/mesh.h over plain TCP with every byte
 * sealed: the daemons' CURVE keys (rdzvcurve.h) authenticate both ends of
 * each connection and libsodium's secretstream encrypts and authenticates
 * the data both ways. coll/gloo.c takes it instead of gloo's plain TCP when
 * this daemon has CURVE keys. The wire format and the threat model are in
 * sealmesh.c's opening comment.
 */
#ifndef ZEROD_COLL_SEALMESH_H
#define ZEROD_COLL_SEALMESH_H

#include "coll/mesh.h"

/* Bytes of data per sealed frame. */
#define SEALMESH_CHUNK (256u << 10)

/* open() needs cfg->keys. */
extern const struct coll_mesh_ops coll_sealmesh_ops;

#endif
