/* Collectives on one device, replica/partition ids, built-in custom calls and
 * random numbers.
 *
 * The interpreter runs a single device, so a collective is evaluated only
 * when every group it names holds one device: then all-reduce,
 * all-gather, reduce-scatter, all-to-all and collective-broadcast return
 * their operands, and collective-permute returns the operand when the device
 * sends to itself and zeros when nobody sends to it. Anything wider is
 * KILN_EUNIMPL naming the instruction.
 *
 * rng-bit-generator follows the algorithms XLA expands it into
 * (RngBitGeneratorExpander + prng.cc): Threefry-2x32 (20 rounds) and
 * Philox-4x32 (10 rounds), with XLA's counter layout, element order and
 * state update; rng_default is Philox, as on XLA's CPU and GPU backends.
 * rng (distributions) draws from a counter-based generator with a fixed
 * seed: deterministic, not XLA's sequence.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/eval/interp_internal.h"
#include "compiler/ir/debug_print.h"
#include "compiler/ir/lapack.h"
#include "compiler/ir/sharding.h"
#include "compiler/ir/user_kernel.h"

static int unimpl(kiln__interp_ctx *c, const kiln_instr *ins, const char *why) {
  return kiln__interp_fail(c, ins, KILN_EUNIMPL, "%s %s: %s", kiln_opcode_name(ins->op), ins->name,
                           why);
}

int kiln__interp_eval_replica_id(kiln__interp_ctx *c, const kiln_instr *ins,
                                 const kiln_literal *const *ops, kiln_literal **out) {
  (void)ops;
  if (!kiln_shape_is_array(&ins->shape) || kiln_shape_elements(&ins->shape) != 1)
    return kiln__interp_fail(c, ins, KILN_EINVAL, "%s %s: result must be a scalar",
                             kiln_opcode_name(ins->op), ins->name);
  int rc = kiln__interp_lit_result(c, ins, out);
  if (rc == 0) {
    int64_t v = ins->op == KILN_OP_REPLICA_ID ? c->opts.replica_id : c->opts.partition_id;
    kiln_literal_set_s64(*out, 0, v);
  }
  return rc;
}

/* ---- collectives -------------------------------------------------------- */

static int64_t devices(const kiln_module *m) {
  int64_t r = m->replica_count > 0 ? m->replica_count : 1;
  int64_t p = m->num_partitions > 0 ? m->num_partitions : 1;
  return r * p;
}

/* 0 when every replica group holds one device. */
static int single_device_groups(kiln__interp_ctx *c, const kiln_instr *ins) {
  const kiln_attr *a = kiln_instr_attr(ins, KILN_ATTR_REPLICA_GROUPS);
  const kiln_replica_groups *g = a ? a->v.groups : NULL;
  int64_t size = 0;
  if (g && g->iota) {
    size = g->iota_shape.n == 2 ? g->iota_shape.v[1] : -1;
  } else if (g && g->ngroups > 0) {
    for (uint32_t i = 0; i < g->ngroups; i++)
      if ((int64_t)g->groups[i].n > size) size = g->groups[i].n;
  } else {
    size = devices(c->m); /* no groups: everyone */
  }
  if (size <= 1) return 0;
  return kiln__interp_fail(c, ins, KILN_EUNIMPL,
                           "%s %s: replica group of %lld devices; the interpreter runs one device",
                           kiln_opcode_name(ins->op), ins->name, (long long)size);
}

/* Fills `r` with the operands (one, or a tuple of them); zeros when !copy. */
static int fill_result(kiln__interp_ctx *c, const kiln_instr *ins, const kiln_literal *const *ops,
                       kiln_literal *r, bool copy) {
  if (!copy) return 0;
  uint32_t n = ins->noperands;
  if (n == 1) return kiln__interp_lit_copy_into(c, ins, r->own, r, ops[0]);
  if (!kiln_shape_is_tuple(&r->shape) || r->shape.rank != n)
    return kiln__interp_fail(c, ins, KILN_EINVAL, "%s %s: result must be a tuple of %u",
                             kiln_opcode_name(ins->op), ins->name, n);
  for (uint32_t k = 0; k < n; k++) {
    int rc = kiln__interp_lit_copy_into(c, ins, r->own, r->elems[k], ops[k]);
    if (rc) return rc;
  }
  return 0;
}

