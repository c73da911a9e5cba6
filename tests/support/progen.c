/* The random program generator: deterministic, well-typed HLO modules as
 * text, for differential tests (backends and passes against the
 * interpreter) and transform tests (gradients, vmap).
 *
 * The idea: grow the ENTRY computation one instruction at a time from a
 * pool of float values (the parameters first). Each step picks an op family
 * from the mask, picks operands from the pool (recent values more often, so
 * chains get deep) and writes the instruction with its result shape, which
 * the generator computes itself; the verifier then checks the generator.
 * Values nobody used at the end become the ROOT (a tuple when several).
 *
 * Every value carries two facts that keep programs numerically sane:
 *  - bound: an upper bound of |element|, assuming arguments in [-1, 1].
 *    Ops that could overflow (exp) are only applied to small values, and a
 *    value whose bound passes 32 is squashed at once (tanh, or a scaling by
 *    a power of two), so float results stay comparable across backends.
 *  - exact: computed only by correctly rounded ops whose result does not
 *    depend on evaluation order or contraction (no multiply, no sums, no
 *    transcendental). Discontinuous ops (compare, floor, data-dependent
 *    branch selectors) only read exact values, so a backend that rounds a
 *    sum differently cannot flip a branch and turn an ulp into a mismatch.
 *
 * Differentiable mode (for gradients against finite differences) keeps to
 * ops that are smooth everywhere on the path from the parameters to the
 * result, with inputs kept in their domains by construction:
 *  - elementwise: negate, sin, cos, tanh, logistic, exp and expm1 (only on
 *    values bounded by 4), x*x, log(x*x+1), log1p(x*x), sqrt(x*x+1),
 *    rsqrt(x*x+1), power(x*x+1, c), add, subtract, multiply, a/(b*b+1),
 *    atan2(a, b*b+1);
 *  - no abs, sign, floor/ceil/round, maximum/minimum, clamp, no reduce or
 *    reduce-window with max/min/multiply (only add);
 *  - select and conditional only with predicates/indices that do not
 *    depend on the parameters (iota compared to a constant, constants), so
 *    the function is smooth in every parameter;
 *  - while bodies are smooth maps and trip counts constants;
 *  - dynamic-slice and gather use constant indices; pad uses a constant.
 * Outside differentiable mode the generator adds the non-smooth ops above,
 * compare+select on data, data-dependent conditional selectors, and
 * out-of-range indices (to test clamping).
 */
#include "tests/support/progen.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/sbuf.h"

#define MAXR 4         /* largest rank generated */
#define MAX_ELEMS 1024 /* largest value generated, in elements */
#define SQUASH_BOUND 32.0

typedef struct val {
  kiln_dtype t; /* KILN_F32/F64 for pool values; PRED/S32 temporaries */
  int rank;
  int64_t dims[MAXR];
  double bound; /* |element| <= bound for arguments in [-1, 1] */
  bool exact;   /* see the file comment */
  bool pool;    /* may be picked as an operand / become the root */
  bool param;
  int uses;
} val;

typedef struct gen {
  uint64_t rng;
  const kiln_progen_options *o;
  bool diff;
  int max_dim;
  kiln_dtype ft;   /* the float type */
  const char *fts; /* its spelling */
  kiln_sbuf comps; /* called computations, written before ENTRY */
  kiln_sbuf body;  /* the ENTRY's instructions */
  val *vals;
  size_t nvals, cap;
  int ncomps; /* computations written so far (for unique names) */
  bool oom;
  bool used_reducer[4];
  const char *tuple_shape; /* the text of the next tuple-shaped value emitted */
} gen;

enum { RED_ADD, RED_MAX, RED_MIN, RED_MUL };
static const char *const reducer_op[] = {"add", "maximum", "minimum", "multiply"};

/* ---- random numbers ----------------------------------------------------- */

static uint64_t next(gen *g) {
  uint64_t z = (g->rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Uniform in [0, n); n >= 1. */
static int64_t rnd(gen *g, int64_t n) { return n <= 1 ? 0 : (int64_t)(next(g) % (uint64_t)n); }
static int64_t rnd_in(gen *g, int64_t lo, int64_t hi) { return lo + rnd(g, hi - lo + 1); }
static bool chance(gen *g, int percent) { return rnd(g, 100) < percent; }

/* A constant on the 1/8 grid in [-1, 1], exact in every float type. */
static double grid_value(gen *g) { return (double)rnd_in(g, -8, 8) / 8.0; }

/* ---- shapes and values -------------------------------------------------- */

static int64_t elems(int rank, const int64_t *dims) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++) n *= dims[i];
  return n;
}

static void put_shape(kiln_sbuf *b, kiln_dtype t, int rank, const int64_t *dims) {
  kiln_sbuf_printf(b, "%s[", kiln_dtype_name(t));
  for (int i = 0; i < rank; i++) kiln_sbuf_printf(b, "%s%lld", i ? "," : "", (long long)dims[i]);
  kiln_sbuf_putc(b, ']');
}

static void put_ints(kiln_sbuf *b, const int64_t *v, int n) {
  kiln_sbuf_putc(b, '{');
  for (int i = 0; i < n; i++) kiln_sbuf_printf(b, "%s%lld", i ? "," : "", (long long)v[i]);
  kiln_sbuf_putc(b, '}');
}

static void put_float(kiln_sbuf *b, double v) {
  if (isinf(v))
    kiln_sbuf_puts(b, v < 0 ? "-inf" : "inf");
  else
    kiln_sbuf_printf(b, "%.17g", v);
}

/* Appends a value to the table; returns its index, -1 on out-of-memory. */
static int add_val(gen *g, kiln_dtype t, int rank, const int64_t *dims, double bound, bool exact,
                   bool pool) {
  if (kiln_grow((void **)&g->vals, &g->cap, g->nvals + 1, sizeof *g->vals)) {
    g->oom = true;
    return -1;
  }
  val *v = &g->vals[g->nvals];
  memset(v, 0, sizeof *v);
  v->t = t;
  v->rank = rank;
  for (int i = 0; i < rank; i++) v->dims[i] = dims[i];
  v->bound = bound;
  v->exact = exact;
  v->pool = pool;
  return (int)g->nvals++;
}

/* Writes "  vN = SHAPE TEXT" for a new value and returns N (-1 on OOM). The
 * text names operands as v<index>; call U() on each operand index. */
__attribute__((format(printf, 8, 9))) static int emit(gen *g, kiln_dtype t, int rank,
                                                      const int64_t *dims, double bound, bool exact,
                                                      bool pool, const char *fmt, ...) {
  int64_t d[MAXR] = {0}; /* dims may point into g->vals, which add_val moves */
  for (int i = 0; i < rank && i < MAXR; i++) d[i] = dims[i];
  int id = add_val(g, t, rank, d, bound, exact, pool);
  if (id < 0) return -1;
  kiln_sbuf_printf(&g->body, "  v%d = ", id);
  if (t == KILN_TUPLE)
    kiln_sbuf_puts(&g->body, g->tuple_shape);
  else
    put_shape(&g->body, t, rank, d);
  kiln_sbuf_putc(&g->body, ' ');
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  kiln_sbuf_puts(&g->body, line);
  kiln_sbuf_putc(&g->body, '\n');
  return id;
}

static int U(gen *g, int i) {
  g->vals[i].uses++;
  return i;
}

