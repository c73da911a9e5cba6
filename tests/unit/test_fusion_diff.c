/* Differential tests of the fusion, layout and schedule passes against the
 * reference interpreter: each module runs on deterministic random
 * arguments before any pass and after each pass in turn (fusion, then
 * layout, then schedule, each on the previous one's output); the results
 * must be bit-identical (the passes never reassociate) and the module must
 * verify after every pass. The modules: hand-written programs (MLP layers
 * with bias, relu and softmax, elementwise chains, reductions, dot chains,
 * loops), the conformance corpus (KILN_CORPUS_DIR, else
 * ../shared/corpus/xla-hlo next to the source tree; skipped when absent),
 * and random programs from the generator (KILN_FUSION_SEEDS=N for N of
 * them instead of 120). Structural checks ride along:
 * every fusion's shape is its fused root's, its computation has one
 * parameter per operand with the operand's shape, its kind is kLoop,
 * kInput or kOutput; after layout every array value has a layout.
 */
#include <dirent.h>
#include <time.h>

#include "test_fusion_harness.h"
#include "tests/support/progen.h"

static const struct {
  const char *name;
  kiln_pass_fn fn;
} k_passes[] = {
    {"fusion", kiln_pass_fusion},
    {"layout", kiln_pass_layout},
    {"schedule", kiln_pass_schedule},
};

/* ---- structural checks ---------------------------------------------------- */

/* Fusions made by the pass (ids from `first` on; input fusions are the
 * input's business). */
static void check_fusions(const kiln_module *m, kiln_id first, const char *what) {
  for (uint32_t c = 0; c < m->ncomps; c++) {
    const kiln_computation *comp = m->comps[c];
    for (uint32_t i = 0; i < comp->ninstrs; i++) {
      const kiln_instr *f = m->instrs[comp->instrs[i]];
      if (f->op != KILN_OP_FUSION || f->id < first) continue;
      ck_assert_msg(f->ncalled == 1, "%s: %s calls %u computations", what, f->name, f->ncalled);
      const kiln_computation *fc = m->comps[f->called[0]];
      const kiln_instr *root = kiln_computation_root(m, fc);
      ck_assert_msg(kiln_shape_equal(&f->shape, &root->shape, false), "%s: %s shape != root", what,
                    f->name);
      ck_assert_uint_eq(kiln_computation_nparams(m, fc), f->noperands);
      for (uint32_t k = 0; k < f->noperands; k++) {
        const kiln_instr *p = kiln_computation_param(m, fc, k);
        ck_assert_msg(p != NULL, "%s: %s has no parameter %u", what, f->name, k);
        ck_assert_msg(kiln_shape_equal(&p->shape, &m->instrs[f->operands[k]]->shape, true),
                      "%s: %s parameter %u differs from its operand", what, f->name, k);
      }
      const char *kind = kiln_instr_attr_str(f, KILN_ATTR_KIND);
      ck_assert_msg(
          kind && (!strcmp(kind, "kLoop") || !strcmp(kind, "kInput") || !strcmp(kind, "kOutput")),
          "%s: %s kind %s", what, f->name, kind ? kind : "(none)");
    }
  }
}

static bool all_laid_out(const kiln_shape *s) {
  if (kiln_shape_is_tuple(s)) {
    for (uint32_t i = 0; i < s->rank; i++)
      if (!all_laid_out(&s->tuple[i])) return false;
    return true;
  }
  if (!kiln_shape_is_array(s) || s->rank == 0) return true;
  return s->layout && s->layout->rank == s->rank;
}

static void check_layouts(const kiln_module *m, const char *what) {
  for (uint32_t c = 0; c < m->ncomps; c++) {
    const kiln_computation *comp = m->comps[c];
    for (uint32_t i = 0; i < comp->ninstrs; i++) {
      const kiln_instr *x = m->instrs[comp->instrs[i]];
      ck_assert_msg(all_laid_out(&x->shape), "%s: %s/%s has no layout", what, comp->name, x->name);
    }
  }
  ck_assert_msg(m->entry_layout != NULL, "%s: no entry_computation_layout", what);
}

/* ---- the differential check ------------------------------------------------ */

typedef struct outcome {
  int ran;     /* 1 when the interpreter ran the module and every pass compared */
  int fusions; /* fusion instructions after the fusion pass */
} outcome;

static int count_fusions(const kiln_module *m) {
  int n = 0;
  for (uint32_t c = 0; c < m->ncomps; c++)
    for (uint32_t i = 0; i < m->comps[c]->ninstrs; i++)
      n += m->instrs[m->comps[c]->instrs[i]]->op == KILN_OP_FUSION;
  return n;
}

