/*
 * filestore.h — a struct coll_store over files in one directory, for test
 * "nodes" that are processes of one machine: set writes a file and renames
 * it into place (readers never see half a value), get polls for it. The
 * daemon's own store is the rendezvous; this one only stands in for it.
 */
#ifndef ZEROD_TEST_FILESTORE_H
#define ZEROD_TEST_FILESTORE_H

#include "coll/coll.h"

/* A store in dir (which must exist); the path is copied. Aborts on ENOMEM. */
struct coll_store filestore_new(const char *dir);
void filestore_free(struct coll_store *s);

#endif
