/* Shardings and replica groups as values (sharding.h).
 *
 * Both carry device lists in two spellings, explicit ids or an iota form
 * (devices 0..n laid out as a shape, transposed, read row-major), and a
 * sharding's subgroup dimensions in two more (last_tile_dim_replicate or
 * last_tile_dims). Everything here goes through one expansion to explicit
 * lists, so that two spellings of one assignment can never disagree: the
 * equality, the canonical copy (the cache key's spelling) and the
 * collective groups the interpreter's mesh uses are all computed from it.
 */
#include "compiler/ir/sharding.h"

#include <string.h>

#include "common/alloc.h"

/* ---- device lists ------------------------------------------------------- */

static int64_t product(const kiln_i64s *v) {
  int64_t p = 1;
  for (uint32_t i = 0; i < v->n; i++) {
    if (v->v[i] < 0 || (v->v[i] && p > INT64_MAX / v->v[i])) return -1;
    p *= v->v[i];
  }
  return p;
}

bool kiln_iota_expand(const kiln_i64s *reshape, const kiln_i64s *perm, int64_t *out, int64_t n) {
  uint32_t r = reshape->n;
  if (product(reshape) != n || r > 64) return false;
  if (perm->n && perm->n != r) return false;
  int64_t p[64], tdims[64], stride[64], idx[64];
  for (uint32_t k = 0; k < r; k++) {
    p[k] = perm->n ? perm->v[k] : (int64_t)k;
    if (p[k] < 0 || p[k] >= (int64_t)r) return false;
    for (uint32_t j = 0; j < k; j++)
      if (p[j] == p[k]) return false;
  }
  int64_t s = 1;
  for (uint32_t k = r; k-- > 0;) {
    stride[k] = s;
    s *= reshape->v[k];
  }
  for (uint32_t k = 0; k < r; k++) {
    tdims[k] = reshape->v[p[k]];
    idx[k] = 0;
  }
  /* Walk the transposed shape row-major; its index k is source dim p[k]. */
  for (int64_t i = 0; i < n; i++) {
    int64_t v = 0;
    for (uint32_t k = 0; k < r; k++) v += idx[k] * stride[p[k]];
    out[i] = v;
    for (uint32_t k = r; k-- > 0;) {
      if (++idx[k] < tdims[k]) break;
      idx[k] = 0;
    }
  }
  return true;
}

int64_t kiln_sharding_tile_count(const kiln_sharding *s) { return product(&s->tile_dims); }

bool kiln_sharding_tile_devices(const kiln_sharding *s, int64_t *out, int64_t n) {
  if (s->kind != KILN_SHARD_TILED || kiln_sharding_tile_count(s) != n) return false;
  if (s->devices.n) {
    if ((int64_t)s->devices.n != n) return false;
    memcpy(out, s->devices.v, (size_t)n * sizeof *out);
    return true;
  }
  return kiln_iota_expand(&s->iota_reshape, &s->iota_perm, out, n);
}

/* ---- equality and the canonical spelling -------------------------------- */

/* The subgroup kinds of a tiled sharding, one per trailing tile dim. */
static uint32_t subgroups(const kiln_sharding *s, const int64_t **kinds) {
  static const int64_t repl = KILN_SHARD_REPLICATED;
  if (s->last_tile_dims.n) {
    *kinds = s->last_tile_dims.v;
    return s->last_tile_dims.n;
  }
  *kinds = &repl;
  return s->last_tile_dim_replicate ? 1 : 0;
}

/* A tiling that leaves every data dim whole and only replicates is
 * {replicated} (as XLA's HloSharding::PartialTile makes it). */
static bool tiles_nothing(const kiln_sharding *s) {
  if (s->kind != KILN_SHARD_TILED) return false;
  const int64_t *k;
  uint32_t ns = subgroups(s, &k);
  if (ns > s->tile_dims.n) return false;
  uint32_t ndata = s->tile_dims.n - ns;
  for (uint32_t i = 0; i < ndata; i++)
    if (s->tile_dims.v[i] != 1) return false;
  for (uint32_t i = 0; i < ns; i++)
    if (k[i] != KILN_SHARD_REPLICATED && s->tile_dims.v[ndata + i] != 1) return false;
  return true;
}

static kiln_sharding_kind kind_of(const kiln_sharding *s) {
  return tiles_nothing(s) ? KILN_SHARD_REPLICATED : s->kind;
}

