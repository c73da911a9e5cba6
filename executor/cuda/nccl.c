/* NCCL's unique id (nccl.h), through libnccl opened at first use. The id
 * is an opaque 128-byte struct (ncclUniqueId); ncclGetUniqueId fills it
 * with the minting host's bootstrap address and a random magic. */
#include "executor/cuda/nccl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct {
  void *lib;
  char why[400];
  int (*get_unique_id)(void *id);
  const char *(*error_string)(int);
} nc;
static pthread_once_t nc_once = PTHREAD_ONCE_INIT;

static void load(void) {
  const char *env = getenv("KILN_NCCL_LIB");
  const char *file = env && env[0] ? env : "libnccl.so.2";
  nc.lib = dlopen(file, RTLD_NOW | RTLD_LOCAL);
  if (nc.lib == NULL) {
    const char *e = dlerror();
    snprintf(nc.why, sizeof nc.why, "NCCL is not installed here (%.300s)", e ? e : file);
    return;
  }
  nc.get_unique_id = (int (*)(void *))dlsym(nc.lib, "ncclGetUniqueId");
  nc.error_string = (const char *(*)(int))dlsym(nc.lib, "ncclGetErrorString");
  if (nc.get_unique_id == NULL)
    snprintf(nc.why, sizeof nc.why, "%.200s has no ncclGetUniqueId", file);
}

int kiln_nccl_mint_id(void *ctx, uint8_t *id, size_t n, kiln_status *st) {
  (void)ctx;
  if (n != KILN_NCCL_ID_BYTES)
    return kiln_status_set(st, KILN_EINVAL, "nccl", "an NCCL id is %d bytes, not %zu",
                           KILN_NCCL_ID_BYTES, n);
  pthread_once(&nc_once, load);
  if (nc.get_unique_id == NULL) return kiln_status_set(st, KILN_EUNAVAIL, "nccl", "%s", nc.why);
  uint8_t buf[KILN_NCCL_ID_BYTES];
  int r = nc.get_unique_id(buf);
  if (r != 0)
    return kiln_status_set(st, KILN_EUNAVAIL, "nccl", "ncclGetUniqueId failed: %s",
                           nc.error_string ? nc.error_string(r) : "?");
  memcpy(id, buf, n);
  return 0;
}