static int permute_receives(kiln__interp_ctx *c, const kiln_instr *ins, bool *recv) {
  const kiln_i64s *p = kiln_instr_attr_ints(ins, KILN_ATTR_SOURCE_TARGET_PAIRS);
  int64_t me = c->m->num_partitions > 1 ? c->opts.partition_id : c->opts.replica_id;
  *recv = false;
  for (uint32_t i = 0; p && i + 1 < p->n; i += 2) {
    if (p->v[i] != p->v[i + 1])
      return kiln__interp_fail(c, ins, KILN_EUNIMPL,
                               "%s %s: sends from device %lld to %lld; the interpreter runs one "
                               "device",
                               kiln_opcode_name(ins->op), ins->name, (long long)p->v[i],
                               (long long)p->v[i + 1]);
    if (p->v[i + 1] == me) *recv = true;
  }
  return 0;
}

int kiln__interp_eval_collective(kiln__interp_ctx *c, const kiln_instr *ins,
                                 const kiln_literal *const *ops, kiln_literal **out) {
  if (c->opts.mesh) return kiln__interp_eval_collective_mesh(c, ins, ops, out);
  bool copy = true, start = false;
  int rc = 0;
  switch (ins->op) {
  case KILN_OP_ALL_REDUCE:
  case KILN_OP_ALL_REDUCE_START:
  case KILN_OP_ALL_GATHER:
  case KILN_OP_REDUCE_SCATTER:
  case KILN_OP_ALL_TO_ALL:
  case KILN_OP_COLLECTIVE_BROADCAST: rc = single_device_groups(c, ins); break;
  case KILN_OP_ALL_GATHER_START:
    rc = single_device_groups(c, ins);
    start = true;
    break;
  case KILN_OP_COLLECTIVE_PERMUTE: rc = permute_receives(c, ins, &copy); break;
  case KILN_OP_COLLECTIVE_PERMUTE_START:
    rc = permute_receives(c, ins, &copy);
    start = true;
    break;
  default: return unimpl(c, ins, "is not supported by the interpreter");
  }
  if (rc) return rc;
  /* A start's value is (operands, result, contexts...) when its shape says so. */
  const kiln_shape *rs = &ins->shape;
  start = start && kiln_shape_is_tuple(rs) && rs->rank >= 2;
  if (start) rs = &rs->tuple[1];
  kiln_literal *r = NULL;
  rc = kiln__interp_lit_new(c, ins, rs, &r);
  if (rc == 0) rc = fill_result(c, ins, ops, r, copy);
  if (rc == 0 && start) {
    rc = kiln__interp_start_value(c, ins, ops, ins->noperands, r, out);
    kiln__interp_lit_free(c, r);
    return rc;
  }
  if (rc) {
    kiln__interp_lit_free(c, r);
    return rc;
  }
  *out = r;
  return 0;
}

/* ---- custom calls ------------------------------------------------------- */

/* Targets that only annotate (sharding, Shardy's markers, host offloading):
 * identities here, when the result has the operand's shape. A Shardy
 * GlobalToLocalShape or LocalToGlobalShape that changes the shape marks a
 * manual (shard_map) region over several devices: that needs the
 * partitioner, which is named in the refusal. */