/* Same element type and dims. */
static bool same_shape(const val *a, const val *b) {
  if (a->t != b->t || a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->dims[i] != b->dims[i]) return false;
  return true;
}

/* A pool value, recent ones more often; -1 when the pool is empty. */
static int pick(gen *g) {
  int n = (int)g->nvals;
  int cand[64], nc = 0;
  for (int i = n - 1; i >= 0 && nc < 64; i--)
    if (g->vals[i].pool) cand[nc++] = i;
  if (nc == 0) return -1;
  if (chance(g, 60)) return cand[rnd(g, nc < 3 ? nc : 3)];
  return cand[rnd(g, nc)];
}

/* Another pool value of x's shape (not x), or -1. */
static int pick_same(gen *g, int x, bool need_exact) {
  int cand[64], nc = 0;
  for (int i = (int)g->nvals - 1; i >= 0 && nc < 64; i--) {
    const val *v = &g->vals[i];
    if (i != x && v->pool && same_shape(v, &g->vals[x]) && (!need_exact || v->exact))
      cand[nc++] = i;
  }
  return nc ? cand[rnd(g, nc)] : -1;
}

/* ---- constants ---------------------------------------------------------- */

static int scalar_const(gen *g, kiln_dtype t, double v) {
  char buf[64];
  kiln_sbuf b = KILN_SBUF_INIT;
  put_float(&b, v);
  snprintf(buf, sizeof buf, "%s", kiln_sbuf_failed(&b) ? "0" : kiln_sbuf_str(&b));
  kiln_sbuf_free(&b);
  return emit(g, t, 0, NULL, fabs(v), true, false, "constant(%s)", buf);
}

static int s32_const(gen *g, int64_t v) {
  return emit(g, KILN_S32, 0, NULL, 0, true, false, "constant(%lld)", (long long)v);
}

/* A value of shape (t, rank, dims) with every element v: a scalar
 * constant, broadcast when rank > 0. Not in the pool. */
static int splat(gen *g, kiln_dtype t, int rank, const int64_t *dims_in, double v) {
  int64_t dims[MAXR] = {0}; /* dims_in may point into g->vals, which grows */
  for (int i = 0; i < rank && i < MAXR; i++) dims[i] = dims_in[i];
  int c = scalar_const(g, t, v);
  if (c < 0 || rank == 0) return c;
  return emit(g, t, rank, dims, fabs(v), true, false, "broadcast(v%d), dimensions={}", U(g, c));
}

static void put_literal(kiln_sbuf *b, gen *g, int rank, const int64_t *dims, int d) {
  if (d == rank) {
    put_float(b, grid_value(g));
    return;
  }
  kiln_sbuf_puts(b, "{ ");
  for (int64_t i = 0; i < dims[d]; i++) {
    if (i) kiln_sbuf_puts(b, ", ");
    put_literal(b, g, rank, dims, d + 1);
  }
  kiln_sbuf_puts(b, " }");
}

/* A constant of x's shape: random grid values written out when small (the
 * constant folder gets real work), a broadcast scalar otherwise. */
static int const_like(gen *g, int x) {
  val v = g->vals[x];
  if (v.rank == 0 || elems(v.rank, v.dims) > 48)
    return splat(g, v.t, v.rank, v.dims, grid_value(g));
  kiln_sbuf b = KILN_SBUF_INIT;
  put_literal(&b, g, v.rank, v.dims, 0);
  int id = -1;
  if (kiln_sbuf_failed(&b))
    g->oom = true;
  else
    id = emit(g, v.t, v.rank, v.dims, 1.0, true, false, "constant(%s)", kiln_sbuf_str(&b));
  kiln_sbuf_free(&b);
  return id;
}

/* A partner of x's shape for a binary op: another pool value, x itself or
 * a constant. */
static int partner(gen *g, int x, bool need_exact) {
  int y = pick_same(g, x, need_exact);
  if (y >= 0 && chance(g, 70)) return y;
  if ((!need_exact || g->vals[x].exact) && chance(g, 40)) return x;
  return const_like(g, x);
}

/* ---- elementwise -------------------------------------------------------- */

#define X_SHAPE(g, x) (g)->vals[x].t, (g)->vals[x].rank, (g)->vals[x].dims

static int unary(gen *g, int x, const char *op, double bound, bool exact) {
  return emit(g, X_SHAPE(g, x), bound, exact, true, "%s(v%d)", op, U(g, x));
}

static int binary(gen *g, const char *op, int a, int b, double bound, bool exact) {
  return emit(g, X_SHAPE(g, a), bound, exact, true, "%s(v%d, v%d)", op, U(g, a), U(g, b));
}

/* x*x + 1: at least 1, so log, sqrt, rsqrt, division and power stay in
 * their domains and smooth. Not in the pool. */
static int sq1(gen *g, int x) {
  double b = g->vals[x].bound;
  int sq = emit(g, X_SHAPE(g, x), b * b, false, false, "multiply(v%d, v%d)", U(g, x), U(g, x));
  int one = splat(g, X_SHAPE(g, x), 1.0);
  if (sq < 0 || one < 0) return -1;
  return emit(g, X_SHAPE(g, x), b * b + 1, false, false, "add(v%d, v%d)", U(g, sq), U(g, one));
}

static int gen_unary(gen *g, int x) {
  double b = g->vals[x].bound;
  bool ex = g->vals[x].exact;
  int k = (int)rnd(g, g->diff ? 12 : 19);
  int s;
  switch (k) {
  case 0: return unary(g, x, "negate", b, ex);
  case 1: return unary(g, x, "sine", 1, false);
  case 2: return unary(g, x, "cosine", 1, false);
  case 3: return unary(g, x, "tanh", 1, false);
  case 4: return unary(g, x, "logistic", 1, false);
  case 5:
    if (b > 4) return unary(g, x, "tanh", 1, false);
    return unary(g, x, chance(g, 50) ? "exponential" : "exponential-minus-one", exp(b), false);
  case 6: return emit(g, X_SHAPE(g, x), b * b, false, true, "multiply(v%d, v%d)", U(g, x), U(g, x));
  case 7:
    if ((s = sq1(g, x)) < 0) return -1;
    return unary(g, s, "log", log(b * b + 1), false);
  case 8:
    if ((s = sq1(g, x)) < 0) return -1;
    return unary(g, s, "sqrt", sqrt(b * b + 1), false);
  case 9:
    if ((s = sq1(g, x)) < 0) return -1;
    return unary(g, s, "rsqrt", 1, false);
  case 10: {
    int sq = emit(g, X_SHAPE(g, x), b * b, false, false, "multiply(v%d, v%d)", U(g, x), U(g, x));
    return sq < 0 ? -1 : unary(g, sq, "log-plus-one", log(b * b + 1), false);
  }
  case 11: {
    static const double exps[] = {0.5, 2.0, -1.0, 1.5};
    double e = exps[rnd(g, 4)];
    if ((s = sq1(g, x)) < 0) return -1;
    int c = splat(g, X_SHAPE(g, x), e);
    if (c < 0) return -1;
    return binary(g, "power", s, c, e > 0 ? pow(b * b + 1, e) : 1, false);
  }
  /* non-smooth, outside differentiable mode only */
  case 12: return unary(g, x, "abs", b, ex);
  case 13: return unary(g, x, "sign", 1, ex);
  case 14: return unary(g, x, ex ? "floor" : "tanh", ex ? b + 1 : 1, ex);
  case 15: return unary(g, x, ex ? "ceil" : "cosine", ex ? b + 1 : 1, ex);
  case 16: return unary(g, x, ex ? "round-nearest-afz" : "sine", ex ? b + 1 : 1, ex);
  case 17: {
    int a = unary(g, x, "abs", b, ex);
    if (a < 0) return -1;
    g->vals[a].pool = false;
    return unary(g, a, "sqrt", sqrt(b), false);
  }
  default: {
    double lo = -0.5 + grid_value(g) / 4, hi = 0.5 + grid_value(g) / 4;
    int l = scalar_const(g, g->ft, lo), h = scalar_const(g, g->ft, hi);
    if (l < 0 || h < 0) return -1;
    return emit(g, X_SHAPE(g, x), 1, ex, true, "clamp(v%d, v%d, v%d)", U(g, l), U(g, x), U(g, h));
  }
  }
}

