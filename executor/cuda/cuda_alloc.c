/* The caching device allocator and the pure launch helpers (cuda_alloc.h).
 * No driver here: raw_alloc/raw_free are the device's, or a test's.
 */
#include "executor/cuda/cuda_alloc.h"

#include <stdio.h>
#include <string.h>

#include "common/alloc.h"

/* ---- size classes -------------------------------------------------------- */

bool kiln__cuda_size_class(uint64_t bytes, uint64_t *rounded, uint32_t *list) {
  if (bytes <= KILN__CUDA_SMALL_MAX) {
    uint64_t c = KILN__CUDA_MIN_BLOCK;
    uint32_t i = 0;
    while (c < bytes) {
      c <<= 1;
      i++;
    }
    *rounded = c;
    *list = i;
    return true;
  }
  if (bytes > UINT64_MAX - (KILN__CUDA_LARGE_STEP - 1)) return false;
  *rounded = (bytes + KILN__CUDA_LARGE_STEP - 1) / KILN__CUDA_LARGE_STEP * KILN__CUDA_LARGE_STEP;
  *list = KILN__CUDA_NSMALL;
  return true;
}

/* ---- the allocator ------------------------------------------------------- */

void kiln__cuda_allocator_init(kiln__cuda_allocator *a, uint64_t budget,
                               int (*raw_alloc)(void *, uint64_t, uint64_t *, kiln_status *),
                               void (*raw_free)(void *, uint64_t), void *ctx, const char *what,
                               const char *budget_name) {
  memset(a, 0, sizeof *a);
  pthread_mutex_init(&a->mu, NULL);
  a->budget = budget;
  a->raw_alloc = raw_alloc;
  a->raw_free = raw_free;
  a->ctx = ctx;
  a->what = what ? what : "cuda";
  a->budget_name = budget_name ? budget_name : "the device memory budget";
}

/* Frees the cached blocks; a->mu held. */
static void trim_locked(kiln__cuda_allocator *a) {
  for (uint32_t i = 0; i <= KILN__CUDA_NSMALL; i++) {
    while (a->free[i]) {
      kiln__cuda_block *b = a->free[i];
      a->free[i] = b->next;
      a->cached -= b->bytes;
      a->raw_free(a->ctx, b->ptr);
      kiln_free(b);
    }
  }
}

void kiln__cuda_allocator_trim(kiln__cuda_allocator *a) {
  pthread_mutex_lock(&a->mu);
  trim_locked(a);
  pthread_mutex_unlock(&a->mu);
}

void kiln__cuda_allocator_fini(kiln__cuda_allocator *a) {
  kiln__cuda_allocator_trim(a);
  pthread_mutex_destroy(&a->mu);
}

/* A cached block of exactly `rounded` bytes from list `list`, or NULL. */
static kiln__cuda_block *take_cached(kiln__cuda_allocator *a, uint64_t rounded, uint32_t list) {
  for (kiln__cuda_block **p = &a->free[list]; *p; p = &(*p)->next) {
    if ((*p)->bytes != rounded) continue;
    kiln__cuda_block *b = *p;
    *p = b->next;
    b->next = NULL;
    a->cached -= b->bytes;
    return b;
  }
  return NULL;
}

int kiln__cuda_allocator_get(kiln__cuda_allocator *a, uint64_t bytes, kiln__cuda_block **out,
                             kiln_status *st) {
  *out = NULL;
  uint64_t rounded;
  uint32_t list;
  if (!kiln__cuda_size_class(bytes, &rounded, &list))
    return kiln_status_set(st, KILN_ELIMIT, a->what, "a device buffer of %llu bytes",
                           (unsigned long long)bytes);
  pthread_mutex_lock(&a->mu);
  kiln__cuda_block *b = take_cached(a, rounded, list);
  int rc = 0;
  if (b == NULL) {
    if (a->live + a->cached + rounded > a->budget || a->live + a->cached + rounded < rounded)
      trim_locked(a);
    if (rounded > a->budget || a->live + rounded > a->budget) {
      rc = kiln_status_set(st, KILN_ELIMIT, a->what,
                           "%llu more bytes of device memory (%llu asked) would pass %s of %llu "
                           "bytes (%llu in use)",
                           (unsigned long long)rounded, (unsigned long long)bytes, a->budget_name,
                           (unsigned long long)a->budget, (unsigned long long)a->live);
      goto out;
    }
    b = kiln_calloc(1, sizeof *b);
    if (b == NULL) {
      rc = kiln_status_set(st, KILN_ENOMEM, a->what, "out of host memory");
      goto out;
    }
    kiln_status raw_st;
    kiln_status_clear(&raw_st);
    rc = a->raw_alloc(a->ctx, rounded, &b->ptr, &raw_st);
    if (rc && a->cached > 0) { /* the cache may hold what the device lacks */
      trim_locked(a);
      kiln_status_clear(&raw_st);
      rc = a->raw_alloc(a->ctx, rounded, &b->ptr, &raw_st);
    }
    if (rc) {
      kiln_free(b);
      b = NULL;
      rc = kiln_status_set(st, rc, raw_st.where[0] ? raw_st.where : a->what,
                           "%s (%llu bytes asked, %llu in use)", raw_st.msg,
                           (unsigned long long)rounded, (unsigned long long)a->live);
      goto out;
    }
    b->bytes = rounded;
  }
  b->asked = bytes;
  a->live += b->bytes;
  if (a->live > a->peak) a->peak = a->live;
  *out = b;
out:
  pthread_mutex_unlock(&a->mu);
  return rc;
}

