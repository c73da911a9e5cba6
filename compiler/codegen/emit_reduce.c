/* Values that loop over other values: reduce (variadic), reduce-window,
 * dot and convolution (direct), and the ops that call a scalar computation
 * (map, and the reducers themselves), which become helper functions
 * written once per computation and called inline.
 *
 * Combination orders follow the reference interpreter so that results
 * match it: reductions start from the init value and visit the reduced
 * positions in row-major order (except float add/max/min over a row, which
 * run in vector lanes: see "row reductions" below); windows skip padding and dilation holes;
 * dot and convolution convert operands to the result type, accumulate
 * products in double (floats) or wrapping integers (32-bit for results of
 * up to 32 bits, which vectorizes and keeps the same low bits, else
 * 64-bit), and round once.
 */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/codegen/emit.h"

static const kiln_instr *opnd(kiln__emit_fn *f, const kiln_instr *ins, uint32_t j) {
  return f->mod->m->instrs[ins->operands[j]];
}

static int bad(kiln__emit_fn *f, const kiln_instr *ins, const char *what) {
  return kiln__emit_fail(f, ins, KILN_EINVAL, "%s %s: %s", kiln_opcode_name(ins->op), ins->name,
                         what);
}

static const kiln_shape *leaf(const kiln_shape *s, uint32_t n, uint32_t k) {
  if (n == 1 && !kiln_shape_is_tuple(s)) return s;
  return kiln_shape_is_tuple(s) && k < s->rank ? &s->tuple[k] : NULL;
}

/* ---- helper functions for scalar computations ---------------------------- */

static int fn_slot(kiln__emit_mod *mod, uint32_t comp, bool tuple, uint32_t *fn) {
  if (kiln_grow((void **)&mod->fn_tuple, &mod->fncap, mod->nfns + 1, 1))
    return kiln_status_set(mod->st, KILN_ENOMEM, "codegen", "out of memory");
  *fn = mod->nfns++;
  mod->fn_tuple[*fn] = tuple;
  mod->comp_fn[comp] = (int32_t)*fn;
  return 0;
}

static int comp_params(kiln__emit_mod *mod, const kiln_computation *c, const kiln_instr *caller,
                       const kiln_instr **params, uint32_t np) {
  for (uint32_t i = 0; i < np; i++) {
    params[i] = kiln_computation_param(mod->m, c, i);
    const kiln_shape *s = params[i] ? &params[i]->shape : NULL;
    if (s == NULL || !kiln_shape_is_array(s) || s->rank != 0 || !kiln__emit_dtype_ok(s->dtype)) {
      char where[KILN_STATUS_WHERE_MAX];
      kiln_instr_where(mod->m, caller, where, sizeof where);
      return kiln_status_set(mod->st, KILN_EUNIMPL, where,
                             "the %s backend cannot compile %s %s: its computation takes a "
                             "parameter that is not a supported scalar",
                             mod->target->name, kiln_opcode_name(caller->op), where);
    }
  }
  return 0;
}

static void fn_header(const kiln__emit_mod *mod, kiln_sbuf *h, uint32_t fn, const kiln_instr *root,
                      const kiln_instr **params, uint32_t np, bool tuple) {
  kiln_sbuf_printf(h, "%s %s kf%u(", mod->target->helper_qual,
                   tuple ? "void" : kiln__ctype(mod, root->shape.dtype), fn);
  for (uint32_t i = 0; i < np; i++)
    kiln_sbuf_printf(h, "%s%s p%u", i ? ", " : "", kiln__ctype(mod, params[i]->shape.dtype), i);
  for (uint32_t k = 0; tuple && k < root->shape.rank; k++)
    kiln_sbuf_printf(h, "%s%s *%s r%u", np + k ? ", " : "",
                     kiln__ctype(mod, root->shape.tuple[k].dtype), mod->target->restrict_qual, k);
  kiln_sbuf_puts(h, ") {\n");
}

