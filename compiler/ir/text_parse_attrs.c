/* Attribute values of HLO instructions, one reader per kind of attrs.def
 * (integers, lists, slices, paddings, windows, dim_labels, replica groups,
 * shardings, words, strings, verbatim text), plus the module header's
 * input_output_alias. Each reader checks the structure it can check without
 * knowing the operands (ranks of window fields agree, dim_labels name every
 * dimension once, a tiled sharding lists as many devices as tiles); the rest
 * is the verifier's job. */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/text_parse.h"

static int nomem(kiln__lex *lx) {
  return kiln__lex_error_code(lx, NULL, KILN_ENOMEM, "out of memory");
}

static const char *found(kiln__lex *lx, char *buf, size_t n) {
  return kiln__lex_found(lx, NULL, buf, n);
}

/* A growable int64 list on the heap, copied into the arena when done. */
typedef struct ivec {
  int64_t *v;
  size_t n, cap;
} ivec;

static int ivec_push(kiln__lex *lx, ivec *v, int64_t x) {
  void *p = v->v;
  if (kiln_grow(&p, &v->cap, v->n + 1, sizeof *v->v)) return nomem(lx);
  v->v = p;
  v->v[v->n++] = x;
  return 0;
}

static int ivec_to(kiln__lex *lx, kiln_arena *a, ivec *v, kiln_i64s *out) {
  out->v = NULL;
  out->n = 0;
  if (v->n > UINT32_MAX) return kiln__lex_error(lx, NULL, "list is too long");
  if (v->n) {
    out->v = kiln_arena_memdup(a, v->v, v->n * sizeof *v->v);
    if (out->v == NULL) return nomem(lx);
  }
  out->n = (uint32_t)v->n;
  return 0;
}

static int ints_into(kiln__lex *lx, ivec *v, const char *what) {
  int rc;
  char ctx[96];
  snprintf(ctx, sizeof ctx, "to open %s", what);
  if ((rc = kiln__lex_expect(lx, '{', ctx))) return rc;
  if (kiln__lex_accept(lx, '}')) return 0;
  for (;;) {
    int64_t x;
    if ((rc = kiln__lex_int(lx, &x, "an integer"))) return rc;
    if ((rc = ivec_push(lx, v, x))) return rc;
    if (kiln__lex_accept(lx, ',')) continue;
    snprintf(ctx, sizeof ctx, "to close %s", what);
    return kiln__lex_expect(lx, '}', ctx);
  }
}

int kiln__parse_int_list(kiln__lex *lx, kiln_arena *a, kiln_i64s *out, const char *what) {
  ivec v = {0};
  int rc = ints_into(lx, &v, what);
  if (rc == 0) rc = ivec_to(lx, a, &v, out);
  kiln_free(v.v);
  return rc;
}

/* "[2,2]" */
static int bracket_ints(kiln__lex *lx, kiln_arena *a, kiln_i64s *out, const char *what) {
  ivec v = {0};
  int rc;
  char ctx[96];
  snprintf(ctx, sizeof ctx, "to open %s", what);
  if ((rc = kiln__lex_expect(lx, '[', ctx))) goto out;
  if (!kiln__lex_accept(lx, ']')) {
    for (;;) {
      int64_t x;
      if ((rc = kiln__lex_int(lx, &x, "an integer"))) goto out;
      if ((rc = ivec_push(lx, &v, x))) goto out;
      if (kiln__lex_accept(lx, ',')) continue;
      snprintf(ctx, sizeof ctx, "to close %s", what);
      if ((rc = kiln__lex_expect(lx, ']', ctx))) goto out;
      break;
    }
  }
  rc = ivec_to(lx, a, &v, out);
out:
  kiln_free(v.v);
  return rc;
}

/* "T(1,0)" after an iota "<=[...]"; n == 0 when absent. */
static int iota_perm(kiln__lex *lx, kiln_arena *a, kiln_i64s *out) {
  out->v = NULL;
  out->n = 0;
  if (kiln__lex_peek(lx) != 'T' || kiln__lex_peek2(lx) != '(') return 0;
  lx->p += 2;
  ivec v = {0};
  int rc;
  for (;;) {
    int64_t x;
    if ((rc = kiln__lex_int(lx, &x, "an integer"))) goto out;
    if ((rc = ivec_push(lx, &v, x))) goto out;
    if (kiln__lex_accept(lx, ',')) continue;
    if ((rc = kiln__lex_expect(lx, ')', "to close the transpose T(...)"))) goto out;
    break;
  }
  rc = ivec_to(lx, a, &v, out);
out:
  kiln_free(v.v);
  return rc;
}

static bool accept_le(kiln__lex *lx) {
  if (kiln__lex_peek(lx) == '<' && kiln__lex_peek2(lx) == '=') {
    lx->p += 2;
    return true;
  }
  return false;
}

static int64_t product(const kiln_i64s *v) {
  int64_t p = 1;
  for (uint32_t i = 0; i < v->n; i++) {
    if (v->v[i] < 0 || (v->v[i] && p > INT64_MAX / v->v[i])) return -1;
    p *= v->v[i];
  }
  return p;
}

/* <=[reshape] T(perm): the reshape and the permutation must agree with the
 * number of devices. */
