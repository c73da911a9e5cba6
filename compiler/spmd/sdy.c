/* User annotations: the sharding= attribute of any instruction, and the
 * sharding custom calls (with_sharding_constraint's "Sharding", Shardy's
 * xla.sdy.* markers), whose sharding is either an HLO sharding= attribute or
 * only Shardy's frontend attribute xla.sdy.sharding.
 *
 * A Shardy sharding names a mesh of the module (frontend attribute
 * xla.sdy.meshes: mesh = #sdy.mesh<["x"=2, "y"=4]>) and, per array dim, the
 * mesh axes that split it, major first. As an HLO sharding that is the iota
 * device array of the mesh's shape, transposed so that each dim's axes come
 * in order followed by the unused axes (the replicated subgroup). Anything
 * this reader does not understand (device_ids, sub-axes "x":(1)2, open dims
 * are fine) leaves the annotation out: propagation then decides, which is
 * never wrong, only perhaps slower.
 */
#include <stdio.h>
#include <string.h>

#include "compiler/ir/sharding.h"
#include "compiler/spmd/spmd_internal.h"

#define MAX_AXES 16

typedef struct mesh {
  char names[MAX_AXES][32];
  int64_t sizes[MAX_AXES];
  uint32_t n;
} mesh;

/* Copies the value of key="..." in a frontend_attributes text, unescaped. */
static bool attr_string(const char *text, const char *key, char *out, size_t cap) {
  char pat[64];
  snprintf(pat, sizeof pat, "%s=\"", key);
  const char *p = text ? strstr(text, pat) : NULL;
  if (p == NULL) return false;
  p += strlen(pat);
  size_t n = 0;
  for (; *p && *p != '"'; p++) {
    if (*p == '\\' && p[1]) p++;
    if (n + 1 >= cap) return false;
    out[n++] = *p;
  }
  out[n] = '\0';
  return *p == '"';
}

static const char *skip_ws(const char *p) {
  while (*p == ' ' || *p == '\t' || *p == '\n') p++;
  return p;
}

/* Reads a quoted axis name at p into name; returns the char after it. */
static const char *quoted(const char *p, char *name, size_t cap) {
  p = skip_ws(p);
  if (*p != '"') return NULL;
  p++;
  size_t n = 0;
  while (*p && *p != '"') {
    if (n + 1 >= cap) return NULL;
    name[n++] = *p++;
  }
  name[n] = '\0';
  return *p == '"' ? p + 1 : NULL;
}

static bool find_mesh(const kiln_module *m, const char *name, mesh *out) {
  const char *meshes = NULL;
  for (uint32_t i = 0; i < m->nheader_extra; i++)
    if (strcmp(m->header_extra[i].name, "frontend_attributes") == 0)
      meshes = m->header_extra[i].text;
  if (meshes == NULL) return false;
  char pat[80];
  snprintf(pat, sizeof pat, "%s = #sdy.mesh<", name);
  const char *p = strstr(meshes, pat);
  if (p == NULL) return false;
  p = skip_ws(p + strlen(pat));
  if (*p != '[') return false;
  p++;
  out->n = 0;
  for (;;) {
    p = skip_ws(p);
    if (*p == ']') break;
    if (out->n == MAX_AXES) return false;
    p = quoted(p, out->names[out->n], sizeof out->names[0]);
    if (p == NULL || *p != '=') return false;
    long long v;
    int used;
    if (sscanf(p + 1, "%lld%n", &v, &used) != 1 || v <= 0) return false;
    out->sizes[out->n++] = v;
    p = skip_ws(p + 1 + used);
    if (*p == ',') p++;
  }
  p = skip_ws(p + 1);
  return *p == '>'; /* device_ids=... and the like: not understood */
}

/* kiln__sdy_parse, keeping only the mesh axes keep[k] (NULL: all) as
 * splits: the others are left to the replicated subgroup. A kept axis after
 * a dropped one in a dim (a manual split minor to an automatic one) is not
 * understood. */
