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
#include "executor/cpu/cpu.h"

#define BLOCK 512 /* elements per reduction block */

#define REDUCE_TYPES(X) \
  X(KILN_F32, float)    \
  X(KILN_F64, double)   \
  X(KILN_S32, int32_t)  \
  X(KILN_S64, int64_t)  \
  X(KILN_U32, uint32_t) \
  X(KILN_U64, uint64_t)

/* acc[i] = acc[i] op x[i] for i < n. Integer add and multiply wrap (as
 * XLA's do): done in the unsigned type. */
#define DEFINE_COMBINE(DT, T)                                                        \
  static void combine_##T(T *acc, const T *x, size_t n, int op) {                   \
    switch (op) {                                                                    \
    case KILN_OP_ADD:                                                                \
      for (size_t i = 0; i < n; i++) acc[i] = wrap_add_##T(acc[i], x[i]);            \
      break;                                                                         \
    case KILN_OP_MULTIPLY:                                                           \
      for (size_t i = 0; i < n; i++) acc[i] = wrap_mul_##T(acc[i], x[i]);            \
      break;                                                                         \
    case KILN_OP_MAXIMUM:                                                            \
      for (size_t i = 0; i < n; i++) acc[i] = pick_max_##T(acc[i], x[i]);            \
      break;                                                                         \
    default:                                                                         \
      for (size_t i = 0; i < n; i++) acc[i] = pick_min_##T(acc[i], x[i]);            \
      break;                                                                         \
    }                                                                                \
  }

/* Float max/min propagate NaN, as HLO's maximum and minimum do. */
#define FLOAT_OPS(T)                                                                   \
  static T wrap_add_##T(T a, T b) { return a + b; }                                    \
  static T wrap_mul_##T(T a, T b) { return a * b; }                                    \
  static T pick_max_##T(T a, T b) { return a != a ? a : b != b ? b : (a > b ? a : b); } \
  static T pick_min_##T(T a, T b) { return a != a ? a : b != b ? b : (a < b ? a : b); }
#define INT_OPS(T, U)                                                          \
  static T wrap_add_##T(T a, T b) { return (T)((U)a + (U)b); }                 \
  static T wrap_mul_##T(T a, T b) { return (T)((U)a * (U)b); }                 \
  static T pick_max_##T(T a, T b) { return a > b ? a : b; }                    \
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
