/* Compiled executables kept by the server, by id: the loaded-executable
 * table in front of the executable cache (cache/cache.h).
 *
 * An executable's id is the hex of its cache key (cache/key.h: module,
 * signature, options, target, version), so identical Compile requests from
 * any client share one entry (the second is a memory hit). Entries are
 * reference counted: the table holds one, every Execute in flight another.
 * Past --max-executables entries or --executable-table-bytes of them the
 * least recently used entry nobody is running is evicted; CacheEvict drops entries nobody is
 * running.
 */
#ifndef KILN_SERVER_EXECUTABLES_H
#define KILN_SERVER_EXECUTABLES_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "server/server.h"

typedef struct kiln_module kiln_module;
typedef struct kiln_executable kiln_executable;
typedef struct kiln_loaded kiln_loaded;
typedef struct kiln_spmd_program kiln_spmd_program;
typedef struct kiln_comm kiln_comm;
typedef struct kiln_mesh kiln_mesh;

#define KILND_EXE_ID_LEN 64
/* A cpu executable loaded on an ordered set of devices as one gang
 * (executor/backend.h: a communicator and a mesh load on it). */
typedef struct kilnd_mesh_slot {
  uint32_t n;
  uint32_t *index; /* backend device indices, in rank order */
  kiln_comm *comm;
  kiln_mesh *mesh;
  bool busy;
  uint64_t used;
} kilnd_mesh_slot;

struct kilnd_exe {
  char id[KILND_EXE_ID_LEN + 1];
  int dev_class;       /* KILND_CLASS_CPU or KILND_CLASS_INTERP */
  uint32_t ndevices;   /* replicas x partitions: devices one run needs */
  kiln_module *module; /* verified, transformed: signature and interp runs */
  /* SPMD programs (ndevices > 1, docs/spmd.md). A global program (spmd set)
   * takes and returns global arrays: `module` is the global one (its
   * signature), spmd->module the per-device program exe was compiled from.
   * A per-device program (per_device) takes and returns arrays per device
   * (device K = replica * partitions + partition); `module` is it. */
  uint32_t replicas, partitions;
  bool per_device;
  kiln_spmd_program *spmd;
  /* cpu, ndevices > 1: loads on the device sets it ran on lately, one slot
   * per gang that fits on the class at once; under mu. */
  kilnd_mesh_slot *meshes;
  uint32_t nmeshes;
  uint64_t mesh_clock;
  kiln_executable *exe; /* cpu: the compiled code; NULL for interp */
  uint64_t peak_bytes;
  uint64_t bytes; /* memory it holds, as the table counts it (set at create) */
  /* cpu: built under CACHE_POLICY_BYPASS and so in no cache tier yet; the
   * first default-policy Compile that finds it here stores it. */
  atomic_bool uncached;
  /* Recent run time in ns, biased up (handlers_execute.c); 0: never ran. */
  _Atomic int64_t run_ns;
  /* cpu: the executable loaded per device, created on first use. */
  pthread_mutex_t mu;
  kiln_loaded **loaded;
  uint32_t nloaded;
  /* owned by the table */
  atomic_int refs;
  uint64_t last_used;
  struct kilnd_exe *next;
};

/* A table of at most `max` entries holding at most `max_bytes` together
 * (0: no byte bound); past either the least recently used entry nobody is
 * running is evicted. */
int kilnd_exes_create(uint32_t max, uint64_t max_bytes, kilnd_exes **out, kiln_status *st);
void kilnd_exes_destroy(kilnd_exes *t);

/* A new entry owning module and exe (either may be NULL on failure paths);
 * NULL on out-of-memory (module and exe are then freed). */
kilnd_exe *kilnd_exe_create(const char *id, int dev_class, uint32_t ndevices, kiln_module *module,
                            kiln_executable *exe, uint32_t ndevice_slots);
void kilnd_exe_unref(kilnd_exe *e);

/* Adds e. An entry of the same id already there is kept (e is freed and
 * *out is that entry) unless `replace`, when e takes its place (Executes
 * holding the old one finish with it). *out receives a reference. */
int kilnd_exes_insert(kilnd_exes *t, kilnd_exe *e, bool replace, kilnd_exe **out, kiln_status *st);
/* A reference to the entry `id`, KILN_ENOTFOUND when there is none. */
int kilnd_exes_get(kilnd_exes *t, const char *id, kilnd_exe **out, kiln_status *st);
uint32_t kilnd_exes_count(kilnd_exes *t);
/* Removes entry `id` (every entry when id is NULL) unless an Execute holds
 * it. Returns how many were removed; *busy (may be NULL) counts those kept
 * because they are running. */
uint32_t kilnd_exes_drop(kilnd_exes *t, const char *id, uint32_t *busy);

/* cpu entries: the executable loaded on device `index` of backend b. */
int kilnd_exe_loaded(kilnd_exe *e, kiln_backend *b, uint32_t index, kiln_loaded **out,
                     kiln_status *st);

/* The per-device module of an SPMD entry (spmd->module or module). */
const kiln_module *kilnd_exe_device_module(const kilnd_exe *e);

/* cpu entries with ndevices > 1: the executable loaded as one gang on
 * backend devices index[0..n) (rank r on index[r]), reused while the same
 * devices run it again. *slot is passed back to kilnd_exe_mesh_release once
 * the run is over. */
int kilnd_exe_mesh_acquire(kilnd_exe *e, kiln_backend *b, const uint32_t *index, uint32_t n,
                           kiln_mesh **out, int *slot, kiln_status *st);
void kilnd_exe_mesh_release(kilnd_exe *e, int slot);

/* Initializes libcrypto (SHA-256 and HMAC of the cache); called once from
 * main before threads start. */
void kilnd_sha256_init(void);

#endif /* KILN_SERVER_EXECUTABLES_H */
