/* Collectives between cpu devices, in shared memory.
 *
 * Every cpu device addresses the host's memory, so a collective called for
 * a whole communicator (executor/comm.c checked the descriptor: ranks,
 * sizes, pairs, aliasing) is plain loops over the ranks' buffers on the
 * caller's thread. Reductions go a block of elements at a time: the block's
 * result is computed from every rank's send buffer into a local
 * accumulator before any recv buffer is written, which is what makes an
 * in-place all-reduce (send[r] == recv[r]) correct. Reduction order is rank
 * order, the same on every rank, so all ranks see bit-identical results.
 */
#include <string.h>

#include "common/alloc.h"
#include "common/fp16.h"
#include "executor/cpu/cpu.h"

#define BLOCK 512 /* elements per reduction block */

#define REDUCE_TYPES(X) \
  X(KILN_F32, float) \
  X(KILN_F64, double) \
  X(KILN_S32, int32_t) \
  X(KILN_S64, int64_t) \
  X(KILN_U32, uint32_t) \
  X(KILN_U64, uint64_t)

/* acc[i] = acc[i] op x[i] for i < n. Integer add and multiply wrap (as
 * XLA's do): done in the unsigned type. */
#define DEFINE_COMBINE(DT, T) \
  static void combine_##T(T *acc, const T *x, size_t n, int op) { \
    switch (op) { \
    case KILN_OP_ADD: \
      for (size_t i = 0; i < n; i++) acc[i] = wrap_add_##T(acc[i], x[i]); \
      break; \
    case KILN_OP_MULTIPLY: \
      for (size_t i = 0; i < n; i++) acc[i] = wrap_mul_##T(acc[i], x[i]); \
      break; \
    case KILN_OP_MAXIMUM: \
      for (size_t i = 0; i < n; i++) acc[i] = pick_max_##T(acc[i], x[i]); \
      break; \
    default: \
      for (size_t i = 0; i < n; i++) acc[i] = pick_min_##T(acc[i], x[i]); \
      break; \
    } \
  }

/* Float max/min propagate NaN, as HLO's maximum and minimum do. */
#define FLOAT_OPS(T) \
  static T wrap_add_##T(T a, T b) { return a + b; } \
  static T wrap_mul_##T(T a, T b) { return a * b; } \
  static T pick_max_##T(T a, T b) { return a != a ? a : b != b ? b : (a > b ? a : b); } \
  static T pick_min_##T(T a, T b) { return a != a ? a : b != b ? b : (a < b ? a : b); }
#define INT_OPS(T, U) \
  static T wrap_add_##T(T a, T b) { return (T)((U)a + (U)b); } \
  static T wrap_mul_##T(T a, T b) { return (T)((U)a * (U)b); } \
  static T pick_max_##T(T a, T b) { return a > b ? a : b; } \
  static T pick_min_##T(T a, T b) { return a < b ? a : b; }

FLOAT_OPS(float)
FLOAT_OPS(double)
INT_OPS(int32_t, uint32_t)
INT_OPS(int64_t, uint64_t)
INT_OPS(uint32_t, uint32_t)
INT_OPS(uint64_t, uint64_t)
REDUCE_TYPES(DEFINE_COMBINE)

typedef void (*combine_fn)(void *acc, const void *x, size_t n, int op);

static combine_fn combiner(int dtype) {
  switch (dtype) {
#define CASE(DT, T) \
  case DT: return (combine_fn)combine_##T;
    REDUCE_TYPES(CASE)
#undef CASE
  default: return NULL;
  }
}

/* Host addresses of every rank's buffers (cpu buffers are host memory). */
static int map_ranks(kiln_comm *c, const kiln_collective *d, const char **send, char **recv,
                     kiln_status *st) {
  for (uint32_t r = 0; r < c->ndevices; r++) {
    send[r] = kiln_buffer_host(d->send[r], false);
    recv[r] = kiln_buffer_host(d->recv[r], false);
    if (send[r] == NULL || recv[r] == NULL)
      return kiln_status_set(st, KILN_EUNIMPL, "cpu", "%s: rank %u's buffer is not host memory",
                             kiln_opcode_name((kiln_opcode)d->op), r);
  }
  return 0;
}

/* Element [first, first + count) of every rank's send buffer reduced into
 * dst[r] + dst_off for every rank r with dst[r] non-NULL... in blocks. When
 * `only` < ndevices, only that rank's recv is written (reduce-scatter). */