void kiln__cuda_allocator_put(kiln__cuda_allocator *a, kiln__cuda_block *b) {
  if (b == NULL) return;
  uint64_t rounded;
  uint32_t list;
  kiln__cuda_size_class(b->bytes, &rounded, &list);
  pthread_mutex_lock(&a->mu);
  a->live -= b->bytes;
  b->next = a->free[list];
  a->free[list] = b;
  a->cached += b->bytes;
  pthread_mutex_unlock(&a->mu);
}

/* ---- launches ------------------------------------------------------------ */

#define MAX_BLOCK 256u
#define BLOCKS_PER_SM 16u

void kiln__cuda_grid(uint64_t range, uint32_t nsm, uint32_t max_block, uint32_t *grid,
                     uint32_t *block) {
  uint32_t most = max_block < MAX_BLOCK ? max_block : MAX_BLOCK;
  most = most >= 32 ? most / 32 * 32 : (most ? most : 1);
  if (range == 0) {
    *grid = 0;
    *block = most;
    return;
  }
  if (range <= most) {
    uint64_t warps = (range + 31) / 32 * 32;
    *block = warps < most ? (uint32_t)warps : most;
    *grid = 1;
    return;
  }
  *block = most;
  uint64_t blocks = (range + most - 1) / most;
  uint64_t cap = (uint64_t)(nsm ? nsm : 1) * BLOCKS_PER_SM;
  if (cap > INT32_MAX) cap = INT32_MAX;
  *grid = (uint32_t)(blocks < cap ? blocks : cap);
}

/* CUresult values from cuda.h, spelled out so that this file needs no
 * toolkit header (they are part of the driver's stable ABI). */
enum {
  R_INVALID_VALUE = 1,
  R_OUT_OF_MEMORY = 2,
  R_NOT_INITIALIZED = 3,
  R_DEINITIALIZED = 4,
  R_NO_DEVICE = 100,
  R_INVALID_DEVICE = 101,
  R_DEVICE_NOT_LICENSED = 102,
  R_INVALID_IMAGE = 200,
  R_NO_BINARY_FOR_GPU = 209,
  R_INVALID_PTX = 218,
  R_UNSUPPORTED_PTX_VERSION = 222,
  R_NOT_FOUND = 500,
  R_LAUNCH_OUT_OF_RESOURCES = 701,
  R_LAUNCH_TIMEOUT = 702,
  R_SYSTEM_NOT_READY = 802,
  R_SYSTEM_DRIVER_MISMATCH = 803,
  R_COMPAT_NOT_SUPPORTED_ON_DEVICE = 804,
};

int kiln__cuda_error_code(int result) {
  switch (result) {
  case 0: return 0;
  case R_OUT_OF_MEMORY:
  case R_LAUNCH_OUT_OF_RESOURCES:
  case R_LAUNCH_TIMEOUT: return KILN_ELIMIT;
  case R_NOT_INITIALIZED:
  case R_DEINITIALIZED:
  case R_NO_DEVICE:
  case R_INVALID_DEVICE:
  case R_DEVICE_NOT_LICENSED:
  case R_SYSTEM_NOT_READY:
  case R_SYSTEM_DRIVER_MISMATCH:
  case R_COMPAT_NOT_SUPPORTED_ON_DEVICE: return KILN_EUNAVAIL;
  case R_NO_BINARY_FOR_GPU:
  case R_UNSUPPORTED_PTX_VERSION: return KILN_EUNIMPL;
  case R_INVALID_IMAGE:
  case R_INVALID_PTX:
  case R_NOT_FOUND:
  case R_INVALID_VALUE: return KILN_EINVAL;
  default: return KILN_EINTERNAL;
  }
}