int kiln__emit_comp_fn(kiln__emit_mod *mod, uint32_t comp, const kiln_instr *caller, uint32_t *fn) {
  const kiln_module *m = mod->m;
  if (comp >= m->ncomps)
    return kiln_status_set(mod->st, KILN_EINVAL, caller->name, "called computation out of range");
  if (mod->comp_fn[comp] >= 0) {
    *fn = (uint32_t)mod->comp_fn[comp];
    return 0;
  }
  const kiln_computation *c = m->comps[comp];
  const kiln_instr *root = kiln_computation_root(m, c);
  uint32_t np = kiln_computation_nparams(m, c);
  const kiln_instr **params = kiln_calloc(np + 1, sizeof *params);
  if (params == NULL || root == NULL) {
    kiln_free(params);
    return kiln_status_set(mod->st, KILN_ENOMEM, "codegen", "out of memory");
  }
  bool tuple = kiln_shape_is_tuple(&root->shape);
  kiln_sbuf body = KILN_SBUF_INIT, head = KILN_SBUF_INIT;
  kiln__emit_fn g;
  int rc = comp_params(mod, c, caller, params, np);
  if (rc == 0) rc = fn_slot(mod, comp, tuple, fn);
  if (rc == 0) rc = kiln__emit_fn_init(&g, mod, &body, 1);
  if (rc) goto out_params;
  for (uint32_t i = 0; rc == 0 && i < np; i++) {
    char name[16];
    const char *nm = name;
    snprintf(name, sizeof name, "p%u", i);
    rc = kiln__emit_bind(&g, params[i]->id, NULL, NULL, &nm, 1);
  }
  const uint32_t *v = NULL;
  uint32_t nv = 0;
  kiln__ix s0 = {0};
  if (rc == 0) rc = kiln__emit_value(&g, root->id, &s0, &v, &nv);
  if (rc == 0 && tuple) {
    for (uint32_t k = 0; k < nv; k++) kiln__emit_line(&g, "*r%u = v%u;", k, v[k]);
  } else if (rc == 0) {
    kiln__emit_line(&g, "return v%u;", v[0]);
  }
  fn_header(mod, &head, *fn, root, params, np, tuple);
  kiln_sbuf_puts(&mod->funcs, kiln_sbuf_str(&head));
  kiln_sbuf_puts(&mod->funcs, kiln_sbuf_str(&body));
  kiln_sbuf_puts(&mod->funcs, "}\n\n");
  kiln__emit_fn_free(&g);
out_params:
  kiln_free(params);
  kiln_sbuf_free(&body);
  kiln_sbuf_free(&head);
  return rc;
}

void kiln__emit_call_fn(kiln__emit_fn *f, uint32_t fn, const uint32_t *args, uint32_t nargs,
                        const uint32_t *outs, uint32_t nouts) {
  kiln_sbuf b = KILN_SBUF_INIT;
  bool tuple = f->mod->fn_tuple[fn];
  if (!tuple) kiln_sbuf_printf(&b, "v%u = ", outs[0]);
  kiln_sbuf_printf(&b, "kf%u(", fn);
  for (uint32_t i = 0; i < nargs; i++) kiln_sbuf_printf(&b, "%sv%u", i ? ", " : "", args[i]);
  for (uint32_t k = 0; tuple && k < nouts; k++)
    kiln_sbuf_printf(&b, "%s&v%u", nargs + k ? ", " : "", outs[k]);
  kiln_sbuf_puts(&b, ");");
  kiln__emit_line(f, "%s", kiln_sbuf_str(&b));
  kiln_sbuf_free(&b);
}

/* Converts variable v of type from into a new variable of type to. */
static int converted(kiln__emit_fn *f, const kiln_instr *ins, uint32_t v, kiln_dtype from,
                     kiln_dtype to, uint32_t *out) {
  if (from == to) {
    *out = v;
    return 0;
  }
  char a[16], e[512];
  snprintf(a, sizeof a, "v%u", v);
  int rc = kiln__emit_convert_expr(f, ins, a, from, to, e, sizeof e);
  if (rc) return rc;
  *out = kiln__emit_newvar(f);
  kiln__emit_line(f, "%s v%u = %s;", kiln__ctype(f->mod, to), *out, e);
  return 0;
}

static kiln_dtype param_type(kiln__emit_fn *f, uint32_t comp, uint32_t i) {
  const kiln_instr *p = kiln_computation_param(f->mod->m, f->mod->m->comps[comp], i);
  return p ? p->shape.dtype : KILN_INVALID;
}

/* ---- reduce ------------------------------------------------------------- */

typedef struct accs {
  uint32_t n, fn, comp;
  uint32_t acc[KILN__EMIT_MAXR];
  kiln_dtype t[KILN__EMIT_MAXR];
} accs;

/* Declares the accumulators from the init operands inits[0..n). */
static int start_accs(kiln__emit_fn *f, const kiln_instr *ins, uint32_t first_init, accs *a) {
  int rc = 0;
  if (ins->ncalled != 1) return bad(f, ins, "needs one reducer");
  a->comp = ins->called[0];
  if ((rc = kiln__emit_comp_fn(f->mod, a->comp, ins, &a->fn))) return f->rc = rc;
  kiln__ix s0 = {0};
  for (uint32_t k = 0; k < a->n; k++) {
    uint32_t v, c;
    const kiln_instr *iv = opnd(f, ins, first_init + k);
    a->t[k] = param_type(f, a->comp, k);
    if ((rc = kiln__emit_value1(f, iv->id, &s0, &v))) return rc;
    if ((rc = converted(f, ins, v, iv->shape.dtype, a->t[k], &c))) return rc;
    a->acc[k] = kiln__emit_newvar(f);
    kiln__emit_line(f, "%s v%u = v%u;", kiln__ctype(f->mod, a->t[k]), a->acc[k], c);
  }
  return 0;
}