static int check_iota(kiln__lex *lx, const char *at, const kiln_i64s *reshape,
                      const kiln_i64s *perm, int64_t want, const char *what) {
  int64_t n = product(reshape);
  if (n != want)
    return kiln__lex_error(lx, at, "%s: the iota list <=[...] has %lld devices, expected %lld",
                           what, (long long)n, (long long)want);
  if (perm->n) {
    bool ok = perm->n == reshape->n;
    for (uint32_t i = 0; ok && i < perm->n; i++) {
      if (perm->v[i] < 0 || perm->v[i] >= (int64_t)perm->n) ok = false;
      for (uint32_t j = 0; ok && j < i; j++)
        if (perm->v[j] == perm->v[i]) ok = false;
    }
    if (!ok)
      return kiln__lex_error(lx, at, "%s: T(...) is not a permutation of the %u iota dimensions",
                             what, (unsigned)reshape->n);
  }
  return 0;
}

/* ---- slices, paddings, pairs --------------------------------------------- */

/* {[0:2], [1:5:2]} -> triples (start, limit, stride) */
static int parse_slice(kiln__lex *lx, kiln_arena *a, kiln_i64s *out) {
  ivec v = {0};
  int rc;
  if ((rc = kiln__lex_expect(lx, '{', "to open the slice"))) goto out;
  if (!kiln__lex_accept(lx, '}')) {
    for (;;) {
      int64_t x[3] = {0, 0, 1};
      if ((rc = kiln__lex_expect(lx, '[', "to open a slice dimension"))) goto out;
      if ((rc = kiln__lex_int(lx, &x[0], "a slice start"))) goto out;
      if ((rc = kiln__lex_expect(lx, ':', "after the slice start"))) goto out;
      if ((rc = kiln__lex_int(lx, &x[1], "a slice limit"))) goto out;
      if (kiln__lex_accept(lx, ':') && (rc = kiln__lex_int(lx, &x[2], "a slice stride"))) goto out;
      if ((rc = kiln__lex_expect(lx, ']', "to close a slice dimension"))) goto out;
      for (int i = 0; i < 3; i++)
        if ((rc = ivec_push(lx, &v, x[i]))) goto out;
      if (kiln__lex_accept(lx, ',')) continue;
      if ((rc = kiln__lex_expect(lx, '}', "to close the slice"))) goto out;
      break;
    }
  }
  rc = ivec_to(lx, a, &v, out);
out:
  kiln_free(v.v);
  return rc;
}

/* An integer glued to what came before ("1_2x3"): no whitespace allowed. */
static int glued_int(kiln__lex *lx, int64_t *x, const char *what) {
  const char *p = lx->p;
  if (p < lx->end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == '/')) {
    char f[64];
    return kiln__lex_error(lx, p, "expected %s, found %s", what, found(lx, f, sizeof f));
  }
  return kiln__lex_int(lx, x, what);
}

static bool next_is(kiln__lex *lx, char c) { return lx->p < lx->end && *lx->p == c; }

/* 0_0x1_2_1 -> triples (lo, hi, interior) */
static int parse_padding(kiln__lex *lx, kiln_arena *a, kiln_i64s *out) {
  ivec v = {0};
  int rc;
  kiln__lex_skip(lx);
  for (;;) {
    int64_t x[3] = {0, 0, 0};
    if ((rc = glued_int(lx, &x[0], "a low padding"))) goto out;
    if (!next_is(lx, '_')) {
      char f[64];
      rc = kiln__lex_error(lx, NULL, "expected '_' between low and high padding, found %s",
                           found(lx, f, sizeof f));
      goto out;
    }
    lx->p++;
    if ((rc = glued_int(lx, &x[1], "a high padding"))) goto out;
    if (next_is(lx, '_')) {
      lx->p++;
      if ((rc = glued_int(lx, &x[2], "an interior padding"))) goto out;
    }
    for (int i = 0; i < 3; i++)
      if ((rc = ivec_push(lx, &v, x[i]))) goto out;
    if (!next_is(lx, 'x')) break;
    lx->p++;
  }
  rc = ivec_to(lx, a, &v, out);
out:
  kiln_free(v.v);
  return rc;
}

/* {{0,1},{1,0}} -> flattened pairs */
static int parse_pairs(kiln__lex *lx, kiln_arena *a, kiln_i64s *out) {
  ivec v = {0};
  int rc;
  if ((rc = kiln__lex_expect(lx, '{', "to open the list of pairs"))) goto out;
  if (!kiln__lex_accept(lx, '}')) {
    for (;;) {
      int64_t x, y;
      if ((rc = kiln__lex_expect(lx, '{', "to open a pair"))) goto out;
      if ((rc = kiln__lex_int(lx, &x, "an integer"))) goto out;
      if ((rc = kiln__lex_expect(lx, ',', "between the two numbers of a pair"))) goto out;
      if ((rc = kiln__lex_int(lx, &y, "an integer"))) goto out;
      if ((rc = kiln__lex_expect(lx, '}', "to close a pair"))) goto out;
      if ((rc = ivec_push(lx, &v, x)) || (rc = ivec_push(lx, &v, y))) goto out;
      if (kiln__lex_accept(lx, ',')) continue;
      if ((rc = kiln__lex_expect(lx, '}', "to close the list of pairs"))) goto out;
      break;
    }
  }
  rc = ivec_to(lx, a, &v, out);
out:
  kiln_free(v.v);
  return rc;
}

/* ---- window ------------------------------------------------------------- */

enum { W_SIZE, W_STRIDE, W_PAD, W_LHS, W_RHS, W_REV, W_COUNT };
static const char *const wnames[W_COUNT] = {"size",       "stride",     "pad",
                                            "lhs_dilate", "rhs_dilate", "rhs_reversal"};

