/* Running a loaded executable on a cpu device: bind, then walk the steps.
 *
 * A run resolves every slot to an address once (temporary arena, constants
 * blob, the caller's parameter leaves, the result leaves) and lays out the
 * slot pointers of every step in one argument vector, so a kernel launch
 * passes a ready `void *const *` and nothing is looked up per iteration.
 * The temporary arena is taken from the loaded executable's small cache (or
 * allocated) for the run's duration, so overlapping runs never share one.
 *
 * Kernel launches split [0, range) over the device pool only when it pays:
 * the first launch of a kernel times a short prefix inline, and the cost
 * per iteration it measures (kept per kernel, refreshed as launches run)
 * decides between running the rest inline and cutting it into chunks of a
 * few tens of microseconds each. The step tables were checked at load
 * (cpu_load.c), so the interpreter indexes without checking. A run flushes
 * denormals to zero on its thread, as the pool's workers do.
 */
#include <math.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/sbuf.h"
#include "compiler/ir/debug_print.h"
#include "executor/cpu/cpu.h"

#define DEFAULT_MAX_ITERATIONS UINT64_C(1000000000)
#define PROBE_ITERATIONS 256 /* timed inline on a kernel's first launch */
#define INLINE_NS 20000.0    /* less work than this stays on the caller */
#define CHUNK_NS 25000.0     /* target work per chunk when splitting */
#define COPY_SPLIT_BYTES (UINT64_C(8) << 20)

typedef struct run_ctx {
  kiln__cpu_loaded *l;
  void **slot; /* nslots addresses */
  void **argv; /* l->nargv step arguments */
  uint64_t max_iterations;
  double deadline;                    /* monotonic seconds; 0: none */
  const atomic_int *cancel;           /* kiln_run_options.cancel */
  const kiln__gang_rank *gang;        /* kiln_run_options.gang */
  const kiln_debug_sink *debug;       /* kiln_run_options.debug */
  const kiln_step_observer *observer; /* kiln_run_options.observer */
  kiln_status *st;
} run_ctx;

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- kernel launches ---------------------------------------------------- */

typedef struct launch {
  kiln_kernel_fn fn;
  void *const *bufs;
  int64_t begin, chunk, end;
} launch;

static void launch_chunk(void *ctx, uint64_t c) {
  const launch *k = ctx;
  int64_t b = k->begin + (int64_t)c * k->chunk;
  int64_t e = k->end - b > k->chunk ? b + k->chunk : k->end;
  k->fn(k->bufs, b, e);
}

static void run_kernel(run_ctx *r, const kiln_step *s, void *const *bufs) {
  kiln__cpu_loaded *l = r->l;
  kiln_kernel_fn fn = l->kernels[s->kernel];
  int64_t range = (int64_t)s->range, begin = 0;
  if (range == 0) return;
  uint32_t nthreads = kiln__cpu_pool_threads(l->dev->pool);
  if (nthreads == 1) {
    fn(bufs, 0, range);
    return;
  }
  _Atomic uint64_t *costp = &l->kernel_cost[s->kernel];
  uint64_t cost = atomic_load_explicit(costp, memory_order_relaxed);
  if (cost == 0) {
    begin = range < PROBE_ITERATIONS ? range : PROBE_ITERATIONS;
    double t0 = now_seconds();
    fn(bufs, 0, begin);
    double ns = (now_seconds() - t0) * 1e9;
    cost = (uint64_t)(ns * 1024.0 / (double)begin) + 1;
    atomic_store_explicit(costp, cost, memory_order_relaxed);
    if (begin == range) return;
  }
  double work = (double)cost / 1024.0 * (double)(range - begin);
  if (work < INLINE_NS) {
    fn(bufs, begin, range);
    return;
  }
  double nchunks = ceil(work / CHUNK_NS);
  double most = 4.0 * nthreads, fewest = nthreads;
  if (nchunks > most) nchunks = most;
  if (nchunks < fewest) nchunks = fewest;
  int64_t n = range - begin, chunks = (int64_t)nchunks;
  if (chunks > n) chunks = n;
  launch k = {
      .fn = fn, .bufs = bufs, .begin = begin, .chunk = (n + chunks - 1) / chunks, .end = range};
  /* Whole multiples of 64 iterations, so that neighbouring chunks of an
   * elementwise kernel do not write the same cache line; of 16 for a short
   * range (a reduction into a few dozen outputs, each iteration a long
   * one): chunks of 8 f32 outputs shared their lines, and two threads
   * accumulating into one line ran several times slower than one thread. */
  if (k.chunk > 256)
    k.chunk = (k.chunk + 63) & ~(int64_t)63;
  else if (n >= 32 && k.chunk < 16)
    k.chunk = 16;
  chunks = (n + k.chunk - 1) / k.chunk;
  double t0 = now_seconds();
  kiln__cpu_pool_run(l->dev->pool, launch_chunk, &k, (uint64_t)chunks);
  /* Refresh the estimate with what the split run cost in thread time. */
  double ns = (now_seconds() - t0) * 1e9 * (double)(chunks < nthreads ? chunks : nthreads);
  atomic_store_explicit(costp, (uint64_t)(ns * 1024.0 / (double)n) + 1, memory_order_relaxed);
}