/* Combines the values of inputs[0..n) at index y into the accumulators. */
static int combine(kiln__emit_fn *f, const kiln_instr *ins, accs *a, const kiln__ix *y) {
  uint32_t args[2 * KILN__EMIT_MAXR];
  for (uint32_t k = 0; k < a->n; k++) {
    uint32_t v;
    const kiln_instr *in = opnd(f, ins, k);
    int rc = kiln__emit_value1(f, in->id, y, &v);
    if (rc == 0) rc = converted(f, ins, v, in->shape.dtype, param_type(f, a->comp, a->n + k), &v);
    if (rc) return rc;
    args[k] = a->acc[k];
    args[a->n + k] = v;
  }
  kiln__emit_call_fn(f, a->fn, args, 2 * a->n, a->acc, a->n);
  return 0;
}

static int finish_accs(kiln__emit_fn *f, const kiln_instr *ins, accs *a, const uint32_t **vars,
                       uint32_t *n) {
  uint32_t *out = kiln_arena_alloc(f->arena, a->n * sizeof *out);
  if (out == NULL) return kiln__emit_fail(f, ins, KILN_ENOMEM, "out of memory");
  for (uint32_t k = 0; k < a->n; k++) {
    const kiln_shape *s = leaf(&ins->shape, a->n, k);
    if (s == NULL || !kiln_shape_is_array(s)) return bad(f, ins, "result must be n arrays");
    int rc = converted(f, ins, a->acc[k], a->t[k], s->dtype, &out[k]);
    if (rc) return rc;
  }
  *vars = out;
  *n = a->n;
  return 0;
}

/* ---- row reductions in vector lanes --------------------------------------
 *
 * A float reduce whose reducer is add, max or min of its two parameters and
 * whose innermost loop runs over the input's physically minor dim (a row
 * reduction: softmax, layernorm) is combined in ROW_LANES partial
 * accumulators, lane l taking positions l, l + ROW_LANES, ... of each row
 * (the last reduced dim; the tail goes to lane 0), and the lanes are
 * combined pairwise at the end, as XLA does. The lanes are independent, so
 * gcc vectorizes the loop; the sum is reassociated, which the tests allow
 * for (tests/support/tolerance.h: kiln_tol_reduce_f32). Lane 0 starts from
 * the init value, the others from the reducer's identity. */

#define ROW_LANES 16

/* The reduced dims of input shape in (red[d]) in the order their loops
 * nest, outermost first: the input's physical order, major to minor, so
 * that the innermost loop walks memory with the smallest stride (the
 * logical order for the default layout). Accumulators of f16 or bf16,
 * rounded after every step, keep the logical order, the interpreter's:
 * another order changes their sum by far more than f32's reassociation
 * does. Returns their count. */
static uint32_t reduced_order(const kiln_shape *in, const bool *red, const accs *a, int64_t *ord) {
  int64_t m2m[KILN__EMIT_MAXR];
  uint32_t n = 0;
  bool narrow = false;
  for (uint32_t i = 0; i < a->n; i++) narrow |= a->t[i] == KILN_F16 || a->t[i] == KILN_BF16;
  if (narrow) {
    for (uint32_t d = 0; d < in->rank; d++)
      if (red[d]) ord[n++] = d;
    return n;
  }
  kiln_shape_minor_to_major(in, m2m);
  for (uint32_t q = in->rank; q-- > 0;)
    if (red[m2m[q]]) ord[n++] = m2m[q];
  return n;
}

/* The identity of reducer comp on float type t (a C literal), or NULL when
 * comp is not add/max/min of its two parameters of type t. */
static const char *lane_identity(const kiln_module *m, uint32_t comp, kiln_dtype t) {
  if (comp >= m->ncomps || (t != KILN_F32 && t != KILN_F64)) return NULL;
  const kiln_computation *c = m->comps[comp];
  const kiln_instr *root = kiln_computation_root(m, c);
  const kiln_instr *p0 = kiln_computation_param(m, c, 0), *p1 = kiln_computation_param(m, c, 1);
  if (root == NULL || p0 == NULL || p1 == NULL || kiln_computation_nparams(m, c) != 2 ||
      root->noperands != 2 || !kiln_shape_is_array(&root->shape) || root->shape.dtype != t ||
      p0->shape.dtype != t || p1->shape.dtype != t || p0->shape.rank || p1->shape.rank)
    return NULL;
  kiln_id a = root->operands[0], b = root->operands[1];
  if (!((a == p0->id && b == p1->id) || (a == p1->id && b == p0->id))) return NULL;
  bool f32 = t == KILN_F32;
  switch (root->op) {
  case KILN_OP_ADD: return f32 ? "-0.0f" : "-0.0";
  case KILN_OP_MAXIMUM: return "-INFINITY";
  case KILN_OP_MINIMUM: return "INFINITY";
  default: return NULL;
  }
}

/* lanes[l] = kf(lanes[l], value of the input at y), lane expression l. */
static int lane_combine(kiln__emit_fn *f, const kiln_instr *ins, accs *a, uint32_t lanes,
                        const char *l, const kiln__ix *y) {
  uint32_t v, cur = kiln__emit_newvar(f);
  const kiln_instr *in = opnd(f, ins, 0);
  int rc = kiln__emit_value1(f, in->id, y, &v);
  if (rc == 0) rc = converted(f, ins, v, in->shape.dtype, a->t[0], &v);
  if (rc) return rc;
  uint32_t args[2] = {cur, v};
  kiln__emit_line(f, "%s v%u = v%u[%s];", kiln__ctype(f->mod, a->t[0]), cur, lanes, l);
  kiln__emit_call_fn(f, a->fn, args, 2, &cur, 1);
  kiln__emit_line(f, "v%u[%s] = v%u;", lanes, l, cur);
  return 0;
}

