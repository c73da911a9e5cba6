/* The executable table: a chained hash of ids under one mutex, with
 * least-recently-used eviction of entries no Execute holds.
 *
 * Loading a cpu executable on a device (dlopen of its code) happens at most
 * once per device, on first use, under the entry's own mutex so that loads
 * for different executables do not wait for each other.
 */
#include "server/executables.h"

#include <stdio.h>
#include <string.h>

#include <openssl/crypto.h>

#include "common/alloc.h"
#include "compiler/codegen/executable.h"
#include "compiler/ir/ir.h"
#include "compiler/spmd/spmd.h"
#include "executor/backend.h"

#define NBUCKETS 256

struct kilnd_exes {
  pthread_mutex_t mu;
  kilnd_exe *buckets[NBUCKETS];
  uint32_t n, max;
  uint64_t bytes, max_bytes; /* of the entries kept (kilnd_exe.bytes); the bound */
  uint64_t clock;            /* for last_used */
};

void kilnd_sha256_init(void) {
  /* On the main thread, before any other: libcrypto's lazy initialization
   * would otherwise read the system's OpenSSL configuration from whichever
   * compile thread hashes first and leave that thread's error state behind.
   * Hashing needs no configuration. */
  OPENSSL_init_crypto(OPENSSL_INIT_NO_LOAD_CONFIG, NULL);
}

static unsigned bucket_of(const char *id) {
  unsigned h = 0;
  for (int i = 0; i < 4 && id[i]; i++)
    h = h * 16 + (unsigned)(id[i] <= '9' ? id[i] - '0' : id[i] - 'a' + 10);
  return h % NBUCKETS;
}

int kilnd_exes_create(uint32_t max, uint64_t max_bytes, kilnd_exes **out, kiln_status *st) {
  *out = kiln_calloc(1, sizeof **out);
  if (*out == NULL) return kiln_status_set(st, KILN_ENOMEM, "executables", "out of memory");
  pthread_mutex_init(&(*out)->mu, NULL);
  (*out)->max = max;
  (*out)->max_bytes = max_bytes ? max_bytes : UINT64_MAX;
  return 0;
}

static void mesh_slot_clear(kilnd_mesh_slot *s) {
  kiln_mesh_destroy(s->mesh);
  kiln_comm_destroy(s->comm);
  kiln_free(s->index);
  memset(s, 0, sizeof *s);
}

static void exe_free(kilnd_exe *e) {
  for (uint32_t i = 0; e->meshes && i < e->nmeshes; i++) mesh_slot_clear(&e->meshes[i]);
  kiln_free(e->meshes);
  kiln_spmd_program_destroy(e->spmd);
  for (uint32_t i = 0; i < e->nloaded; i++) kiln_loaded_destroy(e->loaded[i]);
  kiln_free(e->loaded);
  kiln_executable_destroy(e->exe);
  kiln_module_destroy(e->module);
  pthread_mutex_destroy(&e->mu);
  kiln_free(e);
}

void kilnd_exes_destroy(kilnd_exes *t) {
  if (t == NULL) return;
  for (unsigned b = 0; b < NBUCKETS; b++)
    for (kilnd_exe *e = t->buckets[b], *next; e; e = next) {
      next = e->next;
      kilnd_exe_unref(e);
    }
  pthread_mutex_destroy(&t->mu);
  kiln_free(t);
}

kilnd_exe *kilnd_exe_create(const char *id, int dev_class, uint32_t ndevices, kiln_module *module,
                            kiln_executable *exe, uint32_t ndevice_slots) {
  kilnd_exe *e = kiln_calloc(1, sizeof *e);
  if (e) e->loaded = kiln_calloc(ndevice_slots ? ndevice_slots : 1, sizeof *e->loaded);
  if (e == NULL || e->loaded == NULL) {
    if (e) kiln_free(e);
    kiln_module_destroy(module);
    kiln_executable_destroy(exe);
    return NULL;
  }
  snprintf(e->id, sizeof e->id, "%s", id);
  e->dev_class = dev_class;
  e->ndevices = ndevices;
  e->module = module;
  e->exe = exe;
  e->nloaded = ndevice_slots;
  /* The module, the executable (its tables and code in its arena) and the
   * code once more for the one device a program is usually loaded on. */
  e->bytes = sizeof *e + (module ? kiln_arena_used(module->arena) : 0) +
             (exe ? kiln_arena_used(exe->arena) + exe->ncode : 0);
  pthread_mutex_init(&e->mu, NULL);
  atomic_store(&e->refs, 1);
  return e;
}

void kilnd_exe_unref(kilnd_exe *e) {
  if (e && atomic_fetch_sub(&e->refs, 1) == 1) exe_free(e);
}

/* Under the lock: drops the least recently used entry only the table
 * holds. False when every entry is in use. */