/* ---- GEMMs -------------------------------------------------------------- */

static int run_gemm(run_ctx *r, const kiln_step *s, void *const *a) {
  const kiln_gemm *g = &s->gemm;
  if (g->dtype == KILN_S8 || g->dtype == KILN_U8) { /* checked at load: no epilogue */
    kiln__cpu_igemm(r->l->dev->pool, g, a[0], a[1], a[2]);
    return 0;
  }
  /* Checked at load: range divides the elements of C, its unit divides n. */
  kiln__cpu_epilogue epi = {.fn = s->nargs > 3 ? r->l->kernels[s->kernel] : NULL,
                            .bufs = a + 3,
                            .unit = s->nargs > 3 ? g->batch * g->m * g->n / (int64_t)s->range : 1};
  const kiln__cpu_epilogue *e = s->nargs > 3 ? &epi : NULL;
  if (g->dtype == KILN_BF16) {
    if (kiln__cpu_bgemm(r->l->dev->pool, g, a[0], a[1], a[2], e))
      return kiln_status_set(r->st, KILN_ENOMEM, "gemm",
                             "out of memory widening bf16 operands (%lld x %lld x %lld)",
                             (long long)g->m, (long long)g->k, (long long)g->n);
    return 0;
  }
  kiln__cpu_gemm(r->l->dev->pool, g, a[0], a[1], a[2], e);
  return 0;
}

/* ---- copies ------------------------------------------------------------- */

typedef struct copy_job {
  char *dst;
  const char *src;
  uint64_t bytes, chunk;
} copy_job;

static void copy_chunk(void *ctx, uint64_t c) {
  const copy_job *j = ctx;
  uint64_t off = c * j->chunk, n = j->bytes - off < j->chunk ? j->bytes - off : j->chunk;
  memcpy(j->dst + off, j->src + off, n);
}

static void run_copy(run_ctx *r, void *dst, const void *src, uint64_t bytes) {
  if (bytes == 0 || dst == src) return;
  const char *d = dst, *s = src;
  bool overlap = d < s + bytes && s < d + bytes;
  uint32_t nthreads = kiln__cpu_pool_threads(r->l->dev->pool);
  if (overlap || bytes < COPY_SPLIT_BYTES || nthreads == 1) {
    memmove(dst, src, bytes);
    return;
  }
  copy_job j = {.dst = dst, .src = src, .bytes = bytes};
  j.chunk = ((bytes + nthreads - 1) / nthreads + 63) & ~UINT64_C(63);
  kiln__cpu_pool_run(r->l->dev->pool, copy_chunk, &j, (bytes + j.chunk - 1) / j.chunk);
}

/* ---- programs ----------------------------------------------------------- */

static int run_program(run_ctx *r, uint32_t p);

static int check_deadline(run_ctx *r) {
  /* cancel flag (kiln_run_options.cancel): polled with the time limit */
  if (r->cancel && atomic_load_explicit(r->cancel, memory_order_relaxed))
    return kiln_status_set(r->st, KILN_ECANCELED, "run", "cancelled");
  if (r->deadline > 0 && now_seconds() > r->deadline)
    return kiln_status_set(r->st, KILN_ELIMIT, "run", "time limit exceeded");
  return 0;
}