static int gen_binary(gen *g, int x) {
  int k = (int)rnd(g, g->diff ? 5 : 7);
  int y = partner(g, x, false);
  if (y < 0) return -1;
  double a = g->vals[x].bound, b = g->vals[y].bound;
  bool ex = g->vals[x].exact && g->vals[y].exact;
  int s;
  switch (k) {
  case 0: return binary(g, "add", x, y, a + b, ex);
  case 1: return binary(g, "subtract", x, y, a + b, ex);
  case 2: return binary(g, "multiply", x, y, a * b, false);
  case 3:
    if ((s = sq1(g, y)) < 0) return -1;
    return binary(g, "divide", x, s, a, false);
  case 4:
    if ((s = sq1(g, y)) < 0) return -1;
    return binary(g, "atan2", x, s, 1.6, false);
  case 5: return binary(g, "maximum", x, y, a > b ? a : b, ex);
  default: return binary(g, "minimum", x, y, a > b ? a : b, ex);
  }
}

static const char *const cmp_dirs[] = {"EQ", "NE", "GE", "GT", "LE", "LT"};

/* A predicate of x's shape. On data (compare of exact values) outside
 * differentiable mode; otherwise iota compared to a constant, or a
 * constant for scalars. Not in the pool. */
static int gen_pred(gen *g, int x) {
  val v = g->vals[x];
  if (!g->diff && v.exact && chance(g, 70)) {
    int y = partner(g, x, true);
    if (y < 0) return -1;
    return emit(g, KILN_PRED, v.rank, v.dims, 0, true, false, "compare(v%d, v%d), direction=%s",
                U(g, x), U(g, y), cmp_dirs[rnd(g, 6)]);
  }
  if (v.rank == 0)
    return emit(g, KILN_PRED, 0, NULL, 0, true, false, "constant(%s)",
                chance(g, 50) ? "true" : "false");
  int d = (int)rnd(g, v.rank);
  int io = emit(g, KILN_S32, v.rank, v.dims, 0, true, false, "iota(), iota_dimension=%d", d);
  int c = s32_const(g, rnd_in(g, 0, v.dims[d]));
  if (io < 0 || c < 0) return -1;
  int cb =
      emit(g, KILN_S32, v.rank, v.dims, 0, true, false, "broadcast(v%d), dimensions={}", U(g, c));
  if (cb < 0) return -1;
  return emit(g, KILN_PRED, v.rank, v.dims, 0, true, false, "compare(v%d, v%d), direction=%s",
              U(g, io), U(g, cb), cmp_dirs[rnd(g, 6)]);
}

static int fam_select(gen *g, int x) {
  int p = gen_pred(g, x);
  int y = p < 0 ? -1 : partner(g, x, false);
  if (y < 0) return -1;
  double a = g->vals[x].bound, b = g->vals[y].bound;
  bool swap = chance(g, 50);
  int t = swap ? y : x, f = swap ? x : y;
  return emit(g, X_SHAPE(g, x), a > b ? a : b, g->vals[x].exact && g->vals[y].exact, true,
              "select(v%d, v%d, v%d)", U(g, p), U(g, t), U(g, f));
}

static int fam_elementwise(gen *g, int x) {
  /* compare+select on data belongs to this family outside differentiable mode */
  if (!g->diff && g->vals[x].exact && chance(g, 10)) return fam_select(g, x);
  return chance(g, 50) ? gen_unary(g, x) : gen_binary(g, x);
}

/* ---- data movement ------------------------------------------------------ */

static int fam_broadcast(gen *g, int x) {
  val v = g->vals[x];
  int rank = v.rank + (int)rnd_in(g, 1, 2);
  if (rank > MAXR) rank = MAXR;
  if (rank <= v.rank) return -1;
  /* choose which output dims carry x's dims (increasing) */
  int64_t map[MAXR], dims[MAXR];
  int j = 0;
  for (int i = 0; i < rank; i++) {
    int left = rank - i, need = v.rank - j;
    bool take = need > 0 && (need == left || chance(g, 50));
    if (take) {
      map[j] = i;
      dims[i] = v.dims[j++];
    } else {
      dims[i] = rnd_in(g, 1, g->max_dim);
    }
  }
  if (elems(rank, dims) > MAX_ELEMS) return -1;
  kiln_sbuf b = KILN_SBUF_INIT;
  put_ints(&b, map, v.rank);
  int id = kiln_sbuf_failed(&b) ? -1
                                : emit(g, v.t, rank, dims, v.bound, v.exact, true,
                                       "broadcast(v%d), dimensions=%s", U(g, x), kiln_sbuf_str(&b));
  kiln_sbuf_free(&b);
  return id;
}

static int fam_reshape(gen *g, int x) {
  val v = g->vals[x];
  int64_t n = elems(v.rank, v.dims), f[32];
  int nf = 0;
  for (int64_t p = 2, r = n; r > 1 && nf < 32; p++)
    while (r % p == 0 && nf < 32) {
      f[nf++] = p;
      r /= p;
    }
  int rank = (int)rnd_in(g, nf ? 1 : 0, MAXR - 1);
  int64_t dims[MAXR];
  for (int i = 0; i < rank; i++) dims[i] = 1;
  for (int i = 0; i < nf && rank; i++) dims[rnd(g, rank)] *= f[i];
  return emit(g, v.t, rank, dims, v.bound, v.exact, true, "reshape(v%d)", U(g, x));
}