static int sdy_parse_axes(kiln_arena *a, const kiln_module *m, const char *text, uint32_t rank,
                          const bool *keep, const kiln_sharding **out) {
  *out = NULL;
  const char *p = strstr(text, "<@");
  if (p == NULL || rank > SPMD_MAX_RANK) return 0;
  p += 2;
  char name[64];
  size_t n = 0;
  while (*p && *p != ',' && *p != '>' && n + 1 < sizeof name) name[n++] = *p++;
  name[n] = '\0';
  mesh me;
  if (*p != ',' || !find_mesh(m, name, &me)) return 0;
  p = skip_ws(p + 1);
  if (*p != '[') return 0;
  p++;
  int64_t order[MAX_AXES], tiles[SPMD_MAX_RANK + 1];
  bool used[MAX_AXES] = {false};
  uint32_t norder = 0, d = 0;
  for (;;) {
    p = skip_ws(p);
    if (*p == ']') break;
    if (*p != '{' || d >= rank) return 0;
    p++;
    tiles[d] = 1;
    bool dropped = false;
    for (;;) {
      p = skip_ws(p);
      if (*p == '}') break;
      if (*p == '?') {
        p++;
        continue;
      }
      if (*p == ',') {
        p++;
        continue;
      }
      char ax[32];
      p = quoted(p, ax, sizeof ax);
      if (p == NULL) return 0;
      uint32_t k = 0;
      while (k < me.n && strcmp(me.names[k], ax) != 0) k++;
      if (k == me.n || used[k] || *skip_ws(p) == ':') return 0;
      if (keep && !keep[k]) {
        dropped = true;
        continue;
      }
      if (dropped) return 0;
      used[k] = true;
      order[norder++] = k;
      tiles[d] *= me.sizes[k];
    }
    p = skip_ws(p + 1);
    d++;
    if (*p == ',') p++;
  }
  if (d != rank) return 0;
  int64_t rep = 1;
  for (uint32_t k = 0; k < me.n; k++)
    if (!used[k]) {
      order[norder++] = k;
      rep *= me.sizes[k];
    }
  kiln_sharding *s = kiln_arena_calloc(a, 1, sizeof *s);
  if (s == NULL) return KILN_ENOMEM;
  bool any = false;
  for (uint32_t k = 0; k < rank; k++) any = any || tiles[k] > 1;
  if (!any) {
    s->kind = KILN_SHARD_REPLICATED;
    *out = s;
    return 0;
  }
  s->kind = KILN_SHARD_TILED;
  tiles[rank] = rep;
  uint32_t nd = rank + (rep > 1);
  s->tile_dims.v = kiln_arena_memdup(a, tiles, nd * sizeof(int64_t));
  s->iota_reshape.v = kiln_arena_memdup(a, me.sizes, me.n * sizeof(int64_t));
  s->iota_perm.v = kiln_arena_memdup(a, order, me.n * sizeof(int64_t));
  if (!s->tile_dims.v || !s->iota_reshape.v || !s->iota_perm.v) return KILN_ENOMEM;
  s->tile_dims.n = nd;
  s->iota_reshape.n = s->iota_perm.n = me.n;
  s->last_tile_dim_replicate = rep > 1;
  *out = s;
  return 0;
}

int kiln__sdy_parse(kiln_arena *a, const kiln_module *m, const char *text, uint32_t rank,
                    const kiln_sharding **out) {
  return sdy_parse_axes(a, m, text, rank, NULL, out);
}

/* The region's mesh (its axes' sizes) and which axes are manual, from the
 * frontend attributes of a GlobalToLocalShape or LocalToGlobalShape. */