/* Runs the passes on `text`, comparing after each. When `must_run`, the
 * interpreter must accept the original module. */
static outcome diff_module(const char *text, size_t len, const char *what, bool must_run,
                           int nseeds) {
  outcome out = {0, 0};
  kiln_module *m0 = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  if (kiln_module_parse_text(text, len, what, NULL, &m0, &st) != 0) {
    ck_assert_msg(!must_run, "%s: parse: %s", what, st.msg);
    return out;
  }
  if (kiln_module_verify(m0, NULL, &st) != 0) {
    ck_assert_msg(!must_run, "%s: verify: %s", what, st.msg);
    kiln_module_destroy(m0);
    return out;
  }
  /* The interpreter is slow on big programs: compare only small ones. */
  const kiln_computation *e = kiln_module_entry(m0);
  int64_t pbytes = 0;
  for (uint32_t i = 0; e && i < e->ninstrs; i++) {
    const kiln_instr *x = m0->instrs[e->instrs[i]];
    if (x->op == KILN_OP_PARAMETER && kiln_shape_is_array(&x->shape))
      pbytes += kiln_shape_bytes(&x->shape);
  }
  if (pbytes > (1 << 20)) nseeds = 0;
  kiln_literal **args[4] = {NULL};
  kiln_literal *ref[4] = {NULL};
  uint32_t nargs = 0;
  int rc = 0;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int s = 0; s < nseeds; s++) {
    args[s] = fh_args(m0, (uint64_t)s + 11, &nargs);
    if (args[s] == NULL) break;
    ref[s] = fh_interp(m0, args[s], nargs, &rc, &st);
    if (ref[s] == NULL) break;
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  bool runs = nseeds > 0 && ref[nseeds - 1] != NULL;
  /* A program the interpreter takes seconds on would take minutes here
   * (and hit its time limit under sanitizers): not compared. */
  double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  if (runs && secs > 2.0 && !must_run) runs = false;
  ck_assert_msg(runs || !must_run, "%s: the interpreter refuses the input: %s", what, st.msg);
  kiln_module *m = NULL;
  ck_assert_int_eq(kiln_module_clone(m0, &m), 0);
  for (size_t p = 0; p < sizeof k_passes / sizeof k_passes[0]; p++) {
    char where[512];
    snprintf(where, sizeof where, "%s after %s", what, k_passes[p].name);
    fh_run_pass(m, k_passes[p].fn, k_passes[p].name, NULL, 2);
    fh_verify(m, where);
    if (p == 0) {
      check_fusions(m, m0->ninstrs, where);
      out.fusions = count_fusions(m);
    }
    if (p >= 1) check_layouts(m, where);
    if (p == 2) ck_assert_int_eq(m->is_scheduled, 1);
    for (int s = 0; runs && s < nseeds; s++) {
      kiln_literal *r = fh_interp(m, args[s], nargs, &rc, &st);
      if (r == NULL) {
        char *t = kiln_module_print(m, NULL);
        ck_abort_msg("%s: the interpreter fails: %s: %s\n%s", where, st.where, st.msg, t);
      }
      if (!kiln_literal_equal(r, ref[s])) {
        char *a = fh_lit_text(ref[s]), *b = fh_lit_text(r), *t = kiln_module_print(m, NULL);
        ck_abort_msg("%s: results differ (seed %d)\nbefore: %.2000s\nafter:  %.2000s\n%s", where, s,
                     a, b, t);
      }
      kiln_literal_destroy(r);
    }
  }
  out.ran = runs;
  for (int s = 0; s < nseeds; s++) {
    kiln_literal_destroy(ref[s]);
    fh_free_args(args[s], nargs);
  }
  kiln_module_destroy(m);
  kiln_module_destroy(m0);
  return out;
}

/* ---- hand-written programs --------------------------------------------------- */

#define REDUCERS \
  "add_f32 {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}\n" \
  "max_f32 {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT m = f32[] maximum(a, " \
  "b)\n}\n"