static int fam_transpose(gen *g, int x) {
  val v = g->vals[x];
  if (v.rank < 1) return -1;
  int64_t perm[MAXR], dims[MAXR];
  for (int i = 0; i < v.rank; i++) perm[i] = i;
  for (int i = v.rank - 1; i > 0; i--) {
    int j = (int)rnd(g, i + 1);
    int64_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  for (int i = 0; i < v.rank; i++) dims[i] = v.dims[perm[i]];
  char buf[64];
  kiln_sbuf b = KILN_SBUF_INIT;
  put_ints(&b, perm, v.rank);
  snprintf(buf, sizeof buf, "%s", kiln_sbuf_failed(&b) ? "{}" : kiln_sbuf_str(&b));
  kiln_sbuf_free(&b);
  return emit(g, v.t, v.rank, dims, v.bound, v.exact, true, "transpose(v%d), dimensions=%s",
              U(g, x), buf);
}

static int fam_slice(gen *g, int x) {
  val v = g->vals[x];
  if (v.rank < 1) return -1;
  int64_t dims[MAXR];
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_putc(&b, '{');
  for (int i = 0; i < v.rank; i++) {
    int64_t start = rnd(g, v.dims[i]), limit = rnd_in(g, start + 1, v.dims[i]);
    int64_t stride = rnd_in(g, 1, 3);
    dims[i] = (limit - start + stride - 1) / stride;
    kiln_sbuf_printf(&b, "%s[%lld:%lld:%lld]", i ? ", " : "", (long long)start, (long long)limit,
                     (long long)stride);
  }
  kiln_sbuf_putc(&b, '}');
  int id = kiln_sbuf_failed(&b) ? -1
                                : emit(g, v.t, v.rank, dims, v.bound, v.exact, true,
                                       "slice(v%d), slice=%s", U(g, x), kiln_sbuf_str(&b));
  kiln_sbuf_free(&b);
  return id;
}

static int fam_concatenate(gen *g, int x) {
  val v = g->vals[x];
  if (v.rank < 1) return -1;
  int d = (int)rnd(g, v.rank);
  int cand[64], nc = 0;
  for (int i = (int)g->nvals - 1; i >= 0 && nc < 64; i--) {
    const val *w = &g->vals[i];
    bool ok = w->pool && w->t == v.t && w->rank == v.rank;
    for (int k = 0; ok && k < v.rank; k++) ok = k == d || w->dims[k] == v.dims[k];
    if (ok) cand[nc++] = i;
  }
  int ops[3], nops = 1 + (int)rnd_in(g, 1, 2);
  int64_t dims[MAXR];
  memcpy(dims, v.dims, sizeof dims);
  dims[d] = 0;
  double bound = 0;
  bool exact = true;
  ops[0] = x;
  for (int i = 1; i < nops; i++) ops[i] = nc ? cand[rnd(g, nc)] : x;
  for (int i = 0; i < nops; i++) {
    dims[d] += g->vals[ops[i]].dims[d];
    bound = fmax(bound, g->vals[ops[i]].bound);
    exact &= g->vals[ops[i]].exact;
  }
  if (elems(v.rank, dims) > MAX_ELEMS) return -1;
  for (int i = 0; i < nops; i++) U(g, ops[i]);
  if (nops == 2)
    return emit(g, v.t, v.rank, dims, bound, exact, true, "concatenate(v%d, v%d), dimensions={%d}",
                ops[0], ops[1], d);
  return emit(g, v.t, v.rank, dims, bound, exact, true,
              "concatenate(v%d, v%d, v%d), dimensions={%d}", ops[0], ops[1], ops[2], d);
}

static int fam_pad(gen *g, int x) {
  val v = g->vals[x];
  if (v.rank < 1) return -1;
  int64_t dims[MAXR];
  kiln_sbuf b = KILN_SBUF_INIT;
  for (int i = 0; i < v.rank; i++) {
    int64_t lo, hi, in, out;
    do {
      lo = rnd_in(g, -1, 2);
      hi = rnd_in(g, -1, 2);
      in = chance(g, 25) ? 1 : 0;
      out = lo + hi + v.dims[i] + (v.dims[i] - 1) * in;
    } while (out < 1);
    dims[i] = out;
    kiln_sbuf_printf(&b, "%s%lld_%lld_%lld", i ? "x" : "", (long long)lo, (long long)hi,
                     (long long)in);
  }
  double pv = grid_value(g);
  int c = scalar_const(g, v.t, pv);
  int id = -1;
  if (c >= 0 && !kiln_sbuf_failed(&b) && elems(v.rank, dims) <= MAX_ELEMS)
    id = emit(g, v.t, v.rank, dims, fmax(v.bound, fabs(pv)), v.exact, true,
              "pad(v%d, v%d), padding=%s", U(g, x), U(g, c), kiln_sbuf_str(&b));
  kiln_sbuf_free(&b);
  return id;
}

/* ---- dot ---------------------------------------------------------------- */

static int fam_dot(gen *g, int x) {
  val a = g->vals[x];
  if (a.rank < 1 || a.rank > 3) return -1;
  int ca = (int)rnd(g, a.rank);
  int cand[64], nc = 0;
  for (int i = (int)g->nvals - 1; i >= 0 && nc < 64; i--) {
    const val *w = &g->vals[i];
    if (!w->pool || w->t != a.t || w->rank < 1 || w->rank > 3 || a.rank + w->rank - 2 > MAXR)
      continue;
    for (int k = 0; k < w->rank; k++)
      if (w->dims[k] == a.dims[ca]) {
        cand[nc++] = i;
        break;
      }
  }
  int y = nc && chance(g, 75) ? cand[rnd(g, nc)] : x;
  val b = g->vals[y];
  if (a.rank + b.rank - 2 > MAXR) return -1;
  int cb = -1;
  for (int k = 0, seen = 0; k < b.rank; k++)
    if (b.dims[k] == a.dims[ca] && rnd(g, ++seen) == 0) cb = k;
  /* an optional batch pair among the remaining dims */
  int ba = -1, bb = -1;
  if (chance(g, 40))
    for (int i = 0, seen = 0; i < a.rank; i++)
      for (int k = 0; k < b.rank; k++)
        if (i != ca && k != cb && a.dims[i] == b.dims[k] && rnd(g, ++seen) == 0) {
          ba = i;
          bb = k;
        }
  int64_t dims[MAXR];
  int rank = 0;
  if (ba >= 0) dims[rank++] = a.dims[ba];
  for (int i = 0; i < a.rank; i++)
    if (i != ca && i != ba) dims[rank++] = a.dims[i];
  for (int k = 0; k < b.rank; k++)
    if (k != cb && k != bb) dims[rank++] = b.dims[k];
  if (elems(rank, dims) > MAX_ELEMS) return -1;
  double bound = (double)a.dims[ca] * a.bound * b.bound;
  if (ba >= 0)
    return emit(g, a.t, rank, dims, bound, false, true,
                "dot(v%d, v%d), lhs_batch_dims={%d}, lhs_contracting_dims={%d}, "
                "rhs_batch_dims={%d}, rhs_contracting_dims={%d}",
                U(g, x), U(g, y), ba, ca, bb, cb);
  return emit(g, a.t, rank, dims, bound, false, true,
              "dot(v%d, v%d), lhs_contracting_dims={%d}, rhs_contracting_dims={%d}", U(g, x),
              U(g, y), ca, cb);
}

/* ---- reductions --------------------------------------------------------- */

static const char *reducer(gen *g, int kind) {
  static char name[4][32];
  g->used_reducer[kind] = true;
  snprintf(name[kind], sizeof name[kind], "%s_%s", reducer_op[kind], g->fts);
  return name[kind];
}

/* A reduction kind: add in differentiable mode; also max/min, and
 * multiply for values bounded by 1 outside it. */
static int pick_reduction(gen *g, const val *v) {
  if (g->diff) return RED_ADD;
  int k = (int)rnd(g, v->bound <= 1 ? 4 : 3);
  return k;
}

static double reduce_bound(int kind, double b, int64_t n) {
  if (kind == RED_ADD) return b * (double)n;
  if (kind == RED_MUL) return 1;
  return b;
}

static int reduce_sum_all(gen *g, int x);

static int fam_reduce(gen *g, int x) {
  val v = g->vals[x];
  if (v.rank < 1) return -1;
  int64_t rd[MAXR], dims[MAXR];
  int nr = 0, rank = 0;
  int64_t n = 1;
  for (int i = 0; i < v.rank; i++) {
    if (chance(g, 50)) {
      rd[nr++] = i;
      n *= v.dims[i];
    } else {
      dims[rank++] = v.dims[i];
    }
  }
  if (nr == 0) { /* reduce at least one dim */
    int i = (int)rnd(g, v.rank);
    rd[nr++] = i;
    n = v.dims[i];
    rank = 0;
    for (int k = 0; k < v.rank; k++)
      if (k != i) dims[rank++] = v.dims[k];
  }
  int kind = pick_reduction(g, &v);
  static const double init[] = {0, -INFINITY, INFINITY, 1};
  int c = scalar_const(g, v.t, init[kind]);
  if (c < 0) return -1;
  kiln_sbuf b = KILN_SBUF_INIT;
  put_ints(&b, rd, nr);
  bool exact = v.exact && (kind == RED_MAX || kind == RED_MIN);
  int id = kiln_sbuf_failed(&b) ? -1
                                : emit(g, v.t, rank, dims, reduce_bound(kind, v.bound, n), exact,
                                       true, "reduce(v%d, v%d), dimensions=%s, to_apply=%s",
                                       U(g, x), U(g, c), kiln_sbuf_str(&b), reducer(g, kind));
  kiln_sbuf_free(&b);
  return id;
}

static int fam_reduce_window(gen *g, int x) {
  val v = g->vals[x];
  if (v.rank < 1) return -1;
  int64_t dims[MAXR], size[MAXR], stride[MAXR], lo[MAXR], hi[MAXR], ld[MAXR], rd[MAXR];
  bool dil = false;
  int64_t wn = 1;
  for (int i = 0; i < v.rank; i++) {
    ld[i] = chance(g, 10) ? 2 : 1;
    rd[i] = chance(g, 10) ? 2 : 1;
    lo[i] = rnd_in(g, 0, 1);
    hi[i] = rnd_in(g, 0, 1);
    stride[i] = rnd_in(g, 1, 2);
    int64_t in = (v.dims[i] - 1) * ld[i] + 1 + lo[i] + hi[i];
    size[i] = rnd_in(g, 1, 3);
    while (size[i] > 1 && (size[i] - 1) * rd[i] + 1 > in) size[i]--;
    if ((size[i] - 1) * rd[i] + 1 > in) rd[i] = 1;
    dims[i] = (in - ((size[i] - 1) * rd[i] + 1)) / stride[i] + 1;
    dil |= ld[i] != 1 || rd[i] != 1;
    wn *= size[i];
  }
  if (elems(v.rank, dims) > MAX_ELEMS) return -1;
  int kind = g->diff ? RED_ADD : (chance(g, 50) ? RED_ADD : RED_MAX);
  /* A window may lie wholly in padding or holes and see only the init
   * value: keep it finite for max so no -inf enters later arithmetic. */
  double initv = kind == RED_ADD ? 0 : -(double)(int64_t)(v.bound + 1);
  int c = scalar_const(g, v.t, initv);
  if (c < 0) return -1;
  kiln_sbuf b = KILN_SBUF_INIT;
  const char *fields[] = {"size", "stride", "pad", "lhs_dilate", "rhs_dilate"};
  kiln_sbuf_putc(&b, '{');
  for (int f = 0; f < 5; f++) {
    if (f >= 3 && !dil) break;
    kiln_sbuf_printf(&b, "%s%s=", f ? " " : "", fields[f]);
    for (int i = 0; i < v.rank; i++) {
      if (i) kiln_sbuf_putc(&b, 'x');
      if (f == 0) kiln_sbuf_printf(&b, "%lld", (long long)size[i]);
      if (f == 1) kiln_sbuf_printf(&b, "%lld", (long long)stride[i]);
      if (f == 2) kiln_sbuf_printf(&b, "%lld_%lld", (long long)lo[i], (long long)hi[i]);
      if (f == 3) kiln_sbuf_printf(&b, "%lld", (long long)ld[i]);
      if (f == 4) kiln_sbuf_printf(&b, "%lld", (long long)rd[i]);
    }
  }
  kiln_sbuf_putc(&b, '}');
  double bound = kind == RED_ADD ? v.bound * (double)wn : fmax(v.bound, fabs(initv));
  int id = kiln_sbuf_failed(&b) ? -1
                                : emit(g, v.t, v.rank, dims, bound, v.exact && kind == RED_MAX,
                                       true, "reduce-window(v%d, v%d), window=%s, to_apply=%s",
                                       U(g, x), U(g, c), kiln_sbuf_str(&b), reducer(g, kind));
  kiln_sbuf_free(&b);
  return id;
}

/* Sum of all elements of x as a scalar (x itself for a scalar). */
static int reduce_sum_all(gen *g, int x) {
  val v = g->vals[x];
  if (v.rank == 0) return x;
  int64_t rd[MAXR];
  for (int i = 0; i < v.rank; i++) rd[i] = i;
  int c = scalar_const(g, v.t, 0);
  if (c < 0) return -1;
  kiln_sbuf b = KILN_SBUF_INIT;
  put_ints(&b, rd, v.rank);
  int id = kiln_sbuf_failed(&b) ? -1
                                : emit(g, v.t, 0, NULL, v.bound * (double)elems(v.rank, v.dims),
                                       false, false, "reduce(v%d, v%d), dimensions=%s, to_apply=%s",
                                       U(g, x), U(g, c), kiln_sbuf_str(&b), reducer(g, RED_ADD));
  kiln_sbuf_free(&b);
  return id;
}

/* ---- control flow ------------------------------------------------------- */

/* The loop state is (s32 counter, x, y): the body maps x smoothly, reading
 * the loop-invariant y and sometimes the counter; the condition compares
 * the counter with a constant trip count. */
static void write_while(gen *g, int k, const char *s, const char *tup, int trips, int variant,
                        double cst) {
  kiln_sbuf *c = &g->comps;
  kiln_sbuf_printf(c, "while_cond.%d {\n  p = %s parameter(0)\n", k, tup);
  kiln_sbuf_printf(c, "  i = s32[] get-tuple-element(p), index=0\n");
  kiln_sbuf_printf(c, "  n = s32[] constant(%d)\n", trips);
  kiln_sbuf_printf(c, "  ROOT lt = pred[] compare(i, n), direction=LT\n}\n\n");
  kiln_sbuf_printf(c, "while_body.%d {\n  p = %s parameter(0)\n", k, tup);
  kiln_sbuf_printf(c, "  i = s32[] get-tuple-element(p), index=0\n");
  kiln_sbuf_printf(c, "  x = %s get-tuple-element(p), index=1\n", s);
  kiln_sbuf_printf(c, "  y = %s get-tuple-element(p), index=2\n", s);
  kiln_sbuf_printf(c, "  one = s32[] constant(1)\n  i1 = s32[] add(i, one)\n");
  kiln_sbuf_printf(c, "  c = %s[] constant(%g)\n  cb = %s broadcast(c), dimensions={}\n", g->fts,
                   cst, s);
  switch (variant) {
  case 0: /* x' = tanh(x*c + y) */
    kiln_sbuf_printf(c, "  m = %s multiply(x, cb)\n  a = %s add(m, y)\n  x1 = %s tanh(a)\n", s, s,
                     s);
    break;
  case 1: /* x' = x*c + sin(y) */
    kiln_sbuf_printf(c, "  m = %s multiply(x, cb)\n  sy = %s sine(y)\n  x1 = %s add(m, sy)\n", s, s,
                     s);
    break;
  case 2: /* x' = x + c*i */
    kiln_sbuf_printf(c, "  fi = %s[] convert(i)\n  bi = %s broadcast(fi), dimensions={}\n", g->fts,
                     s);
    kiln_sbuf_printf(c, "  m = %s multiply(bi, cb)\n  x1 = %s add(x, m)\n", s, s);
    break;
  default: /* x' = max(x, y) - c */
    kiln_sbuf_printf(c, "  mx = %s maximum(x, y)\n  x1 = %s subtract(mx, cb)\n", s, s);
    break;
  }
  kiln_sbuf_printf(c, "  ROOT r = %s tuple(i1, x1, y)\n}\n\n", tup);
}

static int fam_while(gen *g, int x) {
  val v = g->vals[x];
  int y = pick_same(g, x, false);
  if (y < 0) y = x;
  int trips = (int)rnd_in(g, 0, 4), variant = (int)rnd(g, g->diff ? 3 : 4);
  double cst = (double)rnd_in(g, 1, 4) / 4, bx = v.bound, by = g->vals[y].bound;
  /* bounds after at most 4 trips (|x*c| <= |x| since c <= 1) */
  double bounds[] = {fmax(bx, 1), bx + 4, bx + 0 + 1 + 2 + 3, fmax(bx, by) + 4};
  int k = g->ncomps++;
  kiln_sbuf sh = KILN_SBUF_INIT, st = KILN_SBUF_INIT;
  put_shape(&sh, v.t, v.rank, v.dims);
  kiln_sbuf_printf(&st, "(s32[], %s, %s)", kiln_sbuf_str(&sh), kiln_sbuf_str(&sh));
  int id = -1;
  if (kiln_sbuf_failed(&sh) || kiln_sbuf_failed(&st)) {
    g->oom = true;
    goto out_free;
  }
  write_while(g, k, kiln_sbuf_str(&sh), kiln_sbuf_str(&st), trips, variant, cst);
  int z = s32_const(g, 0);
  if (z < 0) goto out_free;
  g->tuple_shape = kiln_sbuf_str(&st);
  int t = emit(g, KILN_TUPLE, 0, NULL, 0, false, false, "tuple(v%d, v%d, v%d)", U(g, z), U(g, x),
               U(g, y));
  if (t < 0) goto out_free;
  int w = emit(g, KILN_TUPLE, 0, NULL, 0, false, false,
               "while(v%d), condition=while_cond.%d, body=while_body.%d", U(g, t), k, k);
  if (w < 0) goto out_free;
  id = emit(g, v.t, v.rank, v.dims, bounds[variant], false, true, "get-tuple-element(v%d), index=1",
            U(g, w));
out_free:
  g->tuple_shape = NULL;
  kiln_sbuf_free(&sh);
  kiln_sbuf_free(&st);
  return id;
}

/* A scalar that reads x exactly (its maximum), for data-dependent
 * selectors. Not in the pool. */
static int exact_scalar(gen *g, int x) {
  val v = g->vals[x];
  if (v.rank == 0) return x;
  int64_t rd[MAXR];
  for (int i = 0; i < v.rank; i++) rd[i] = i;
  int c = scalar_const(g, v.t, -INFINITY);
  if (c < 0) return -1;
  kiln_sbuf b = KILN_SBUF_INIT;
  put_ints(&b, rd, v.rank);
  int id = kiln_sbuf_failed(&b) ? -1
                                : emit(g, v.t, 0, NULL, v.bound, true, false,
                                       "reduce(v%d, v%d), dimensions=%s, to_apply=%s", U(g, x),
                                       U(g, c), kiln_sbuf_str(&b), reducer(g, RED_MAX));
  kiln_sbuf_free(&b);
  return id;
}

/* The selector of a conditional with nb branches: a pred (nb == 2 and
 * pred_form) or an s32 index, on data outside differentiable mode when x
 * is exact, a constant otherwise (indices may be out of range: the last
 * branch runs). */
static int cond_selector(gen *g, int x, int nb, bool pred_form) {
  bool data = !g->diff && g->vals[x].exact && chance(g, 60);
  if (!data) {
    if (pred_form)
      return emit(g, KILN_PRED, 0, NULL, 0, true, false, "constant(%s)",
                  chance(g, 50) ? "true" : "false");
    return s32_const(g, rnd_in(g, -1, nb));
  }
  int s = exact_scalar(g, x);
  if (s < 0) return -1;
  if (pred_form) {
    int c = scalar_const(g, g->vals[x].t, grid_value(g));
    if (c < 0) return -1;
    return emit(g, KILN_PRED, 0, NULL, 0, true, false, "compare(v%d, v%d), direction=%s", U(g, s),
                U(g, c), cmp_dirs[rnd(g, 6)]);
  }
  int f = emit(g, g->vals[x].t, 0, NULL, g->vals[s].bound + 1, true, false, "floor(v%d)", U(g, s));
  if (f < 0) return -1;
  return emit(g, KILN_S32, 0, NULL, 0, true, false, "convert(v%d)", U(g, f));
}

static int fam_conditional(gen *g, int x) {
  val v = g->vals[x];
  bool pred_form = chance(g, 50);
  int nb = pred_form ? 2 : (int)rnd_in(g, 1, 3);
  int k = g->ncomps++;
  static const char *const ops[] = {"negate", "sine", "cosine", "tanh", "multiply", "add"};
  double bound = 0;
  kiln_sbuf sh = KILN_SBUF_INIT;
  put_shape(&sh, v.t, v.rank, v.dims);
  const char *s = kiln_sbuf_str(&sh);
  for (int j = 0; j < nb; j++) {
    int op = (int)rnd(g, 6);
    kiln_sbuf_printf(&g->comps, "branch.%d.%d {\n  p = %s parameter(0)\n", k, j, s);
    if (op >= 4)
      kiln_sbuf_printf(&g->comps, "  ROOT r = %s %s(p, p)\n}\n\n", s, ops[op]);
    else
      kiln_sbuf_printf(&g->comps, "  ROOT r = %s %s(p)\n}\n\n", s, ops[op]);
    double b = op == 0 ? v.bound : op == 4 ? v.bound * v.bound : op == 5 ? 2 * v.bound : 1;
    bound = fmax(bound, b);
  }
  int sel = cond_selector(g, x, nb, pred_form);
  int id = -1;
  if (sel >= 0 && !kiln_sbuf_failed(&sh)) {
    kiln_sbuf b = KILN_SBUF_INIT;
    kiln_sbuf_printf(&b, "conditional(v%d", U(g, sel));
    for (int j = 0; j < nb; j++) kiln_sbuf_printf(&b, ", v%d", U(g, x));
    if (pred_form) {
      kiln_sbuf_printf(&b, "), true_computation=branch.%d.0, false_computation=branch.%d.1", k, k);
    } else {
      kiln_sbuf_puts(&b, "), branch_computations={");
      for (int j = 0; j < nb; j++) kiln_sbuf_printf(&b, "%sbranch.%d.%d", j ? ", " : "", k, j);
      kiln_sbuf_putc(&b, '}');
    }
    if (!kiln_sbuf_failed(&b))
      id = emit(g, v.t, v.rank, v.dims, bound, false, true, "%s", kiln_sbuf_str(&b));
    kiln_sbuf_free(&b);
  }
  kiln_sbuf_free(&sh);
  return id;
}

/* ---- dynamic slicing and gather ----------------------------------------- */

/* s32 scalar start indices, one per dim of x; out of range sometimes
 * (clamped by the op's semantics) outside differentiable mode. */
static int start_indices(gen *g, const val *v, const int64_t *sizes, int *idx) {
  for (int i = 0; i < v->rank; i++) {
    int64_t hi = v->dims[i] - sizes[i];
    int64_t s = (!g->diff && chance(g, 15)) ? rnd_in(g, -2, hi + 2) : rnd_in(g, 0, hi);
    if ((idx[i] = s32_const(g, s)) < 0) return -1;
  }
  return 0;
}

static void put_index_operands(kiln_sbuf *b, gen *g, const int *idx, int n) {
  for (int i = 0; i < n; i++) kiln_sbuf_printf(b, ", v%d", U(g, idx[i]));
}

static int fam_dynamic_slice(gen *g, int x) {
  val v = g->vals[x];
  if (v.rank < 1) return -1;
  int64_t sizes[MAXR];
  int idx[MAXR];
  for (int i = 0; i < v.rank; i++) sizes[i] = rnd_in(g, 1, v.dims[i]);
  if (start_indices(g, &v, sizes, idx)) return -1;
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_printf(&b, "dynamic-slice(v%d", U(g, x));
  put_index_operands(&b, g, idx, v.rank);
  kiln_sbuf_puts(&b, "), dynamic_slice_sizes=");
  put_ints(&b, sizes, v.rank);
  int id = kiln_sbuf_failed(&b)
               ? -1
               : emit(g, v.t, v.rank, sizes, v.bound, v.exact, true, "%s", kiln_sbuf_str(&b));
  kiln_sbuf_free(&b);
  if (id < 0 || chance(g, 60)) return id;
  /* and write it back, negated, into x or a value of x's shape */
  int upd = unary(g, id, "negate", v.bound, v.exact);
  int dst = partner(g, x, false);
  if (upd < 0 || dst < 0 || start_indices(g, &v, sizes, idx)) return -1;
  kiln_sbuf_init(&b);
  kiln_sbuf_printf(&b, "dynamic-update-slice(v%d, v%d", U(g, dst), U(g, upd));
  put_index_operands(&b, g, idx, v.rank);
  kiln_sbuf_putc(&b, ')');
  double bound = fmax(v.bound, g->vals[dst].bound);
  id = kiln_sbuf_failed(&b) ? -1
                            : emit(g, v.t, v.rank, v.dims, bound, v.exact && g->vals[dst].exact,
                                   true, "%s", kiln_sbuf_str(&b));
  kiln_sbuf_free(&b);
  return id;
}

/* jnp.take-like gathers: m (1 or 2) operand dims indexed by an s32[K, m]
 * constant, collapsed; the other dims sliced with random sizes. */
static int fam_gather(gen *g, int x) {
  val v = g->vals[x];
  if (v.rank < 1) return -1;
  int m = v.rank >= 2 && chance(g, 30) ? 2 : 1;
  int64_t map[2] = {0, 0}, collapsed[2], sizes[MAXR], offs[MAXR], dims[MAXR];
  map[0] = rnd(g, v.rank);
  if (m == 2) map[1] = (map[0] + 1 + rnd(g, v.rank - 1)) % v.rank;
  collapsed[0] = map[0] < (m == 2 ? map[1] : map[0]) ? map[0] : (m == 2 ? map[1] : map[0]);
  collapsed[1] = m == 2 ? (map[0] < map[1] ? map[1] : map[0]) : 0;
  int64_t nk = rnd_in(g, 1, 4);
  int rank = 0;
  dims[rank++] = nk;
  int noff = 0;
  for (int i = 0; i < v.rank; i++) {
    bool coll = i == map[0] || (m == 2 && i == map[1]);
    sizes[i] = coll ? 1 : rnd_in(g, 1, v.dims[i]);
    if (!coll) {
      offs[noff] = 1 + noff;
      noff++;
      dims[rank++] = sizes[i];
    }
  }
  if (elems(rank, dims) > MAX_ELEMS) return -1;
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_puts(&b, "constant({ ");
  for (int64_t r = 0; r < nk; r++) {
    kiln_sbuf_puts(&b, r ? ", {" : "{");
    for (int j = 0; j < m; j++) {
      int64_t d = v.dims[map[j]];
      int64_t s = (!g->diff && chance(g, 15)) ? rnd_in(g, -2, d + 1) : rnd(g, d);
      kiln_sbuf_printf(&b, "%s%lld", j ? ", " : "", (long long)s);
    }
    kiln_sbuf_putc(&b, '}');
  }
  kiln_sbuf_puts(&b, " })");
  int64_t idims[2] = {nk, m};
  int ind = kiln_sbuf_failed(&b)
                ? -1
                : emit(g, KILN_S32, 2, idims, 0, true, false, "%s", kiln_sbuf_str(&b));
  kiln_sbuf_reset(&b);
  int id = -1;
  if (ind >= 0) {
    kiln_sbuf_printf(&b, "gather(v%d, v%d), offset_dims=", U(g, x), U(g, ind));
    put_ints(&b, offs, noff);
    kiln_sbuf_puts(&b, ", collapsed_slice_dims=");
    put_ints(&b, collapsed, m);
    kiln_sbuf_puts(&b, ", start_index_map=");
    put_ints(&b, map, m);
    kiln_sbuf_puts(&b, ", index_vector_dim=1, slice_sizes=");
    put_ints(&b, sizes, v.rank);
    if (!kiln_sbuf_failed(&b))
      id = emit(g, v.t, rank, dims, v.bound, v.exact, true, "%s", kiln_sbuf_str(&b));
  }
  kiln_sbuf_free(&b);
  return id;
}

/* ---- the driver --------------------------------------------------------- */

typedef int (*family_fn)(gen *g, int x);

static const struct {
  unsigned bit;
  family_fn fn;
  int weight;
} families[] = {
    {KILN_PROGEN_ELEMENTWISE, fam_elementwise, 8},
    {KILN_PROGEN_BROADCAST, fam_broadcast, 2},
    {KILN_PROGEN_RESHAPE, fam_reshape, 2},
    {KILN_PROGEN_TRANSPOSE, fam_transpose, 2},
    {KILN_PROGEN_SLICE, fam_slice, 2},
    {KILN_PROGEN_CONCATENATE, fam_concatenate, 2},
    {KILN_PROGEN_PAD, fam_pad, 2},
    {KILN_PROGEN_DOT, fam_dot, 2},
    {KILN_PROGEN_REDUCE, fam_reduce, 2},
    {KILN_PROGEN_REDUCE_WINDOW, fam_reduce_window, 1},
    {KILN_PROGEN_SELECT, fam_select, 1},
    {KILN_PROGEN_WHILE, fam_while, 1},
    {KILN_PROGEN_CONDITIONAL, fam_conditional, 1},
    {KILN_PROGEN_DYNAMIC_SLICE, fam_dynamic_slice, 1},
    {KILN_PROGEN_GATHER, fam_gather, 1},
};
#define NFAMILIES (sizeof families / sizeof families[0])

/* Keeps |values| small: a value past SQUASH_BOUND is replaced in the pool
 * by tanh of it, or (outside differentiable mode) by an exact scaling with
 * a power of two. */
static int squash(gen *g, int id) {
  if (g->vals[id].bound <= SQUASH_BOUND) return id;
  g->vals[id].pool = false;
  if (g->diff || chance(g, 50)) return unary(g, id, "tanh", 1, false);
  int e = (int)ceil(log2(g->vals[id].bound));
  int c = splat(g, X_SHAPE(g, id), ldexp(1.0, -e));
  if (c < 0) return -1;
  return binary(g, "multiply", id, c, 1.0, g->vals[id].exact);
}

static int step(gen *g) {
  unsigned mask = g->o->families ? g->o->families & KILN_PROGEN_ALL : KILN_PROGEN_ALL;
  int total = 0;
  for (size_t i = 0; i < NFAMILIES; i++)
    if (mask & families[i].bit) total += families[i].weight;
  for (int attempt = 0; attempt < 16 && total > 0; attempt++) {
    int r = (int)rnd(g, total);
    size_t f = 0;
    for (; f < NFAMILIES; f++)
      if (mask & families[f].bit) {
        if (r < families[f].weight) break;
        r -= families[f].weight;
      }
    int x = pick(g);
    if (x < 0) return -1;
    int id = families[f].fn(g, x);
    if (g->oom) return -1;
    if (id >= 0) return squash(g, id);
  }
  /* nothing in the mask applies to the values at hand */
  int x = pick(g);
  return x < 0 ? -1 : unary(g, x, "negate", g->vals[x].bound, g->vals[x].exact);
}

static void write_reducers(gen *g, kiln_sbuf *out) {
  for (int k = 0; k < 4; k++) {
    if (!g->used_reducer[k]) continue;
    kiln_sbuf_printf(out, "%s_%s {\n  a = %s[] parameter(0)\n  b = %s[] parameter(1)\n",
                     reducer_op[k], g->fts, g->fts, g->fts);
    kiln_sbuf_printf(out, "  ROOT r = %s[] %s(a, b)\n}\n\n", g->fts, reducer_op[k]);
  }
}

/* The ROOT: the unused pool values (at most 6, the most recent), summed to
 * a scalar when asked. Returns the root's id, emitted last. */
static int make_root(gen *g) {
  int leaves[6], n = 0;
  for (int i = (int)g->nvals - 1; i >= 0 && n < 6; i--)
    if (g->vals[i].pool && !g->vals[i].param && g->vals[i].uses == 0) leaves[n++] = i;
  if (n == 0) { /* only parameters: the last one, copied */
    int x = pick(g);
    return x < 0 ? -1 : unary(g, x, "copy", g->vals[x].bound, g->vals[x].exact);
  }
  if (g->o->scalar_output) {
    int acc = -1;
    for (int i = n - 1; i >= 0; i--) {
      int s = reduce_sum_all(g, leaves[i]);
      if (s < 0) return -1;
      if (acc < 0)
        acc = s;
      else if ((acc = binary(g, "add", acc, s, g->vals[acc].bound + g->vals[s].bound, false)) < 0)
        return -1;
    }
    if (acc != (int)g->nvals - 1 || g->vals[acc].param)
      acc = unary(g, acc, "copy", g->vals[acc].bound, false);
    return acc;
  }
  if (n == 1) {
    if (leaves[0] == (int)g->nvals - 1) return leaves[0];
    return unary(g, leaves[0], "copy", g->vals[leaves[0]].bound, g->vals[leaves[0]].exact);
  }
  kiln_sbuf sh = KILN_SBUF_INIT, ops = KILN_SBUF_INIT;
  kiln_sbuf_putc(&sh, '(');
  for (int i = n - 1; i >= 0; i--) {
    const val *v = &g->vals[leaves[i]];
    if (i != n - 1) kiln_sbuf_puts(&sh, ", ");
    put_shape(&sh, v->t, v->rank, v->dims);
    kiln_sbuf_printf(&ops, "%sv%d", i != n - 1 ? ", " : "", U(g, leaves[i]));
  }
  kiln_sbuf_putc(&sh, ')');
  int id = -1;
  if (!kiln_sbuf_failed(&sh) && !kiln_sbuf_failed(&ops)) {
    g->tuple_shape = kiln_sbuf_str(&sh);
    id = emit(g, KILN_TUPLE, 0, NULL, 0, false, false, "tuple(%s)", kiln_sbuf_str(&ops));
    g->tuple_shape = NULL;
  }
  kiln_sbuf_free(&sh);
  kiln_sbuf_free(&ops);
  return id;
}

static void add_params(gen *g, int nparams) {
  for (int i = 0; i < nparams && !g->oom; i++) {
    int rank = (int)rnd_in(g, 0, 3);
    if (rank == 0 && chance(g, 50)) rank = 1;
    int64_t dims[MAXR];
    for (int d = 0; d < rank; d++) dims[d] = rnd_in(g, 1, g->max_dim);
    int id = emit(g, g->ft, rank, dims, 1.0, true, true, "parameter(%d)", i);
    if (id >= 0) g->vals[id].param = true;
  }
}

/* Marks the last instruction of the entry as ROOT. */
static void mark_root(gen *g, size_t line_start) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_putn(&b, g->body.data, line_start);
  kiln_sbuf_puts(&b, "  ROOT ");
  kiln_sbuf_puts(&b, g->body.data + line_start + 2);
  kiln_sbuf_free(&g->body);
  g->body = b;
}