bool kiln__sdy_region_axes(const kiln_module *m, const kiln_instr *ins, int64_t *sizes,
                           bool *manual, uint32_t *naxes) {
  const kiln_attr *fa = kiln_instr_attr(ins, KILN_ATTR_FRONTEND_ATTRIBUTES);
  const char *target = kiln_instr_attr_str(ins, KILN_ATTR_CUSTOM_CALL_TARGET);
  bool in = target && strcmp(target, "xla.sdy.GlobalToLocalShape") == 0;
  char text[4096], axes[512], name[64];
  if (fa == NULL ||
      !attr_string(fa->v.s, in ? "xla.sdy.in_shardings" : "xla.sdy.out_shardings", text,
                   sizeof text) ||
      !attr_string(fa->v.s, "xla.sdy.manual_axes", axes, sizeof axes))
    return false;
  const char *p = strstr(text, "<@");
  if (p == NULL) return false;
  size_t n = 0;
  for (const char *q = p + 2; *q && *q != ',' && *q != '>' && n + 1 < sizeof name; q++)
    name[n++] = *q;
  name[n] = '\0';
  mesh me;
  if (!find_mesh(m, name, &me)) return false;
  for (uint32_t k = 0; k < me.n; k++) sizes[k] = me.sizes[k], manual[k] = false;
  for (const char *q = strchr(axes, '{'); q && *q && *q != '}';) {
    char ax[32];
    const char *nx = quoted(q + 1, ax, sizeof ax);
    if (nx == NULL) break;
    for (uint32_t k = 0; k < me.n; k++)
      if (strcmp(me.names[k], ax) == 0) manual[k] = true;
    q = skip_ws(nx);
  }
  *naxes = me.n;
  return true;
}

int kiln__sdy_instr_sharding_axes(kiln_arena *a, const kiln_module *m, const kiln_instr *ins,
                                  const bool *keep, const kiln_sharding **out) {
  *out = NULL;
  const kiln_attr *fa = kiln_instr_attr(ins, KILN_ATTR_FRONTEND_ATTRIBUTES);
  char text[1024];
  if (fa == NULL || !kiln_shape_is_array(&ins->shape) ||
      !attr_string(fa->v.s, "xla.sdy.sharding", text, sizeof text))
    return 0;
  return sdy_parse_axes(a, m, text, ins->shape.rank, keep, out);
}

int kiln__user_sharding(kiln_arena *a, const kiln_module *m, const kiln_instr *ins,
                        const kiln_sharding **out, kiln_status *st) {
  (void)st;
  *out = NULL;
  const kiln_attr *sa = kiln_instr_attr(ins, KILN_ATTR_SHARDING);
  const kiln_attr *fa0 = kiln_instr_attr(ins, KILN_ATTR_FRONTEND_ATTRIBUTES);
  char open[1024];
  if (sa && ins->op == KILN_OP_CUSTOM_CALL && fa0 && kiln_shape_is_array(&ins->shape) &&
      attr_string(fa0->v.s, "xla.sdy.sharding", open, sizeof open) && strchr(open, '?')) {
    /* Shardy's open dims ({?}), which the HLO form writes as replicated:
     * with no axis at all, no constraint (propagation decides) */
    const kiln_sharding *s = NULL;
    int rc = kiln__sdy_parse(a, m, open, ins->shape.rank, &s);
    if (rc) return rc;
    if (s && s->kind == KILN_SHARD_REPLICATED) return 0;
  }
  if (sa) {
    *out = sa->v.sharding;
    return 0;
  }
  if (ins->op != KILN_OP_CUSTOM_CALL ||
      !kiln_custom_call_is_annotation(kiln_instr_attr_str(ins, KILN_ATTR_CUSTOM_CALL_TARGET)) ||
      !kiln_shape_is_array(&ins->shape))
    return 0;
  const kiln_attr *fa = kiln_instr_attr(ins, KILN_ATTR_FRONTEND_ATTRIBUTES);
  char text[1024];
  if (fa && !attr_string(fa->v.s, "xla.sdy.sharding", text, sizeof text) &&
      strcmp(kiln_instr_attr_str(ins, KILN_ATTR_CUSTOM_CALL_TARGET),
             "xla.sdy.LocalToGlobalShape") == 0) {
    /* the end of a manual region: the result's sharding is out_shardings'
     * (a region manual over some axes only: open along the others, so no
     * constraint; propagation decides) */
    int64_t sizes[MAX_AXES];
    bool manual[MAX_AXES];
    uint32_t na;
    if (kiln__sdy_region_axes(m, ins, sizes, manual, &na))
      for (uint32_t k = 0; k < na; k++)
        if (!manual[k]) return 0;
    kiln_status ignore;
    kiln_status_clear(&ignore);
    if (kiln__sdy_region_sharding(a, m, ins, 0, ins->shape.rank, out, &ignore)) *out = NULL;
    return 0;
  }
  if (fa == NULL || !attr_string(fa->v.s, "xla.sdy.sharding", text, sizeof text)) return 0;
  int rc = kiln__sdy_parse(a, m, text, ins->shape.rank, out);
  /* open dims ({?}) and no axis: no constraint at all, propagation decides */
  if (rc == 0 && *out && (*out)->kind == KILN_SHARD_REPLICATED && strchr(text, '?')) *out = NULL;
  return rc;
}