static const struct {
  const char *name;
  int min_fusions; /* the pass must find at least this many */
  const char *text;
} k_programs[] = {
    /* the first GEMM with its epilogue; the softmax, with the second bias add, as one row
     * kernel (the second GEMM stays on its own: nothing joins a dot into a row kernel) */
    {"mlp_softmax", 2,
     "HloModule mlp_softmax\n" REDUCERS "ENTRY main {\n"
     "  x = f32[8,16] parameter(0)\n"
     "  w1 = f32[16,32] parameter(1)\n"
     "  b1 = f32[32] parameter(2)\n"
     "  w2 = f32[32,10] parameter(3)\n"
     "  b2 = f32[10] parameter(4)\n"
     "  d1 = f32[8,32] dot(x, w1), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
     "  bb1 = f32[8,32] broadcast(b1), dimensions={1}\n"
     "  a1 = f32[8,32] add(d1, bb1)\n"
     "  z = f32[] constant(0)\n"
     "  zb = f32[8,32] broadcast(z), dimensions={}\n"
     "  h = f32[8,32] maximum(a1, zb)\n"
     "  d2 = f32[8,10] dot(h, w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
     "  bb2 = f32[8,10] broadcast(b2), dimensions={1}\n"
     "  lg = f32[8,10] add(d2, bb2)\n"
     "  ninf = f32[] constant(-inf)\n"
     "  mx = f32[8] reduce(lg, ninf), dimensions={1}, to_apply=max_f32\n"
     "  mxb = f32[8,10] broadcast(mx), dimensions={0}\n"
     "  sh = f32[8,10] subtract(lg, mxb)\n"
     "  ex = f32[8,10] exponential(sh)\n"
     "  sm = f32[8] reduce(ex, z), dimensions={1}, to_apply=add_f32\n"
     "  smb = f32[8,10] broadcast(sm), dimensions={0}\n"
     "  ROOT p = f32[8,10] divide(ex, smb)\n"
     "}\n"},
    {"elementwise_select", 1,
     "HloModule elementwise_select\n"
     "ENTRY main {\n"
     "  x = f32[6,7] parameter(0)\n"
     "  y = f32[6,7] parameter(1)\n"
     "  c = f32[] constant(0.5)\n"
     "  cb = f32[6,7] broadcast(c), dimensions={}\n"
     "  gt = pred[6,7] compare(x, cb), direction=GT\n"
     "  n = f32[6,7] negate(y)\n"
     "  s = f32[6,7] select(gt, x, n)\n"
     "  io = s32[6,7] iota(), iota_dimension=1\n"
     "  fi = f32[6,7] convert(io)\n"
     "  m = f32[6,7] multiply(s, fi)\n"
     "  t = f32[7,6] transpose(m), dimensions={1,0}\n"
     "  r = f32[42] reshape(t)\n"
     "  sl = f32[20] slice(r), slice={[2:42:2]}\n"
     "  ROOT o = f32[20] tanh(sl)\n"
     "}\n"},
    {"reductions", 2,
     "HloModule reductions\n" REDUCERS "ENTRY main {\n"
     "  x = f32[12,9] parameter(0)\n"
     "  z = f32[] constant(0)\n"
     "  ninf = f32[] constant(-inf)\n"
     "  sq = f32[12,9] multiply(x, x)\n"
     "  rows = f32[12] reduce(sq, z), dimensions={1}, to_apply=add_f32\n"
     "  cols = f32[9] reduce(x, ninf), dimensions={0}, to_apply=max_f32\n"
     "  e = f32[12,9] exponential(x)\n"
     "  all = f32[] reduce(e, z), dimensions={0,1}, to_apply=add_f32\n"
     "  rows2 = f32[12] reduce(x, z), dimensions={1}, to_apply=add_f32\n"
     "  mean = f32[12] add(rows, rows2)\n"
     "  ROOT t = (f32[12], f32[9], f32[]) tuple(mean, cols, all)\n"
     "}\n"},
    {"layer_norm", 1, /* one row kernel */
     "HloModule layer_norm\n" REDUCERS "ENTRY main {\n"
     "  x = f32[4,32] parameter(0)\n"
     "  g = f32[32] parameter(1)\n"
     "  z = f32[] constant(0)\n"
     "  inv = f32[] constant(0.03125)\n"
     "  s = f32[4] reduce(x, z), dimensions={1}, to_apply=add_f32\n"
     "  x2 = f32[4,32] multiply(x, x)\n"
     "  s2 = f32[4] reduce(x2, z), dimensions={1}, to_apply=add_f32\n"
     "  invb = f32[4] broadcast(inv), dimensions={}\n"
     "  mean = f32[4] multiply(s, invb)\n"
     "  m2 = f32[4] multiply(s2, invb)\n"
     "  mm = f32[4] multiply(mean, mean)\n"
     "  var = f32[4] subtract(m2, mm)\n"
     "  eps = f32[] constant(0.001)\n"
     "  epsb = f32[4] broadcast(eps), dimensions={}\n"
     "  ve = f32[4] add(var, epsb)\n"
     "  rs = f32[4] rsqrt(ve)\n"
     "  meanb = f32[4,32] broadcast(mean), dimensions={0}\n"
     "  xc = f32[4,32] subtract(x, meanb)\n"
     "  rsb = f32[4,32] broadcast(rs), dimensions={0}\n"
     "  gb = f32[4,32] broadcast(g), dimensions={1}\n"
     "  y = f32[4,32] multiply(xc, rsb)\n"
     "  ROOT o = f32[4,32] multiply(y, gb)\n"
     "}\n"},
    {"dot_chain", 1,
     "HloModule dot_chain\n"
     "ENTRY main {\n"
     "  a = f32[5,7] parameter(0)\n"
     "  b = f32[5,3] parameter(1)\n"
     "  c = f32[4,3] parameter(2)\n"
     "  at = f32[7,5] transpose(a), dimensions={1,0}\n"
     "  ab = f32[7,3] dot(at, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
     "  ct = f32[3,4] transpose(c), dimensions={1,0}\n"
     "  abc = f32[7,4] dot(ab, ct), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
     "  t = f32[7,4] tanh(abc)\n"
     "  p = f32[2,3,4] parameter(3)\n"
     "  q = f32[2,5,4] parameter(4)\n"
     "  qt = f32[2,4,5] transpose(q), dimensions={0,2,1}\n"
     "  bd = f32[2,3,5] dot(p, qt), lhs_batch_dims={0}, lhs_contracting_dims={2}, "
     "rhs_batch_dims={0}, rhs_contracting_dims={1}\n"
     "  e = f32[2,3,5] exponential(bd)\n"
     "  ROOT o = (f32[7,4], f32[2,3,5]) tuple(t, e)\n"
     "}\n"},
    {"gram_matrix", 2,
     "HloModule gram_matrix\n"
     "ENTRY main {\n"
     "  x = f32[4,6] parameter(0)\n"
     "  xt = f32[6,4] transpose(x), dimensions={1,0}\n"
     "  g = f32[6,6] dot(xt, xt), lhs_contracting_dims={1}, rhs_contracting_dims={1}\n"
     "  z = f32[] constant(0)\n"
     "  zb = f32[6,6] broadcast(z), dimensions={}\n"
     "  r = f32[6,6] maximum(g, zb)\n"
     "  y = f32[6,4] parameter(1)\n"
     "  yt = f32[4,6] transpose(y), dimensions={1,0}\n"
     "  h = f32[4,4] dot(yt, xt), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
     "  hn = f32[4,4] negate(h)\n"
     "  ROOT o = (f32[6,6], f32[4,4]) tuple(r, hn)\n"
     "}\n"},
    /* Regressions: sibling merges that closed a cycle through other
     * multi-output groups (generated programs, seeds 1027 and 5997). */
    {"sibling_cycle_a", 1,
     "HloModule progen_1027\n"
     "\n"
     "ENTRY main {\n"
     "  v0 = f32[4] parameter(0)\n"
     "  v1 = f32[4] parameter(1)\n"
     "  v2 = f32[4] minimum(v1, v0)\n"
     "  v3 = f32[4] abs(v1)\n"
     "  v4 = f32[4] transpose(v2), dimensions={0}\n"
     "  v5 = f32[4] abs(v0)\n"
     "  v6 = f32[4] sqrt(v5)\n"
     "  v7 = f32[4] minimum(v0, v3)\n"
     "  v8 = f32[] dot(v3, v1), lhs_contracting_dims={0}, rhs_contracting_dims={0}\n"
     "  v9 = f32[4] subtract(v7, v4)\n"
     "  v10 = f32[] dot(v7, v3), lhs_contracting_dims={0}, rhs_contracting_dims={0}\n"
     "  v11 = f32[] tanh(v8)\n"
     "  v12 = f32[4] subtract(v1, v4)\n"
     "  v13 = f32[] dot(v12, v2), lhs_contracting_dims={0}, rhs_contracting_dims={0}\n"
     "  v14 = f32[] multiply(v10, v10)\n"
     "  v15 = f32[] constant(1)\n"
     "  v16 = f32[] add(v14, v15)\n"
     "  v17 = f32[] divide(v11, v16)\n"
     "  v18 = f32[4,4,4] broadcast(v2), dimensions={0}\n"
     "  v19 = pred[4] compare(v3, v12), direction=GT\n"
     "  v20 = f32[4] constant({ 0.75, -0.125, -0.125, 1 })\n"
     "  v21 = f32[4] select(v19, v20, v3)\n"
     "  ROOT v22 = (f32[4], f32[4], f32[], f32[], f32[4,4,4], f32[4]) tuple(v6, v9, v13, v17, v18, "
     "v21)\n"
     "}\n"},
    {"sibling_cycle_b", 1,
     "HloModule progen_5997\n"
     "\n"
     "ENTRY main {\n"
     "  v0 = f32[6] parameter(0)\n"
     "  v1 = f32[6] multiply(v0, v0)\n"
     "  v2 = f32[6] log-plus-one(v1)\n"
     "  v3 = f32[6] constant({ 0.875, 0.25, 0.25, -0.75, -0.125, -0.125 })\n"
     "  v4 = f32[6] multiply(v0, v3)\n"
     "  v5 = f32[] constant(-0.53125)\n"
     "  v6 = f32[] constant(0.3125)\n"
     "  v7 = f32[6] clamp(v5, v0, v6)\n"
     "  v8 = f32[] dot(v2, v0), lhs_contracting_dims={0}, rhs_contracting_dims={0}\n"
     "  v9 = f32[6] multiply(v7, v7)\n"
     "  v10 = f32[] constant(1)\n"
     "  v11 = f32[6] broadcast(v10), dimensions={}\n"
     "  v12 = f32[6] add(v9, v11)\n"
     "  v13 = f32[6] log(v12)\n"
     "  v14 = f32[] tanh(v8)\n"
     "  v15 = f32[6] negate(v7)\n"
     "  v16 = f32[6] maximum(v15, v15)\n"
     "  v17 = f32[] dot(v16, v13), lhs_contracting_dims={0}, rhs_contracting_dims={0}\n"
     "  v18 = f32[3] broadcast(v17), dimensions={}\n"
     "  v19 = f32[6] add(v16, v0)\n"
     "  v20 = f32[1,3] broadcast(v18), dimensions={1}\n"
     "  v21 = f32[6] tanh(v15)\n"
     "  v22 = f32[6] transpose(v15), dimensions={0}\n"
     "  v23 = f32[6,1,6] broadcast(v21), dimensions={0}\n"
     "  v24 = f32[6] multiply(v13, v13)\n"
     "  v25 = f32[] constant(1)\n"
     "  v26 = f32[6] broadcast(v25), dimensions={}\n"
     "  v27 = f32[6] add(v24, v26)\n"
     "  v28 = f32[6] atan2(v22, v27)\n"
     "  v29 = f32[6,1,6] transpose(v23), dimensions={2,1,0}\n"
     "  ROOT v30 = (f32[6], f32[], f32[6], f32[1,3], f32[6], f32[6,1,6]) tuple(v4, v14, v19, v20, "
     "v28, v29)\n"
     "}\n"},
    {"while_loop", 1,
     "HloModule while_loop\n" REDUCERS "cond {\n"
     "  s = (s32[], f32[6,6]) parameter(0)\n"
     "  i = s32[] get-tuple-element(s), index=0\n"
     "  n = s32[] constant(3)\n"
     "  ROOT lt = pred[] compare(i, n), direction=LT\n"
     "}\n"
     "body {\n"
     "  s = (s32[], f32[6,6]) parameter(0)\n"
     "  i = s32[] get-tuple-element(s), index=0\n"
     "  v = f32[6,6] get-tuple-element(s), index=1\n"
     "  one = s32[] constant(1)\n"
     "  i1 = s32[] add(i, one)\n"
     "  h = f32[] constant(0.25)\n"
     "  hb = f32[6,6] broadcast(h), dimensions={}\n"
     "  vt = f32[6,6] transpose(v), dimensions={1,0}\n"
     "  d = f32[6,6] dot(v, vt), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
     "  m = f32[6,6] multiply(d, hb)\n"
     "  t = f32[6,6] tanh(m)\n"
     "  ROOT r = (s32[], f32[6,6]) tuple(i1, t)\n"
     "}\n"
     "ENTRY main {\n"
     "  x = f32[6,6] parameter(0)\n"
     "  z = s32[] constant(0)\n"
     "  init = (s32[], f32[6,6]) tuple(z, x)\n"
     "  w = (s32[], f32[6,6]) while(init), condition=cond, body=body\n"
     "  v = f32[6,6] get-tuple-element(w), index=1\n"
     "  zf = f32[] constant(0)\n"
     "  ROOT s = f32[6] reduce(v, zf), dimensions={1}, to_apply=add_f32\n"
     "}\n"},
    {"conditional_ints", 1,
     "HloModule conditional_ints\n"
     "b0 {\n"
     "  p = s32[8] parameter(0)\n"
     "  c = s32[] constant(3)\n"
     "  cb = s32[8] broadcast(c), dimensions={}\n"
     "  m = s32[8] multiply(p, cb)\n"
     "  ROOT a = s32[8] add(m, p)\n"
     "}\n"
     "b1 {\n"
     "  p = s32[8] parameter(0)\n"
     "  ROOT n = s32[8] negate(p)\n"
     "}\n"
     "ENTRY main {\n"
     "  x = s32[8] parameter(0)\n"
     "  k = pred[] parameter(1)\n"
     "  y = s32[8] abs(x)\n"
     "  c = s32[8] conditional(k, y, x), true_computation=b0, false_computation=b1\n"
     "  one = s32[] constant(1)\n"
     "  ob = s32[8] broadcast(one), dimensions={}\n"
     "  sh = s32[8] shift-left(c, ob)\n"
     "  ROOT r = s32[8] xor(sh, x)\n"
     "}\n"},
    {"column_major_entry", 1,
     "HloModule column_major_entry, entry_computation_layout={(f32[3,5]{0,1}, "
     "f32[5,3]{1,0})->(f32[5,3]{0,1}, f32[3,5]{1,0})}\n"
     "ENTRY main {\n"
     "  x = f32[3,5] parameter(0)\n"
     "  y = f32[5,3] parameter(1)\n"
     "  xt = f32[5,3] transpose(x), dimensions={1,0}\n"
     "  s = f32[5,3] add(xt, y)\n"
     "  e = f32[5,3] exponential(s)\n"
     "  et = f32[3,5] transpose(e), dimensions={1,0}\n"
     "  r = f32[15] reshape(et)\n"
     "  r2 = f32[3,5] reshape(r)\n"
     "  ROOT t = (f32[5,3], f32[3,5]) tuple(s, r2)\n"
     "}\n"},
};