int kiln__interp_eval_custom_call(kiln__interp_ctx *c, const kiln_instr *ins,
                                  const kiln_literal *const *ops, kiln_literal **out) {
  const char *t = kiln_instr_attr_str(ins, KILN_ATTR_CUSTOM_CALL_TARGET);
  if (kiln_debug_print_is(ins)) {
    int rc = kiln_debug_print_check(c->m, ins, c->st);
    if (rc) return rc;
    if (c->opts.debug && c->opts.debug->write) {
      kiln_sbuf sb = KILN_SBUF_INIT;
      size_t nf;
      const char *f = kiln_debug_print_format(ins, &nf);
      kiln_debug_print_render(&sb, f, nf, ops[0]);
      if (!kiln_sbuf_failed(&sb)) c->opts.debug->write(c->opts.debug->ctx, sb.data, sb.len);
      kiln_sbuf_free(&sb);
    }
    rc = kiln__interp_lit_result(c, ins, out);
    if (rc == 0) rc = kiln__interp_lit_copy_into(c, ins, (*out)->own, *out, ops[0]);
    if (rc && *out) {
      kiln__interp_lit_free(c, *out);
      *out = NULL;
    }
    return rc;
  }
  if (kiln_user_kernel_call(ins, NULL))
    return kiln__interp_fail(c, ins, KILN_EUNIMPL,
                             "custom-call %s: %.80s is a user kernel: the interpreter runs no "
                             "compiled code; run it on the cpu backend",
                             ins->name, t);
  if (kiln_lapack_is_target(t)) return kiln__interp_eval_lapack(c, ins, ops, out);
  if (kiln_custom_call_is_annotation(t)) {
    if (ins->noperands != 1)
      return kiln__interp_fail(c, ins, KILN_EINVAL, "custom-call %s: %s takes one operand",
                               ins->name, t);
    if (!kiln__interp_same_dims(&ins->shape, &ops[0]->shape) ||
        ins->shape.dtype != ops[0]->shape.dtype)
      return kiln__interp_fail(c, ins, KILN_EUNIMPL,
                               "custom-call %s: %s changes the shape (a region partitioned by "
                               "hand over several devices): run the module partitioned "
                               "(--partitions P, or device_count in Compile), or its per-device "
                               "program (compile().as_text())",
                               ins->name, t);
    int rc = kiln__interp_lit_result(c, ins, out);
    if (rc == 0) rc = kiln__interp_lit_copy_into(c, ins, (*out)->own, *out, ops[0]);
    if (rc && *out) {
      kiln__interp_lit_free(c, *out);
      *out = NULL;
    }
    return rc;
  }
  uint32_t n;
  const char *const *names = kiln_annotation_targets(&n);
  char list[512] = "";
  for (uint32_t i = 0; i < n; i++) {
    size_t l = strlen(list);
    snprintf(list + l, sizeof list - l, "%s%s", i ? ", " : "", names[i]);
  }
  return kiln__interp_fail(c, ins, KILN_EUNIMPL,
                           "custom-call %s: target \"%s\" is not built in (built in: %s)",
                           ins->name, t ? t : "", list);
}

/* ---- rng (distributions) ------------------------------------------------ */

static uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* The interpreter's fixed seed; every draw advances one counter. */
static uint64_t draw(kiln__interp_ctx *c) {
  return splitmix64(0x6B696C6E5EEDull + c->rng_counter++);
}

static double unit(kiln__interp_ctx *c) { return (double)(draw(c) >> 11) * 0x1p-53; }