int kiln__cuda_error(int result, const char *call, const char *name, const char *desc,
                     const char *where, kiln_status *st) {
  int code = kiln__cuda_error_code(result);
  if (code == 0) return 0;
  char num[32];
  snprintf(num, sizeof num, "CUresult %d", result);
  return kiln_status_set(st, code, where ? where : "cuda", "%s failed: %s: %s", call,
                         name ? name : num, desc ? desc : "no description from the driver");
}

bool kiln__cuda_arch_parse(const char *arch, int *major, int *minor) {
  if (arch == NULL || strncmp(arch, "sm_", 3) != 0) return false;
  const char *d = arch + 3;
  size_t n = strlen(d);
  if (n < 2 || n > 3) return false;
  int v = 0;
  for (size_t i = 0; i < n; i++) {
    if (d[i] < '0' || d[i] > '9') return false;
    v = v * 10 + (d[i] - '0');
  }
  *major = v / 10;
  *minor = v % 10;
  return true;
}

bool kiln__cuda_arch_runs(int cubin_major, int cubin_minor, int dev_major, int dev_minor) {
  return cubin_major == dev_major && dev_minor >= cubin_minor;
}

/* ---- cubins ---------------------------------------------------------------- */

static uint64_t le(const uint8_t *p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes; i-- > 0;) v = v << 8 | p[i];
  return v;
}

/* [off, off + count * size) inside n bytes, without overflow. */
static bool table_fits(uint64_t off, uint64_t count, uint64_t size, uint64_t n) {
  if (count == 0) return true;
  if (size == 0 || off > n || count > (n - off) / size) return false;
  return true;
}

#define EM_CUDA 190
#define ELF_HEADER 64
#define SHT_NOBITS 8

bool kiln__cuda_cubin_check(const uint8_t *code, uint64_t n, char *why, size_t nwhy) {
  if (code == NULL || n < ELF_HEADER || memcmp(code, "\177ELF", 4) != 0) {
    snprintf(why, nwhy, "the code object is not an ELF file (%llu bytes)", (unsigned long long)n);
    return false;
  }
  if (code[4] != 2 || code[5] != 1 || le(code + 18, 2) != EM_CUDA) {
    snprintf(why, nwhy,
             "the code object is not a 64-bit little-endian cubin (class %u, data %u, "
             "machine %u)",
             code[4], code[5], (unsigned)le(code + 18, 2));
    return false;
  }
  uint64_t phoff = le(code + 32, 8), shoff = le(code + 40, 8);
  uint64_t phentsize = le(code + 54, 2), phnum = le(code + 56, 2);
  uint64_t shentsize = le(code + 58, 2), shnum = le(code + 60, 2);
  if (!table_fits(phoff, phnum, phentsize, n) || (phnum && phentsize < 56)) {
    snprintf(why, nwhy, "the cubin's program headers lie outside its %llu bytes",
             (unsigned long long)n);
    return false;
  }
  if (!table_fits(shoff, shnum, shentsize, n) || (shnum && shentsize < 64)) {
    snprintf(why, nwhy, "the cubin's section headers lie outside its %llu bytes",
             (unsigned long long)n);
    return false;
  }
  for (uint64_t i = 0; i < shnum; i++) {
    const uint8_t *sh = code + shoff + i * shentsize;
    uint64_t type = le(sh + 4, 4), off = le(sh + 24, 8), size = le(sh + 32, 8);
    if (type != SHT_NOBITS && (off > n || size > n - off)) {
      snprintf(why, nwhy, "the cubin's section %llu lies outside its %llu bytes",
               (unsigned long long)i, (unsigned long long)n);
      return false;
    }
  }
  for (uint64_t i = 0; i < phnum; i++) {
    const uint8_t *ph = code + phoff + i * phentsize;
    uint64_t type = le(ph, 4), off = le(ph + 8, 8), filesz = le(ph + 32, 8);
    if (type != 0 && (off > n || filesz > n - off)) {
      snprintf(why, nwhy, "the cubin's segment %llu lies outside its %llu bytes",
               (unsigned long long)i, (unsigned long long)n);
      return false;
    }
  }
  return true;
}