static bool same_ints(const kiln_i64s *a, const kiln_i64s *b) {
  return a->n == b->n && (a->n == 0 || memcmp(a->v, b->v, a->n * sizeof *a->v) == 0);
}

static bool tiled_equal(const kiln_sharding *a, const kiln_sharding *b) {
  if (!same_ints(&a->tile_dims, &b->tile_dims)) return false;
  const int64_t *ka, *kb;
  uint32_t na = subgroups(a, &ka), nb = subgroups(b, &kb);
  if (na != nb) return false;
  for (uint32_t i = 0; i < na; i++)
    if (ka[i] != kb[i]) return false;
  int64_t n = kiln_sharding_tile_count(a);
  if (n < 0 || n > (int64_t)(SIZE_MAX / 2 / sizeof(int64_t))) return false;
  int64_t *da = kiln_malloc((size_t)(n ? n : 1) * 2 * sizeof *da);
  if (da == NULL) return false;
  bool eq = kiln_sharding_tile_devices(a, da, n) && kiln_sharding_tile_devices(b, da + n, n) &&
            memcmp(da, da + n, (size_t)n * sizeof *da) == 0;
  kiln_free(da);
  return eq;
}

bool kiln_sharding_equal(const kiln_sharding *a, const kiln_sharding *b) {
  if (a == NULL || b == NULL) return a == b;
  kiln_sharding_kind k = kind_of(a);
  if (k != kind_of(b)) return false;
  switch (k) {
  case KILN_SHARD_MAXIMAL: return a->device == b->device;
  case KILN_SHARD_TILED: return tiled_equal(a, b);
  case KILN_SHARD_TUPLE:
    if (a->nelems != b->nelems) return false;
    for (uint32_t i = 0; i < a->nelems; i++)
      if (!kiln_sharding_equal(&a->elems[i], &b->elems[i])) return false;
    return true;
  default: return true;
  }
}

kiln_sharding *kiln_sharding_canonical(kiln_arena *a, const kiln_sharding *s) {
  kiln_sharding *d = kiln_arena_calloc(a, 1, sizeof *d);
  if (d == NULL) return NULL;
  d->kind = kind_of(s);
  d->extra = s->extra;
  switch (d->kind) {
  case KILN_SHARD_MAXIMAL: d->device = s->device; break;
  case KILN_SHARD_TILED: {
    int64_t n = kiln_sharding_tile_count(s);
    if (n < 0 || n > (int64_t)(SIZE_MAX / sizeof(int64_t))) return NULL;
    d->tile_dims = s->tile_dims;
    d->devices.v = kiln_arena_alloc(a, (size_t)(n ? n : 1) * sizeof *d->devices.v);
    d->devices.n = (uint32_t)n;
    if (d->devices.v == NULL || !kiln_sharding_tile_devices(s, d->devices.v, n)) return NULL;
    const int64_t *k;
    uint32_t ns = subgroups(s, &k);
    if (ns == 1 && k[0] == KILN_SHARD_REPLICATED) {
      d->last_tile_dim_replicate = true;
    } else if (ns) {
      d->last_tile_dims.v = kiln_arena_memdup(a, k, ns * sizeof *k);
      d->last_tile_dims.n = ns;
      if (d->last_tile_dims.v == NULL) return NULL;
    }
    break;
  }
  case KILN_SHARD_TUPLE:
    d->nelems = s->nelems;
    if (s->nelems) {
      d->elems = kiln_arena_alloc(a, s->nelems * sizeof *d->elems);
      if (d->elems == NULL) return NULL;
    }
    for (uint32_t i = 0; i < s->nelems; i++) {
      kiln_sharding *e = kiln_sharding_canonical(a, &s->elems[i]);
      if (e == NULL) return NULL;
      d->elems[i] = *e;
    }
    break;
  default: break;
  }
  return d;
}

/* ---- annotations -------------------------------------------------------- */

static const char *const annotation_targets[] = {
    "Sharding",
    "SPMDFullToShardShape",
    "SPMDShardToFullShape",
    "MoveToHost",
    "MoveToDevice",
    "xla.sdy.FuncResultSharding",
    "xla.sdy.GlobalToLocalShape",
    "xla.sdy.LocalToGlobalShape",
};

const char *const *kiln_annotation_targets(uint32_t *n) {
  *n = sizeof annotation_targets / sizeof *annotation_targets;
  return annotation_targets;
}