/* The reduce in lanes (see above); red[d] marks reduced dims, last the
 * innermost (physically minor) one. */
static int reduce_lanes(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x, accs *a,
                        const bool *red, uint32_t last, const char *ident) {
  const kiln_shape *in = &opnd(f, ins, 0)->shape;
  const char *T = kiln__ctype(f->mod, a->t[0]);
  uint32_t lanes = kiln__emit_newvar(f), marks[KILN__EMIT_MAXR + 2], nl = 0;
  kiln__emit_line(f, "%s v%u[%d];", T, lanes, ROW_LANES);
  kiln__emit_line(f, "for (int l = 1; l < %d; l++) v%u[l] = %s;", ROW_LANES, lanes, ident);
  kiln__emit_line(f, "v%u[0] = v%u;", lanes, a->acc[0]);
  kiln__ix y, t;
  int rc = kiln__ix_new(f, in->rank, &y);
  if (rc == 0) rc = kiln__ix_new(f, in->rank, &t);
  if (rc) return rc;
  for (uint32_t d = 0, j = 0; d < in->rank; d++) {
    if (red[d]) continue;
    const char *c = kiln__ix_get(f, x, j++);
    kiln__ix_set(&y, d, "%s", c);
    kiln__ix_set(&t, d, "%s", c);
  }
  int64_t ord[KILN__EMIT_MAXR];
  uint32_t nord = reduced_order(in, red, a, ord);
  for (uint32_t q = 0; q < nord; q++) {
    int64_t d = ord[q];
    if (d == (int64_t)last) continue;
    uint32_t r = kiln__emit_newvar(f);
    marks[nl++] = kiln__emit_open(f, "for (int64_t r%u = 0; r%u < %lld; r%u++)", r, r,
                                  (long long)in->dims[d], r);
    kiln__ix_set(&y, (uint32_t)d, "r%u", r);
    kiln__ix_set(&t, (uint32_t)d, "r%u", r);
  }
  long long len = (long long)in->dims[last], full = len - len % ROW_LANES;
  uint32_t r = kiln__emit_newvar(f), l = kiln__emit_newvar(f), q = kiln__emit_newvar(f);
  char lv[16];
  snprintf(lv, sizeof lv, "l%u", l);
  uint32_t m1 =
      kiln__emit_open(f, "for (int64_t r%u = 0; r%u < %lld; r%u += %d)", r, r, full, r, ROW_LANES);
  uint32_t m2 = kiln__emit_open(f, "for (int l%u = 0; l%u < %d; l%u++)", l, l, ROW_LANES, l);
  kiln__ix_set(&y, last, "(r%u + l%u)", r, l);
  rc = lane_combine(f, ins, a, lanes, lv, &y);
  kiln__emit_close(f, m2, NULL);
  kiln__emit_close(f, m1, NULL);
  if (rc == 0 && full < len) {
    uint32_t m3 =
        kiln__emit_open(f, "for (int64_t r%u = %lld; r%u < %lld; r%u++)", q, full, q, len, q);
    kiln__ix_set(&t, last, "r%u", q);
    rc = lane_combine(f, ins, a, lanes, "0", &t);
    kiln__emit_close(f, m3, NULL);
  }
  while (nl-- > 0) kiln__emit_close(f, marks[nl], NULL);
  if (rc) return rc;
  for (int w = ROW_LANES / 2; w >= 1; w /= 2) {
    uint32_t m = kiln__emit_open(f, "for (int l = 0; l < %d; l++)", w);
    uint32_t c0 = kiln__emit_newvar(f), c1 = kiln__emit_newvar(f), args[2] = {c0, c1};
    kiln__emit_line(f, "%s v%u = v%u[l], v%u = v%u[l + %d];", T, c0, lanes, c1, lanes, w);
    kiln__emit_call_fn(f, a->fn, args, 2, &c0, 1);
    kiln__emit_line(f, "v%u[l] = v%u;", lanes, c0);
    kiln__emit_close(f, m, NULL);
  }
  kiln__emit_line(f, "v%u = v%u[0];", a->acc[0], lanes);
  return 0;
}

/* The reduced dim the lanes run over: the input's physically minor dim,
 * when it is reduced (then it is the innermost loop: reduced_order) and
 * long enough; else -1. */
static int lanes_dim(const kiln_shape *in, const bool *red) {
  int64_t m2m[KILN__EMIT_MAXR];
  if (in->rank == 0) return -1;
  kiln_shape_minor_to_major(in, m2m);
  int64_t d = m2m[0];
  if (!red[d] || in->dims[d] < 2 * ROW_LANES) return -1;
  return (int)d;
}