START_TEST(test_programs) {
  const char *text = k_programs[_i].text;
  outcome o = diff_module(text, strlen(text), k_programs[_i].name, true, 3);
  ck_assert_int_eq(o.ran, 1);
  ck_assert_msg(o.fusions >= k_programs[_i].min_fusions, "%s: %d fusions, expected at least %d",
                k_programs[_i].name, o.fusions, k_programs[_i].min_fusions);
}
END_TEST

/* ---- the corpus ------------------------------------------------------------- */

static char corpus_dir[2048];

static bool find_corpus(void) {
  const char *env = getenv("KILN_CORPUS_DIR");
  snprintf(corpus_dir, sizeof corpus_dir, "%s",
           env && *env ? env : KILN_SOURCE_DIR "/../shared/corpus/xla-hlo");
  DIR *d = opendir(corpus_dir);
  if (d == NULL) return false;
  closedir(d);
  return true;
}

/* Softmax, log-softmax, layernorm and rmsnorm over one dim of random
 * shapes, layouts and types (f32, bf16): bit-identical after every pass;
 * when the dim is the output's minor one and at least 8 long, one row
 * kernel (every reduce inside the fusion). */
START_TEST(test_row_patterns) {
  static const char *const ts[] = {"f32", "bf16"};
  uint64_t rng = 0x9e3779b97f4a7c15ull ^ ((uint64_t)_i * 7919);
  for (int it = 0; it < 4; it++) {
#define RND(n) ((rng = rng * 6364136223846793005ull + 1442695040888963407ull) >> 33) % (n)
    int pat = (int)((_i + it) % 4);
    uint32_t rank = 2 + (uint32_t)RND(2), minor = rank - 1;
    int64_t dims[3];
    for (uint32_t d = 0; d < rank; d++) dims[d] = 1 + (int64_t)RND(d + 1 == rank ? 40 : 5);
    char L[16] = "";
    bool swap = RND(3) == 0;
    if (swap) minor = rank - 2;
    for (uint32_t q = 0; q < rank; q++) {
      uint32_t d = swap && q < 2 ? (q == 0 ? rank - 2 : rank - 1) : rank - 1 - q;
      snprintf(L + strlen(L), sizeof L - strlen(L), "%s%u", q ? "," : "", d);
    }
    uint32_t rd = RND(3) == 0 ? (uint32_t)RND(rank) : minor;
    const char *t = ts[RND(2)];
    char S[64] = "", R[64] = "", K[16] = "";
    for (uint32_t d = 0; d < rank; d++) {
      snprintf(S + strlen(S), sizeof S - strlen(S), "%s%lld", d ? "," : "", (long long)dims[d]);
      if (d == rd) continue;
      snprintf(R + strlen(R), sizeof R - strlen(R), "%s%lld", R[0] ? "," : "", (long long)dims[d]);
      snprintf(K + strlen(K), sizeof K - strlen(K), "%s%u", K[0] ? "," : "", d);
    }
    char text[4096];
    int o = snprintf(text, sizeof text,
                     "HloModule rows\nmx { a = %s[] parameter(0)  b = %s[] parameter(1)  ROOT m = "
                     "%s[] maximum(a, b) }\nad { a = %s[] parameter(0)  b = %s[] parameter(1)  "
                     "ROOT s = %s[] add(a, b) }\nENTRY main {\n  p = %s[%s]{%s} parameter(0)\n"
                     "  z = %s[] constant(0)\n  ninf = %s[] constant(-inf)\n",
                     t, t, t, t, t, t, t, S, L, t, t);
#define ADD(...) o += snprintf(text + o, sizeof text - (size_t)o, __VA_ARGS__)
#define BC(name, src) \
  ADD("  " name " = %s[%s]{%s} broadcast(" src "), dimensions={%s}\n", t, S, L, K)
#define EW(name, op, a, b) ADD("  " name " = %s[%s]{%s} " op "(" a ", " b ")\n", t, S, L)
#define RED(name, src, fn) \
  ADD("  " name " = %s[%s] reduce(" src ", %s), dimensions={%u}, to_apply=" fn "\n", t, R, \
      strcmp(fn, "mx") ? "z" : "ninf", rd)
    if (pat <= 1) {
      RED("m", "p", "mx");
      BC("mb", "m");
      EW("d", "subtract", "p", "mb");
      ADD("  e = %s[%s]{%s} exponential(d)\n", t, S, L);
      RED("s", "e", "ad");
      if (pat == 0) {
        BC("sb", "s");
        EW("o", "divide", "e", "sb");
      } else {
        ADD("  ls = %s[%s] log(s)\n", t, R);
        BC("lb", "ls");
        EW("o", "subtract", "d", "lb");
      }
    } else {
      const char *x = "p";
      ADD("  nc = %s[] constant(%lld)\n  nb = %s[%s] broadcast(nc), dimensions={}\n", t,
          (long long)dims[rd], t, R);
      if (pat == 2) {
        RED("s1", "p", "ad");
        ADD("  mean = %s[%s] divide(s1, nb)\n", t, R);
        BC("mbc", "mean");
        EW("c", "subtract", "p", "mbc");
        x = "c";
      }
      ADD("  sq = %s[%s]{%s} multiply(%s, %s)\n", t, S, L, x, x);
      RED("v", "sq", "ad");
      ADD("  var = %s[%s] divide(v, nb)\n  rs = %s[%s] rsqrt(var)\n", t, R, t, R);
      BC("rb", "rs");
      ADD("  o = %s[%s]{%s} multiply(%s, rb)\n", t, S, L, x);
    }
    ADD("}\n");
    char *root = strstr(text, "\n  o = ");
    ck_assert_ptr_nonnull(root);
    memmove(root + 8, root + 3, strlen(root + 3) + 1); /* "  o =" -> "  ROOT o =" */
    memcpy(root + 3, "ROOT ", 5);
#undef RED
#undef EW
#undef BC
#undef ADD
    ck_assert_int_lt(o, (int)sizeof text);
    outcome out = diff_module(text, strlen(text), "row pattern", true, 2);
    ck_assert_int_eq(out.ran, 1);
    if (rd == minor && dims[rd] >= 8)
      ck_assert_msg(out.fusions == 1, "%d fusions for\n%s", out.fusions, text);
#undef RND
  }
}
END_TEST