static void reduce_range(kiln_comm *c, const kiln_collective *d, combine_fn f, size_t esize,
                         const char **send, char **recv, uint64_t first, uint64_t count,
                         uint32_t only) {
  _Alignas(16) unsigned char acc[BLOCK * 8];
  for (uint64_t at = 0; at < count; at += BLOCK) {
    size_t m = (size_t)(count - at < BLOCK ? count - at : BLOCK);
    size_t off = (size_t)(first + at) * esize;
    memcpy(acc, send[0] + off, m * esize);
    for (uint32_t r = 1; r < c->ndevices; r++) f(acc, send[r] + off, m, d->reduce_op);
    if (only < c->ndevices) {
      memcpy(recv[only] + (size_t)at * esize, acc, m * esize);
    } else {
      for (uint32_t r = 0; r < c->ndevices; r++) memcpy(recv[r] + off, acc, m * esize);
    }
  }
}

int kiln__cpu_collective(kiln_comm *c, const kiln_collective *d, kiln_status *st) {
  const char *name = kiln_opcode_name((kiln_opcode)d->op);
  uint32_t n = c->ndevices;
  size_t esize = kiln_dtype_size((kiln_dtype)d->dtype);
  size_t bytes = (size_t)d->count * esize; /* per rank, send side; checked */
  combine_fn f = NULL;
  if (d->op == KILN_OP_ALL_REDUCE || d->op == KILN_OP_REDUCE_SCATTER) {
    f = combiner(d->dtype);
    if (f == NULL)
      return kiln_status_set(st, KILN_EUNIMPL, "cpu",
                             "%s over %s is not implemented by backend cpu (f32, f64, s32, s64, "
                             "u32, u64 are)",
                             name, kiln_dtype_name((kiln_dtype)d->dtype));
  }
  const char **send = kiln_calloc(n, sizeof *send);
  char **recv = kiln_calloc(n, sizeof *recv);
  int rc = 0;
  if (send == NULL || recv == NULL) {
    rc = kiln_status_set(st, KILN_ENOMEM, "cpu", "%s: out of memory", name);
    goto out_free;
  }
  if ((rc = map_ranks(c, d, send, recv, st)) != 0) goto out_free;
  switch (d->op) {
  case KILN_OP_ALL_REDUCE: reduce_range(c, d, f, esize, send, recv, 0, d->count, n); break;
  case KILN_OP_REDUCE_SCATTER:
    for (uint32_t r = 0; r < n; r++)
      reduce_range(c, d, f, esize, send, recv, r * (d->count / n), d->count / n, r);
    break;
  case KILN_OP_ALL_GATHER:
    for (uint32_t r = 0; r < n; r++)
      for (uint32_t k = 0; k < n; k++) memcpy(recv[r] + k * bytes, send[k], bytes);
    break;
  case KILN_OP_ALL_TO_ALL: {
    size_t chunk = bytes / n; /* chunk j of rank r goes to chunk r of rank j */
    for (uint32_t r = 0; r < n; r++)
      for (uint32_t j = 0; j < n; j++) memcpy(recv[j] + r * chunk, send[r] + j * chunk, chunk);
    break;
  }
  case KILN_OP_COLLECTIVE_PERMUTE:
    for (uint32_t r = 0; r < n; r++) memset(recv[r], 0, bytes);
    for (uint32_t i = 0; i < d->npairs; i++)
      memcpy(recv[d->pairs[2 * i + 1]], send[d->pairs[2 * i]], bytes);
    break;
  default:
    rc = kiln_status_set(st, KILN_EUNIMPL, "cpu", "%s is not implemented by backend cpu", name);
  }
out_free:
  kiln_free(send);
  kiln_free(recv);
  return rc;
}

/* ---- collective steps of a mesh program --------------------------------- */

/* Per-rank collectives (KILN_STEP_COLLECTIVE): each rank's step program
 * reaches the step on its own gang thread, posts its operands at the
 * rendezvous (executor/comm.c) and, once its group has posted, computes
 * its own results from the members' operands, read in place (every cpu
 * device addresses host memory). A result that shares bytes with one of
 * the rank's own operands (buffer assignment may put an all-reduce in
 * place) is computed aside and copied in after every member has finished
 * reading. Reductions fold in rank order from member 0, the order the
 * interpreter's mesh uses, so the two agree bit for bit. */

#define STEP_TYPES(X) \
  X(KILN_S8, int8_t, uint8_t) \
  X(KILN_S16, int16_t, uint16_t) \
  X(KILN_S32, int32_t, uint32_t) \
  X(KILN_S64, int64_t, uint64_t) \
  X(KILN_U8, uint8_t, uint8_t) \
  X(KILN_U16, uint16_t, uint16_t) \
  X(KILN_U32, uint32_t, uint32_t) \
  X(KILN_U64, uint64_t, uint64_t)