/* {size=3x3 stride=2x2 pad=1_1x0_1 lhs_dilate=1x1 rhs_dilate=2x2 rhs_reversal=0x1} */
static int parse_window(kiln__lex *lx, kiln_arena *a, kiln_window **out) {
  ivec f[W_COUNT];
  memset(f, 0, sizeof f);
  bool seen[W_COUNT] = {0};
  const char *open;
  int rc;
  kiln__lex_skip(lx);
  open = lx->p;
  if ((rc = kiln__lex_expect(lx, '{', "to open the window"))) goto out;
  while (!kiln__lex_accept(lx, '}')) {
    kiln__lex_skip(lx);
    const char *at = lx->p;
    kiln__tok name;
    if ((rc = kiln__lex_bare_name(lx, &name, "a window field or '}'"))) goto out;
    int w = -1;
    for (int i = 0; i < W_COUNT; i++)
      if (strlen(wnames[i]) == name.n && memcmp(wnames[i], name.s, name.n) == 0) w = i;
    if (w < 0) {
      rc = kiln__lex_error(lx, at, "unknown window field '%.*s'", (int)(name.n > 60 ? 60 : name.n),
                           name.s);
      goto out;
    }
    if (seen[w]) {
      rc = kiln__lex_error(lx, at, "duplicate window field %s", wnames[w]);
      goto out;
    }
    seen[w] = true;
    if ((rc = kiln__lex_expect(lx, '=', "after a window field name"))) goto out;
    if (w == W_PAD) {
      kiln_i64s pad;
      if ((rc = parse_padding(lx, a, &pad))) goto out;
      for (uint32_t i = 0; i < pad.n; i++) {
        if (i % 3 == 2) {
          if (pad.v[i] != 0) {
            rc = kiln__lex_error(lx, at, "window padding has no interior part");
            goto out;
          }
          continue;
        }
        if ((rc = ivec_push(lx, &f[w], pad.v[i]))) goto out;
      }
    } else {
      for (;;) {
        int64_t x;
        if ((rc = kiln__lex_int(lx, &x, "an integer"))) goto out;
        if ((rc = ivec_push(lx, &f[w], x))) goto out;
        if (!next_is(lx, 'x')) break;
        lx->p++;
      }
    }
  }
  size_t rank = 0;
  int first = -1;
  for (int i = 0; i < W_COUNT; i++) {
    if (!seen[i]) continue;
    size_t r = i == W_PAD ? f[i].n / 2 : f[i].n;
    if (first < 0) {
      first = i;
      rank = r;
    } else if (r != rank) {
      rc = kiln__lex_error(lx, open, "window %s has %zu dimensions but %s has %zu", wnames[first],
                           rank, wnames[i], r);
      goto out;
    }
  }
  if (first >= 0 && !seen[W_SIZE]) {
    rc = kiln__lex_error(lx, open, "window has no size");
    goto out;
  }
  kiln_window *win = kiln_arena_calloc(a, 1, sizeof *win);
  if (win == NULL ||
      (rank && (win->dims = kiln_arena_calloc(a, rank, sizeof *win->dims)) == NULL)) {
    rc = nomem(lx);
    goto out;
  }
  win->rank = (uint32_t)rank;
  for (size_t i = 0; i < rank; i++) {
    kiln_window_dim *d = &win->dims[i];
    d->size = f[W_SIZE].v[i];
    d->stride = seen[W_STRIDE] ? f[W_STRIDE].v[i] : 1;
    d->pad_lo = seen[W_PAD] ? f[W_PAD].v[2 * i] : 0;
    d->pad_hi = seen[W_PAD] ? f[W_PAD].v[2 * i + 1] : 0;
    d->lhs_dilate = seen[W_LHS] ? f[W_LHS].v[i] : 1;
    d->rhs_dilate = seen[W_RHS] ? f[W_RHS].v[i] : 1;
    d->reversal = seen[W_REV] ? f[W_REV].v[i] != 0 : false;
  }
  *out = win;
out:
  for (int i = 0; i < W_COUNT; i++) kiln_free(f[i].v);
  return rc;
}

/* ---- dim_labels --------------------------------------------------------- */

/* One side of "b01f_01io->b01f": finds the two letters and the spatial
 * digits; spatial[d] is the position of digit d. */
static bool label_side(const char *s, size_t n, char l1, char l2, int64_t *p1, int64_t *p2,
                       int64_t *spatial, uint32_t *nspatial) {
  *p1 = *p2 = -1;
  uint32_t ns = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == l1) {
      if (*p1 >= 0) return false;
      *p1 = (int64_t)i;
    } else if (s[i] == l2) {
      if (*p2 >= 0) return false;
      *p2 = (int64_t)i;
    } else if (s[i] >= '0' && s[i] <= '9') {
      ns++;
    } else {
      return false;
    }
  }
  if (*p1 < 0 || *p2 < 0) return false;
  for (uint32_t d = 0; d < ns; d++) {
    int64_t pos = -1;
    for (size_t i = 0; i < n; i++)
      if (s[i] == (char)('0' + d)) {
        if (pos >= 0) return false;
        pos = (int64_t)i;
      }
    if (pos < 0) return false;
    spatial[d] = pos;
  }
  *nspatial = ns;
  return true;
}