static bool evict_one(kilnd_exes *t) {
  kilnd_exe **victim = NULL;
  for (unsigned b = 0; b < NBUCKETS; b++)
    for (kilnd_exe **pp = &t->buckets[b]; *pp; pp = &(*pp)->next)
      if (atomic_load(&(*pp)->refs) == 1 &&
          (victim == NULL || (*pp)->last_used < (*victim)->last_used))
        victim = pp;
  if (victim == NULL) return false;
  kilnd_exe *e = *victim;
  *victim = e->next;
  t->n--;
  t->bytes -= e->bytes;
  kilnd_exe_unref(e);
  return true;
}

/* Under the lock: evicts until `bytes` more fit under both bounds with
 * `more` entries more. False when what is in use leaves no room. */
static bool make_room(kilnd_exes *t, uint32_t more, uint64_t bytes) {
  while (t->n + more > t->max || t->bytes + bytes > t->max_bytes)
    if (!evict_one(t)) return false;
  return true;
}

static kilnd_exe *find_locked(kilnd_exes *t, const char *id) {
  kilnd_exe *e = t->buckets[bucket_of(id)];
  while (e && strcmp(e->id, id) != 0) e = e->next;
  return e;
}

int kilnd_exes_insert(kilnd_exes *t, kilnd_exe *e, bool replace, kilnd_exe **out, kiln_status *st) {
  *out = NULL;
  pthread_mutex_lock(&t->mu);
  kilnd_exe **pp = &t->buckets[bucket_of(e->id)];
  while (*pp && strcmp((*pp)->id, e->id) != 0) pp = &(*pp)->next;
  kilnd_exe *old = *pp, *drop = NULL;
  int rc = 0;
  if (old && !replace) {
    atomic_fetch_add(&old->refs, 1);
    old->last_used = ++t->clock;
    *out = old;
    drop = e;
  } else if (e->bytes > t->max_bytes) {
    rc = kiln_status_set(st, KILN_ELIMIT, "executables",
                         "the executable takes %llu bytes, more than the whole table may hold "
                         "(%llu, executable-table-bytes)",
                         (unsigned long long)e->bytes, (unsigned long long)t->max_bytes);
    drop = e;
  } else if (old) {
    e->next = old->next;
    *pp = e;
    e->last_used = ++t->clock;
    atomic_fetch_add(&e->refs, 1); /* the table's and the caller's */
    *out = e;
    drop = old;
    t->bytes += e->bytes - old->bytes;
    make_room(t, 0, 0); /* a bigger replacement: others go, if they can */
  } else if (!make_room(t, 1, e->bytes)) {
    if (t->n >= t->max)
      rc = kiln_status_set(st, KILN_ELIMIT, "executables",
                           "%u executables are kept and all are in use (max-executables)", t->n);
    else
      rc = kiln_status_set(st, KILN_ELIMIT, "executables",
                           "%llu bytes of executables are kept and in use; %llu more do not fit "
                           "in %llu (executable-table-bytes)",
                           (unsigned long long)t->bytes, (unsigned long long)e->bytes,
                           (unsigned long long)t->max_bytes);
    drop = e;
  } else {
    unsigned b = bucket_of(e->id);
    e->next = t->buckets[b];
    t->buckets[b] = e;
    t->n++;
    t->bytes += e->bytes;
    e->last_used = ++t->clock;
    atomic_fetch_add(&e->refs, 1);
    *out = e;
  }
  pthread_mutex_unlock(&t->mu);
  kilnd_exe_unref(drop);
  return rc;
}

int kilnd_exes_get(kilnd_exes *t, const char *id, kilnd_exe **out, kiln_status *st) {
  pthread_mutex_lock(&t->mu);
  kilnd_exe *e = strlen(id) == KILND_EXE_ID_LEN ? find_locked(t, id) : NULL;
  if (e) {
    atomic_fetch_add(&e->refs, 1);
    e->last_used = ++t->clock;
  }
  pthread_mutex_unlock(&t->mu);
  *out = e;
  if (e == NULL)
    return kiln_status_set(st, KILN_ENOTFOUND, "executable_id",
                           "unknown executable id '%.80s' (compile it first)", id);
  return 0;
}

uint32_t kilnd_exes_drop(kilnd_exes *t, const char *id, uint32_t *busy) {
  uint32_t dropped = 0, running = 0;
  kilnd_exe *gone = NULL; /* unreferenced outside the lock: freeing unloads code */
  pthread_mutex_lock(&t->mu);
  for (unsigned b = id ? bucket_of(id) : 0; b < NBUCKETS; b++) {
    for (kilnd_exe **pp = &t->buckets[b]; *pp;) {
      kilnd_exe *e = *pp;
      if (id && strcmp(e->id, id) != 0) {
        pp = &e->next;
      } else if (atomic_load(&e->refs) > 1) {
        running++;
        pp = &e->next;
      } else {
        *pp = e->next;
        e->next = gone;
        gone = e;
        t->n--;
        t->bytes -= e->bytes;
        dropped++;
      }
    }
    if (id) break;
  }
  pthread_mutex_unlock(&t->mu);
  while (gone) {
    kilnd_exe *next = gone->next;
    kilnd_exe_unref(gone);
    gone = next;
  }
  if (busy) *busy = running;
  return dropped;
}