static int run_while(run_ctx *r, const kiln_step *s, void *const *a) {
  const uint8_t *pred = a[0];
  for (uint64_t it = 0;; it++) {
    int rc = run_program(r, s->sub[0]);
    if (rc) return rc;
    if (*pred == 0) return 0;
    if (it >= r->max_iterations)
      return kiln_status_set(r->st, KILN_ELIMIT, "run", "while loop ran past %llu iterations",
                             (unsigned long long)r->max_iterations);
    if ((rc = run_program(r, s->sub[1])) != 0) return rc;
    if ((rc = check_deadline(r)) != 0) return rc;
  }
}

static int run_conditional(run_ctx *r, const kiln_step *s, void *const *a) {
  const kiln_slot *sel = &r->l->exe->slots[s->args[0]];
  uint32_t branch;
  if (sel->size == 1) {
    branch = *(const uint8_t *)a[0] ? 0 : 1;
  } else {
    int32_t v;
    memcpy(&v, a[0], sizeof v);
    branch = v < 0 ? UINT32_MAX : (uint32_t)v;
  }
  if (branch >= s->nsub) branch = s->nsub - 1; /* out of range: the last branch */
  return run_program(r, s->sub[branch]);
}

/* The record was checked at load (cpu_load.c). */
static void run_debug_print(run_ctx *r, const kiln_step *s, void *const *a) {
  if (r->debug == NULL || r->debug->write == NULL) return;
  const kiln_slot *rs = &r->l->exe->slots[s->args[1]];
  kiln_debug_record rec;
  char why[160];
  if (!kiln_debug_record_read(a[1], rs->size, r->l->exe->slots[s->args[0]].size, &rec, why,
                              sizeof why))
    return;
  kiln_sbuf sb = KILN_SBUF_INIT;
  kiln_debug_record_render(&sb, &rec, a[0]);
  if (!kiln_sbuf_failed(&sb)) r->debug->write(r->debug->ctx, sb.data, sb.len);
  kiln_sbuf_free(&sb);
}

static int run_program(run_ctx *r, uint32_t p) {
  const kiln_program *pr = &r->l->exe->programs[p];
  const uint64_t *base = r->l->argv_base[p];
  for (uint32_t i = 0; i < pr->nsteps; i++) {
    const kiln_step *s = &pr->steps[i];
    void *const *a = r->argv + base[i];
    int rc = 0;
    int64_t t0 = r->observer ? now_ns() : 0;
    switch (s->kind) {
    case KILN_STEP_KERNEL: run_kernel(r, s, a); break;
    case KILN_STEP_GEMM: rc = run_gemm(r, s, a); break;
    case KILN_STEP_COPY: run_copy(r, a[0], a[1], s->range); break;
    case KILN_STEP_WHILE: rc = run_while(r, s, a); break;
    case KILN_STEP_CONDITIONAL: rc = run_conditional(r, s, a); break;
    case KILN_STEP_CALL: rc = run_program(r, s->sub[0]); break;
    case KILN_STEP_CONV:
      rc = kiln__cpu_conv_run(r->l->conv[p][i], r->l->dev->pool, a[0], a[1], a[2], r->st);
      break;
    case KILN_STEP_COLLECTIVE:
      rc = kiln__cpu_coll_step(r->l->exe, s, a, r->gang, r->cancel, r->deadline, r->st);
      break;
    case KILN_STEP_DEBUG_PRINT: run_debug_print(r, s, a); break;
    case KILN_STEP_FFT:
      rc = kiln__cpu_fft_run(r->l->fft[p][i], r->l->dev->pool, a[0], a[1], r->st);
      break;
    case KILN_STEP_LINALG: rc = kiln__cpu_linalg_run(s->linalg, r->l->dev->pool, a, r->st); break;
    }
    if (r->observer) r->observer->step(r->observer->ctx, p, i, t0, now_ns());
    if (rc == 0) rc = check_deadline(r);
    if (rc) return rc;
  }
  return 0;
}

