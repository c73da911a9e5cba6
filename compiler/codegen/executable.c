/* The executable's lifetime and its blob form.
 *
 * The blob is a flat little-endian record written field by field in the
 * order of kiln_executable's declaration: fixed-width integers, strings as a
 * u32 length and bytes, shapes recursively, every step with all of its
 * fields (unused ones too), so that loading a blob and writing it again
 * gives the same bytes. Reading treats the blob as hostile: every count is
 * bounded by the bytes left, every slot, program and kernel id by its table,
 * every byte range by its arena or blob, and the first failure names the
 * field and the offset it was read at. Nested programs must come after the
 * program that runs them (sub > own id), which rules out recursion at run
 * time. The last 8 bytes are a checksum (64-bit FNV-1a of everything
 * before them), checked right after the magic and version, so that a
 * damaged blob (a flipped bit in a cache entry) is refused as a whole even
 * where the damage would pass the field checks (a kernel's range, a slot
 * swapped for another of the same kind). It is no defence against a
 * crafted blob, which may carry any code anyway: the cache signs entries.
 */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/codegen/executable.h"
#include "compiler/ir/debug_print.h"

#define MAX_RANK 64  /* array rank and tuple arity in a blob */
#define MAX_DEPTH 16 /* tuple nesting in a blob */
#define NULL_STR UINT32_MAX

kiln_executable *kiln_executable_create(void) {
  kiln_executable *e = kiln_calloc(1, sizeof *e);
  if (e == NULL) return NULL;
  e->arena = kiln_arena_create();
  if (e->arena == NULL) {
    kiln_free(e);
    return NULL;
  }
  e->format_version = KILN_EXE_FORMAT_VERSION;
  e->compiler_version = KILN_COMPILER_VERSION;
  e->target = "";
  return e;
}

void kiln_executable_destroy(kiln_executable *e) {
  if (e == NULL) return;
  kiln_arena_destroy(e->arena);
  kiln_free(e);
}