#define DEFINE_INT_STEP(DT, T, U) \
  static void step_##T(T *acc, const T *x, size_t n, uint32_t op) { \
    for (size_t i = 0; i < n; i++) { \
      T a = acc[i], b = x[i]; \
      switch (op) { \
      case KILN_OP_ADD: a = (T)((U)a + (U)b); break; \
      case KILN_OP_MULTIPLY: a = (T)((U)a * (U)b); break; \
      case KILN_OP_MAXIMUM: a = a > b ? a : b; break; \
      case KILN_OP_MINIMUM: a = a < b ? a : b; break; \
      case KILN_OP_AND: a = (T)(a & b); break; \
      default: a = (T)(a | b); break; \
      } \
      acc[i] = a; \
    } \
  }
STEP_TYPES(DEFINE_INT_STEP)

static double fold_real(double a, double b, uint32_t op) {
  switch (op) {
  case KILN_OP_ADD: return a + b;
  case KILN_OP_MULTIPLY: return a * b;
  case KILN_OP_MAXIMUM: return a != a ? a : b != b ? b : (a > b ? a : b);
  default: return a != a ? a : b != b ? b : (a < b ? a : b);
  }
}

/* acc[i] = acc[i] reduce x[i] for n elements of dtype. */
static void step_combine(void *acc, const void *x, size_t n, uint32_t dtype, uint32_t op) {
  switch (dtype) {
#define CASE(DT, T, U) \
  case DT: step_##T(acc, x, n, op); return;
    STEP_TYPES(CASE)
#undef CASE
  case KILN_PRED: {
    uint8_t *a = acc;
    const uint8_t *b = x;
    bool any = op == KILN_OP_OR || op == KILN_OP_MAXIMUM || op == KILN_OP_ADD;
    for (size_t i = 0; i < n; i++) a[i] = any ? (a[i] | b[i]) != 0 : (a[i] & b[i]) != 0;
    return;
  }
  case KILN_F32: combine_float(acc, x, n, (int)op); return;
  case KILN_F64: combine_double(acc, x, n, (int)op); return;
  case KILN_F16:
  case KILN_BF16: {
    uint16_t *a = acc;
    const uint16_t *b = x;
    bool bf = dtype == KILN_BF16;
    for (size_t i = 0; i < n; i++) {
      double u = bf ? kiln_bf16_to_f64(a[i]) : kiln_f16_to_f64(a[i]);
      double v = bf ? kiln_bf16_to_f64(b[i]) : kiln_f16_to_f64(b[i]);
      double r = fold_real(u, v, op);
      a[i] = bf ? kiln_f64_to_bf16(r) : kiln_f64_to_f16(r);
    }
    return;
  }
  default: return; /* refused at compile and load */
  }
}

/* dst = the fold of the members' bytes at offset `off` (len bytes), a
 * block at a time so that the partial result stays in cache while every
 * member's block is folded in. */
#define STEP_BLOCK_BYTES (32u << 10)

static void reduce_members(const kiln_coll *c, void *const *const *peer, uint32_t i, size_t off,
                           size_t len, char *dst) {
  size_t es = kiln_dtype_size((kiln_dtype)c->dtype);
  for (size_t at = 0; at < len; at += STEP_BLOCK_BYTES) {
    size_t m = len - at < STEP_BLOCK_BYTES ? len - at : STEP_BLOCK_BYTES;
    memcpy(dst + at, (const char *)peer[0][i] + off + at, m);
    for (uint32_t j = 1; j < c->gsize; j++)
      step_combine(dst + at, (const char *)peer[j][i] + off + at, m / es, c->dtype, c->reduce);
  }
}

static bool overlaps(const char *a, size_t an, const char *b, size_t bn) {
  return an && bn && a < b + bn && b < a + an;
}

/* Computes this rank's results into out[0..nops) from the members'
 * operands. */