/* ---- arenas and binding ------------------------------------------------- */

static void *take_arena(kiln__cpu_loaded *l, void **raw) {
  *raw = NULL;
  if (l->exe->temp_bytes == 0) return NULL;
  pthread_mutex_lock(&l->mu);
  if (l->narena_cache > 0) *raw = l->arena_cache[--l->narena_cache];
  pthread_mutex_unlock(&l->mu);
  if (*raw) return (void *)(((uintptr_t)*raw + 63) & ~(uintptr_t)63);
  return kiln__cpu_aligned_alloc(l->exe->temp_bytes, raw);
}

static void give_arena(kiln__cpu_loaded *l, void *raw) {
  if (raw == NULL) return;
  pthread_mutex_lock(&l->mu);
  if (l->narena_cache < KILN__CPU_ARENA_CACHE) {
    l->arena_cache[l->narena_cache++] = raw;
    raw = NULL;
  }
  pthread_mutex_unlock(&l->mu);
  kiln_free(raw);
}

static void resolve_slots(const kiln__cpu_loaded *l, char *arena, const void *const *params,
                          void *const *results, void **slot) {
  const kiln_executable *e = l->exe;
  for (uint32_t i = 0; i < e->nslots; i++) {
    const kiln_slot *s = &e->slots[i];
    switch (s->kind) {
    case KILN_SLOT_TEMP: slot[i] = arena ? arena + s->offset : NULL; break;
    case KILN_SLOT_CONSTANT: slot[i] = e->constants + s->offset; break;
    /* Read-only by contract: load refuses steps that write parameter slots. */
    case KILN_SLOT_PARAM: slot[i] = (void *)params[l->leaf_base[s->index] + s->leaf]; break;
    case KILN_SLOT_OUTPUT: slot[i] = results[s->index]; break;
    }
  }
}

int kiln__cpu_run(kiln__cpu_loaded *l, const void *const *params, void *const *results,
                  const kiln_run_options *opts, kiln_status *st) {
  const kiln_executable *e = l->exe;
  void *raw_arena;
  char *arena = take_arena(l, &raw_arena);
  void **slot = kiln_calloc((size_t)e->nslots + (size_t)l->nargv + 1, sizeof *slot);
  if ((arena == NULL && e->temp_bytes > 0) || slot == NULL) {
    give_arena(l, raw_arena);
    kiln_free(slot);
    return kiln_status_set(st, KILN_ENOMEM, "run", "out of memory for a %llu-byte temporary arena",
                           (unsigned long long)e->temp_bytes);
  }
  run_ctx r = {.l = l, .slot = slot, .argv = slot + e->nslots, .st = st};
  r.max_iterations =
      opts->max_while_iterations ? opts->max_while_iterations : DEFAULT_MAX_ITERATIONS;
  if (opts->timeout_seconds > 0) r.deadline = now_seconds() + opts->timeout_seconds;
  r.cancel = opts->cancel;
  r.gang = opts->gang;
  r.debug = opts->debug;
  r.observer = opts->observer;
  resolve_slots(l, arena, params, results, slot);
  for (uint32_t p = 0; p < e->nprograms; p++)
    for (uint32_t i = 0; i < e->programs[p].nsteps; i++) {
      const kiln_step *s = &e->programs[p].steps[i];
      for (uint32_t j = 0; j < s->nargs; j++) r.argv[l->argv_base[p][i] + j] = slot[s->args[j]];
    }
  unsigned csr = kiln__cpu_flush_denormals();
  int rc = run_program(&r, 0);
  kiln__cpu_restore_denormals(csr);
  /* Results bound to slots other than their own output slot are copied out. */
  for (uint32_t i = 0; rc == 0 && i < e->nresults; i++) {
    const kiln_slot *s = &e->slots[e->results[i].slot];
    if (s->kind == KILN_SLOT_OUTPUT && s->index == i) continue;
    if (s->size) memmove(results[i], slot[e->results[i].slot], s->size);
  }
  give_arena(l, raw_arena);
  kiln_free(slot);
  return rc;
}