static uint64_t fnv1a(const uint8_t *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

/* ---- writing ------------------------------------------------------------ */

typedef struct writer {
  uint8_t *p;
  size_t len, cap;
  bool failed;
} writer;

static void put(writer *w, const void *src, size_t n) {
  if (w->failed || n == 0) return;
  if (kiln_grow((void **)&w->p, &w->cap, w->len + n, 1)) {
    w->failed = true;
    return;
  }
  memcpy(w->p + w->len, src, n);
  w->len += n;
}

static void put_u8(writer *w, uint8_t v) { put(w, &v, 1); }

static void put_u32(writer *w, uint32_t v) {
  uint8_t b[4];
  for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
  put(w, b, 4);
}

static void put_u64(writer *w, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
  put(w, b, 8);
}

static void put_i64(writer *w, int64_t v) { put_u64(w, (uint64_t)v); }

static void put_f64(writer *w, double v) {
  uint64_t b;
  memcpy(&b, &v, sizeof b);
  put_u64(w, b);
}

static void put_str(writer *w, const char *s) {
  if (s == NULL) {
    put_u32(w, NULL_STR);
    return;
  }
  size_t n = strlen(s);
  put_u32(w, (uint32_t)n);
  put(w, s, n);
}

static void put_shape(writer *w, const kiln_shape *s) {
  put_u32(w, (uint32_t)s->dtype);
  put_u32(w, s->rank);
  if (s->dtype == KILN_TUPLE) {
    for (uint32_t i = 0; i < s->rank; i++) put_shape(w, &s->tuple[i]);
    return;
  }
  for (uint32_t i = 0; i < s->rank; i++) put_i64(w, s->dims[i]);
  put_u8(w, s->dynamic != NULL);
  for (uint32_t i = 0; s->dynamic && i < s->rank; i++) put_u8(w, s->dynamic[i] != 0);
  put_u8(w, s->layout != NULL);
  if (s->layout) {
    put_u32(w, s->layout->rank);
    for (uint32_t i = 0; i < s->layout->rank; i++) put_i64(w, s->layout->minor_to_major[i]);
    put_str(w, s->layout->tail);
    put_i64(w, s->layout->memory_space);
  }
}

static void put_binding(writer *w, const kiln_binding *b) {
  put_shape(w, &b->shape);
  put_u32(w, b->slot);
}

/* The convolution payload, after the common step fields of a CONV step. */
static void put_conv(writer *w, const kiln_conv *c) {
  kiln_conv zero = {0};
  if (c == NULL) c = &zero;
  put_u32(w, (uint32_t)c->dtype);
  put_u32(w, c->nspatial);
  put_i64(w, c->feature_groups);
  put_i64(w, c->batch_groups);
  for (int i = 0; i < KILN_CONV_MAX_DIMS; i++) {
    put_i64(w, c->lhs_dims[i]);
    put_i64(w, c->lhs_strides[i]);
    put_i64(w, c->rhs_dims[i]);
    put_i64(w, c->rhs_strides[i]);
    put_i64(w, c->out_dims[i]);
    put_i64(w, c->out_strides[i]);
  }
  for (int i = 0; i < KILN_CONV_MAX_SPATIAL; i++) {
    put_i64(w, c->stride[i]);
    put_i64(w, c->pad_lo[i]);
    put_i64(w, c->pad_hi[i]);
    put_i64(w, c->lhs_dilate[i]);
    put_i64(w, c->rhs_dilate[i]);
  }
}

/* The fft payload, after the common step fields of an FFT step. */
static void put_fft(writer *w, const kiln_fft *f) {
  kiln_fft zero = {0};
  if (f == NULL) f = &zero;
  put_u32(w, f->type);
  put_u32(w, f->dtype);
  put_u32(w, f->rank);
  put_u32(w, f->nfft);
  for (int i = 0; i < KILN_FFT_MAX_RANK; i++) {
    put_i64(w, f->len[i]);
    put_i64(w, f->in_dims[i]);
    put_i64(w, f->in_strides[i]);
    put_i64(w, f->out_dims[i]);
    put_i64(w, f->out_strides[i]);
  }
}

/* The LAPACK payload, after the common step fields of a LINALG step. */
static void put_linalg(writer *w, const kiln_linalg *g) {
  kiln_linalg zero;
  memset(&zero, 0, sizeof zero);
  if (g == NULL) g = &zero;
  const kiln_lapack *l = &g->l;
  uint32_t v[4] = {l->kind, l->dtype, l->nbatch, l->nargs};
  for (int i = 0; i < 4; i++) put_u32(w, v[i]);
  for (int i = 0; i < KILN_LAPACK_MAX_BATCH; i++) put_i64(w, l->batch[i]);
  put_i64(w, l->m);
  put_i64(w, l->n);
  put_i64(w, l->k);
  uint8_t f[5] = {l->uplo, l->side, l->trans, l->diag, l->mode};
  for (int i = 0; i < 5; i++) put_u8(w, f[i]);
  for (int a = 0; a < KILN_LAPACK_MAX_ARGS; a++)
    for (int d = 0; d < KILN_LINALG_MAX_RANK; d++) put_i64(w, g->strides[a][d]);
}

/* A collective step's description: only collective steps carry one. */
static void put_coll(writer *w, const kiln_coll *c) {
  uint32_t v[7] = {c->op, c->reduce, c->dtype, c->replicas, c->partitions, c->nops, c->gsize};
  for (int i = 0; i < 7; i++) put_u32(w, v[i]);
  uint64_t ndev = (uint64_t)c->replicas * c->partitions;
  for (uint64_t i = 0; i < ndev * c->gsize; i++) put_u32(w, c->members[i]);
  put_u8(w, c->source != NULL);
  for (uint64_t i = 0; c->source && i < ndev; i++) put_u32(w, (uint32_t)c->source[i]);
  for (uint32_t i = 0; i < c->nops; i++) put_u64(w, c->outer[i]);
}

static void put_step(writer *w, const kiln_step *s) {
  put_u32(w, (uint32_t)s->kind);
  put_u32(w, s->kernel);
  put_u64(w, s->range);
  put_u32(w, s->nargs);
  for (uint32_t i = 0; i < s->nargs; i++) put_u32(w, s->args[i]);
  put_u32(w, s->nsub);
  for (uint32_t i = 0; i < s->nsub; i++) put_u32(w, s->sub[i]);
  const kiln_gemm *g = &s->gemm;
  put_u32(w, (uint32_t)g->dtype);
  int64_t v[10] = {g->batch, g->m,   g->n,        g->k,        g->lda,
                   g->ldb,   g->ldc, g->stride_a, g->stride_b, g->stride_c};
  for (int i = 0; i < 10; i++) put_i64(w, v[i]);
  put_u8(w, g->trans_a);
  put_u8(w, g->trans_b);
  put_f64(w, g->alpha);
  put_f64(w, g->beta);
  if (s->kind == KILN_STEP_CONV) put_conv(w, s->conv);
  if (s->kind == KILN_STEP_COLLECTIVE) put_coll(w, &s->coll);
  if (s->kind == KILN_STEP_FFT) put_fft(w, s->fft);
  if (s->kind == KILN_STEP_LINALG) put_linalg(w, s->linalg);
}

static void put_dyn_dims(writer *w, const kiln_dyn_dim *d, uint32_t n) {
  put_u32(w, n);
  for (uint32_t i = 0; i < n; i++) {
    put_u32(w, d[i].leaf);
    put_u32(w, d[i].dim);
  }
}

/* The bounded-dynamic signature: a flag, then its fields. */
static void put_dyn(writer *w, const kiln_exe_dynamic *d) {
  put_u8(w, d != NULL);
  if (d == NULL) return;
  put_u32(w, d->nuser_params);
  for (uint32_t i = 0; i < d->nuser_params; i++) put_shape(w, &d->user_param_shapes[i]);
  put_shape(w, &d->user_result);
  put_u32(w, d->nuser_results);
  put_dyn_dims(w, d->size_params, d->nsize_params);
  put_dyn_dims(w, d->size_results, d->nsize_results);
}

int kiln_executable_serialize(const kiln_executable *e, uint8_t **buf, size_t *len,
                              kiln_status *st) {
  writer w = {0};
  put(&w, KILN_EXE_MAGIC, 8);
  put_u32(&w, e->format_version);
  put_str(&w, e->compiler_version ? e->compiler_version : "");
  put_str(&w, e->target ? e->target : "");
  put(&w, e->key, 32);
  put_u32(&w, e->nparams);
  for (uint32_t i = 0; i < e->nparams; i++) put_shape(&w, &e->param_shapes[i]);
  put_shape(&w, &e->result_shape);
  put_u32(&w, e->nparam_leaves);
  for (uint32_t i = 0; i < e->nparam_leaves; i++) put_binding(&w, &e->params[i]);
  put_u32(&w, e->nresults);
  for (uint32_t i = 0; i < e->nresults; i++) put_binding(&w, &e->results[i]);
  put_u32(&w, e->nslots);
  for (uint32_t i = 0; i < e->nslots; i++) {
    const kiln_slot *s = &e->slots[i];
    put_u32(&w, (uint32_t)s->kind);
    put_u32(&w, s->index);
    put_u32(&w, s->leaf);
    put_u64(&w, s->offset);
    put_u64(&w, s->size);
  }
  put_u64(&w, e->temp_bytes);
  put_u64(&w, e->peak_bytes);
  put_u64(&w, e->nconstants);
  put(&w, e->constants, e->nconstants);
  put_u32(&w, e->nprograms);
  for (uint32_t p = 0; p < e->nprograms; p++) {
    put_u32(&w, e->programs[p].nsteps);
    for (uint32_t i = 0; i < e->programs[p].nsteps; i++) put_step(&w, &e->programs[p].steps[i]);
  }
  put_u32(&w, e->nkernels);
  put_u32(&w, e->code_kind);
  put_u64(&w, e->ncode);
  put(&w, e->code, e->ncode);
  put_dyn(&w, e->dyn);
  if (!w.failed) put_u64(&w, fnv1a(w.p, w.len));
  if (w.failed) {
    kiln_free(w.p);
    return kiln_status_set(st, KILN_ENOMEM, "executable", "out of memory serializing");
  }
  *buf = w.p;
  *len = w.len;
  return 0;
}

/* ---- reading ------------------------------------------------------------ */

typedef struct reader {
  const uint8_t *p;
  size_t len, pos;
  kiln_arena *a;
  kiln_status *st;
  int rc; /* first failure; every read after it is a no-op */
} reader;

static int fail(reader *r, int code, const char *field, const char *fmt, const char *detail) {
  if (r->rc == 0) {
    r->rc = code;
    kiln_status_set(r->st, code, "executable blob", "%s at offset %zu: %s%s", field, r->pos, fmt,
                    detail ? detail : "");
  }
  return r->rc;
}

static bool take(reader *r, void *dst, size_t n, const char *field) {
  if (r->rc) return false;
  if (n > r->len - r->pos) {
    fail(r, KILN_EINVAL, field, "truncated", NULL);
    return false;
  }
  if (n) memcpy(dst, r->p + r->pos, n);
  r->pos += n;
  return true;
}

static uint64_t get_le(reader *r, int bytes, const char *field) {
  uint8_t b[8] = {0};
  if (!take(r, b, (size_t)bytes, field)) return 0;
  uint64_t v = 0;
  for (int i = bytes; i-- > 0;) v = v << 8 | b[i];
  return v;
}

static uint8_t get_u8(reader *r, const char *f) { return (uint8_t)get_le(r, 1, f); }
static uint32_t get_u32(reader *r, const char *f) { return (uint32_t)get_le(r, 4, f); }
static uint64_t get_u64(reader *r, const char *f) { return get_le(r, 8, f); }
static int64_t get_i64(reader *r, const char *f) { return (int64_t)get_le(r, 8, f); }

static bool get_bool(reader *r, const char *f) {
  uint8_t v = get_u8(r, f);
  if (v > 1) fail(r, KILN_EINVAL, f, "a flag must be 0 or 1", NULL);
  return v == 1;
}

/* A count of items each taking at least `min_bytes`: bounded by what is left. */
static uint32_t get_count(reader *r, size_t min_bytes, const char *f) {
  uint32_t n = get_u32(r, f);
  if (r->rc == 0 && (uint64_t)n * min_bytes > r->len - r->pos)
    fail(r, KILN_EINVAL, f, "count exceeds the bytes left", NULL);
  return r->rc ? 0 : n;
}

static void *arr(reader *r, size_t n, size_t elem) {
  if (r->rc) return NULL;
  void *p = kiln_arena_calloc(r->a, n ? n : 1, elem);
  if (p == NULL) fail(r, KILN_ENOMEM, "allocation", "out of memory", NULL);
  return p;
}

static const char *get_str(reader *r, const char *f, bool nullable) {
  uint32_t n = get_u32(r, f);
  if (r->rc) return NULL;
  if (n == NULL_STR) {
    if (!nullable) fail(r, KILN_EINVAL, f, "string missing", NULL);
    return NULL;
  }
  if (n > r->len - r->pos) {
    fail(r, KILN_EINVAL, f, "truncated", NULL);
    return NULL;
  }
  if (memchr(r->p + r->pos, 0, n)) {
    fail(r, KILN_EINVAL, f, "string holds a NUL byte", NULL);
    return NULL;
  }
  char *s = arr(r, (size_t)n + 1, 1);
  if (s) take(r, s, n, f);
  return s;
}

static void get_layout(reader *r, kiln_shape *s) {
  kiln_layout *l = arr(r, 1, sizeof *l);
  if (l == NULL) return;
  s->layout = l;
  l->rank = get_count(r, 8, "layout rank");
  if (r->rc == 0 && l->rank != s->rank)
    fail(r, KILN_EINVAL, "layout rank", "differs from the shape's rank", NULL);
  l->minor_to_major = arr(r, l->rank, sizeof(int64_t));
  uint8_t seen[MAX_RANK] = {0};
  for (uint32_t i = 0; r->rc == 0 && i < l->rank; i++) {
    int64_t d = get_i64(r, "layout minor_to_major");
    if (r->rc == 0 && (d < 0 || d >= (int64_t)l->rank || seen[d]++))
      fail(r, KILN_EINVAL, "layout minor_to_major", "not a permutation of the dims", NULL);
    if (r->rc == 0) l->minor_to_major[i] = d;
  }
  l->tail = get_str(r, "layout tail", true);
  l->memory_space = get_i64(r, "layout memory_space");
}

static void get_shape(reader *r, kiln_shape *s, int depth) {
  uint32_t t = get_u32(r, "shape dtype");
  if (r->rc) return;
  if (t == KILN_INVALID || t >= KILN_DTYPE_COUNT) {
    fail(r, KILN_EINVAL, "shape dtype", "unknown element type", NULL);
    return;
  }
  s->dtype = (kiln_dtype)t;
  s->rank = get_u32(r, "shape rank");
  if (r->rc == 0 && s->rank > MAX_RANK) fail(r, KILN_EINVAL, "shape rank", "too large", NULL);
  if (r->rc) return;
  if (s->dtype == KILN_TUPLE) {
    if (depth >= MAX_DEPTH) {
      fail(r, KILN_EINVAL, "shape tuple", "nested too deeply", NULL);
      return;
    }
    s->tuple = arr(r, s->rank, sizeof *s->tuple);
    for (uint32_t i = 0; r->rc == 0 && i < s->rank; i++) get_shape(r, &s->tuple[i], depth + 1);
    return;
  }
  if (!kiln_dtype_is_array(s->dtype) && s->rank != 0)
    fail(r, KILN_EINVAL, "shape rank", "a token or opaque shape has no dims", NULL);
  s->dims = arr(r, s->rank, sizeof *s->dims);
  for (uint32_t i = 0; r->rc == 0 && i < s->rank; i++) {
    s->dims[i] = get_i64(r, "shape dims");
    if (r->rc == 0 && s->dims[i] < 0) fail(r, KILN_EINVAL, "shape dims", "negative size", NULL);
  }
  if (get_bool(r, "shape dynamic flag")) {
    s->dynamic = arr(r, s->rank, 1);
    for (uint32_t i = 0; r->rc == 0 && i < s->rank; i++)
      s->dynamic[i] = get_bool(r, "shape dynamic");
  }
  if (get_bool(r, "shape layout flag")) get_layout(r, s);
  if (r->rc == 0 && kiln_dtype_is_array(s->dtype) && kiln_shape_bytes(s) < 0)
    fail(r, KILN_EINVAL, "shape dims", "size overflows", NULL);
}

static void get_binding(reader *r, kiln_binding *b, const char *field) {
  get_shape(r, &b->shape, 0);
  if (r->rc == 0 && b->shape.dtype == KILN_TUPLE)
    fail(r, KILN_EINVAL, field, "a binding must be an array or token", NULL);
  b->slot = get_u32(r, field);
}

static void get_slot(reader *r, kiln_slot *s) {
  uint32_t k = get_u32(r, "slot kind");
  if (r->rc == 0 && k > KILN_SLOT_OUTPUT) fail(r, KILN_EINVAL, "slot kind", "unknown kind", NULL);
  s->kind = (kiln_slot_kind)k;
  s->index = get_u32(r, "slot index");
  s->leaf = get_u32(r, "slot leaf");
  s->offset = get_u64(r, "slot offset");
  s->size = get_u64(r, "slot size");
}

/* Read as it comes; kiln_conv_check judges it with the slots (check_step). */
static void get_conv(reader *r, kiln_step *s) {
  kiln_conv *c = arr(r, 1, sizeof *c);
  if (c == NULL) return;
  c->dtype = (kiln_dtype)get_u32(r, "conv dtype");
  c->nspatial = get_u32(r, "conv nspatial");
  c->feature_groups = get_i64(r, "conv feature_groups");
  c->batch_groups = get_i64(r, "conv batch_groups");
  for (int i = 0; i < KILN_CONV_MAX_DIMS; i++) {
    c->lhs_dims[i] = get_i64(r, "conv lhs dims");
    c->lhs_strides[i] = get_i64(r, "conv lhs strides");
    c->rhs_dims[i] = get_i64(r, "conv rhs dims");
    c->rhs_strides[i] = get_i64(r, "conv rhs strides");
    c->out_dims[i] = get_i64(r, "conv out dims");
    c->out_strides[i] = get_i64(r, "conv out strides");
  }
  for (int i = 0; i < KILN_CONV_MAX_SPATIAL; i++) {
    c->stride[i] = get_i64(r, "conv window stride");
    c->pad_lo[i] = get_i64(r, "conv window pad_lo");
    c->pad_hi[i] = get_i64(r, "conv window pad_hi");
    c->lhs_dilate[i] = get_i64(r, "conv window lhs_dilate");
    c->rhs_dilate[i] = get_i64(r, "conv window rhs_dilate");
  }
  s->conv = c;
}

/* Read as it comes; kiln_fft_check judges it with the slots (check_step). */
static void get_fft(reader *r, kiln_step *s) {
  kiln_fft *f = arr(r, 1, sizeof *f);
  if (f == NULL) return;
  f->type = get_u32(r, "fft type");
  f->dtype = get_u32(r, "fft dtype");
  f->rank = get_u32(r, "fft rank");
  f->nfft = get_u32(r, "fft nfft");
  for (int i = 0; i < KILN_FFT_MAX_RANK; i++) {
    f->len[i] = get_i64(r, "fft lengths");
    f->in_dims[i] = get_i64(r, "fft operand dims");
    f->in_strides[i] = get_i64(r, "fft operand strides");
    f->out_dims[i] = get_i64(r, "fft result dims");
    f->out_strides[i] = get_i64(r, "fft result strides");
  }
  s->fft = f;
}

/* Read as it comes; kiln_linalg_check judges it with the slots. */
static void get_linalg(reader *r, kiln_step *s) {
  kiln_linalg *g = arr(r, 1, sizeof *g);
  if (g == NULL) return;
  kiln_lapack *l = &g->l;
  l->kind = get_u32(r, "linalg kind");
  l->dtype = get_u32(r, "linalg dtype");
  l->nbatch = get_u32(r, "linalg nbatch");
  l->nargs = get_u32(r, "linalg nargs");
  for (int i = 0; i < KILN_LAPACK_MAX_BATCH; i++) l->batch[i] = get_i64(r, "linalg batch");
  l->m = get_i64(r, "linalg m");
  l->n = get_i64(r, "linalg n");
  l->k = get_i64(r, "linalg k");
  uint8_t *f[5] = {&l->uplo, &l->side, &l->trans, &l->diag, &l->mode};
  for (int i = 0; i < 5; i++) *f[i] = (uint8_t)get_u8(r, "linalg flags");
  for (int a = 0; a < KILN_LAPACK_MAX_ARGS; a++)
    for (int d = 0; d < KILN_LINALG_MAX_RANK; d++) g->strides[a][d] = get_i64(r, "linalg strides");
  s->linalg = g;
}

#define MAX_MESH 4096 /* devices of a collective step's mesh */

static void get_coll(reader *r, kiln_coll *c) {
  uint32_t *v[7] = {&c->op,         &c->reduce, &c->dtype, &c->replicas,
                    &c->partitions, &c->nops,   &c->gsize};
  for (int i = 0; i < 7; i++) *v[i] = get_u32(r, "collective fields");
  uint64_t ndev = (uint64_t)c->replicas * c->partitions;
  if (r->rc == 0 && (c->replicas == 0 || c->partitions == 0 || ndev > MAX_MESH || c->gsize == 0 ||
                     c->gsize > ndev))
    fail(r, KILN_EINVAL, "collective mesh", "bad replicas, partitions or group size", NULL);
  if (r->rc == 0 && ndev * c->gsize * 4 > r->len - r->pos)
    fail(r, KILN_EINVAL, "collective groups", "count exceeds the bytes left", NULL);
  if (r->rc) return;
  c->members = arr(r, (size_t)(ndev * c->gsize), sizeof *c->members);
  for (uint64_t i = 0; r->rc == 0 && i < ndev * c->gsize; i++)
    c->members[i] = get_u32(r, "collective groups");
  if (get_bool(r, "collective source flag")) {
    if (r->rc == 0 && ndev * 4 > r->len - r->pos)
      fail(r, KILN_EINVAL, "collective sources", "count exceeds the bytes left", NULL);
    c->source = arr(r, (size_t)ndev, sizeof *c->source);
    for (uint64_t i = 0; r->rc == 0 && i < ndev; i++)
      c->source[i] = (int32_t)get_u32(r, "collective sources");
  }
  if (r->rc == 0 && (uint64_t)c->nops * 8 > r->len - r->pos)
    fail(r, KILN_EINVAL, "collective operands", "count exceeds the bytes left", NULL);
  c->outer = arr(r, c->nops, sizeof *c->outer);
  for (uint32_t i = 0; r->rc == 0 && i < c->nops; i++) c->outer[i] = get_u64(r, "collective rows");
}

static void get_step(reader *r, kiln_step *s) {
  uint32_t k = get_u32(r, "step kind");
  if (r->rc == 0 && k > KILN_STEP_LINALG) fail(r, KILN_EINVAL, "step kind", "unknown kind", NULL);
  s->kind = (kiln_step_kind)k;
  s->kernel = get_u32(r, "step kernel");
  s->range = get_u64(r, "step range");
  s->nargs = get_count(r, 4, "step nargs");
  s->args = arr(r, s->nargs, sizeof *s->args);
  for (uint32_t i = 0; r->rc == 0 && i < s->nargs; i++) s->args[i] = get_u32(r, "step args");
  s->nsub = get_count(r, 4, "step nsub");
  s->sub = arr(r, s->nsub, sizeof *s->sub);
  for (uint32_t i = 0; r->rc == 0 && i < s->nsub; i++) s->sub[i] = get_u32(r, "step sub");
  kiln_gemm *g = &s->gemm;
  g->dtype = (kiln_dtype)get_u32(r, "gemm dtype");
  int64_t *v[10] = {&g->batch, &g->m,   &g->n,        &g->k,        &g->lda,
                    &g->ldb,   &g->ldc, &g->stride_a, &g->stride_b, &g->stride_c};
  for (int i = 0; i < 10; i++) *v[i] = get_i64(r, "gemm dims");
  g->trans_a = get_bool(r, "gemm trans_a");
  g->trans_b = get_bool(r, "gemm trans_b");
  uint64_t a = get_u64(r, "gemm alpha"), b = get_u64(r, "gemm beta");
  memcpy(&g->alpha, &a, sizeof a);
  memcpy(&g->beta, &b, sizeof b);
  s->conv = NULL;
  s->fft = NULL;
  s->linalg = NULL;
  if (r->rc == 0 && s->kind == KILN_STEP_CONV) get_conv(r, s);
  if (r->rc == 0 && s->kind == KILN_STEP_LINALG) get_linalg(r, s);
  if (r->rc == 0 && s->kind == KILN_STEP_FFT) get_fft(r, s);
  if (r->rc == 0 && s->kind == KILN_STEP_COLLECTIVE) get_coll(r, &s->coll);
}

/* ---- checks of the whole ------------------------------------------------ */

static int bad(kiln_status *st, const char *field, uint32_t i, const char *what) {
  return kiln_status_set(st, KILN_EINVAL, "executable blob", "%s %u: %s", field, i, what);
}

static uint32_t count_leaves(const kiln_shape *s) {
  if (s->dtype != KILN_TUPLE) return 1;
  uint32_t n = 0;
  for (uint32_t i = 0; i < s->rank; i++) n += count_leaves(&s->tuple[i]);
  return n;
}

static bool range_ok(uint64_t off, uint64_t size, uint64_t total) {
  return off <= total && size <= total - off;
}

static int check_slots(const kiln_executable *e, kiln_status *st) {
  for (uint32_t i = 0; i < e->nslots; i++) {
    const kiln_slot *s = &e->slots[i];
    switch (s->kind) {
    case KILN_SLOT_TEMP:
      if (!range_ok(s->offset, s->size, e->temp_bytes))
        return bad(st, "slot", i, "lies outside the temporary arena");
      break;
    case KILN_SLOT_CONSTANT:
      if (!range_ok(s->offset, s->size, e->nconstants))
        return bad(st, "slot", i, "lies outside the constants");
      break;
    case KILN_SLOT_PARAM:
      if (s->index >= e->nparams)
        return bad(st, "slot", i, "names a parameter that does not exist");
      if (s->leaf >= count_leaves(&e->param_shapes[s->index]))
        return bad(st, "slot", i, "names a parameter leaf that does not exist");
      break;
    case KILN_SLOT_OUTPUT:
      if (s->index >= e->nresults) return bad(st, "slot", i, "names a result that does not exist");
      break;
    }
  }
  return 0;
}

static int check_bindings(const kiln_executable *e, kiln_status *st) {
  uint32_t leaves = 0;
  for (uint32_t i = 0; i < e->nparams; i++) leaves += count_leaves(&e->param_shapes[i]);
  if (leaves != e->nparam_leaves)
    return bad(st, "nparam_leaves", e->nparam_leaves, "differs from the parameter shapes' leaves");
  if (count_leaves(&e->result_shape) != e->nresults)
    return bad(st, "nresults", e->nresults, "differs from the result shape's leaves");
  for (uint32_t i = 0; i < e->nparam_leaves; i++)
    if (e->params[i].slot >= e->nslots) return bad(st, "parameter binding", i, "slot out of range");
  for (uint32_t i = 0; i < e->nresults; i++) {
    uint32_t s = e->results[i].slot;
    if (s >= e->nslots) return bad(st, "result binding", i, "slot out of range");
    int64_t need = kiln_shape_bytes(&e->results[i].shape);
    if (need < 0 || (uint64_t)need > e->slots[s].size)
      return bad(st, "result binding", i, "slot is smaller than the result");
  }
  return 0;
}

static uint64_t slot_size(const kiln_executable *e, uint32_t s) { return e->slots[s].size; }

/* Bytes a row-major view of `rows` x `cols` with leading dim ld spans, batched. */
static bool gemm_view_ok(int64_t batch, int64_t rows, int64_t cols, int64_t ld, int64_t stride,
                         uint64_t esize, uint64_t have) {
  if (batch < 0 || rows < 0 || cols < 0 || ld < 0 || stride < 0) return false;
  if (batch == 0 || rows == 0 || cols == 0) return true;
  if (ld < cols) return false;
  __int128 last = (__int128)(batch - 1) * stride + (__int128)(rows - 1) * ld + cols;
  return last * esize <= (__int128)have;
}

static int check_gemm(const kiln_executable *e, const kiln_step *s, uint32_t p) {
  const kiln_gemm *g = &s->gemm;
  bool i8 = g->dtype == KILN_S8 || g->dtype == KILN_U8, bf = g->dtype == KILN_BF16;
  if (g->dtype != KILN_F32 && g->dtype != KILN_F64 && !i8 && !bf) return -1;
  if (i8 && s->nargs != 3) return -1;                               /* no epilogue */
  uint64_t es = kiln_dtype_size(g->dtype), esc = i8 || bf ? 4 : es; /* C: s32, f32 */
  int64_t ar = g->trans_a ? g->k : g->m, ac = g->trans_a ? g->m : g->k;
  int64_t br = g->trans_b ? g->n : g->k, bc = g->trans_b ? g->k : g->n;
  if (!gemm_view_ok(g->batch, ar, ac, g->lda, g->stride_a, es, slot_size(e, s->args[0])) ||
      !gemm_view_ok(g->batch, br, bc, g->ldb, g->stride_b, es, slot_size(e, s->args[1])) ||
      !gemm_view_ok(g->batch, g->m, g->n, g->ldc, g->stride_c, esc, slot_size(e, s->args[2])))
    return -1;
  (void)p;
  return 0;
}

static bool is_reduction(uint32_t op, uint32_t dtype) {
  bool logic = op == KILN_OP_AND || op == KILN_OP_OR;
  bool arith =
      op == KILN_OP_ADD || op == KILN_OP_MULTIPLY || op == KILN_OP_MAXIMUM || op == KILN_OP_MINIMUM;
  if (dtype == KILN_PRED) return logic || op == KILN_OP_MAXIMUM || op == KILN_OP_MINIMUM;
  if (kiln_dtype_is_float((kiln_dtype)dtype)) return arith;
  return arith || logic;
}

/* Whether the members of every device's group are in range, every row
 * equals its first member's row and every member has that first member
 * (so all members share one row), and every device is in its own row
 * exactly once (which, rows being shared, rules out repeats): linear in
 * the table, which is as long as the blob allows. */
static const char *check_groups(const kiln_coll *c) {
  uint32_t ndev = c->replicas * c->partitions, g = c->gsize;
  for (uint32_t d = 0; d < ndev; d++) {
    const uint32_t *row = c->members + (size_t)d * g;
    uint32_t self = 0;
    for (uint32_t k = 0; k < g; k++) {
      if (row[k] >= ndev) return "a group member is outside the mesh";
      self += row[k] == d;
    }
    if (self != 1) return "a device is not in its own group exactly once";
    if (memcmp(c->members + (size_t)row[0] * g, row, g * sizeof *row) != 0)
      return "members disagree on their group";
    for (uint32_t k = 0; k < g; k++)
      if (c->members[(size_t)row[k] * g] != row[0]) return "members disagree on their group";
  }
  return NULL;
}

/* Elements spanned by `batch` row-major matrices of rows x cols with leading
 * dimension ld, `stride` apart; false on overflow. */
static bool gemm_span(int64_t batch, int64_t rows, int64_t cols, int64_t ld, int64_t stride,
                      uint64_t *out) {
  *out = 0;
  if (batch == 0 || rows == 0 || cols == 0) return true;
  int64_t a, b, t;
  if (__builtin_mul_overflow(batch - 1, stride, &a) || __builtin_mul_overflow(rows - 1, ld, &b) ||
      __builtin_add_overflow(a, b, &t) || __builtin_add_overflow(t, cols, &t))
    return false;
  *out = (uint64_t)t;
  return true;
}

bool kiln_gemm_check_extents(const kiln_gemm *g, const uint32_t *args, const kiln_slot *slots,
                             char *why, size_t nwhy) {
  if (g->trans_a > 1 || g->trans_b > 1) {
    snprintf(why, nwhy, "gemm transpose flags %u, %u (0 or 1)", g->trans_a, g->trans_b);
    return false;
  }
  bool wide_c = g->dtype == KILN_S8 || g->dtype == KILN_U8 || g->dtype == KILN_BF16;
  int64_t ra = g->trans_a ? g->k : g->m, ca = g->trans_a ? g->m : g->k;
  int64_t rb = g->trans_b ? g->n : g->k, cb = g->trans_b ? g->k : g->n;
  struct {
    const char *name;
    int64_t rows, cols, ld, stride;
  } mats[3] = {{"A", ra, ca, g->lda, g->stride_a},
               {"B", rb, cb, g->ldb, g->stride_b},
               {"C", g->m, g->n, g->ldc, g->stride_c}};
  for (int i = 0; i < 3; i++) {
    size_t esize = wide_c && i == 2 ? 4 : kiln_dtype_size(g->dtype); /* C: s32, f32 */
    int64_t minld = mats[i].cols > 1 ? mats[i].cols : 1;
    if (mats[i].ld < minld || mats[i].ld > INT32_MAX || mats[i].stride < 0) {
      snprintf(why, nwhy, "gemm %s: leading dimension %lld (at least %lld), stride %lld",
               mats[i].name, (long long)mats[i].ld, (long long)minld, (long long)mats[i].stride);
      return false;
    }
    uint64_t span, bytes;
    if (!gemm_span(g->batch, mats[i].rows, mats[i].cols, mats[i].ld, mats[i].stride, &span) ||
        __builtin_mul_overflow(span, (uint64_t)esize, &bytes)) {
      snprintf(why, nwhy, "gemm %s: extent overflows", mats[i].name);
      return false;
    }
    uint64_t have = slots[args[i]].size;
    if (bytes > have) {
      snprintf(why, nwhy, "gemm %s spans %llu bytes, slot %u has %llu", mats[i].name,
               (unsigned long long)bytes, args[i], (unsigned long long)have);
      return false;
    }
  }
  uint64_t one_c = 0;
  gemm_span(1, g->m, g->n, g->ldc, 0, &one_c);
  if (g->batch > 1 && (uint64_t)g->stride_c < one_c) {
    snprintf(why, nwhy, "gemm C batches overlap (stride %lld < %llu)", (long long)g->stride_c,
             (unsigned long long)one_c);
    return false;
  }
  return true;
}

const char *kiln_coll_check(const kiln_coll *c, uint32_t nargs, const kiln_slot *slots,
                            const uint32_t *args) {
  if (c->op == KILN_OP_REPLICA_ID || c->op == KILN_OP_PARTITION_ID) {
    if (nargs != 1 || c->nops != 0 || slots[args[0]].size < 4) return "needs one u32 result slot";
    if (c->members == NULL || check_groups(c)) return "bad mesh";
    return NULL;
  }
  bool known = c->op == KILN_OP_ALL_REDUCE || c->op == KILN_OP_ALL_GATHER ||
               c->op == KILN_OP_REDUCE_SCATTER || c->op == KILN_OP_ALL_TO_ALL ||
               c->op == KILN_OP_COLLECTIVE_PERMUTE || c->op == KILN_OP_COLLECTIVE_BROADCAST;
  if (!known) return "unknown collective";
  if (c->dtype == KILN_INVALID || c->dtype >= KILN_DTYPE_COUNT ||
      !kiln_dtype_is_array((kiln_dtype)c->dtype) || kiln_dtype_size((kiln_dtype)c->dtype) == 0)
    return "bad element type";
  if ((c->op == KILN_OP_ALL_REDUCE || c->op == KILN_OP_REDUCE_SCATTER) &&
      !is_reduction(c->reduce, c->dtype))
    return "unknown reduction for the element type";
  if (c->nops == 0 || nargs != 2 * c->nops) return "needs its operands and as many results";
  const char *why = check_groups(c);
  if (why) return why;
  uint32_t ndev = c->replicas * c->partitions, n = c->gsize;
  if (c->op == KILN_OP_COLLECTIVE_PERMUTE) {
    if (c->source == NULL || c->nops != 1) return "needs one operand and a source per device";
    for (uint32_t d = 0; d < ndev; d++) {
      int32_t s = c->source[d];
      if (s < -1 || s >= (int32_t)ndev) return "a source is outside the mesh";
      bool member = s < 0;
      for (uint32_t k = 0; k < n && !member; k++)
        member = c->members[(size_t)d * n + k] == (uint32_t)s;
      if (!member) return "a source is not a member of the device's group";
    }
  }
  uint64_t es = kiln_dtype_size((kiln_dtype)c->dtype);
  bool tuple_a2a = c->op == KILN_OP_ALL_TO_ALL && c->outer[0] == 0;
  if (tuple_a2a && c->nops != n) return "the tuple all-to-all needs one operand per member";
  uint64_t first = slots[args[0]].size;
  for (uint32_t i = 0; i < c->nops; i++) {
    uint64_t in = slots[args[i]].size, out = slots[args[c->nops + i]].size, rows = c->outer[i];
    if (tuple_a2a) {
      if (rows != 0 || in != first || out != first || in % es) return "operand sizes differ";
      continue;
    }
    if (rows == 0 || in % rows || in / rows % es) return "rows do not divide the operand";
    uint64_t row = in / rows, want = in;
    if (c->op == KILN_OP_ALL_GATHER) want = in * n;
    if (c->op == KILN_OP_REDUCE_SCATTER || c->op == KILN_OP_ALL_TO_ALL) {
      if (row % (n * es)) return "a row does not split over the group";
      if (c->op == KILN_OP_REDUCE_SCATTER) want = in / n;
    }
    if (out != want) return "result size does not match the operand";
  }
  return NULL;
}

static int check_step(const kiln_executable *e, uint32_t p, const kiln_step *s, kiln_status *st) {
  for (uint32_t i = 0; i < s->nargs; i++)
    if (s->args[i] >= e->nslots) return bad(st, "step slot in program", p, "out of range");
  for (uint32_t i = 0; i < s->nsub; i++)
    if (s->sub[i] >= e->nprograms || s->sub[i] <= p)
      return bad(st, "nested program of program", p, "must be a later program");
  switch (s->kind) {
  case KILN_STEP_KERNEL:
    if (s->kernel >= e->nkernels)
      return bad(st, "kernel step in program", p, "kernel out of range");
    break;
  case KILN_STEP_GEMM:
    if (s->nargs < 3 || check_gemm(e, s, p))
      return bad(st, "gemm step in program", p, "bad type, dims or operands");
    if (s->nargs > 3 && (s->kernel >= e->nkernels || s->range == 0))
      return bad(st, "gemm step in program", p, "epilogue kernel out of range");
    break;
  case KILN_STEP_COPY:
    if (s->nargs != 2 || s->range > slot_size(e, s->args[0]) || s->range > slot_size(e, s->args[1]))
      return bad(st, "copy step in program", p, "copies past the end of a slot");
    break;
  case KILN_STEP_WHILE:
    if (s->nsub != 2 || s->nargs < 1)
      return bad(st, "while step in program", p, "needs 2 programs and a predicate");
    break;
  case KILN_STEP_CONDITIONAL:
    if (s->nsub < 1 || s->nargs < 1)
      return bad(st, "conditional step in program", p, "needs branches and a selector");
    break;
  case KILN_STEP_CALL:
    if (s->nsub != 1) return bad(st, "call step in program", p, "needs 1 program");
    break;
  case KILN_STEP_CONV: {
    char why[160];
    if (s->nargs != 3 || s->conv == NULL)
      return bad(st, "conv step in program", p, "needs 3 slots (lhs, rhs, out) and a description");
    if (!kiln_conv_check(s->conv, slot_size(e, s->args[0]), slot_size(e, s->args[1]),
                         slot_size(e, s->args[2]), why, sizeof why))
      return kiln_status_set(st, KILN_EINVAL, "executable blob", "conv step in program %u: %s", p,
                             why);
    break;
  }
  case KILN_STEP_COLLECTIVE: {
    const char *why = kiln_coll_check(&s->coll, s->nargs, e->slots, s->args);
    if (why) return bad(st, "collective step in program", p, why);
    break;
  }
  case KILN_STEP_DEBUG_PRINT: {
    kiln_debug_record rec;
    char why[160];
    const kiln_slot *rs = s->nargs == 2 ? &e->slots[s->args[1]] : NULL;
    if (rs == NULL || rs->kind != KILN_SLOT_CONSTANT)
      return bad(st, "debug print step in program", p, "needs a value and a constant record");
    if (!kiln_debug_record_read(e->constants + rs->offset, rs->size, slot_size(e, s->args[0]), &rec,
                                why, sizeof why))
      return kiln_status_set(st, KILN_EINVAL, "executable blob",
                             "debug print step in program %u: %s", p, why);
    break;
  }
  case KILN_STEP_FFT: {
    char why[200];
    if (s->nargs != 2 || s->fft == NULL)
      return bad(st, "fft step in program", p, "needs 2 slots (operand, result) and a description");
    if (!kiln_fft_check(s->fft, slot_size(e, s->args[0]), slot_size(e, s->args[1]), why,
                        sizeof why))
      return kiln_status_set(st, KILN_EINVAL, "executable blob", "fft step in program %u: %s", p,
                             why);
    break;
  }
  case KILN_STEP_LINALG: {
    char why[200];
    uint64_t sizes[KILN_LAPACK_MAX_ARGS];
    if (s->linalg == NULL || s->nargs > KILN_LAPACK_MAX_ARGS)
      return bad(st, "linalg step in program", p, "needs its slots and a description");
    for (uint32_t i = 0; i < s->nargs; i++) sizes[i] = slot_size(e, s->args[i]);
    if (!kiln_linalg_check(s->linalg, s->nargs, sizes, why, sizeof why))
      return kiln_status_set(st, KILN_EINVAL, "executable blob", "linalg step in program %u: %s", p,
                             why);
    break;
  }
  }
  return 0;
}

/* a and b alike but for the dynamic flags (arrays; tuples recursively). */
static bool same_but_dynamic(const kiln_shape *a, const kiln_shape *b) {
  if (a->dtype != b->dtype || a->rank != b->rank) return false;
  for (uint32_t i = 0; i < a->rank; i++) {
    if (a->dtype == KILN_TUPLE ? !same_but_dynamic(&a->tuple[i], &b->tuple[i])
                               : a->dims[i] != b->dims[i])
      return false;
  }
  return true;
}

static bool is_s32_scalar(const kiln_shape *s) { return s->dtype == KILN_S32 && s->rank == 0; }

/* The i-th array leaf of s (depth-first), or NULL. */
static const kiln_shape *leaf_at(const kiln_shape *s, uint32_t *i) {
  if (s->dtype != KILN_TUPLE) return (*i)-- == 0 ? s : NULL;
  for (uint32_t k = 0; k < s->rank; k++) {
    const kiln_shape *l = leaf_at(&s->tuple[k], i);
    if (l) return l;
  }
  return NULL;
}

/* The bounded-dynamic signature against the padded one it describes: what
 * the cpu runtime relies on when it binds sizes (executor/cpu/cpu_bind.c). */
static int check_dyn(const kiln_executable *e, kiln_status *st) {
  const kiln_exe_dynamic *d = e->dyn;
  if (d == NULL) return 0;
  if ((uint64_t)d->nuser_params + d->nsize_params != e->nparams)
    return bad(st, "dynamic nuser_params", d->nuser_params, "and the sizes differ from nparams");
  for (uint32_t i = 0; i < d->nuser_params; i++)
    if (!same_but_dynamic(&d->user_param_shapes[i], &e->param_shapes[i]))
      return bad(st, "dynamic user_param_shapes", i, "differs from the parameter's bounds");
  for (uint32_t i = 0; i < d->nsize_params; i++) {
    const kiln_dyn_dim *z = &d->size_params[i];
    if (z->leaf >= d->nuser_params || !kiln_shape_is_array(&d->user_param_shapes[z->leaf]) ||
        z->dim >= d->user_param_shapes[z->leaf].rank ||
        !is_s32_scalar(&e->param_shapes[d->nuser_params + i]))
      return bad(st, "dynamic size_params", i, "names no dimension of an array parameter");
  }
  const kiln_shape *r = &e->result_shape;
  if (r->dtype != KILN_TUPLE || r->rank != 1 + d->nsize_results ||
      !same_but_dynamic(&d->user_result, &r->tuple[0]) ||
      count_leaves(&d->user_result) != d->nuser_results)
    return bad(st, "dynamic user_result", d->nuser_results, "differs from the result shape");
  for (uint32_t i = 0; i < d->nsize_results; i++) {
    const kiln_dyn_dim *z = &d->size_results[i];
    uint32_t k = z->leaf;
    const kiln_shape *l = z->leaf < d->nuser_results ? leaf_at(&d->user_result, &k) : NULL;
    if (l == NULL || z->dim >= l->rank || !is_s32_scalar(&r->tuple[1 + i]))
      return bad(st, "dynamic size_results", i, "names no dimension of a result leaf");
  }
  return 0;
}

static int check_all(const kiln_executable *e, kiln_status *st) {
  if (e->nprograms == 0) return bad(st, "nprograms", 0, "an executable needs an entry program");
  int rc = check_slots(e, st);
  if (rc == 0) rc = check_bindings(e, st);
  if (rc == 0) rc = check_dyn(e, st);
  for (uint32_t p = 0; rc == 0 && p < e->nprograms; p++)
    for (uint32_t i = 0; rc == 0 && i < e->programs[p].nsteps; i++)
      rc = check_step(e, p, &e->programs[p].steps[i], st);
  return rc;
}

static void get_header(reader *r, kiln_executable *e) {
  char magic[8];
  if (!take(r, magic, 8, "magic")) return;
  if (memcmp(magic, KILN_EXE_MAGIC, 8) != 0) {
    r->pos = 0;
    fail(r, KILN_EINVAL, "magic", "not a Kiln executable", NULL);
    return;
  }
  e->format_version = get_u32(r, "format version");
  if (r->rc == 0 && e->format_version != KILN_EXE_FORMAT_VERSION) {
    char v[32];
    snprintf(v, sizeof v, "%u (expected %u)", e->format_version, KILN_EXE_FORMAT_VERSION);
    fail(r, KILN_EINVAL, "format version", "unsupported format version ", v);
    return;
  }
  if (r->rc) return;
  if (r->len < 20 + 8) {
    fail(r, KILN_EINVAL, "checksum", "truncated", NULL);
    return;
  }
  uint64_t want = 0;
  for (int i = 8; i-- > 0;) want = want << 8 | r->p[r->len - 8 + i];
  if (fnv1a(r->p, r->len - 8) != want) {
    fail(r, KILN_EINVAL, "checksum", "the blob is damaged (checksum mismatch)", NULL);
    return;
  }
  r->len -= 8; /* the fields end where the checksum starts */
  e->compiler_version = get_str(r, "compiler version", false);
  e->target = get_str(r, "target", false);
  take(r, e->key, 32, "key");
}

static kiln_dyn_dim *get_dyn_dims(reader *r, uint32_t *n, const char *field) {
  *n = get_count(r, 8, field);
  kiln_dyn_dim *d = arr(r, *n, sizeof *d);
  for (uint32_t i = 0; r->rc == 0 && i < *n; i++) {
    d[i].leaf = get_u32(r, field);
    d[i].dim = get_u32(r, field);
  }
  return d;
}

static void get_dyn(reader *r, kiln_executable *e) {
  if (!get_bool(r, "dynamic flag") || r->rc) return;
  kiln_exe_dynamic *d = arr(r, 1, sizeof *d);
  if (d == NULL) return;
  d->nuser_params = get_count(r, 8, "dynamic nuser_params");
  d->user_param_shapes = arr(r, d->nuser_params, sizeof *d->user_param_shapes);
  for (uint32_t i = 0; r->rc == 0 && i < d->nuser_params; i++)
    get_shape(r, &d->user_param_shapes[i], 0);
  get_shape(r, &d->user_result, 0);
  d->nuser_results = get_u32(r, "dynamic nuser_results");
  d->size_params = get_dyn_dims(r, &d->nsize_params, "dynamic size_params");
  d->size_results = get_dyn_dims(r, &d->nsize_results, "dynamic size_results");
  e->dyn = d;
}

static void get_body(reader *r, kiln_executable *e) {
  e->nparams = get_count(r, 8, "nparams");
  e->param_shapes = arr(r, e->nparams, sizeof *e->param_shapes);
  for (uint32_t i = 0; r->rc == 0 && i < e->nparams; i++) get_shape(r, &e->param_shapes[i], 0);
  get_shape(r, &e->result_shape, 0);
  e->nparam_leaves = get_count(r, 13, "nparam_leaves");
  e->params = arr(r, e->nparam_leaves, sizeof *e->params);
  for (uint32_t i = 0; r->rc == 0 && i < e->nparam_leaves; i++)
    get_binding(r, &e->params[i], "parameter binding slot");
  e->nresults = get_count(r, 13, "nresults");
  e->results = arr(r, e->nresults, sizeof *e->results);
  for (uint32_t i = 0; r->rc == 0 && i < e->nresults; i++)
    get_binding(r, &e->results[i], "result binding slot");
  e->nslots = get_count(r, 28, "nslots");
  e->slots = arr(r, e->nslots, sizeof *e->slots);
  for (uint32_t i = 0; r->rc == 0 && i < e->nslots; i++) get_slot(r, &e->slots[i]);
  e->temp_bytes = get_u64(r, "temp_bytes");
  e->peak_bytes = get_u64(r, "peak_bytes");
  e->nconstants = get_u64(r, "nconstants");
  if (r->rc == 0 && e->nconstants > r->len - r->pos)
    fail(r, KILN_EINVAL, "nconstants", "truncated", NULL);
  e->constants = arr(r, (size_t)e->nconstants, 1);
  take(r, e->constants, (size_t)e->nconstants, "constants");
  e->nprograms = get_count(r, 4, "nprograms");
  e->programs = arr(r, e->nprograms, sizeof *e->programs);
  for (uint32_t p = 0; r->rc == 0 && p < e->nprograms; p++) {
    kiln_program *pr = &e->programs[p];
    pr->nsteps = get_count(r, 120, "nsteps");
    pr->steps = arr(r, pr->nsteps, sizeof *pr->steps);
    for (uint32_t i = 0; r->rc == 0 && i < pr->nsteps; i++) get_step(r, &pr->steps[i]);
  }
  e->nkernels = get_u32(r, "nkernels");
  e->code_kind = get_u32(r, "code kind");
  if (r->rc == 0 && e->code_kind > KILN_CODE_CUBIN)
    fail(r, KILN_EINVAL, "code kind", "unknown code kind", NULL);
  e->ncode = get_u64(r, "ncode");
  if (r->rc == 0 && e->ncode > r->len - r->pos) fail(r, KILN_EINVAL, "ncode", "truncated", NULL);
  e->code = arr(r, (size_t)e->ncode, 1);
  take(r, e->code, (size_t)e->ncode, "code");
  get_dyn(r, e);
  if (r->rc == 0 && r->pos != r->len)
    fail(r, KILN_EINVAL, "end", "trailing bytes after the code", NULL);
}

int kiln_executable_deserialize(const uint8_t *buf, size_t len, kiln_executable **out,
                                kiln_status *st) {
  *out = NULL;
  if (buf == NULL && len) return kiln_status_set(st, KILN_EINVAL, "executable blob", "no data");
  kiln_executable *e = kiln_executable_create();
  if (e == NULL) return kiln_status_set(st, KILN_ENOMEM, "executable blob", "out of memory");
  reader r = {buf, len, 0, e->arena, st, 0};
  get_header(&r, e);
  if (r.rc == 0) get_body(&r, e);
  int rc = r.rc ? r.rc : check_all(e, st);
  if (rc) {
    kiln_executable_destroy(e);
    return rc;
  }
  *out = e;
  return 0;
}
