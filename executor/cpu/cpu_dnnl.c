/* oneDNN on the cpu backend: the loader, the engine, per-thread streams,
 * the matmul plan cache and the helpers that build and run primitives
 * (see cpu_dnnl.h for the why of dlopen and of leaving sanitizer builds
 * out).
 *
 * The loader opens the library once per process (KILN_DNNL_LIBRARY from
 * the build, else its soname), resolves every entry point the backend uses
 * into one table, and makes one cpu engine; any failure leaves the table
 * unusable and a sentence in kiln__dnnl_why(). The matmul cache maps a
 * GEMM step's shape and operand types to its primitive: an open-addressed
 * hash table of fixed size whose entries are never freed or moved, so a
 * plan found under the mutex is used after it without one.
 */
#include "executor/cpu/cpu_dnnl.h"

#include <stdio.h>
#include <string.h>

#if KILN__DNNL
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

/* ---- the loader ---------------------------------------------------------- */

kiln__dnnl_api kiln__dnnl;
static bool usable;
static char why[256];
static pthread_once_t open_once = PTHREAD_ONCE_INIT;
static pthread_key_t stream_key;

static void destroy_stream(void *s) { kiln__dnnl.stream_destroy(s); }

static void open_library(void) {
  /* kiln and kilnd set OMP_WAIT_POLICY at start (kiln_cpu_blas_select_core);
   * a process that did not (a test, another program linking the executor)
   * gets it here, before oneDNN's runtime first reads it. setenv is not
   * safe against a concurrent getenv, so it is skipped when already set. */
  if (getenv("OMP_WAIT_POLICY") == NULL) setenv("OMP_WAIT_POLICY", "passive", 0);
  void *h = dlopen(KILN_DNNL_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    const char *e = dlerror();
    snprintf(why, sizeof why, "oneDNN is not installed (%s)", e ? e : "libdnnl.so.2 not found");
    return;
  }
  const char *missing = NULL;
#define RESOLVE(f) \
  if ((*(void **)&kiln__dnnl.f = dlsym(h, "dnnl_" #f)) == NULL && missing == NULL) \
    missing = "dnnl_" #f;
  KILN__DNNL_FNS(RESOLVE)
#undef RESOLVE
  if (missing) {
    snprintf(why, sizeof why, "the oneDNN found (%s) has no %s", KILN_DNNL_LIBRARY, missing);
    return;
  }
  /* Its OpenMP runtime is a dependency of the library: dlsym on the
   * handle finds these there. */
  *(void **)&kiln__dnnl.omp_get_max_threads = dlsym(h, "omp_get_max_threads");
  *(void **)&kiln__dnnl.omp_set_num_threads = dlsym(h, "omp_set_num_threads");
  dnnl_status_t s = kiln__dnnl.engine_create(&kiln__dnnl.engine, dnnl_cpu, 0);
  if (s != dnnl_success) {
    snprintf(why, sizeof why, "oneDNN's cpu engine could not be made (status %d)", (int)s);
    return;
  }
  if (pthread_key_create(&stream_key, destroy_stream) != 0) {
    snprintf(why, sizeof why, "no thread-local key for oneDNN's streams");
    return;
  }
  usable = true;
}

const kiln__dnnl_api *kiln__dnnl_get(void) {
  pthread_once(&open_once, open_library);
  return usable ? &kiln__dnnl : NULL;
}

const char *kiln__dnnl_why(void) { return kiln__dnnl_get() ? NULL : why; }

dnnl_stream_t kiln__dnnl_stream(void) {
  if (kiln__dnnl_get() == NULL) return NULL;
  dnnl_stream_t s = pthread_getspecific(stream_key);
  if (s) return s;
  if (kiln__dnnl.stream_create(&s, kiln__dnnl.engine, dnnl_stream_default_flags) != dnnl_success)
    return NULL;
  if (pthread_setspecific(stream_key, s) != 0) {
    kiln__dnnl.stream_destroy(s);
    return NULL;
  }
  return s;
}

/* ---- building primitives ------------------------------------------------- */

dnnl_status_t kiln__dnnl_md_strided(dnnl_memory_desc_t *md, int n, const dnnl_dims_t dims,
                                    dnnl_data_type_t type, const dnnl_dims_t strides) {
  return kiln__dnnl.memory_desc_init_by_strides(md, n, dims, type, strides);
}

dnnl_status_t kiln__dnnl_md_any(dnnl_memory_desc_t *md, int n, const dnnl_dims_t dims,
                                dnnl_data_type_t type) {
  return kiln__dnnl.memory_desc_init_by_tag(md, n, dims, type, dnnl_format_tag_any);
}

/* Attributes with the scratchpad the run passes, or NULL (the defaults). */
static dnnl_status_t make_attr(dnnl_primitive_attr_t *attr, bool user_scratchpad) {
  *attr = NULL;
  if (!user_scratchpad) return dnnl_success;
  dnnl_status_t s = kiln__dnnl.primitive_attr_create(attr);
  if (s == dnnl_success)
    s = kiln__dnnl.primitive_attr_set_scratchpad_mode(*attr, dnnl_scratchpad_mode_user);
  if (s != dnnl_success && *attr) {
    kiln__dnnl.primitive_attr_destroy(*attr);
    *attr = NULL;
  }
  return s;
}

dnnl_status_t kiln__dnnl_pd_create(dnnl_primitive_desc_t *pd, const void *op_desc,
                                   bool user_scratchpad) {
  dnnl_primitive_attr_t attr;
  dnnl_status_t s = make_attr(&attr, user_scratchpad);
  if (s != dnnl_success) return s;
  s = kiln__dnnl.primitive_desc_create(pd, op_desc, attr, kiln__dnnl.engine, NULL);
  if (attr) kiln__dnnl.primitive_attr_destroy(attr);
  return s;
}

dnnl_status_t kiln__dnnl_reorder_pd(dnnl_primitive_desc_t *pd, const dnnl_memory_desc_t *from,
                                    const dnnl_memory_desc_t *to) {
  dnnl_primitive_attr_t attr;
  dnnl_status_t s = make_attr(&attr, true);
  if (s != dnnl_success) return s;
  s = kiln__dnnl.reorder_primitive_desc_create(pd, from, kiln__dnnl.engine, to, kiln__dnnl.engine,
                                               attr);
  kiln__dnnl.primitive_attr_destroy(attr);
  return s;
}

bool kiln__dnnl_pd_is_ref(dnnl_primitive_desc_t pd) {
  const char *impl = NULL;
  if (kiln__dnnl.primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success ||
      !impl)
    return true;
  return strncmp(impl, "ref", 3) == 0;
}

dnnl_status_t kiln__dnnl_prim_create(dnnl_primitive_t *prim, dnnl_primitive_desc_t pd,
                                     dnnl_memory_desc_t *scratch) {
  if (scratch) {
    const dnnl_memory_desc_t *sm =
        kiln__dnnl.primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    if (sm)
      *scratch = *sm;
    else
      memset(scratch, 0, sizeof *scratch);
  }
  *prim = NULL;
  dnnl_status_t s = kiln__dnnl.primitive_create(prim, pd);
  if (s != dnnl_success) *prim = NULL;
  kiln__dnnl.primitive_desc_destroy(pd);
  return s;
}

/* ---- running them -------------------------------------------------------- */

#define MAX_ARGS 8

dnnl_status_t kiln__dnnl_exec(dnnl_primitive_t prim, const kiln__dnnl_arg *args, int n) {
  dnnl_stream_t s = kiln__dnnl_stream();
  if (s == NULL || n > MAX_ARGS) return dnnl_runtime_error;
  dnnl_memory_t mem[MAX_ARGS] = {NULL};
  dnnl_exec_arg_t ea[MAX_ARGS];
  dnnl_status_t st = dnnl_success;
  for (int i = 0; i < n && st == dnnl_success; i++) {
    st = kiln__dnnl.memory_create(&mem[i], args[i].md, kiln__dnnl.engine, (void *)args[i].data);
    ea[i] = (dnnl_exec_arg_t){args[i].arg, mem[i]};
  }
  if (st == dnnl_success) st = kiln__dnnl.primitive_execute(prim, s, n, ea);
  if (st == dnnl_success) st = kiln__dnnl.stream_wait(s);
  for (int i = 0; i < n; i++)
    if (mem[i]) kiln__dnnl.memory_destroy(mem[i]);
  return st;
}

/* ---- cached matmuls ------------------------------------------------------ */

/* A matmul's shape and types, all int64 so that it has no padding and
 * compares and hashes as bytes. */
typedef struct mm_key {
  int64_t a, b, c; /* kiln_dtype of each operand */
  int64_t batch, m, n, k, lda, ldb, ldc, stride_a, stride_b, stride_c, trans_a, trans_b;
} mm_key;

typedef struct mm_plan {
  mm_key key;
  bool used;
  dnnl_memory_desc_t a, b, c;
  dnnl_primitive_t prim; /* NULL: oneDNN refused the shape */
} mm_plan;

#define NSLOTS (2 * KILN__DNNL_MAX_PLANS) /* half full at most: short probes */
static mm_plan plans[NSLOTS];
static uint32_t nplans;
static pthread_mutex_t plans_mu = PTHREAD_MUTEX_INITIALIZER;

/* FNV-1a over the key's bytes. */
static uint64_t hash_key(const mm_key *k) {
  const unsigned char *p = (const unsigned char *)k;
  uint64_t h = 14695981039346656037u;
  for (size_t i = 0; i < sizeof *k; i++) h = (h ^ p[i]) * 1099511628211u;
  return h;
}

static mm_key key_of(const kiln_gemm *g, kiln_dtype a, kiln_dtype b, kiln_dtype c) {
  mm_key k;
  memset(&k, 0, sizeof k);
  k.a = a, k.b = b, k.c = c;
  k.batch = g->batch, k.m = g->m, k.n = g->n, k.k = g->k;
  k.lda = g->lda, k.ldb = g->ldb, k.ldc = g->ldc;
  k.stride_a = g->stride_a, k.stride_b = g->stride_b, k.stride_c = g->stride_c;
  k.trans_a = g->trans_a, k.trans_b = g->trans_b;
  return k;
}

static bool dnnl_type(int64_t t, dnnl_data_type_t *out) {
  switch (t) {
  case KILN_S8: *out = dnnl_s8; return true;
  case KILN_U8: *out = dnnl_u8; return true;
  case KILN_S32: *out = dnnl_s32; return true;
  case KILN_BF16: *out = dnnl_bf16; return true;
  case KILN_F32: *out = dnnl_f32; return true;
  default: return false;
  }
}

/* Makes p's descriptors and primitive from p->key; p->prim stays NULL
 * when oneDNN refuses. */
static void make_plan(mm_plan *p) {
  const mm_key *g = &p->key;
  dnnl_dims_t ad = {g->batch, g->m, g->k}, bd = {g->batch, g->k, g->n};
  dnnl_dims_t cd = {g->batch, g->m, g->n};
  dnnl_dims_t as = {g->stride_a, g->trans_a ? 1 : g->lda, g->trans_a ? g->lda : 1};
  dnnl_dims_t bs = {g->stride_b, g->trans_b ? 1 : g->ldb, g->trans_b ? g->ldb : 1};
  dnnl_dims_t cs = {g->stride_c, g->ldc, 1};
  dnnl_data_type_t at, bt, ct;
  dnnl_matmul_desc_t md;
  dnnl_primitive_desc_t pd = NULL;
  p->prim = NULL;
  if (!dnnl_type(g->a, &at) || !dnnl_type(g->b, &bt) || !dnnl_type(g->c, &ct) ||
      kiln__dnnl_md_strided(&p->a, 3, ad, at, as) != dnnl_success ||
      kiln__dnnl_md_strided(&p->b, 3, bd, bt, bs) != dnnl_success ||
      kiln__dnnl_md_strided(&p->c, 3, cd, ct, cs) != dnnl_success ||
      kiln__dnnl.matmul_desc_init(&md, &p->a, &p->b, NULL, &p->c) != dnnl_success ||
      kiln__dnnl_pd_create(&pd, &md, false) != dnnl_success)
    return;
  kiln__dnnl_prim_create(&p->prim, pd, NULL);
}

/* The plan of k: a cached one, or *tmp made now (its primitive the
 * caller's to destroy) when the table is full. */
static const mm_plan *find_plan(const mm_key *k, mm_plan *tmp) {
  uint32_t slot = (uint32_t)(hash_key(k) % NSLOTS);
  const mm_plan *found = NULL;
  pthread_mutex_lock(&plans_mu);
  for (uint32_t i = 0; i < NSLOTS && found == NULL; i++, slot = (slot + 1) % NSLOTS) {
    mm_plan *p = &plans[slot];
    if (p->used) {
      if (memcmp(&p->key, k, sizeof *k) == 0) found = p;
      continue;
    }
    if (nplans >= KILN__DNNL_MAX_PLANS) break;
    p->key = *k;
    make_plan(p);
    p->used = true;
    nplans++;
    found = p;
  }
  pthread_mutex_unlock(&plans_mu);
  if (found) return found;
  tmp->key = *k;
  make_plan(tmp);
  return tmp;
}

/* Runs the matmul when pc is not NULL; whether oneDNN takes it (and ran
 * it without an error). */
static bool matmul(const kiln_gemm *g, kiln_dtype a, kiln_dtype b, kiln_dtype c, const void *pa,
                   const void *pb, void *pc) {
  if (kiln__dnnl_get() == NULL) return false;
  mm_key k = key_of(g, a, b, c);
  mm_plan tmp;
  const mm_plan *p = find_plan(&k, &tmp);
  bool ok = p->prim != NULL;
  if (ok && pc) {
    kiln__dnnl_arg args[3] = {
        {DNNL_ARG_SRC, &p->a, pa}, {DNNL_ARG_WEIGHTS, &p->b, pb}, {DNNL_ARG_DST, &p->c, pc}};
    ok = kiln__dnnl_exec(p->prim, args, 3) == dnnl_success;
  }
  if (p == &tmp && tmp.prim) kiln__dnnl.primitive_destroy(tmp.prim);
  return ok;
}

bool kiln__dnnl_matmul_run(const kiln_gemm *g, kiln_dtype a, kiln_dtype b, kiln_dtype c,
                           const void *pa, const void *pb, void *pc) {
  return pc != NULL && matmul(g, a, b, c, pa, pb, pc);
}

bool kiln__dnnl_matmul_takes(const kiln_gemm *g, kiln_dtype a, kiln_dtype b, kiln_dtype c) {
  return matmul(g, a, b, c, NULL, NULL, NULL);
}

#else /* no oneDNN in the build, or a sanitizer build */

const char *kiln__dnnl_why(void) {
#ifdef KILN_HAVE_DNNL
  return "a sanitizer build does not use oneDNN (it is not instrumented)";
#else
  return "this build has no oneDNN (libdnnl-dev was not found when it was configured)";
#endif
}

bool kiln__dnnl_matmul_run(const kiln_gemm *g, kiln_dtype a, kiln_dtype b, kiln_dtype c,
                           const void *pa, const void *pb, void *pc) {
  (void)g, (void)a, (void)b, (void)c, (void)pa, (void)pb, (void)pc;
  return false;
}

bool kiln__dnnl_matmul_takes(const kiln_gemm *g, kiln_dtype a, kiln_dtype b, kiln_dtype c) {
  (void)g, (void)a, (void)b, (void)c;
  return false;
}

#endif