static int parse_dim_labels(kiln__lex *lx, kiln_arena *a, kiln_conv_dims **out) {
  kiln__lex_skip(lx);
  const char *at = lx->p, *p = at, *end = lx->end;
  const char *part[3];
  size_t len[3];
  for (int k = 0; k < 3; k++) {
    part[k] = p;
    while (p < end && ((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z'))) p++;
    len[k] = (size_t)(p - part[k]);
    if (k == 0 && p < end && *p == '_')
      p++;
    else if (k == 1 && end - p >= 2 && p[0] == '-' && p[1] == '>')
      p += 2;
    else if (k < 2) {
      lx->p = p;
      char f[64];
      return kiln__lex_error(lx, p, "expected dim_labels like b01f_01io->b01f, found %s",
                             found(lx, f, sizeof f));
    }
  }
  lx->p = p;
  int shown = (int)(p - at > 80 ? 80 : p - at);
  kiln_conv_dims *cd = kiln_arena_calloc(a, 1, sizeof *cd);
  if (cd == NULL) return nomem(lx);
  size_t maxn = len[0] > len[1] ? len[0] : len[1];
  if (len[2] > maxn) maxn = len[2];
  int64_t *sp = kiln_arena_calloc(a, 3 * (maxn ? maxn : 1), sizeof *sp);
  if (sp == NULL) return nomem(lx);
  cd->in_spatial = sp;
  cd->kernel_spatial = sp + maxn;
  cd->out_spatial = sp + 2 * maxn;
  uint32_t n0, n1, n2;
  if (!label_side(part[0], len[0], 'b', 'f', &cd->in_batch, &cd->in_feature, cd->in_spatial, &n0))
    return kiln__lex_error(
        lx, at,
        "bad dim_labels %.*s: the input part needs b, f and spatial digits 0..n-1 once each", shown,
        at);
  if (!label_side(part[1], len[1], 'i', 'o', &cd->kernel_in, &cd->kernel_out, cd->kernel_spatial,
                  &n1))
    return kiln__lex_error(
        lx, at,
        "bad dim_labels %.*s: the kernel part needs i, o and spatial digits 0..n-1 once each",
        shown, at);
  if (!label_side(part[2], len[2], 'b', 'f', &cd->out_batch, &cd->out_feature, cd->out_spatial,
                  &n2))
    return kiln__lex_error(
        lx, at,
        "bad dim_labels %.*s: the output part needs b, f and spatial digits 0..n-1 once each",
        shown, at);
  if (n0 != n1 || n0 != n2)
    return kiln__lex_error(
        lx, at,
        "bad dim_labels %.*s: input, kernel and output have %u, %u and %u spatial dimensions",
        shown, at, (unsigned)n0, (unsigned)n1, (unsigned)n2);
  cd->nspatial = n0;
  *out = cd;
  return 0;
}

/* ---- replica groups ----------------------------------------------------- */

/* 'name' (single quotes, as XLA prints mesh axes). */
static int quoted_axis(kiln__lex *lx, kiln__tok *t) {
  kiln__lex_skip(lx);
  const char *at = lx->p;
  if (kiln__lex_peek(lx) != '\'') {
    char f[64];
    return kiln__lex_error(lx, NULL, "expected a quoted mesh axis name 'x', found %s",
                           found(lx, f, sizeof f));
  }
  const char *s = ++lx->p;
  while (lx->p < lx->end && *lx->p != '\'' && *lx->p != '\n') lx->p++;
  if (lx->p >= lx->end || *lx->p != '\'')
    return kiln__lex_error(lx, at, "unterminated mesh axis name");
  t->s = s;
  t->n = (size_t)(lx->p - s);
  lx->p++;
  return 0;
}

#define MESH_MAX_AXES 16

/* replica_groups=mesh['x'=2,'y'=4] {'y'} (or {'x':(1)2}, a sub-axis: size 2
 * of 'x' above a minor part of 1): the devices 0..n laid out as the mesh, a
 * group per index of the axes not named, its members along the named axes
 * in the order named. That is exactly an iota list, [groups,size]<=[mesh
 * dims]T(other axes, named axes) with a sub-axis split into (major, sub,
 * minor) dims, which is how it is kept (and printed). */
static int parse_mesh_groups(kiln__lex *lx, kiln_arena *a, kiln_replica_groups *g, const char *at) {
  kiln__tok names[MESH_MAX_AXES];
  int64_t sizes[MESH_MAX_AXES];
  uint32_t naxes = 0;
  int rc;
  if ((rc = kiln__lex_expect(lx, '[', "to open the mesh axes"))) return rc;
  do {
    if (naxes == MESH_MAX_AXES)
      return kiln__lex_error(lx, at, "a replica group mesh has at most %d axes", MESH_MAX_AXES);
    if ((rc = quoted_axis(lx, &names[naxes]))) return rc;
    if ((rc = kiln__lex_expect(lx, '=', "after a mesh axis name"))) return rc;
    if ((rc = kiln__lex_uint(lx, &sizes[naxes], "a mesh axis size"))) return rc;
    if (sizes[naxes] < 1 || sizes[naxes] > (1 << 20))
      return kiln__lex_error(lx, at, "mesh axis '%.*s' has size %lld", (int)names[naxes].n,
                             names[naxes].s, (long long)sizes[naxes]);
    for (uint32_t j = 0; j < naxes; j++)
      if (names[j].n == names[naxes].n && memcmp(names[j].s, names[naxes].s, names[j].n) == 0)
        return kiln__lex_error(lx, at, "mesh axis '%.*s' appears twice", (int)names[j].n,
                               names[j].s);
    naxes++;
  } while (kiln__lex_accept(lx, ','));
  if ((rc = kiln__lex_expect(lx, ']', "to close the mesh axes"))) return rc;
  /* Virtual dims: each axis is (major, sub, minor); unsplit axes have
   * major = 1 and minor = 1, dropped below. */
  int64_t major[MESH_MAX_AXES], sub[MESH_MAX_AXES], minor[MESH_MAX_AXES];
  int order[MESH_MAX_AXES]; /* named axes, in the order named */
  uint32_t nnamed = 0;
  for (uint32_t i = 0; i < naxes; i++) major[i] = 1, sub[i] = sizes[i], minor[i] = 1;
  if ((rc = kiln__lex_expect(lx, '{', "to open the replica group axes"))) return rc;
  if (!kiln__lex_accept(lx, '}')) {
    do {
      kiln__tok t;
      const char *aat = lx->p;
      if ((rc = quoted_axis(lx, &t))) return rc;
      uint32_t i = 0;
      while (i < naxes && !(names[i].n == t.n && memcmp(names[i].s, t.s, t.n) == 0)) i++;
      if (i == naxes)
        return kiln__lex_error(lx, aat, "replica group axis '%.*s' is not a mesh axis", (int)t.n,
                               t.s);
      for (uint32_t j = 0; j < nnamed; j++)
        if (order[j] == (int)i)
          return kiln__lex_error(lx, aat, "replica group axis '%.*s' is named twice", (int)t.n,
                                 t.s);
      if (kiln__lex_accept(lx, ':')) {
        int64_t pre, sz;
        if ((rc = kiln__lex_expect(lx, '(', "to open a sub-axis (pre-size)"))) return rc;
        if ((rc = kiln__lex_uint(lx, &pre, "a sub-axis pre-size"))) return rc;
        if ((rc = kiln__lex_expect(lx, ')', "to close a sub-axis pre-size"))) return rc;
        if ((rc = kiln__lex_uint(lx, &sz, "a sub-axis size"))) return rc;
        if (pre < 1 || sz < 1 || sizes[i] % (pre * sz) != 0)
          return kiln__lex_error(lx, aat,
                                 "sub-axis (%lld)%lld does not divide mesh axis '%.*s' of %lld",
                                 (long long)pre, (long long)sz, (int)t.n, t.s, (long long)sizes[i]);
        major[i] = sizes[i] / (pre * sz);
        sub[i] = sz;
        minor[i] = pre;
      }
      order[nnamed++] = (int)i;
    } while (kiln__lex_accept(lx, ','));
    if ((rc = kiln__lex_expect(lx, '}', "to close the replica group axes"))) return rc;
  }
  /* Lay out the virtual dims; remember which are in the groups. */
  int64_t dims[3 * MESH_MAX_AXES];
  int vsub[MESH_MAX_AXES];
  bool in_group[3 * MESH_MAX_AXES];
  uint32_t nd = 0;
  for (uint32_t i = 0; i < naxes; i++) {
    bool named = false;
    for (uint32_t j = 0; j < nnamed; j++) named = named || order[j] == (int)i;
    if (major[i] > 1) in_group[nd] = false, dims[nd++] = major[i];
    vsub[i] = (int)nd;
    in_group[nd] = named, dims[nd++] = sub[i];
    if (minor[i] > 1) in_group[nd] = false, dims[nd++] = minor[i];
  }
  int64_t perm[3 * MESH_MAX_AXES], ng = 1, gs = 1;
  uint32_t np = 0;
  for (uint32_t d = 0; d < nd; d++)
    if (!in_group[d]) perm[np++] = d, ng *= dims[d];
  for (uint32_t j = 0; j < nnamed; j++) perm[np++] = vsub[order[j]], gs *= dims[vsub[order[j]]];
  bool identity = true;
  for (uint32_t d = 0; d < nd; d++) identity = identity && perm[d] == (int64_t)d;
  int64_t shape[2] = {ng, gs};
  g->iota = true;
  g->iota_shape.v = kiln_arena_memdup(a, shape, sizeof shape);
  g->iota_shape.n = 2;
  g->iota_reshape.v = kiln_arena_memdup(a, dims, nd * sizeof *dims);
  g->iota_reshape.n = nd;
  if (!identity) {
    g->iota_perm.v = kiln_arena_memdup(a, perm, nd * sizeof *perm);
    g->iota_perm.n = nd;
  }
  if (!g->iota_shape.v || !g->iota_reshape.v || (!identity && !g->iota_perm.v)) return nomem(lx);
  return 0;
}

static int parse_replica_groups(kiln__lex *lx, kiln_arena *a, kiln_replica_groups **out) {
  kiln_replica_groups *g = kiln_arena_calloc(a, 1, sizeof *g);
  if (g == NULL) return nomem(lx);
  int rc;
  kiln__lex_skip(lx);
  const char *at = lx->p;
  if (kiln__lex_accept_word(lx, "mesh")) {
    if ((rc = parse_mesh_groups(lx, a, g, at))) return rc;
    *out = g;
    return 0;
  }
  if (kiln__lex_peek(lx) == '[') { /* [2,2]<=[4] or [2,2]<=[2,2]T(1,0) */
    g->iota = true;
    if ((rc = bracket_ints(lx, a, &g->iota_shape, "the replica group shape"))) return rc;
    if (g->iota_shape.n != 2)
      return kiln__lex_error(lx, at,
                             "replica_groups iota shape needs 2 numbers [groups,size], found %u",
                             (unsigned)g->iota_shape.n);
    if (!accept_le(lx)) {
      char f[64];
      return kiln__lex_error(lx, NULL, "expected '<=' in iota replica_groups, found %s",
                             found(lx, f, sizeof f));
    }
    if ((rc = bracket_ints(lx, a, &g->iota_reshape, "the iota dimensions"))) return rc;
    if ((rc = iota_perm(lx, a, &g->iota_perm))) return rc;
    int64_t n = product(&g->iota_shape);
    if (n < 0) return kiln__lex_error(lx, at, "replica_groups iota shape is too large");
    if ((rc = check_iota(lx, at, &g->iota_reshape, &g->iota_perm, n, "replica_groups"))) return rc;
    *out = g;
    return 0;
  }
  if ((rc = kiln__lex_expect(lx, '{', "to open replica_groups"))) return rc;
  kiln_i64s *v = NULL;
  size_t n = 0, cap = 0;
  if (!kiln__lex_accept(lx, '}')) {
    for (;;) {
      void *p = v;
      if (kiln_grow(&p, &cap, n + 1, sizeof *v)) {
        kiln_free(v);
        return nomem(lx);
      }
      v = p;
      if ((rc = kiln__parse_int_list(lx, a, &v[n], "a replica group"))) {
        kiln_free(v);
        return rc;
      }
      n++;
      if (kiln__lex_accept(lx, ',')) continue;
      if ((rc = kiln__lex_expect(lx, '}', "to close replica_groups"))) {
        kiln_free(v);
        return rc;
      }
      break;
    }
  }
  if (n) {
    g->groups = kiln_arena_memdup(a, v, n * sizeof *v);
    kiln_free(v);
    if (g->groups == NULL) return nomem(lx);
  }
  g->ngroups = (uint32_t)n;
  *out = g;
  return 0;
}

/* ---- sharding ----------------------------------------------------------- */

static bool tok_is(kiln__tok t, const char *w) {
  return strlen(w) == t.n && memcmp(t.s, w, t.n) == 0;
}

static int sharding_kind_word(kiln__lex *lx, int64_t *out) {
  kiln__lex_skip(lx);
  const char *at = lx->p;
  kiln__tok t;
  int rc = kiln__lex_bare_name(lx, &t, "a sharding kind");
  if (rc) return rc;
  if (tok_is(t, "manual"))
    *out = KILN_SHARD_MANUAL;
  else if (tok_is(t, "replicated"))
    *out = KILN_SHARD_REPLICATED;
  else if (tok_is(t, "unknown"))
    *out = KILN_SHARD_UNKNOWN;
  else if (tok_is(t, "maximal"))
    *out = KILN_SHARD_MAXIMAL;
  else
    return kiln__lex_error(lx, at, "unknown sharding kind '%.*s' in last_tile_dims",
                           (int)(t.n > 60 ? 60 : t.n), t.s);
  return 0;
}

/* devices=[2,1,2]0,1,2,3 or devices=[2,2]<=[4] or devices=[2,2]<=[2,2]T(1,0) */
static int sharding_devices(kiln__lex *lx, kiln_arena *a, kiln_sharding *s, const char *at) {
  int rc;
  if ((rc = bracket_ints(lx, a, &s->tile_dims, "the tile dimensions"))) return rc;
  int64_t tiles = product(&s->tile_dims);
  if (tiles < 0) return kiln__lex_error(lx, at, "sharding tile dimensions are too large");
  if (accept_le(lx)) {
    if ((rc = bracket_ints(lx, a, &s->iota_reshape, "the iota dimensions"))) return rc;
    if ((rc = iota_perm(lx, a, &s->iota_perm))) return rc;
    return check_iota(lx, at, &s->iota_reshape, &s->iota_perm, tiles, "sharding");
  }
  ivec v = {0};
  for (;;) {
    int64_t x;
    if ((rc = kiln__lex_int(lx, &x, "a device number"))) goto out;
    if ((rc = ivec_push(lx, &v, x))) goto out;
    if (!kiln__lex_accept(lx, ',')) break;
  }
  if ((int64_t)v.n != tiles) {
    rc =
        kiln__lex_error(lx, at, "sharding lists %zu devices for %lld tiles", v.n, (long long)tiles);
    goto out;
  }
  rc = ivec_to(lx, a, &v, &s->devices);
out:
  kiln_free(v.v);
  return rc;
}

static int sharding_body(kiln__lex *lx, kiln_arena *a, kiln_sharding *s, const char *open) {
  int rc;
  kiln__tok kind_word = {NULL, 0};
  bool have_device = false, have_ltd = false;
  kiln_sbuf extra = KILN_SBUF_INIT;
  while (!kiln__lex_accept(lx, '}')) {
    if (kiln__lex_peek(lx) < 0) {
      rc = kiln__lex_error(lx, open, "unbalanced braces: this '{' is never closed");
      goto out;
    }
    kiln__lex_skip(lx);
    const char *at = lx->p;
    kiln__tok w;
    if (kiln__lex_peek(lx) == '%' || !kiln__lex_try_name(lx, &w)) w.n = 0;
    bool is_devices = tok_is(w, "devices") && kiln__lex_peek(lx) == '=';
    if (is_devices || tok_is(w, "replicated") || tok_is(w, "manual") || tok_is(w, "unknown") ||
        tok_is(w, "maximal")) {
      if (kind_word.n) {
        rc = kiln__lex_error(lx, at, "sharding gives both %.*s and %.*s", (int)kind_word.n,
                             kind_word.s, (int)w.n, w.s);
        goto out;
      }
      kind_word = w;
      if (is_devices) {
        lx->p++; /* '=' */
        s->kind = KILN_SHARD_TILED;
        if ((rc = sharding_devices(lx, a, s, at))) goto out;
      } else {
        s->kind = tok_is(w, "replicated") ? KILN_SHARD_REPLICATED
                  : tok_is(w, "manual")   ? KILN_SHARD_MANUAL
                  : tok_is(w, "unknown")  ? KILN_SHARD_UNKNOWN
                                          : KILN_SHARD_MAXIMAL;
      }
    } else if (tok_is(w, "device") && kiln__lex_accept(lx, '=')) {
      if (have_device) {
        rc = kiln__lex_error(lx, at, "duplicate device= in sharding");
        goto out;
      }
      have_device = true;
      if ((rc = kiln__lex_uint(lx, &s->device, "a device number"))) goto out;
    } else if (tok_is(w, "last_tile_dim_replicate") && !s->last_tile_dim_replicate && !have_ltd) {
      s->last_tile_dim_replicate = true;
    } else if (tok_is(w, "last_tile_dims") && !have_ltd && !s->last_tile_dim_replicate &&
               kiln__lex_accept(lx, '=')) {
      have_ltd = true;
      ivec v = {0};
      if ((rc = kiln__lex_expect(lx, '{', "to open last_tile_dims"))) goto out;
      for (;;) {
        int64_t k = 0;
        if ((rc = sharding_kind_word(lx, &k)) || (rc = ivec_push(lx, &v, k))) {
          kiln_free(v.v);
          goto out;
        }
        if (!kiln__lex_accept(lx, ',')) break;
      }
      rc = kiln__lex_expect(lx, '}', "to close last_tile_dims");
      if (rc == 0) rc = ivec_to(lx, a, &v, &s->last_tile_dims);
      kiln_free(v.v);
      if (rc) goto out;
    } else if (tok_is(w, "last_tile_dim_replicate") || tok_is(w, "last_tile_dims")) {
      rc =
          kiln__lex_error(lx, at, "sharding gives last_tile_dim_replicate or last_tile_dims twice");
      goto out;
    } else {
      /* Anything else (metadata={...}, shard_as 1, ...) is kept verbatim. */
      lx->p = at;
      kiln__tok t;
      if ((rc = kiln__lex_verbatim(lx, &t, "a sharding field or '}'"))) goto out;
      if (extra.len) kiln_sbuf_putc(&extra, ' ');
      kiln_sbuf_putn(&extra, t.s, t.n);
    }
  }
  if (kind_word.n == 0)
    rc = kiln__lex_error(lx, open,
                         "sharding has no kind (replicated, maximal, devices=, manual or unknown)");
  else if (s->kind == KILN_SHARD_MAXIMAL && !have_device)
    rc = kiln__lex_error(lx, open, "maximal sharding needs device=");
  else if (s->kind != KILN_SHARD_MAXIMAL && have_device)
    rc = kiln__lex_error(lx, open, "device= is only for maximal sharding");
  else if (s->kind != KILN_SHARD_TILED && (have_ltd || s->last_tile_dim_replicate))
    rc = kiln__lex_error(lx, open, "last_tile_dim_replicate and last_tile_dims need devices=");
  else if (kiln_sbuf_failed(&extra))
    rc = nomem(lx);
  else if (extra.len && (s->extra = kiln_arena_strdup(a, kiln_sbuf_str(&extra))) == NULL)
    rc = nomem(lx);
  else
    rc = 0;
out:
  kiln_sbuf_free(&extra);
  return rc;
}

static int parse_sharding(kiln__lex *lx, kiln_arena *a, kiln_sharding *s, bool top) {
  kiln__lex_skip(lx);
  const char *open = lx->p;
  int rc;
  if ((rc = kiln__lex_expect(lx, '{', "to open the sharding"))) return rc;
  memset(s, 0, sizeof *s);
  int c = kiln__lex_peek(lx);
  if (!(top && (c == '{' || c == '}'))) return sharding_body(lx, a, s, open);
  /* tuple: {{replicated}, {maximal device=0}}, or {} for an empty tuple */
  s->kind = KILN_SHARD_TUPLE;
  kiln_sharding *v = NULL;
  size_t n = 0, cap = 0;
  if (!kiln__lex_accept(lx, '}')) {
    for (;;) {
      void *p = v;
      if (kiln_grow(&p, &cap, n + 1, sizeof *v)) {
        rc = nomem(lx);
        goto out;
      }
      v = p;
      if ((rc = parse_sharding(lx, a, &v[n], false))) goto out;
      n++;
      if (kiln__lex_accept(lx, ',')) continue;
      if ((rc = kiln__lex_expect(lx, '}', "to close the tuple sharding"))) goto out;
      break;
    }
  }
  if (n > UINT32_MAX) {
    rc = kiln__lex_error(lx, open, "tuple sharding has too many elements");
    goto out;
  }
  if (n && (s->elems = kiln_arena_memdup(a, v, n * sizeof *v)) == NULL) {
    rc = nomem(lx);
    goto out;
  }
  s->nelems = (uint32_t)n;
  rc = 0;
out:
  kiln_free(v);
  return rc;
}

/* ---- dispatch ----------------------------------------------------------- */

static int parse_cmp_dir(kiln__lex *lx, int64_t *out) {
  kiln__lex_skip(lx);
  const char *at = lx->p;
  kiln__tok t;
  int rc = kiln__lex_bare_name(lx, &t, "a comparison direction");
  if (rc) return rc;
  for (int d = KILN_CMP_EQ; d <= KILN_CMP_LT; d++) {
    if (tok_is(t, kiln_cmp_dir_name((kiln_cmp_dir)d))) {
      *out = d;
      return 0;
    }
  }
  return kiln__lex_error(lx, at,
                         "unknown comparison direction '%.*s' (expected EQ, NE, GE, GT, LE or LT)",
                         (int)(t.n > 60 ? 60 : t.n), t.s);
}

int kiln__parse_attr_value(kiln__lex *lx, kiln_module *m, kiln_instr *ins, kiln_attr_key key) {
  kiln_arena *a = m->arena;
  kiln_attr v;
  memset(&v, 0, sizeof v);
  char f[64];
  int rc = 0;
  kiln__tok t;
  switch (kiln_attr_key_kind(key)) {
  case KILN_AK_INT: rc = kiln__lex_int(lx, &v.v.i, "an integer"); break;
  case KILN_AK_BOOL:
    if (kiln__lex_accept_word(lx, "true"))
      v.v.i = 1;
    else if (kiln__lex_accept_word(lx, "false"))
      v.v.i = 0;
    else
      rc = kiln__lex_error(lx, NULL, "expected true or false for %s, found %s",
                           kiln_attr_key_name(key), found(lx, f, sizeof f));
    break;
  case KILN_AK_FLOAT: rc = kiln__lex_float(lx, &v.v.f, "a number"); break;
  case KILN_AK_INTS: rc = kiln__parse_int_list(lx, a, &v.v.ints, kiln_attr_key_name(key)); break;
  case KILN_AK_SLICE: rc = parse_slice(lx, a, &v.v.ints); break;
  case KILN_AK_PADDING: rc = parse_padding(lx, a, &v.v.ints); break;
  case KILN_AK_PAIRS: rc = parse_pairs(lx, a, &v.v.ints); break;
  case KILN_AK_WINDOW: rc = parse_window(lx, a, &v.v.window); break;
  case KILN_AK_DIM_LABELS: rc = parse_dim_labels(lx, a, &v.v.conv); break;
  case KILN_AK_CMP_DIR: rc = parse_cmp_dir(lx, &v.v.i); break;
  case KILN_AK_REPLICA_GROUPS: rc = parse_replica_groups(lx, a, &v.v.groups); break;
  case KILN_AK_SHARDING:
    v.v.sharding = kiln_arena_calloc(a, 1, sizeof *v.v.sharding);
    rc = v.v.sharding ? parse_sharding(lx, a, v.v.sharding, true) : nomem(lx);
    break;
  case KILN_AK_IDENT:
    rc = kiln__lex_word(lx, &t, "a word");
    if (rc == 0 && (v.v.s = kiln_arena_strndup(a, t.s, t.n)) == NULL) rc = nomem(lx);
    break;
  case KILN_AK_STRING: rc = kiln__lex_string(lx, a, &v.v.s, NULL); break;
  case KILN_AK_OPAQUE:
    rc = kiln__lex_verbatim(lx, &t, "an attribute value");
    if (rc == 0 && (v.v.s = kiln_arena_strndup(a, t.s, t.n)) == NULL) rc = nomem(lx);
    break;
  }
  if (rc) return rc;
  kiln_attr *slot = kiln_instr_add_attr(m, ins, key);
  if (slot == NULL) return nomem(lx);
  slot->v = v.v;
  return 0;
}

/* ---- module header: input_output_alias ----------------------------------- */

static int parse_alias(kiln__lex *lx, kiln_arena *a, kiln_alias *al) {
  int rc;
  if ((rc = kiln__parse_int_list(lx, a, &al->output_index, "an output index"))) return rc;
  if ((rc = kiln__lex_expect(lx, ':', "after the output index of an alias"))) return rc;
  if ((rc = kiln__lex_expect(lx, '(', "to open an alias"))) return rc;
  if ((rc = kiln__lex_uint(lx, &al->param_number, "a parameter number"))) return rc;
  if ((rc = kiln__lex_expect(lx, ',', "after the parameter number of an alias"))) return rc;
  if ((rc = kiln__parse_int_list(lx, a, &al->param_index, "a parameter index"))) return rc;
  al->kind = KILN_ALIAS_MAY;
  if (kiln__lex_accept(lx, ',')) {
    kiln__lex_skip(lx);
    const char *at = lx->p;
    kiln__tok t;
    if ((rc = kiln__lex_bare_name(lx, &t, "may-alias or must-alias"))) return rc;
    if (tok_is(t, "must-alias"))
      al->kind = KILN_ALIAS_MUST;
    else if (!tok_is(t, "may-alias"))
      return kiln__lex_error(lx, at, "expected may-alias or must-alias, found '%.*s'",
                             (int)(t.n > 60 ? 60 : t.n), t.s);
  }
  return kiln__lex_expect(lx, ')', "to close an alias");
}

int kiln__parse_aliases(kiln__lex *lx, kiln_module *m) {
  int rc;
  if ((rc = kiln__lex_expect(lx, '{', "to open input_output_alias"))) return rc;
  kiln_alias *v = NULL;
  size_t n = 0, cap = 0;
  if (!kiln__lex_accept(lx, '}')) {
    for (;;) {
      void *p = v;
      if (kiln_grow(&p, &cap, n + 1, sizeof *v)) {
        rc = nomem(lx);
        goto out;
      }
      v = p;
      memset(&v[n], 0, sizeof v[n]);
      if ((rc = parse_alias(lx, m->arena, &v[n]))) goto out;
      n++;
      if (kiln__lex_accept(lx, ',')) continue;
      if ((rc = kiln__lex_expect(lx, '}', "to close input_output_alias"))) goto out;
      break;
    }
  }
  if (n > UINT32_MAX) {
    rc = kiln__lex_error(lx, NULL, "too many aliases");
    goto out;
  }
  if (n && (m->aliases = kiln_arena_memdup(m->arena, v, n * sizeof *v)) == NULL) {
    rc = nomem(lx);
    goto out;
  }
  m->naliases = (uint32_t)n;
  m->has_aliases = true;
  rc = 0;
out:
  kiln_free(v);
  return rc;
}