int kiln__interp_eval_rng(kiln__interp_ctx *c, const kiln_instr *ins,
                          const kiln_literal *const *ops, kiln_literal **out) {
  const char *dist = kiln_instr_attr_str(ins, KILN_ATTR_DISTRIBUTION);
  bool normal = dist && strcmp(dist, "rng_normal") == 0;
  if (dist == NULL || (!normal && strcmp(dist, "rng_uniform") != 0))
    return kiln__interp_fail(c, ins, KILN_EINVAL,
                             "rng %s: distribution must be rng_uniform or "
                             "rng_normal",
                             ins->name);
  kiln_dtype t = ins->shape.dtype;
  for (uint32_t j = 0; j < 2; j++)
    if (!kiln_shape_is_array(&ops[j]->shape) || kiln_literal_elements(ops[j]) != 1)
      return kiln__interp_fail(c, ins, KILN_EINVAL, "rng %s: parameters must be scalars",
                               ins->name);
  bool is_float = kiln_dtype_is_float(t);
  if (!kiln_shape_is_array(&ins->shape) || !kiln__interp_dtype_computable(t) ||
      (normal && !is_float) || kiln_dtype_is_complex(t))
    return unimpl(c, ins, "cannot draw that element type");
  int rc = kiln__interp_lit_result(c, ins, out);
  if (rc) return rc;
  kiln__interp_scalar a = kiln__interp_scalar_convert(kiln__interp_scalar_load(ops[0], 0), t);
  kiln__interp_scalar b = kiln__interp_scalar_convert(kiln__interp_scalar_load(ops[1], 0), t);
  int64_t n = kiln_literal_elements(*out);
  for (int64_t i = 0; i < n; i++) {
    if (normal) {
      double u1 = 1.0 - unit(c), u2 = unit(c);
      double z = sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
      kiln_literal_set_f64(*out, i, a.v.f + b.v.f * z);
    } else if (is_float) {
      kiln_literal_set_f64(*out, i, a.v.f + (b.v.f - a.v.f) * unit(c));
      /* rounding up to the exclusive bound: take the lower one */
      if (b.v.f > a.v.f && kiln_literal_get_f64(*out, i) >= b.v.f)
        kiln_literal_set_f64(*out, i, a.v.f);
    } else {
      bool s = kiln_dtype_is_signed_int(t);
      uint64_t lo = s ? (uint64_t)a.v.s : a.v.u, hi = s ? (uint64_t)b.v.s : b.v.u;
      uint64_t span = hi - lo;
      bool empty = s ? b.v.s <= a.v.s : b.v.u <= a.v.u;
      kiln_literal_set_u64(*out, i, empty ? lo : lo + draw(c) % span);
    }
  }
  return 0;
}

int kiln__interp_eval_rng_get_and_update_state(kiln__interp_ctx *c, const kiln_instr *ins,
                                               const kiln_literal *const *ops, kiln_literal **out) {
  (void)ops;
  int64_t delta = 0;
  for (uint32_t i = 0; i < ins->nattrs; i++)
    if (ins->attrs[i].key == KILN_ATTR_UNKNOWN && ins->attrs[i].name &&
        strcmp(ins->attrs[i].name, "delta") == 0 && ins->attrs[i].v.s)
      delta = strtoll(ins->attrs[i].v.s, NULL, 10);
  if (!kiln_shape_is_array(&ins->shape) || kiln_dtype_size(ins->shape.dtype) != 8 ||
      kiln_shape_elements(&ins->shape) != 2)
    return kiln__interp_fail(c, ins, KILN_EINVAL, "%s: result must be u64[2]", ins->name);
  int rc = kiln__interp_lit_result(c, ins, out);
  if (rc) return rc;
  kiln_literal_set_u64(*out, 0, c->rng_state[0]);
  kiln_literal_set_u64(*out, 1, c->rng_state[1]);
  uint64_t lo = c->rng_state[0] + (uint64_t)delta;
  if (lo < c->rng_state[0]) c->rng_state[1]++;
  c->rng_state[0] = lo;
  return 0;
}

/* ---- rng-bit-generator -------------------------------------------------- */

static uint32_t rotl32(uint32_t v, int d) { return (v << d) | (v >> (32 - d)); }

/* Threefry-2x32 with 20 rounds (Salmon et al., SC 2011). */
static void threefry2x32(uint32_t key0, uint32_t key1, uint32_t *x) {
  static const int rot[8] = {13, 15, 26, 6, 17, 29, 16, 24};
  uint32_t ks[3] = {key0, key1, 0x1BD11BDAu ^ key0 ^ key1};
  x[0] += ks[0];
  x[1] += ks[1];
  for (int block = 0; block < 5; block++) {
    for (int r = 0; r < 4; r++) {
      x[0] += x[1];
      x[1] = rotl32(x[1], rot[(block % 2) * 4 + r]);
      x[1] ^= x[0];
    }
    x[0] += ks[(block + 1) % 3];
    x[1] += ks[(block + 2) % 3] + (uint32_t)(block + 1);
  }
}