static void coll_compute(const kiln_executable *e, const kiln_step *s, uint32_t me, uint32_t rank,
                         void *const *const *peer, char **out) {
  const kiln_coll *c = &s->coll;
  uint32_t n = c->gsize, nops = c->nops;
  for (uint32_t i = 0; i < nops; i++) {
    size_t in = (size_t)e->slots[s->args[i]].size, outb = (size_t)e->slots[s->args[nops + i]].size;
    size_t rows = c->outer[i] ? (size_t)c->outer[i] : 1, row = in / rows, blk = row / n;
    char *dst = out[i];
    switch (c->op) {
    case KILN_OP_ALL_REDUCE: reduce_members(c, peer, i, 0, in, dst); break;
    case KILN_OP_ALL_GATHER:
      for (size_t o = 0; o < rows; o++)
        for (uint32_t j = 0; j < n; j++)
          memcpy(dst + (o * n + j) * row, (const char *)peer[j][i] + o * row, row);
      break;
    case KILN_OP_REDUCE_SCATTER:
      for (size_t o = 0; o < rows; o++)
        reduce_members(c, peer, i, o * row + rank * blk, blk, dst + o * blk);
      break;
    case KILN_OP_ALL_TO_ALL:
      if (c->outer[i] == 0) { /* the tuple form */
        memcpy(dst, peer[i][rank], outb);
        break;
      }
      for (size_t o = 0; o < rows; o++)
        for (uint32_t j = 0; j < n; j++)
          memcpy(dst + o * row + j * blk, (const char *)peer[j][i] + o * row + rank * blk, blk);
      break;
    case KILN_OP_COLLECTIVE_PERMUTE: {
      int32_t src = c->source[me];
      memset(dst, 0, outb);
      for (uint32_t j = 0; src >= 0 && j < n; j++)
        if (c->members[(size_t)me * n + j] == (uint32_t)src) memcpy(dst, peer[j][0], outb);
      break;
    }
    default: memcpy(dst, peer[0][i], outb); break; /* COLLECTIVE_BROADCAST */
    }
  }
}

int kiln__cpu_coll_step(const kiln_executable *e, const kiln_step *s, void *const *a,
                        const kiln__gang_rank *g, const atomic_int *cancel, double deadline,
                        kiln_status *st) {
  const kiln_coll *c = &s->coll;
  uint32_t ndev = c->replicas * c->partitions, me = g ? g->rank : 0;
  if ((g ? g->nranks : 1) != ndev)
    return kiln_status_set(st, KILN_EINVAL, "collective",
                           "%s was compiled for %u replicas x %u partitions; this run has %u "
                           "device%s (run it with kiln_mesh_execute on that many)",
                           kiln_opcode_name((kiln_opcode)c->op), c->replicas, c->partitions,
                           g ? g->nranks : 1, (g ? g->nranks : 1) == 1 ? "" : "s");
  if (c->op == KILN_OP_REPLICA_ID || c->op == KILN_OP_PARTITION_ID) {
    uint32_t v = c->op == KILN_OP_REPLICA_ID ? me / c->partitions : me % c->partitions;
    memcpy(a[0], &v, sizeof v);
    return 0;
  }
  uint32_t n = c->gsize, nops = c->nops, rank = 0;
  const uint32_t *row = c->members + (size_t)me * n;
  while (row[rank] != me) rank++; /* checked at load: me is a member */
  void *const **peer = kiln_calloc(n, sizeof *peer);
  char **out = kiln_calloc(nops, sizeof *out);
  void **aside = kiln_calloc(nops, sizeof *aside);
  int rc = 0;
  if (peer == NULL || out == NULL || aside == NULL) {
    rc = kiln_status_set(st, KILN_ENOMEM, "collective", "out of memory");
    goto out_free;
  }
  for (uint32_t i = 0; i < nops && rc == 0; i++) {
    size_t outb = (size_t)e->slots[s->args[nops + i]].size;
    out[i] = a[nops + i];
    for (uint32_t k = 0; k < nops; k++)
      if (overlaps(out[i], outb, a[k], (size_t)e->slots[s->args[k]].size)) {
        out[i] = kiln__cpu_aligned_alloc(outb, &aside[i]);
        if (out[i] == NULL) rc = kiln_status_set(st, KILN_ENOMEM, "collective", "out of memory");
        break;
      }
  }
  if (rc) goto out_free;
  if (g == NULL) {
    peer[0] = a;
    coll_compute(e, s, me, rank, peer, out);
  } else {
    rc = kiln__rendezvous_enter(g, (uint64_t)(uintptr_t)s, row, n, a, peer, cancel, deadline, st);
    if (rc) goto out_free;
    coll_compute(e, s, me, rank, peer, out);
    rc = kiln__rendezvous_leave(g, row, n, cancel, deadline, st);
  }
  for (uint32_t i = 0; i < nops && rc == 0; i++)
    if (aside[i]) memcpy(a[nops + i], out[i], (size_t)e->slots[s->args[nops + i]].size);
out_free:
  for (uint32_t i = 0; aside && i < nops; i++) kiln_free(aside[i]);
  kiln_free(aside);
  kiln_free(out);
  kiln_free(peer);
  return rc;
}