char *kiln_progen_text(const kiln_progen_options *o) {
  gen g;
  memset(&g, 0, sizeof g);
  g.o = o;
  g.rng = o->seed ^ 0x6b696c6e70726f67ull; /* "kilnprog" */
  g.diff = o->differentiable;
  g.ft = o->dtype == KILN_F64 ? KILN_F64 : KILN_F32;
  g.fts = kiln_dtype_name(g.ft);
  g.max_dim = o->max_dim > 0 ? o->max_dim : 6;
  if (g.max_dim > 16) g.max_dim = 16;
  int nparams = o->nparams > 0 ? o->nparams : 1;
  int ninstrs = o->ninstrs > 0 ? o->ninstrs : 12;
  kiln_sbuf_init(&g.comps);
  kiln_sbuf_init(&g.body);
  add_params(&g, nparams);
  while (!g.oom && (int)g.nvals - nparams < ninstrs)
    if (step(&g) < 0) break;
  if (!g.oom) {
    /* the root is always the last value: its line is the body's last */
    int root = make_root(&g);
    if (root >= 0 && root == (int)g.nvals - 1 && g.body.len > 0 && !kiln_sbuf_failed(&g.body)) {
      size_t line = g.body.len - 1;
      while (line > 0 && g.body.data[line - 1] != '\n') line--;
      mark_root(&g, line);
    } else {
      g.oom = true;
    }
  }
  kiln_sbuf out = KILN_SBUF_INIT;
  kiln_sbuf_printf(&out, "HloModule progen_%llu\n\n", (unsigned long long)o->seed);
  write_reducers(&g, &out);
  kiln_sbuf_putn(&out, g.comps.data ? g.comps.data : "", g.comps.len);
  kiln_sbuf_puts(&out, "ENTRY main {\n");
  kiln_sbuf_putn(&out, g.body.data ? g.body.data : "", g.body.len);
  kiln_sbuf_puts(&out, "}\n");
  bool failed = g.oom || kiln_sbuf_failed(&g.comps) || kiln_sbuf_failed(&g.body);
  kiln_sbuf_free(&g.comps);
  kiln_sbuf_free(&g.body);
  kiln_free(g.vals);
  if (failed) {
    kiln_sbuf_free(&out);
    return NULL;
  }
  return kiln_sbuf_detach(&out, NULL);
}