/* Philox-4x32 with 10 rounds. */
static void philox4x32(uint32_t k0, uint32_t k1, uint32_t *x) {
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)x[0] * 0xD2511F53u, p1 = (uint64_t)x[2] * 0xCD9E8D57u;
    uint32_t y0 = (uint32_t)(p1 >> 32) ^ x[1] ^ k0, y2 = (uint32_t)(p0 >> 32) ^ x[3] ^ k1;
    x[0] = y0;
    x[1] = (uint32_t)p1;
    x[2] = y2;
    x[3] = (uint32_t)p0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
}

/* XLA splits a shape in halves for 32-bit Threefry: the first even dim (else
 * the first largest) is cut in two, and element i of that dim comes from
 * output word i % 2 of counter (its index in the half shape). */
static int split_dim(const kiln_shape *s) {
  if (s->rank == 0) return -1;
  for (uint32_t i = 0; i < s->rank; i++)
    if (s->dims[i] % 2 == 0) return (int)i;
  int best = 0;
  for (uint32_t i = 1; i < s->rank; i++)
    if (s->dims[i] > s->dims[best]) best = (int)i;
  return best;
}

static void store_bits(kiln_literal *r, int64_t i, uint64_t bits) {
  size_t e = kiln_dtype_size(r->shape.dtype);
  if (kiln_dtype_is_integral(r->shape.dtype)) {
    kiln_literal_set_u64(r, i, bits);
  } else {
    memcpy((char *)r->data + (size_t)i * e, &bits, e); /* little-endian low bytes */
  }
}

static void threefry_fill(kiln_literal *r, uint64_t key, uint64_t *ctr) {
  const kiln_shape *s = &r->shape;
  int64_t n = kiln_literal_elements(r);
  uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
  if (kiln_dtype_bits(s->dtype) == 64) {
    for (int64_t i = 0; i < n; i++) {
      uint64_t in = *ctr + (uint64_t)i;
      uint32_t x[2] = {(uint32_t)in, (uint32_t)(in >> 32)};
      threefry2x32(k0, k1, x);
      store_bits(r, i, (uint64_t)x[0] | (uint64_t)x[1] << 32);
    }
    *ctr += (uint64_t)n;
    return;
  }
  int sd = split_dim(s);
  int64_t hdims[KILN_INTERP_MAX_RANK], hst[KILN_INTERP_MAX_RANK], idx[KILN_INTERP_MAX_RANK] = {0};
  int64_t hn = 1;
  for (uint32_t k = 0; k < s->rank; k++) {
    hdims[k] = (int)k == sd ? (s->dims[k] + 1) / 2 : s->dims[k];
    hn *= hdims[k];
  }
  if (sd < 0) hn = 1;
  kiln_shape hs = {.dtype = s->dtype, .rank = s->rank, .dims = hdims};
  kiln__interp_strides(&hs, hst);
  for (int64_t i = 0; i < n; i++) {
    int64_t lin = 0, w = 0;
    for (uint32_t k = 0; k < s->rank; k++) lin += ((int)k == sd ? idx[k] / 2 : idx[k]) * hst[k];
    if (sd >= 0) w = idx[sd] % 2;
    uint64_t in = *ctr + (uint64_t)lin;
    uint32_t x[2] = {(uint32_t)in, (uint32_t)(in >> 32)};
    threefry2x32(k0, k1, x);
    store_bits(r, i, x[w]);
    kiln__interp_next_index(idx, s->dims, s->rank);
  }
  *ctr += (uint64_t)hn;
}