uint32_t kilnd_exes_count(kilnd_exes *t) {
  pthread_mutex_lock(&t->mu);
  uint32_t n = t->n;
  pthread_mutex_unlock(&t->mu);
  return n;
}

int kilnd_exe_loaded(kilnd_exe *e, kiln_backend *b, uint32_t index, kiln_loaded **out,
                     kiln_status *st) {
  *out = NULL;
  if (e->exe == NULL || b == NULL || index >= e->nloaded)
    return kiln_status_set(st, KILN_EINTERNAL, "execute", "no code for device %u", index);
  pthread_mutex_lock(&e->mu);
  int rc = 0;
  if (e->loaded[index] == NULL)
    rc = kiln_device_load(kiln_backend_device(b, index), e->exe, &e->loaded[index], st);
  *out = e->loaded[index];
  pthread_mutex_unlock(&e->mu);
  return rc;
}

const kiln_module *kilnd_exe_device_module(const kilnd_exe *e) {
  return e->spmd ? e->spmd->module : e->module;
}

/* Under e->mu: loads e on the devices into slot s (emptied first). */
static int mesh_slot_fill(kilnd_exe *e, kilnd_mesh_slot *s, kiln_backend *b, const uint32_t *index,
                          uint32_t n, kiln_status *st) {
  mesh_slot_clear(s);
  kiln_device **devs = kiln_calloc(n, sizeof *devs);
  s->index = kiln_calloc(n, sizeof *s->index);
  int rc = 0;
  if (devs == NULL || s->index == NULL)
    rc = kiln_status_set(st, KILN_ENOMEM, "execute", "out of memory loading a mesh");
  for (uint32_t r = 0; rc == 0 && r < n; r++) {
    s->index[r] = index[r];
    if ((devs[r] = kiln_backend_device(b, index[r])) == NULL)
      rc = kiln_status_set(st, KILN_EINTERNAL, "execute", "no device %u", index[r]);
  }
  if (rc == 0) rc = kiln_comm_create(b, devs, n, &s->comm, st);
  if (rc == 0) rc = kiln_comm_load(s->comm, e->exe, &s->mesh, st);
  kiln_free(devs);
  if (rc) {
    mesh_slot_clear(s);
    return rc;
  }
  s->n = n;
  return 0;
}

int kilnd_exe_mesh_acquire(kilnd_exe *e, kiln_backend *b, const uint32_t *index, uint32_t n,
                           kiln_mesh **out, int *slot, kiln_status *st) {
  *out = NULL;
  *slot = -1;
  if (e->exe == NULL || b == NULL || n == 0)
    return kiln_status_set(st, KILN_EINTERNAL, "execute", "no code for a mesh of %u devices", n);
  pthread_mutex_lock(&e->mu);
  int rc = 0;
  if (e->meshes == NULL) {
    e->nmeshes = e->nloaded / n ? e->nloaded / n : 1;
    if ((e->meshes = kiln_calloc(e->nmeshes, sizeof *e->meshes)) == NULL)
      rc = kiln_status_set(st, KILN_ENOMEM, "execute", "out of memory");
  }
  kilnd_mesh_slot *pick = NULL;
  for (uint32_t i = 0; rc == 0 && i < e->nmeshes; i++) {
    kilnd_mesh_slot *s = &e->meshes[i];
    if (!s->busy && s->mesh && s->n == n && memcmp(s->index, index, n * sizeof *index) == 0) {
      pick = s;
      break;
    }
  }
  /* Otherwise the least recently used idle slot (an empty one first).
   * There are as many slots as gangs of n fit on the class's devices at
   * once, so one is always idle. */
  for (uint32_t i = 0; rc == 0 && pick == NULL && i < e->nmeshes; i++) {
    kilnd_mesh_slot *s = &e->meshes[i];
    if (!s->busy && (pick == NULL || s->mesh == NULL || (pick->mesh && s->used < pick->used)))
      pick = s;
  }
  if (rc == 0 && pick == NULL)
    rc = kiln_status_set(st, KILN_EINTERNAL, "execute",
                         "every mesh load of this program is in use (%u at once)", e->nmeshes);
  if (rc == 0 &&
      (pick->mesh == NULL || pick->n != n || memcmp(pick->index, index, n * sizeof *index) != 0))
    rc = mesh_slot_fill(e, pick, b, index, n, st);
  if (rc == 0) {
    pick->busy = true;
    pick->used = ++e->mesh_clock;
    *out = pick->mesh;
    *slot = (int)(pick - e->meshes);
  }
  pthread_mutex_unlock(&e->mu);
  return rc;
}

void kilnd_exe_mesh_release(kilnd_exe *e, int slot) {
  if (slot < 0 || (uint32_t)slot >= e->nmeshes) return;
  pthread_mutex_lock(&e->mu);
  e->meshes[slot].busy = false;
  pthread_mutex_unlock(&e->mu);
}