START_TEST(test_corpus) {
  if (!find_corpus()) {
    fprintf(stderr, "test_corpus: skipped: no corpus at %s\n", corpus_dir);
    return;
  }
  DIR *d = opendir(corpus_dir);
  struct dirent *de;
  int seen = 0, ran = 0, fusions = 0;
  while ((de = readdir(d)) != NULL) {
    size_t l = strlen(de->d_name);
    if (l < 5 || strcmp(de->d_name + l - 4, ".hlo") != 0) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", corpus_dir, de->d_name);
    size_t len;
    char *text = fh_read_file(path, &len);
    if (text == NULL) continue;
    seen++;
    outcome o = diff_module(text, len, de->d_name, false, 2);
    ran += o.ran;
    fusions += o.fusions;
    free(text);
  }
  closedir(d);
  fprintf(stderr, "test_corpus: %d modules, %d compared on the interpreter, %d fusions\n", seen,
          ran, fusions);
  ck_assert_int_gt(seen, 0);
  ck_assert_int_gt(ran, seen / 2);
}
END_TEST

/* ---- random programs ----------------------------------------------------------- */

START_TEST(test_generated) {
  static const unsigned fams[] = {
      KILN_PROGEN_ELEMENTWISE | KILN_PROGEN_BROADCAST | KILN_PROGEN_SELECT,
      KILN_PROGEN_ELEMENTWISE | KILN_PROGEN_REDUCE | KILN_PROGEN_BROADCAST,
      KILN_PROGEN_ELEMENTWISE | KILN_PROGEN_DOT | KILN_PROGEN_TRANSPOSE | KILN_PROGEN_BROADCAST,
      KILN_PROGEN_ELEMENTWISE | KILN_PROGEN_RESHAPE | KILN_PROGEN_SLICE | KILN_PROGEN_TRANSPOSE,
      0, /* everything */
  };
  int ran = 0, total = 0, fusions = 0;
  const char *env = getenv("KILN_FUSION_SEEDS"); /* longer soak runs */
  uint64_t nseeds = env && atoi(env) > 0 ? (uint64_t)atoi(env) : 120;
  for (uint64_t seed = 1; seed <= nseeds; seed++) {
    kiln_progen_options o = {0};
    o.seed = seed;
    o.ninstrs = 12 + (int)(seed % 20);
    o.nparams = 1 + (int)(seed % 3);
    o.dtype = seed % 4 == 0 ? KILN_F64 : KILN_F32;
    o.families = fams[seed % (sizeof fams / sizeof fams[0])];
    char *text = kiln_progen_text(&o);
    if (text == NULL) continue;
    char what[64];
    snprintf(what, sizeof what, "progen seed %llu", (unsigned long long)seed);
    outcome r = diff_module(text, strlen(text), what, false, 1);
    ran += r.ran;
    fusions += r.fusions;
    total++;
    kiln_free(text);
  }
  fprintf(stderr, "test_generated: %d programs, %d compared on the interpreter, %d fusions\n",
          total, ran, fusions);
  ck_assert_int_gt(ran, total / 2);
  ck_assert_int_gt(fusions, total);
}
END_TEST