/* ctr is a 128-bit counter (lo, hi); 64-bit outputs take two words each. */
static void philox_fill(kiln_literal *r, uint64_t key, uint64_t *lo, uint64_t *hi) {
  int64_t n = kiln_literal_elements(r);
  bool wide = kiln_dtype_bits(r->shape.dtype) == 64;
  int64_t per = wide ? 2 : 4, blocks = (n + per - 1) / per;
  uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
  for (int64_t b = 0; b < blocks; b++) {
    uint64_t l = *lo + (uint64_t)b, h = *hi + (l < *lo ? 1 : 0);
    uint32_t x[4] = {(uint32_t)l, (uint32_t)(l >> 32), (uint32_t)h, (uint32_t)(h >> 32)};
    philox4x32(k0, k1, x);
    for (int64_t j = 0; j < per && b * per + j < n; j++) {
      uint64_t v = wide ? ((uint64_t)x[2 * j] | (uint64_t)x[2 * j + 1] << 32) : x[j];
      store_bits(r, b * per + j, v);
    }
  }
  uint64_t l = *lo + (uint64_t)blocks;
  if (l < *lo) (*hi)++;
  *lo = l;
}

int kiln__interp_eval_rng_bit_generator(kiln__interp_ctx *c, const kiln_instr *ins,
                                        const kiln_literal *const *ops, kiln_literal **out) {
  const kiln_literal *st = ops[0];
  const kiln_shape *s = &ins->shape;
  const char *alg = kiln_instr_attr_str(ins, KILN_ATTR_ALGORITHM);
  bool three = alg && strcmp(alg, "rng_three_fry") == 0;
  if (alg && !three && strcmp(alg, "rng_philox") != 0 && strcmp(alg, "rng_default") != 0)
    return unimpl(c, ins, "unknown algorithm");
  if (!kiln_shape_is_array(&st->shape) || st->shape.rank != 1 ||
      kiln_dtype_bits(st->shape.dtype) != 64 || !kiln_dtype_is_integral(st->shape.dtype) ||
      st->shape.dims[0] < 2 || (three && st->shape.dims[0] != 2) || st->shape.dims[0] > 3 ||
      !kiln_shape_is_tuple(s) || s->rank != 2 || !kiln_shape_is_array(&s->tuple[1]))
    return kiln__interp_fail(c, ins, KILN_EINVAL,
                             "rng-bit-generator %s: needs a u64[2] state (u64[2] or u64[3] for "
                             "Philox) and a (state, bits) result",
                             ins->name);
  int bits = kiln_dtype_bits(s->tuple[1].dtype);
  if (kiln_dtype_is_complex(s->tuple[1].dtype) || s->tuple[1].dtype == KILN_PRED ||
      (bits != 8 && bits != 16 && bits != 32 && bits != 64))
    return unimpl(c, ins, "generates 8-, 16-, 32- and 64-bit types only");
  int rc = kiln__interp_lit_result(c, ins, out);
  if (rc) return rc;
  kiln_literal *ns = (*out)->elems[0], *data = (*out)->elems[1];
  if (!kiln__interp_same_dims(&ns->shape, &st->shape)) {
    kiln__interp_lit_free(c, *out);
    *out = NULL;
    return kiln__interp_fail(c, ins, KILN_EINVAL, "rng-bit-generator %s: state shapes differ",
                             ins->name);
  }
  uint64_t key = kiln_literal_get_u64(st, 0);
  kiln_literal_set_u64(ns, 0, key);
  if (three) {
    uint64_t ctr = kiln_literal_get_u64(st, 1);
    threefry_fill(data, key, &ctr);
    kiln_literal_set_u64(ns, 1, ctr);
  } else if (st->shape.dims[0] == 3) {
    uint64_t lo = kiln_literal_get_u64(st, 1), hi = kiln_literal_get_u64(st, 2);
    philox_fill(data, key, &lo, &hi);
    kiln_literal_set_u64(ns, 1, lo);
    kiln_literal_set_u64(ns, 2, hi);
  } else {
    /* A two-word state reads its counter reversed: (lo, hi) = (s[1], key). */
    uint64_t lo = kiln_literal_get_u64(st, 1), hi = key;
    philox_fill(data, key, &lo, &hi);
    kiln_literal_set_u64(ns, 1, lo);
  }
  return 0;
}