static int reduce(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x, const uint32_t **vars,
                  uint32_t *n) {
  accs a = {.n = ins->noperands / 2};
  if (ins->noperands % 2 || a.n == 0 || a.n > KILN__EMIT_MAXR)
    return bad(f, ins, "needs inputs and inits");
  const kiln_shape *in = &opnd(f, ins, 0)->shape;
  const kiln_i64s *dl = kiln_instr_attr_ints(ins, KILN_ATTR_DIMENSIONS);
  bool red[KILN__EMIT_MAXR] = {false};
  for (uint32_t i = 0; dl && i < dl->n; i++) {
    if (dl->v[i] < 0 || dl->v[i] >= in->rank) return bad(f, ins, "dimension out of range");
    red[dl->v[i]] = true;
  }
  int rc = start_accs(f, ins, a.n, &a);
  if (rc) return rc;
  const char *ident = a.n == 1 ? lane_identity(f->mod->m, a.comp, a.t[0]) : NULL;
  int last = ident && opnd(f, ins, 0)->shape.dtype == a.t[0] ? lanes_dim(in, red) : -1;
  if (last >= 0) {
    if ((rc = reduce_lanes(f, ins, x, &a, red, (uint32_t)last, ident))) return rc;
    return finish_accs(f, ins, &a, vars, n);
  }
  kiln__ix y;
  if ((rc = kiln__ix_new(f, in->rank, &y))) return rc;
  uint32_t marks[KILN__EMIT_MAXR], nl = 0;
  for (uint32_t d = 0, j = 0; d < in->rank; d++)
    if (!red[d]) kiln__ix_set(&y, d, "%s", kiln__ix_get(f, x, j++));
  int64_t ord[KILN__EMIT_MAXR];
  uint32_t nord = reduced_order(in, red, &a, ord);
  for (uint32_t q = 0; q < nord; q++) {
    int64_t d = ord[q];
    uint32_t r = kiln__emit_newvar(f);
    marks[nl++] = kiln__emit_open(f, "for (int64_t r%u = 0; r%u < %lld; r%u++)", r, r,
                                  (long long)in->dims[d], r);
    kiln__ix_set(&y, (uint32_t)d, "r%u", r);
  }
  rc = combine(f, ins, &a, &y);
  while (nl-- > 0) kiln__emit_close(f, marks[nl], NULL);
  if (rc) return rc;
  return finish_accs(f, ins, &a, vars, n);
}

/* ---- reduce-window ------------------------------------------------------ */

static int reduce_window(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x,
                         const uint32_t **vars, uint32_t *n) {
  accs a = {.n = ins->noperands / 2};
  if (ins->noperands % 2 || a.n == 0 || a.n > KILN__EMIT_MAXR)
    return bad(f, ins, "needs inputs and inits");
  const kiln_shape *in = &opnd(f, ins, 0)->shape;
  const kiln_attr *wa = kiln_instr_attr(ins, KILN_ATTR_WINDOW);
  const kiln_window *w = wa ? wa->v.window : NULL;
  if (w == NULL || w->rank != in->rank) return bad(f, ins, "window must have one entry per dim");
  int rc = start_accs(f, ins, a.n, &a);
  kiln__ix y;
  if (rc || (rc = kiln__ix_new(f, in->rank, &y))) return rc;
  uint32_t marks[KILN__EMIT_MAXR], loops[KILN__EMIT_MAXR], nl = 0;
  for (uint32_t d = 0; d < in->rank; d++) {
    uint32_t r = kiln__emit_newvar(f);
    loops[d] = r;
    marks[nl++] = kiln__emit_open(f, "for (int64_t r%u = 0; r%u < %lld; r%u++)", r, r,
                                  (long long)w->dims[d].size, r);
  }
  kiln_sbuf skip = KILN_SBUF_INIT;
  for (uint32_t d = 0; d < in->rank; d++) {
    const kiln_window_dim *wd = &w->dims[d];
    char pos[KILN__IX_LEN];
    kiln__ix_var(f, pos, "%s * %lld + r%u * %lld - %lld", kiln__ix_get(f, x, d),
                 (long long)wd->stride, loops[d], (long long)wd->rhs_dilate, (long long)wd->pad_lo);
    if (wd->lhs_dilate > 1) {
      kiln_sbuf_printf(&skip, "%s%s < 0 || %s %% %lld != 0 || %s / %lld >= %lld",
                       skip.len ? " || " : "", pos, pos, (long long)wd->lhs_dilate, pos,
                       (long long)wd->lhs_dilate, (long long)in->dims[d]);
      kiln__ix_set(&y, d, "(%s / %lld)", pos, (long long)wd->lhs_dilate);
    } else {
      if (wd->pad_lo != 0 || wd->pad_hi != 0)
        kiln_sbuf_printf(&skip, "%s(uint64_t)%s >= %lluu", skip.len ? " || " : "", pos,
                         (unsigned long long)in->dims[d]);
      kiln__ix_set(&y, d, "%s", pos);
    }
  }
  if (skip.len) kiln__emit_line(f, "if (%s) continue;", kiln_sbuf_str(&skip));
  kiln_sbuf_free(&skip);
  rc = combine(f, ins, &a, &y);
  while (nl-- > 0) kiln__emit_close(f, marks[nl], NULL);
  if (rc) return rc;
  return finish_accs(f, ins, &a, vars, n);
}