/* ---- the pipeline ------------------------------------------------------------ */

START_TEST(test_pipeline_levels) {
  const char *text = k_programs[0].text;
  for (int level = 0; level <= 2; level++) {
    kiln_module *m = fh_parse(text, strlen(text), "mlp");
    kiln_status st;
    kiln_status_clear(&st);
    kiln_pipeline_options po = {0};
    po.opt_level = level;
    po.verify_each = true;
    int rc = kiln_pipeline_run(m, &po, NULL, NULL, &st);
    ck_assert_msg(rc == 0, "level %d: %s: %s", level, st.where, st.msg);
    /* Fusion and layout only from level 1; scheduling always. */
    ck_assert_int_eq(count_fusions(m) > 0, level >= 1);
    ck_assert_int_eq(m->entry_layout != NULL, level >= 1);
    ck_assert_int_eq(m->is_scheduled, 1);
    kiln_module_destroy(m);
  }
  uint32_t n;
  const kiln_pass *ps = kiln_pipeline_passes(&n);
  int fi = -1, li = -1, si = -1;
  for (uint32_t i = 0; i < n; i++) {
    if (!strcmp(ps[i].name, "fusion")) fi = (int)i;
    if (!strcmp(ps[i].name, "layout")) li = (int)i;
    if (!strcmp(ps[i].name, "schedule")) si = (int)i;
  }
  ck_assert(fi >= 0 && fi < li && li < si);
}
END_TEST