int kiln__sdy_region_sharding(kiln_arena *a, const kiln_module *m, const kiln_instr *ins,
                              uint32_t i, uint32_t rank, const kiln_sharding **out,
                              kiln_status *st) {
  *out = NULL;
  const char *target = kiln_instr_attr_str(ins, KILN_ATTR_CUSTOM_CALL_TARGET);
  bool in = target && strcmp(target, "xla.sdy.GlobalToLocalShape") == 0;
  const char *key = in ? "xla.sdy.in_shardings" : "xla.sdy.out_shardings";
  const kiln_attr *fa = kiln_instr_attr(ins, KILN_ATTR_FRONTEND_ATTRIBUTES);
  char where[160], text[4096], axes[512];
  snprintf(where, sizeof where, "%.100s %.40s", target ? target : "custom-call", ins->name);
  if (fa == NULL || !attr_string(fa->v.s, key, text, sizeof text))
    return kiln_status_set(st, KILN_EUNIMPL, where, "a manual region (shard_map) without %s", key);
  const char *p = text;
  for (uint32_t k = 0; p && k <= i; k++) {
    p = strstr(p, "<@");
    if (p && k < i) p += 2;
  }
  if (p == NULL) return kiln_status_set(st, KILN_EINVAL, where, "%s has no value %u", key, i);
  /* The mesh, and the region's manual axes: every axis of it. */
  char name[64];
  size_t n = 0;
  for (const char *q = p + 2; *q && *q != ',' && *q != '>' && n + 1 < sizeof name; q++)
    name[n++] = *q;
  name[n] = '\0';
  mesh me;
  if (!find_mesh(m, name, &me))
    return kiln_status_set(st, KILN_EUNIMPL, where, "mesh '%s' of %s is not understood", name, key);
  if (!attr_string(fa->v.s, "xla.sdy.manual_axes", axes, sizeof axes))
    return kiln_status_set(st, KILN_EUNIMPL, where, "a manual region without manual_axes");
  uint32_t nman = 0;
  bool seen[MAX_AXES] = {false};
  for (const char *q = strchr(axes, '{'); q && *q && *q != '}';) {
    char ax[32];
    const char *nx = quoted(q + 1, ax, sizeof ax);
    if (nx == NULL) break;
    for (uint32_t k = 0; k < me.n; k++)
      if (strcmp(me.names[k], ax) == 0 && !seen[k]) seen[k] = true, nman++;
    q = skip_ws(nx);
  }
  if (nman == 0)
    return kiln_status_set(st, KILN_EINVAL, where, "a manual region manual over no axis of '%s'",
                           name);
  /* Manual over some axes only: the region's values are its local shapes
   * along the manual axes and whole along the others, so only the manual
   * axes split them (the others replicate). */
  int rc = sdy_parse_axes(a, m, p, rank, seen, out);
  if (rc) return kiln_status_set(st, rc, where, "out of memory");
  if (*out == NULL)
    return kiln_status_set(st, KILN_EUNIMPL, where, "value %u of %s is not understood", i, key);
  return 0;
}