/* ---- dot and convolution ------------------------------------------------ */

/* Integer results of at most 32 bits accumulate in uint32_t: the same
 * bits modulo 2^32 as a 64-bit sum, and a loop the compiler vectorizes. */
static bool narrow_int(kiln_dtype t) {
  return (kiln_dtype_is_signed_int(t) || kiln_dtype_is_unsigned_int(t)) && kiln_dtype_bits(t) <= 32;
}

/* acc += convert(l) * convert(r), in the accumulator of result type t. */
static int accumulate(kiln__emit_fn *f, const kiln_instr *ins, uint32_t acc, kiln_dtype t,
                      const kiln__ix *ly, const kiln__ix *ry) {
  const kiln_instr *l = opnd(f, ins, 0), *r = opnd(f, ins, 1);
  uint32_t lv, rv;
  int rc = kiln__emit_value1(f, l->id, ly, &lv);
  if (rc == 0) rc = converted(f, ins, lv, l->shape.dtype, t, &lv);
  if (rc == 0) rc = kiln__emit_value1(f, r->id, ry, &rv);
  if (rc == 0) rc = converted(f, ins, rv, r->shape.dtype, t, &rv);
  if (rc) return rc;
  if (kiln_dtype_is_float(t))
    kiln__emit_line(f, "v%u += (double)v%u * (double)v%u;", acc, lv, rv);
  else if (narrow_int(t) && kiln_dtype_is_signed_int(t))
    kiln__emit_line(f, "v%u += (uint32_t)(int32_t)v%u * (uint32_t)(int32_t)v%u;", acc, lv, rv);
  else if (narrow_int(t))
    kiln__emit_line(f, "v%u += (uint32_t)v%u * (uint32_t)v%u;", acc, lv, rv);
  else if (kiln_dtype_is_signed_int(t))
    kiln__emit_line(f, "v%u += (uint64_t)(int64_t)v%u * (uint64_t)(int64_t)v%u;", acc, lv, rv);
  else
    kiln__emit_line(f, "v%u += (uint64_t)v%u * (uint64_t)v%u;", acc, lv, rv);
  return 0;
}

static uint32_t open_acc(kiln__emit_fn *f, kiln_dtype t) {
  uint32_t acc = kiln__emit_newvar(f);
  const char *ty = kiln_dtype_is_float(t) ? "double" : narrow_int(t) ? "uint32_t" : "uint64_t";
  kiln__emit_line(f, "%s v%u = 0;", ty, acc);
  return acc;
}

static int close_acc(kiln__emit_fn *f, const kiln_instr *ins, uint32_t acc, kiln_dtype t,
                     uint32_t *var) {
  char a[16], e[256];
  snprintf(a, sizeof a, "v%u", acc);
  kiln_dtype at = kiln_dtype_is_float(t) ? KILN_F64 : narrow_int(t) ? KILN_U32 : KILN_U64;
  int rc = kiln__emit_convert_expr(f, ins, a, at, t, e, sizeof e);
  if (rc) return rc;
  *var = kiln__emit_newvar(f);
  kiln__emit_line(f, "%s v%u = %s;", kiln__ctype(f->mod, t), *var, e);
  return 0;
}

static bool in_list(const kiln_i64s *l, int64_t d, uint32_t *at) {
  for (uint32_t i = 0; l && i < l->n; i++)
    if (l->v[i] == d) {
      *at = i;
      return true;
    }
  return false;
}

/* Index of one dot operand: batch dims from x, contracting from the loops,
 * free dims from x starting at component *next. */
static int dot_side(kiln__emit_fn *f, const kiln__ix *x, const kiln_shape *s, const kiln_i64s *b,
                    const kiln_i64s *c, const uint32_t *loops, uint32_t *next, kiln__ix *y) {
  int rc = kiln__ix_new(f, s->rank, y);
  if (rc) return rc;
  for (uint32_t d = 0; d < s->rank; d++) {
    uint32_t at;
    if (in_list(b, d, &at))
      kiln__ix_set(y, d, "%s", kiln__ix_get(f, x, at));
    else if (in_list(c, d, &at))
      kiln__ix_set(y, d, "r%u", loops[at]);
    else if (*next < x->rank)
      kiln__ix_set(y, d, "%s", kiln__ix_get(f, x, (*next)++));
    else
      return -1;
  }
  return 0;
}