START_TEST(test_idempotent) {
  /* Running the three passes twice changes nothing the second time. */
  for (size_t i = 0; i < sizeof k_programs / sizeof k_programs[0]; i++) {
    const char *text = k_programs[i].text;
    kiln_module *m = fh_parse(text, strlen(text), k_programs[i].name);
    for (size_t p = 0; p < 3; p++) fh_run_pass(m, k_passes[p].fn, k_passes[p].name, NULL, 2);
    char *once = kiln_module_print(m, NULL);
    for (size_t p = 0; p < 3; p++) fh_run_pass(m, k_passes[p].fn, k_passes[p].name, NULL, 2);
    char *twice = kiln_module_print(m, NULL);
    ck_assert_msg(strcmp(once, twice) == 0, "%s: second run changed:\n%s\n----\n%s",
                  k_programs[i].name, once, twice);
    kiln_free(once);
    kiln_free(twice);
    kiln_module_destroy(m);
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("fusion_diff");
  TCase *tc = tcase_create("programs");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_programs, 0, (int)(sizeof k_programs / sizeof k_programs[0]));
  tcase_add_test(tc, test_pipeline_levels);
  tcase_add_loop_test(tc, test_row_patterns, 0, 8);
  tcase_add_test(tc, test_idempotent);
  suite_add_tcase(s, tc);
  TCase *big = tcase_create("corpus_and_generated");
  tcase_set_timeout(big, 300);
  tcase_add_test(big, test_corpus);
  tcase_add_test(big, test_generated);
  suite_add_tcase(s, big);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