bool kiln_custom_call_is_annotation(const char *target) {
  for (size_t i = 0; target && i < sizeof annotation_targets / sizeof *annotation_targets; i++)
    if (strcmp(target, annotation_targets[i]) == 0) return true;
  return false;
}

/* ---- replica groups ----------------------------------------------------- */

#include <stdarg.h>
#include <stdio.h>

/* Sets st to "<op> <name>: <message>" at the instruction (or at
 * "replica_groups" when there is none) and returns code. */
static int where_fail(kiln_status *st, const kiln_instr *ins, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int where_fail(kiln_status *st, const kiln_instr *ins, int code, const char *fmt, ...) {
  char msg[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (ins == NULL) return kiln_status_set(st, code, "replica_groups", "%s", msg);
  return kiln_status_set(st, code, ins->name, "%s %s: %s", kiln_opcode_name(ins->op), ins->name,
                         msg);
}

static bool has_ugdi(kiln_opcode op) {
  switch (op) {
  case KILN_OP_ALL_REDUCE:
  case KILN_OP_ALL_REDUCE_START:
  case KILN_OP_ALL_GATHER:
  case KILN_OP_ALL_GATHER_START:
  case KILN_OP_REDUCE_SCATTER: return true;
  default: return false;
  }
}

int kiln_collective_group_mode(const kiln_instr *ins, kiln_group_mode *mode, kiln_status *st) {
  bool channel = kiln_instr_has_attr(ins, KILN_ATTR_CHANNEL_ID);
  bool ugdi = kiln_instr_attr_int(ins, KILN_ATTR_USE_GLOBAL_DEVICE_IDS, 0) != 0;
  if (!channel) {
    if (ugdi)
      return where_fail(st, ins, KILN_EINVAL, "use_global_device_ids=true needs a channel_id");
    *mode = KILN_GROUPS_CROSS_REPLICA;
  } else if (!has_ugdi(ins->op)) {
    *mode = KILN_GROUPS_CROSS_PARTITION;
  } else {
    *mode = ugdi ? KILN_GROUPS_FLATTENED_ID : KILN_GROUPS_CROSS_REPLICA_AND_PARTITION;
  }
  return 0;
}

int kiln_replica_groups_expand(const kiln_replica_groups *g, kiln_arena *a, int64_t **out,
                               int64_t *ngroups, int64_t *size, kiln_status *st) {
  *out = NULL;
  *ngroups = *size = 0;
  if (g == NULL) return 0;
  if (g->iota) {
    if (g->iota_shape.n != 2 || g->iota_shape.v[0] < 0 || g->iota_shape.v[1] < 0)
      return where_fail(st, NULL, KILN_EINVAL, "iota replica groups need [groups,size]");
    int64_t n = product(&g->iota_shape);
    if (n < 0 || n > (int64_t)(1u << 24))
      return where_fail(st, NULL, KILN_EINVAL, "%lld replica group ids are too many", (long long)n);
    int64_t *v = kiln_arena_alloc(a, (size_t)(n ? n : 1) * sizeof *v);
    if (v == NULL) return kiln_status_set(st, KILN_ENOMEM, "replica_groups", "out of memory");
    if (!kiln_iota_expand(&g->iota_reshape, &g->iota_perm, v, n))
      return where_fail(st, NULL, KILN_EINVAL, "the iota list does not hold %lld devices",
                        (long long)n);
    *out = v;
    *ngroups = g->iota_shape.v[0];
    *size = g->iota_shape.v[1];
    return 0;
  }
  if (g->ngroups == 0) return 0;
  int64_t sz = g->groups[0].n;
  for (uint32_t i = 1; i < g->ngroups; i++)
    if ((int64_t)g->groups[i].n != sz)
      return where_fail(
          st, NULL, KILN_EINVAL,
          "replica group %lld has %lld ids; every group must have as many as the first",
          (long long)i, (long long)g->groups[i].n);
  int64_t total = (int64_t)g->ngroups * sz;
  int64_t *v = kiln_arena_alloc(a, (size_t)(total > 0 ? total : 1) * sizeof *v);
  if (v == NULL) return kiln_status_set(st, KILN_ENOMEM, "replica_groups", "out of memory");
  for (uint32_t i = 0; i < g->ngroups; i++)
    memcpy(v + (int64_t)i * sz, g->groups[i].v, (size_t)sz * sizeof *v);
  *out = v;
  *ngroups = g->ngroups;
  *size = sz;
  return 0;
}

/* Finds `id` in the groups: its group and the position in it. */
static bool find_in_groups(const int64_t *ids, int64_t ngroups, int64_t size, int64_t id,
                           int64_t *grp, int64_t *pos) {
  for (int64_t i = 0; i < ngroups * size; i++)
    if (ids[i] == id) {
      *grp = i / size;
      *pos = i % size;
      return true;
    }
  return false;
}

int kiln_collective_group_of(const kiln_instr *ins, int64_t replicas, int64_t partitions,
                             int64_t device, kiln_arena *a, kiln_collective_group *out,
                             kiln_status *st) {
  memset(out, 0, sizeof *out);
  kiln_group_mode mode;
  int rc = kiln_collective_group_mode(ins, &mode, st);
  if (rc) return rc;
  int64_t my_r = device / partitions, my_p = device % partitions;
  int64_t ndev = replicas * partitions;
  bool pairs = ins->op == KILN_OP_COLLECTIVE_PERMUTE || ins->op == KILN_OP_COLLECTIVE_PERMUTE_START;
  const kiln_attr *ga = kiln_instr_attr(ins, KILN_ATTR_REPLICA_GROUPS);
  int64_t *ids = NULL, ngroups = 0, size = 0;
  if (!pairs &&
      (rc = kiln_replica_groups_expand(ga ? ga->v.groups : NULL, a, &ids, &ngroups, &size, st)))
    return rc;
  /* The id space the groups are written in, and its extent. */
  int64_t space = mode == KILN_GROUPS_CROSS_PARTITION ? partitions
                  : mode == KILN_GROUPS_FLATTENED_ID  ? ndev
                                                      : replicas;
  int64_t my_id = mode == KILN_GROUPS_CROSS_PARTITION ? my_p
                  : mode == KILN_GROUPS_FLATTENED_ID  ? device
                                                      : my_r;
  if (mode == KILN_GROUPS_FLATTENED_ID && ngroups == 0 && !pairs)
    return where_fail(st, ins, KILN_EINVAL, "use_global_device_ids=true needs replica_groups");
  for (int64_t i = 0; i < ngroups * size; i++)
    if (ids[i] < 0 || ids[i] >= space)
      return where_fail(st, ins, KILN_EINVAL,
                        "replica group id %lld is out of range for %lld devices in this mode",
                        (long long)ids[i], (long long)space);
  int64_t grp = 0, pos = my_id;
  const int64_t *mine = NULL;
  if (pairs || ngroups == 0) {
    size = space; /* everyone in the id space */
  } else {
    if (!find_in_groups(ids, ngroups, size, my_id, &grp, &pos))
      return where_fail(st, ins, KILN_EINVAL, "id %lld is in no replica group (of %lld)",
                        (long long)my_id, (long long)ngroups);
    for (int64_t i = 0; i < ngroups * size; i++)
      for (int64_t j = 0; j < i; j++)
        if (ids[i] == ids[j])
          return where_fail(st, ins, KILN_EINVAL, "id %lld is in two replica groups",
                            (long long)ids[i]);
    mine = ids + grp * size;
  }
  /* Cross-replica-and-partition: every partition of each listed replica. */
  int64_t fan = mode == KILN_GROUPS_CROSS_REPLICA_AND_PARTITION ? partitions : 1;
  out->n = size * fan;
  out->members = kiln_arena_alloc(a, (size_t)(out->n ? out->n : 1) * sizeof *out->members);
  out->ids = kiln_arena_alloc(a, (size_t)(out->n ? out->n : 1) * sizeof *out->ids);
  if (out->members == NULL || out->ids == NULL)
    return kiln_status_set(st, KILN_ENOMEM, ins->name, "out of memory");
  for (int64_t i = 0; i < size; i++) {
    int64_t id = mine ? mine[i] : i;
    for (int64_t f = 0; f < fan; f++) {
      int64_t k = i * fan + f, dev;
      switch (mode) {
      case KILN_GROUPS_CROSS_REPLICA: dev = id * partitions + my_p; break;
      case KILN_GROUPS_CROSS_PARTITION: dev = my_r * partitions + id; break;
      case KILN_GROUPS_FLATTENED_ID: dev = id; break;
      default: dev = id * partitions + f; break;
      }
      out->members[k] = dev;
      out->ids[k] = id;
      if (dev == device) out->rank = k;
    }
  }
  (void)pos;
  return 0;
}