static int dot(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x, uint32_t *var) {
  const kiln_shape *ls = &opnd(f, ins, 0)->shape, *rs = &opnd(f, ins, 1)->shape;
  const kiln_i64s *lb = kiln_instr_attr_ints(ins, KILN_ATTR_LHS_BATCH_DIMS);
  const kiln_i64s *rb = kiln_instr_attr_ints(ins, KILN_ATTR_RHS_BATCH_DIMS);
  const kiln_i64s *lc = kiln_instr_attr_ints(ins, KILN_ATTR_LHS_CONTRACTING_DIMS);
  const kiln_i64s *rc_ = kiln_instr_attr_ints(ins, KILN_ATTR_RHS_CONTRACTING_DIMS);
  uint32_t nc = lc ? lc->n : 0, nb = lb ? lb->n : 0;
  if ((rc_ ? rc_->n : 0) != nc || (rb ? rb->n : 0) != nb || nc > KILN__EMIT_MAXR)
    return bad(f, ins, "dimension numbers do not pair up");
  kiln_dtype t = ins->shape.dtype;
  uint32_t acc = open_acc(f, t), loops[KILN__EMIT_MAXR], marks[KILN__EMIT_MAXR];
  for (uint32_t i = 0; i < nc; i++) {
    loops[i] = kiln__emit_newvar(f);
    if (lc->v[i] < 0 || lc->v[i] >= ls->rank) return bad(f, ins, "contracting dim out of range");
    marks[i] = kiln__emit_open(f, "for (int64_t r%u = 0; r%u < %lld; r%u++)", loops[i], loops[i],
                               (long long)ls->dims[lc->v[i]], loops[i]);
  }
  kiln__ix ly, ry;
  uint32_t next = nb;
  int rc = dot_side(f, x, ls, lb, lc, loops, &next, &ly);
  if (rc == 0) rc = dot_side(f, x, rs, rb, rc_, loops, &next, &ry);
  if (rc < 0 || (rc == 0 && next != x->rank))
    rc = bad(f, ins, "result rank is not batch + free dims");
  if (rc == 0) rc = accumulate(f, ins, acc, t, &ly, &ry);
  for (uint32_t i = nc; i-- > 0;) kiln__emit_close(f, marks[i], NULL);
  if (rc) return rc;
  return close_acc(f, ins, acc, t, var);
}

typedef struct conv_geo {
  const kiln_conv_dims *d;
  const kiln_window *w;
  int64_t fgc, bgc, in_b, ifgs, ofgs, bgs, depth_mult;
} conv_geo;

static int conv_plan(kiln__emit_fn *f, const kiln_instr *ins, conv_geo *g) {
  const kiln_shape *ls = &opnd(f, ins, 0)->shape, *rs = &opnd(f, ins, 1)->shape;
  const kiln_attr *da = kiln_instr_attr(ins, KILN_ATTR_DIM_LABELS);
  const kiln_attr *wa = kiln_instr_attr(ins, KILN_ATTR_WINDOW);
  g->d = da ? da->v.conv : NULL;
  g->w = wa ? wa->v.window : NULL;
  if (g->d == NULL || ls->rank != g->d->nspatial + 2 || rs->rank != ls->rank ||
      (g->w && g->w->rank != g->d->nspatial))
    return bad(f, ins, "dim_labels and window must describe the operands");
  g->fgc = kiln_instr_attr_int(ins, KILN_ATTR_FEATURE_GROUP_COUNT, 1);
  g->bgc = kiln_instr_attr_int(ins, KILN_ATTR_BATCH_GROUP_COUNT, 1);
  int64_t in_z = ls->dims[g->d->in_feature], out_z = rs->dims[g->d->kernel_out];
  g->in_b = ls->dims[g->d->in_batch];
  if (g->fgc < 1 || g->bgc < 1 || in_z % g->fgc || out_z % g->fgc || g->in_b % g->bgc ||
      out_z % g->bgc)
    return bad(f, ins, "group counts must divide the feature and batch sizes");
  g->ifgs = in_z / g->fgc;
  g->ofgs = out_z / g->fgc;
  g->bgs = g->in_b / g->bgc;
  g->depth_mult = g->bgc > 1 ? out_z / g->bgc : 1;
  return 0;
}

static kiln_window_dim conv_wdim(const conv_geo *g, const kiln_shape *rs, uint32_t i) {
  kiln_window_dim def = {
      .size = rs->dims[g->d->kernel_spatial[i]], .stride = 1, .lhs_dilate = 1, .rhs_dilate = 1};
  return g->w ? g->w->dims[i] : def;
}

static int convolution(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x, uint32_t *var) {
  const kiln_shape *ls = &opnd(f, ins, 0)->shape, *rs = &opnd(f, ins, 1)->shape;
  conv_geo g = {0};
  int rc = conv_plan(f, ins, &g);
  if (rc) return rc;
  const kiln_conv_dims *d = g.d;
  uint32_t ns = d->nspatial;
  kiln_dtype t = ins->shape.dtype;
  const char *oz = kiln__ix_get(f, x, (uint32_t)d->out_feature);
  char lbatch[KILN__IX_LEN], fgi[KILN__IX_LEN];
  kiln__ix_var(f, fgi, "%s / %lld", oz, (long long)g.ofgs);
  kiln__ix_var(f, lbatch, "%s + (%s / %lld * %lld) %% %lld",
               kiln__ix_get(f, x, (uint32_t)d->out_batch), oz, (long long)g.depth_mult,
               (long long)g.bgs, (long long)g.in_b);
  uint32_t acc = open_acc(f, t), loops[KILN__EMIT_MAXR], marks[KILN__EMIT_MAXR + 1];
  kiln__ix ly, ry;
  if ((rc = kiln__ix_new(f, ls->rank, &ly)) || (rc = kiln__ix_new(f, rs->rank, &ry))) return rc;
  for (uint32_t i = 0; i < ns; i++) {
    loops[i] = kiln__emit_newvar(f);
    marks[i] = kiln__emit_open(f, "for (int64_t r%u = 0; r%u < %lld; r%u++)", loops[i], loops[i],
                               (long long)rs->dims[d->kernel_spatial[i]], loops[i]);
  }
  kiln_sbuf skip = KILN_SBUF_INIT;
  for (uint32_t i = 0; i < ns; i++) {
    kiln_window_dim wd = conv_wdim(&g, rs, i);
    char u[KILN__IX_LEN];
    kiln__ix_var(f, u, "%s * %lld - %lld + r%u * %lld",
                 kiln__ix_get(f, x, (uint32_t)d->out_spatial[i]), (long long)wd.stride,
                 (long long)wd.pad_lo, loops[i], (long long)wd.rhs_dilate);
    long long dil = wd.lhs_dilate, dim = ls->dims[d->in_spatial[i]];
    kiln_sbuf_printf(&skip, "%s%s < 0 || %s %% %lld != 0 || %s / %lld >= %lld",
                     skip.len ? " || " : "", u, u, dil, u, dil, dim);
    kiln__ix_set(&ly, (uint32_t)d->in_spatial[i], "(%s / %lld)", u, dil);
    if (wd.reversal)
      kiln__ix_set(&ry, (uint32_t)d->kernel_spatial[i], "(%lld - r%u)",
                   (long long)rs->dims[d->kernel_spatial[i]] - 1, loops[i]);
    else
      kiln__ix_set(&ry, (uint32_t)d->kernel_spatial[i], "r%u", loops[i]);
  }
  if (skip.len) kiln__emit_line(f, "if (%s) continue;", kiln_sbuf_str(&skip));
  kiln_sbuf_free(&skip);
  uint32_t z = kiln__emit_newvar(f);
  marks[ns] =
      kiln__emit_open(f, "for (int64_t r%u = 0; r%u < %lld; r%u++)", z, z, (long long)g.ifgs, z);
  kiln__ix_set(&ly, (uint32_t)d->in_batch, "%s", lbatch);
  kiln__ix_set(&ly, (uint32_t)d->in_feature, "(%s * %lld + r%u)", fgi, (long long)g.ifgs, z);
  kiln__ix_set(&ry, (uint32_t)d->kernel_out, "%s", oz);
  kiln__ix_set(&ry, (uint32_t)d->kernel_in, "r%u", z);
  rc = accumulate(f, ins, acc, t, &ly, &ry);
  for (uint32_t i = ns + 1; i-- > 0;) kiln__emit_close(f, marks[i], NULL);
  if (rc) return rc;
  return close_acc(f, ins, acc, t, var);
}

/* ---- map ---------------------------------------------------------------- */

static int map(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x, uint32_t *var) {
  uint32_t fn, args[KILN__EMIT_MAXR];
  if (ins->ncalled != 1 || ins->noperands > KILN__EMIT_MAXR)
    return bad(f, ins, "needs one computation");
  int rc = kiln__emit_comp_fn(f->mod, ins->called[0], ins, &fn);
  if (rc) return f->rc = rc;
  if (f->mod->fn_tuple[fn]) return bad(f, ins, "computation must return a scalar");
  for (uint32_t j = 0; j < ins->noperands; j++) {
    const kiln_instr *o = opnd(f, ins, j);
    if ((rc = kiln__emit_value1(f, o->id, x, &args[j]))) return rc;
    if ((rc = converted(f, ins, args[j], o->shape.dtype, param_type(f, ins->called[0], j),
                        &args[j])))
      return rc;
  }
  uint32_t out = kiln__emit_newvar(f);
  const kiln_instr *root = kiln_computation_root(f->mod->m, f->mod->m->comps[ins->called[0]]);
  kiln__emit_line(f, "%s v%u;", kiln__ctype(f->mod, root->shape.dtype), out);
  kiln__emit_call_fn(f, fn, args, ins->noperands, &out, 1);
  return converted(f, ins, out, root->shape.dtype, ins->shape.dtype, var);
}

int kiln__emit_reduction(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x,
                         const uint32_t **vars, uint32_t *n) {
  uint32_t *one = kiln_arena_alloc(f->arena, sizeof *one);
  if (one == NULL) return kiln__emit_fail(f, ins, KILN_ENOMEM, "out of memory");
  *vars = one;
  *n = 1;
  switch (ins->op) {
  case KILN_OP_REDUCE: return reduce(f, ins, x, vars, n);
  case KILN_OP_REDUCE_WINDOW: return reduce_window(f, ins, x, vars, n);
  case KILN_OP_DOT: return dot(f, ins, x, one);
  case KILN_OP_CONVOLUTION: return convolution(f, ins, x, one);
  case KILN_OP_MAP: return map(f, ins, x, one);
  default: return bad(f, ins, "not a reduction");
  }
}
