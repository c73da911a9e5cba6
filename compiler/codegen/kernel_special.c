/* Kernels that are not one value per output element: dynamic-update-slice
 * in place (iterates over the update, in rows of its minor dimension when
 * they are 8 or longer), dynamic-slice and in-place dynamic-update-slice
 * between buffers of one layout as copies of contiguous runs (the start
 * indices clamped once per invocation), scatter (updates applied in order
 * through the combiner, as XLA's evaluator and the interpreter do: when
 * every update window is one index wide along some operand dimension and
 * at least 8 elements large, the range is blocks of that dimension, each
 * iteration walking all updates and applying those that land in its
 * block, so that blocks run on different threads and each element still
 * sees its updates in order (on cpu one walk per invocation serves all of
 * its blocks); a row scatter, one index per update row, first sorts its
 * updates by block into scratch, once, so that a block walks only its
 * own; otherwise one sequential iteration),
 * select-and-scatter (likewise sequential: the result filled with the init
 * value, then for each source element the window position `select`
 * prefers, scanned in row-major order, combined with it through
 * `scatter`), sort (one iteration per row: a stable bottom-up merge sort of
 * a permutation under the comparator, then a gather of every operand
 * through it), and topk (one iteration per row: a heap of the k best, never
 * a sort of the row).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "compiler/buffer_assign.h"
#include "compiler/codegen/kernel.h"

static const kiln_instr *ins_of(kiln__codegen *g, kiln_id id) { return g->mod.m->instrs[id]; }

static void strides_of(const kiln_shape *s, int64_t *st) {
  int64_t m2m[KILN__EMIT_MAXR], acc = 1;
  kiln_shape_minor_to_major(s, m2m);
  for (uint32_t k = 0; k < s->rank; k++) {
    st[m2m[k]] = acc;
    acc *= s->dims[m2m[k]];
  }
}

static int fail(kiln__codegen *g, const kiln_instr *ins, const char *what) {
  char where[KILN_STATUS_WHERE_MAX];
  kiln_instr_where(g->mod.m, ins, where, sizeof where);
  return kiln_status_set(g->st, KILN_EUNIMPL, where, "the %s backend cannot compile %s %s: %s",
                         g->mod.target->name, kiln_opcode_name(ins->op), where, what);
}

/* ---- dynamic-update-slice in place -------------------------------------- */

/* The update's minor dimension (in its layout) and its size. */
static int64_t minor_of(const kiln_shape *s, uint32_t *md) {
  int64_t m2m[KILN__EMIT_MAXR];
  kiln_shape_minor_to_major(s, m2m);
  *md = (uint32_t)m2m[0];
  return s->dims[*md];
}

#define DUS_TILE 16 /* rows and columns of one tile of a transposing update */

/* Whether the update of dynamic-update-slice d (inside a fusion) is read
 * across its rows: through a transpose, or a reshape that moves elements,
 * on the way from the kernel's inputs (k's binds). Walked row by row, such
 * an update reads one element per cache line; in tiles, a few lines that
 * stay in cache. */
static bool reads_across(kiln__codegen *g, const kiln__kernel_spec *k, const kiln_instr *d) {
  const kiln_module *m = g->mod.m;
  kiln_id stack[64];
  uint32_t top = 0, seen = 0;
  stack[top++] = d->operands[1];
  while (top && seen < 256) {
    const kiln_instr *x = m->instrs[stack[--top]];
    seen++;
    bool bound = x->op == KILN_OP_PARAMETER;
    for (uint32_t i = 0; i < k->nbinds && !bound; i++) bound = k->binds[i].id == x->id;
    if (bound) continue;
    if (x->op == KILN_OP_TRANSPOSE || (x->op == KILN_OP_RESHAPE && !kiln__is_alias_op(m, x)))
      return true;
    for (uint32_t j = 0; j < x->noperands && top < 64; j++)
      if (x->operands[j] < m->ninstrs) stack[top++] = x->operands[j];
  }
  return false;
}

/* Reads the scalar start indices of dynamic-update-slice d once, into
 * *top (before the loops), and binds each to its C variable: read in the
 * loop, each is a load the compiler must assume the stores change (a local
 * pointer's restrict is not honoured), once per element. */
static int hoist_starts(kiln__emit_fn *f, const kiln_instr *d, kiln_sbuf *top) {
  const kiln_module *m = f->mod->m;
  kiln_sbuf *body = f->out;
  int indent = f->indent, rc = 0;
  f->out = top;
  f->indent = 1;
  for (uint32_t k = 2; rc == 0 && k < d->noperands; k++) {
    const kiln_instr *x = m->instrs[d->operands[k]];
    bool seen = false;
    for (uint32_t j = 2; j < k; j++) seen |= d->operands[j] == x->id;
    if (seen || !kiln_shape_is_array(&x->shape) || x->shape.rank != 0) continue;
    kiln__ix y = {0};
    uint32_t v;
    if ((rc = kiln__emit_value1(f, x->id, &y, &v))) break;
    char name[16];
    const char *nm = name;
    snprintf(name, sizeof name, "v%u", v);
    rc = kiln__emit_bind(f, x->id, NULL, NULL, &nm, 1);
  }
  f->out = body;
  f->indent = indent;
  return rc;
}

/* Walks the update: in rows (one iteration per row of its minor dimension,
 * an inner loop along it, as the loop kernels do) when the rows are at
 * least 8 long, so the copy needs no division per element; else one
 * iteration per element. */
int kiln__kernel_dus(kiln__codegen *g, const kiln__kernel_spec *k, kiln_id dus, uint32_t *kernel,
                     uint64_t *range) {
  const kiln_instr *d = ins_of(g, dus);
  const kiln_shape *us = &ins_of(g, d->operands[1])->shape;
  int64_t n = kiln_shape_elements(us);
  uint32_t md = 0;
  int64_t minor = us->rank ? minor_of(us, &md) : 1;
  bool rows = us->rank >= 2 && minor >= 8 && n > 0;
  int64_t nrows = rows ? n / minor : 0;
  bool tiled = rows && minor >= 2 * DUS_TILE && nrows >= 2 * DUS_TILE && reads_across(g, k, d);
  kiln_sbuf body = KILN_SBUF_INIT, out = KILN_SBUF_INIT, top = KILN_SBUF_INIT;
  kiln__emit_fn f;
  int rc = kiln__kernel_begin(g, k, &body, &f, tiled ? 5 : rows ? 3 : 2);
  kiln__ix u, t;
  if (rc == 0) rc = hoist_starts(&f, d, &top);
  if (rc == 0) rc = kiln__ix_new(&f, us->rank, &u);
  if (rc) goto done;
  char lin[96];
  if (rows)
    snprintf(lin, sizeof lin, "(r * %lld + j)", (long long)minor);
  else
    snprintf(lin, sizeof lin, "i");
  for (uint32_t i = 0; i < us->rank; i++) {
    if (rows && i == md)
      kiln__ix_set(&u, i, "j");
    else
      kiln__ix_set(&u, i, "o%u", i);
  }
  u.root = true;
  u.lin = lin;
  u.lin_shape = us;
  uint32_t v;
  rc = kiln__emit_dus_target(&f, d, &u, &v, &t);
  if (rc == 0 && f.rc) rc = f.rc;
  if (rc) goto done;
  char off[512], vs[16], e[64];
  kiln__ix_offset(&f, &t, k->out_shape[0], off, sizeof off);
  snprintf(vs, sizeof vs, "v%u", v);
  kiln__emit_store_expr(k->out_shape[0]->dtype, vs, e, sizeof e);
  kiln__emit_line(&f, "b%u[%s] = %s;", k->out_arg[0], off, e);
  char loop[256];
  g->mod.target->range_loop(loop, sizeof loop, tiled ? "rb" : rows ? "r" : "i");
  kiln_sbuf_puts(&out, kiln_sbuf_str(&top));
  kiln_sbuf_printf(&out, "  %s {\n", loop);
  if (tiled) {
    /* Tiles of DUS_TILE rows by DUS_TILE columns: each tile's reads along
     * the other dim stay in cache while its rows are written. */
    kiln_sbuf_printf(&out,
                     "    for (int64_t j0 = 0; j0 < %lld; j0 += %d) {\n"
                     "      const int64_t je = j0 + %d < %lld ? j0 + %d : %lld;\n"
                     "      for (int64_t r = rb * %d; r < rb * %d + %d && r < %lld; r++) {\n",
                     (long long)minor, DUS_TILE, DUS_TILE, (long long)minor, DUS_TILE,
                     (long long)minor, DUS_TILE, DUS_TILE, DUS_TILE, (long long)nrows);
    kiln__kernel_decompose(&out, us, "r", 1, "o", 4);
    kiln_sbuf_puts(&out, "        for (int64_t j = j0; j < je; j++) {\n");
    kiln_sbuf_puts(&out, kiln_sbuf_str(&body));
    kiln_sbuf_puts(&out, "        }\n      }\n    }\n  }\n");
    *range = (uint64_t)((nrows + DUS_TILE - 1) / DUS_TILE);
  } else if (rows) {
    kiln__kernel_decompose(&out, us, "r", 1, "o", 2);
    kiln_sbuf_printf(&out, "    for (int64_t j = 0; j < %lld; j++) {\n", (long long)minor);
    kiln_sbuf_puts(&out, kiln_sbuf_str(&body));
    kiln_sbuf_puts(&out, "    }\n  }\n");
    *range = (uint64_t)(n / minor);
  } else {
    kiln__kernel_decompose(&out, us, "i", 0, "o", 2);
    kiln_sbuf_puts(&out, kiln_sbuf_str(&body));
    kiln_sbuf_puts(&out, "  }\n");
    *range = (uint64_t)(n > 0 ? n : 0);
  }
  *kernel = g->nkernels;
  kiln__kernel_finish(g, k, kiln_sbuf_str(&out), *range);
done:
  kiln__emit_fn_free(&f);
  kiln_sbuf_free(&body);
  kiln_sbuf_free(&out);
  kiln_sbuf_free(&top);
  return rc;
}

/* ---- dynamic slices as block copies ------------------------------------ */

#define WINDOW_PIECE 16384 /* elements of a run one iteration copies, at most */

/* Argument number and buffer shape of bound instruction id (its leaf 0). */
static bool bound_arg(const kiln__kernel_spec *k, kiln_id id, uint32_t *arg, const kiln_shape **s) {
  for (uint32_t i = 0; i < k->nbinds; i++)
    if (k->binds[i].id == id && k->binds[i].nleaves == 1 && k->binds[i].args &&
        k->binds[i].shapes) {
      *arg = k->binds[i].args[0];
      *s = k->binds[i].shapes[0];
      return true;
    }
  return false;
}

/* Emits "const int64_t ws<d> = <start d of ins, clamped to [0, hi]>;" once,
 * before any loop: start operands from `first` on, one scalar per dim or
 * one vector (what the emitter's dynamic-slice reads per element). */
static int emit_start(kiln__emit_fn *f, const kiln_instr *ins, uint32_t first, uint32_t d,
                      int64_t hi) {
  const kiln_module *m = f->mod->m;
  uint32_t r = m->instrs[ins->operands[0]]->shape.rank, nidx = ins->noperands - first, v;
  kiln__ix x = {0};
  kiln_id src;
  int rc;
  if (nidx == 1 && r != 1 && m->instrs[ins->operands[first]]->shape.rank == 1) {
    src = ins->operands[first];
    if ((rc = kiln__ix_new(f, 1, &x))) return rc;
    kiln__ix_set(&x, 0, "%u", d);
  } else {
    if (nidx != r) return KILN_EINVAL;
    src = ins->operands[first + d];
  }
  kiln_dtype t = m->instrs[src]->shape.dtype;
  if (!kiln_dtype_is_integral(t)) return KILN_EINVAL;
  if ((rc = kiln__emit_value1(f, src, &x, &v))) return rc;
  if (t == KILN_U64)
    kiln__emit_line(f,
                    "const int64_t ws%u = kclampi(v%u > (uint64_t)INT64_MAX ? INT64_MAX : "
                    "(int64_t)v%u, %lld);",
                    d, v, v, (long long)hi);
  else
    kiln__emit_line(f, "const int64_t ws%u = kclampi((int64_t)v%u, %lld);", d, v, (long long)hi);
  return 0;
}

/* The window of dynamic-slice or in-place dynamic-update-slice `ins`
 * (k->root) copied between two buffers of one element type and one layout
 * in runs: the physically minor dims that the window, the source and the
 * destination all span whole, and the next dim's window, are one
 * contiguous run (a [1,256,256] slice of [8,256,256] is one run of 65536
 * elements); one iteration per run, its start computed from the start
 * indices clamped once per invocation, not per element. The bits move as
 * they are (no conversion), as the interpreter's copy does. *done is false
 * (nothing written) when the buffers differ in type or layout or the runs
 * would be shorter than 8 elements, where the loop kernels do better. */
int kiln__kernel_window_copy(kiln__codegen *g, const kiln__kernel_spec *k, uint32_t *kernel,
                             uint64_t *range, bool *done) {
  const kiln_instr *ins = ins_of(g, k->root);
  bool dus = ins->op == KILN_OP_DYNAMIC_UPDATE_SLICE;
  *done = false;
  if ((!dus && ins->op != KILN_OP_DYNAMIC_SLICE) || k->nouts != 1 || ins->noperands < 2) return 0;
  uint32_t src, dst = k->out_arg[0];
  const kiln_shape *ss, *ds = k->out_shape[0];
  if (!bound_arg(k, ins->operands[dus ? 1 : 0], &src, &ss)) return 0;
  const kiln_shape *win = dus ? ss : &ins->shape, *big = dus ? ds : ss;
  uint32_t r = win->rank;
  if (!kiln_shape_is_array(ss) || !kiln_shape_is_array(ds) || ss->dtype != ds->dtype ||
      ss->rank != r || ds->rank != r || r > KILN__EMIT_MAXR || kiln_shape_is_dynamic(ss) ||
      kiln_shape_is_dynamic(ds))
    return 0;
  int64_t m2s[KILN__EMIT_MAXR], m2d[KILN__EMIT_MAXR], sst[KILN__EMIT_MAXR], dst_[KILN__EMIT_MAXR];
  kiln_shape_minor_to_major(ss, m2s);
  kiln_shape_minor_to_major(ds, m2d);
  if (r && memcmp(m2s, m2d, r * sizeof *m2s) != 0) return 0;
  for (uint32_t d = 0; d < r; d++)
    if (big->dims[d] < win->dims[d]) return 0;
  strides_of(ss, sst);
  strides_of(ds, dst_);
  /* Run: m2s[0..nrun) */
  uint32_t nrun = r ? 1 : 0;
  int64_t run = r ? win->dims[m2s[0]] : 1;
  while (nrun < r && win->dims[m2s[nrun - 1]] == big->dims[m2s[nrun - 1]]) {
    run *= win->dims[m2s[nrun]];
    nrun++;
  }
  int64_t n = kiln_shape_elements(win);
  if (n <= 0 || run < 8) return 0;
  kiln_sbuf body = KILN_SBUF_INIT, out = KILN_SBUF_INIT;
  kiln__emit_fn f;
  int rc = kiln__kernel_begin(g, k, &body, &f, 1);
  for (uint32_t d = 0; rc == 0 && d < r; d++)
    rc = emit_start(&f, ins, dus ? 2 : 1, d, big->dims[d] - win->dims[d]);
  if (rc == 0 && f.rc) rc = f.rc;
  if (rc) {
    if (rc == KILN_EINVAL) rc = fail(g, ins, "malformed start indices");
    goto done;
  }
  kiln_sbuf_puts(&out, kiln_sbuf_str(&body));
  char loop[256];
  g->mod.target->range_loop(loop, sizeof loop, "r");
  /* A long run is cut into pieces of WINDOW_PIECE elements, so that a step
   * can still be split across threads. */
  int64_t pieces = (run + WINDOW_PIECE - 1) / WINDOW_PIECE;
  kiln_sbuf_printf(&out, "  %s {\n    int64_t wq = r / %lld, wp = (r %% %lld) * %lld;\n", loop,
                   (long long)pieces, (long long)pieces, (long long)WINDOW_PIECE);
  /* The window's position of run r in its outer dims, minor first; the
   * source (dynamic-slice) or the destination (update) adds the starts. */
  char off[2][1024];
  size_t len[2] = {0, 0};
  off[0][0] = off[1][0] = '\0';
  for (uint32_t j = 0; j < r; j++) {
    uint32_t d = (uint32_t)m2s[j];
    bool outer = j >= nrun;
    if (outer && j + 1 < r)
      kiln_sbuf_printf(&out, "    const int64_t wo%u = wq %% %lld;\n    wq /= %lld;\n", d,
                       (long long)win->dims[d], (long long)win->dims[d]);
    else if (outer)
      kiln_sbuf_printf(&out, "    const int64_t wo%u = wq;\n", d);
    for (int w = 0; w < 2; w++) {
      bool starts = (w == 0) != dus; /* w 0: source, 1: destination */
      int64_t st = w == 0 ? sst[d] : dst_[d];
      if (!starts && !outer) continue;
      char term[96];
      if (starts && outer)
        snprintf(term, sizeof term, " + (ws%u + wo%u) * %lld", d, d, (long long)st);
      else if (starts)
        snprintf(term, sizeof term, " + ws%u * %lld", d, (long long)st);
      else
        snprintf(term, sizeof term, " + wo%u * %lld", d, (long long)st);
      size_t tl = strlen(term);
      if (len[w] + tl + 1 > sizeof off[w]) {
        rc = fail(g, ins, "index expression too long");
        goto done;
      }
      memcpy(off[w] + len[w], term, tl + 1);
      len[w] += tl;
    }
  }
  kiln_sbuf_printf(&out, "    const int64_t wsi = 0%s, wdi = 0%s;\n", off[0], off[1]);
  kiln_sbuf_printf(&out,
                   "    const int64_t wn = %lld - wp < %lld ? %lld - wp : %lld;\n"
                   "    (void)wq;\n"
                   "    for (int64_t j = wp; j < wp + wn; j++) b%u[wdi + j] = b%u[wsi + j];\n"
                   "  }\n",
                   (long long)run, (long long)WINDOW_PIECE, (long long)run, (long long)WINDOW_PIECE,
                   dst, src);
  *range = (uint64_t)(n / run * pieces);
  *kernel = g->nkernels;
  kiln__kernel_finish(g, k, kiln_sbuf_str(&out), *range);
  *done = kiln_sbuf_failed(&out) == 0 && kiln_sbuf_failed(&body) == 0;
  if (!*done) rc = kiln_status_set(g->st, KILN_ENOMEM, "codegen", "out of memory");
done:
  kiln__emit_fn_free(&f);
  kiln_sbuf_free(&body);
  kiln_sbuf_free(&out);
  return rc;
}

/* ---- scatter ------------------------------------------------------------ */

static const kiln_i64s *ints(const kiln_instr *ins, kiln_attr_key key) {
  static const kiln_i64s none = {NULL, 0};
  const kiln_i64s *l = kiln_instr_attr_ints(ins, key);
  return l ? l : &none;
}

static bool has(const kiln_i64s *l, int64_t v) {
  for (uint32_t i = 0; i < l->n; i++)
    if (l->v[i] == v) return true;
  return false;
}

typedef struct scat {
  const kiln_instr *s, *ind, *upd0;
  uint32_t n, ar, irank;
  int64_t ivd;
  const kiln_i64s *map, *uw, *iw, *obatch, *ibatch;
  uint32_t wd[KILN__EMIT_MAXR], nw;   /* operand window dims */
  uint32_t usd[KILN__EMIT_MAXR], nus; /* update scatter dims */
  int64_t wsize[KILN__EMIT_MAXR];
  int64_t part_dim;   /* operand dim the range is blocks of; -1: one iteration */
  int64_t part_block; /* indices of part_dim per block */
  int64_t part_size;  /* the operand's size along part_dim */
} scat;

#define SCATTER_BLOCKS 32 /* at most, per scatter */

/* The plan of scatter s in module m: 0, or -1 (malformed scatter) or -2
 * (malformed dimension numbers). */
static int plan_of(const kiln_module *m, const kiln_instr *s, scat *p) {
  memset(p, 0, sizeof *p);
  p->s = s;
  p->n = (s->noperands - 1) / 2;
  if (s->noperands % 2 == 0 || p->n == 0 || s->ncalled != 1) return -1;
  const kiln_shape *as = &m->instrs[s->operands[0]]->shape;
  p->ind = m->instrs[s->operands[p->n]];
  p->upd0 = m->instrs[s->operands[p->n + 1]];
  p->ar = as->rank;
  p->irank = p->ind->shape.rank;
  p->ivd = kiln_instr_attr_int(s, KILN_ATTR_INDEX_VECTOR_DIM, p->irank);
  p->map = ints(s, KILN_ATTR_SCATTER_DIMS_TO_OPERAND_DIMS);
  p->uw = ints(s, KILN_ATTR_UPDATE_WINDOW_DIMS);
  p->iw = ints(s, KILN_ATTR_INSERTED_WINDOW_DIMS);
  p->obatch = ints(s, KILN_ATTR_INPUT_BATCHING_DIMS);
  p->ibatch = ints(s, KILN_ATTR_SCATTER_INDICES_BATCHING_DIMS);
  for (uint32_t d = 0; d < p->ar; d++)
    if (!has(p->iw, d) && !has(p->obatch, d)) p->wd[p->nw++] = d;
  const kiln_shape *us = &p->upd0->shape;
  for (uint32_t d = 0; d < us->rank; d++)
    if (!has(p->uw, d)) p->usd[p->nus++] = d;
  if (p->nw != p->uw->n || p->ivd < 0 || p->ivd > p->irank || p->obatch->n != p->ibatch->n)
    return -2;
  for (uint32_t d = 0; d < p->ar; d++) p->wsize[d] = 1;
  for (uint32_t j = 0; j < p->nw; j++) p->wsize[p->wd[j]] = us->dims[p->uw->v[j]];
  /* Blocks of the largest operand dim every window is one index wide in:
   * an update touches one block only, so blocks never share an element.
   * Each block reads every update's indices, so there are fewer blocks
   * for narrower windows (a window of w elements: at most w / 4 blocks,
   * the index reads then cost a fraction of the updates), none below 2. */
  p->part_dim = -1;
  int64_t window = 1;
  for (uint32_t d = 0; d < p->ar; d++) window *= p->wsize[d];
  int64_t blocks = window / 4 < SCATTER_BLOCKS ? window / 4 : SCATTER_BLOCKS;
  for (uint32_t d = 0; d < p->ar && blocks >= 2; d++)
    if (p->wsize[d] == 1 && as->dims[d] >= 2 &&
        (p->part_dim < 0 || as->dims[d] > as->dims[p->part_dim]))
      p->part_dim = d;
  if (p->part_dim >= 0) {
    int64_t n = as->dims[p->part_dim];
    p->part_block = (n + blocks - 1) / blocks;
    p->part_size = n;
  }
  return 0;
}

static int scatter_plan(kiln__codegen *g, const kiln_instr *s, scat *p) {
  int rc = plan_of(g->mod.m, s, p);
  if (rc == -1) return fail(g, s, "malformed scatter");
  if (rc) return fail(g, s, "malformed scatter dimension numbers");
  return 0;
}

/* Row scatters (one update dim, one index component, the one the blocks
 * are of, no batching dims) are bucketed: a sequential kernel sorts the
 * updates by block, stably, into a scratch buffer of int32: the block ends
 * (blocks + 1), the row each update starts at (-1: its window does not
 * fit) and the updates in block order; then a kernel per block applies
 * its own updates, in order. The indices are then read once, not once
 * per block or per invocation. */
static bool rows_plan(const scat *p) {
  return p->part_dim >= 0 && p->nus == 1 && p->map->n == 1 && p->map->v[0] == p->part_dim &&
         p->obatch->n == 0 && p->upd0->shape.dims[p->usd[0]] < INT32_MAX &&
         p->part_size < INT32_MAX && /* rows and update numbers are int32 */
         p->ind->shape.rank <= KILN__EMIT_MAXR;
}

static int64_t rows_blocks(const scat *p, const kiln_shape *as) {
  return (as->dims[p->part_dim] + p->part_block - 1) / p->part_block;
}

uint64_t kiln__scatter_rows_scratch(const kiln_module *m, const kiln_instr *s) {
  scat p;
  if (s->op != KILN_OP_SCATTER || s->noperands < 3 || s->noperands % 2 == 0) return 0;
  uint32_t n = (s->noperands - 1) / 2;
  if (m->instrs[s->operands[0]]->shape.rank > KILN__EMIT_MAXR ||
      m->instrs[s->operands[n]]->shape.rank > KILN__EMIT_MAXR ||
      m->instrs[s->operands[n + 1]]->shape.rank > KILN__EMIT_MAXR)
    return 0;
  if (plan_of(m, s, &p) || !rows_plan(&p)) return 0;
  int64_t blocks = rows_blocks(&p, &m->instrs[s->operands[0]]->shape);
  int64_t nu = p.upd0->shape.dims[p.usd[0]];
  return (uint64_t)(blocks + 1 + 2 * nu) * 4;
}

/* Start index component k of the scatter index vector at batch loops g. */
static int scatter_start(kiln__emit_fn *f, const scat *p, const uint32_t *gl, uint32_t k,
                         char dst[KILN__IX_LEN]) {
  kiln__ix y;
  int rc = kiln__ix_new(f, p->irank, &y);
  if (rc) return rc;
  for (uint32_t d = 0, j = 0; d < p->irank; d++) {
    if ((int64_t)d == p->ivd)
      kiln__ix_set(&y, d, "%u", k);
    else
      kiln__ix_set(&y, d, "r%u", gl[j++]);
  }
  uint32_t v;
  if ((rc = kiln__emit_value1(f, p->ind->id, &y, &v))) return rc;
  if (p->ind->shape.dtype == KILN_U64)
    kiln__ix_var(f, dst, "(v%u > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v%u)", v, v);
  else
    kiln__ix_var(f, dst, "(int64_t)v%u", v);
  return 0;
}

static int scatter_apply(kiln__codegen *g, kiln__emit_fn *f, const kiln__kernel_spec *k,
                         const scat *p, const uint32_t *gl, const uint32_t *wl,
                         char st[][KILN__IX_LEN], uint32_t fn) {
  kiln__ix pos, u;
  const kiln_shape *us = &p->upd0->shape;
  int rc = kiln__ix_new(f, p->ar, &pos);
  if (rc == 0) rc = kiln__ix_new(f, us->rank, &u);
  if (rc) return rc;
  for (uint32_t d = 0; d < p->ar; d++) kiln__ix_set(&pos, d, "%s", st[d]);
  for (uint32_t j = 0; j < p->nw; j++)
    kiln__ix_set(&pos, p->wd[j], "(%s + r%u)", st[p->wd[j]], wl[j]);
  for (uint32_t j = 0; j < p->nus; j++) kiln__ix_set(&u, p->usd[j], "r%u", gl[j]);
  for (uint32_t j = 0; j < p->nw; j++) kiln__ix_set(&u, (uint32_t)p->uw->v[j], "r%u", wl[j]);
  const kiln_computation *c = g->mod.m->comps[p->s->called[0]];
  uint32_t args[2 * KILN__EMIT_MAXR], outs[KILN__EMIT_MAXR];
  char offs[KILN__EMIT_MAXR][256];
  for (uint32_t q = 0; q < p->n && q < KILN__EMIT_MAXR; q++) {
    const kiln_shape *os = k->out_shape[q];
    char e[400];
    kiln__ix_offset(f, &pos, os, offs[q], sizeof offs[q]);
    kiln__emit_load_expr(os->dtype, k->out_arg[q], offs[q], e, sizeof e);
    const kiln_instr *pa = kiln_computation_param(g->mod.m, c, q);
    const kiln_instr *pb = kiln_computation_param(g->mod.m, c, p->n + q);
    if (pa == NULL || pb == NULL || pa->shape.dtype != os->dtype)
      return fail(g, p->s, "combiner parameters must be scalars of the operand types");
    args[q] = kiln__emit_newvar(f);
    kiln__emit_line(f, "%s v%u = %s;", kiln__ctype(f->mod, os->dtype), args[q], e);
    const kiln_instr *ui = ins_of(g, p->s->operands[p->n + 1 + q]);
    if ((rc = kiln__emit_value1(f, ui->id, &u, &args[p->n + q]))) return rc;
    char a[16], ce[256];
    snprintf(a, sizeof a, "v%u", args[p->n + q]);
    if ((rc = kiln__emit_convert_expr(f, p->s, a, ui->shape.dtype, pb->shape.dtype, ce, sizeof ce)))
      return rc;
    args[p->n + q] = kiln__emit_newvar(f);
    kiln__emit_line(f, "%s v%u = %s;", kiln__ctype(f->mod, pb->shape.dtype), args[p->n + q], ce);
    outs[q] = kiln__emit_newvar(f);
    kiln__emit_line(f, "%s v%u;", kiln__ctype(f->mod, os->dtype), outs[q]);
  }
  kiln__emit_call_fn(f, fn, args, 2 * p->n, outs, p->n);
  for (uint32_t q = 0; q < p->n; q++) {
    char v[16], e[64];
    snprintf(v, sizeof v, "v%u", outs[q]);
    kiln__emit_store_expr(k->out_shape[q]->dtype, v, e, sizeof e);
    kiln__emit_line(f, "b%u[%s] = %s;", k->out_arg[q], offs[q], e);
  }
  return 0;
}

static int scatter_body(kiln__codegen *g, kiln__emit_fn *f, const kiln__kernel_spec *k,
                        const scat *p, uint32_t fn, bool chunked) {
  const kiln_shape *us = &p->upd0->shape, *as = k->out_shape[0];
  uint32_t gl[KILN__EMIT_MAXR], wl[KILN__EMIT_MAXR], marks[2 * KILN__EMIT_MAXR + 1], nm = 0;
  bool once = p->nus == 0; /* one update window: a loop for `continue` to leave */
  if (once) marks[nm++] = kiln__emit_open(f, "do");
  for (uint32_t j = 0; j < p->nus; j++) {
    gl[j] = kiln__emit_newvar(f);
    marks[nm++] = kiln__emit_open(f, "for (int64_t r%u = 0; r%u < %lld; r%u++)", gl[j], gl[j],
                                  (long long)us->dims[p->usd[j]], gl[j]);
  }
  char st[KILN__EMIT_MAXR][KILN__IX_LEN];
  for (uint32_t d = 0; d < p->ar; d++) snprintf(st[d], KILN__IX_LEN, "0");
  int rc = 0;
  for (uint32_t q = 0; rc == 0 && q < p->map->n; q++) {
    if (p->map->v[q] < 0 || p->map->v[q] >= p->ar) return fail(g, p->s, "index map out of range");
    rc = scatter_start(f, p, gl, q, st[p->map->v[q]]);
  }
  for (uint32_t q = 0; rc == 0 && q < p->obatch->n; q++) {
    int64_t b = p->ibatch->v[q];
    if (b < 0 || b == p->ivd || p->obatch->v[q] < 0 || p->obatch->v[q] >= p->ar)
      return fail(g, p->s, "batching dims out of range");
    snprintf(st[p->obatch->v[q]], KILN__IX_LEN, "r%u", gl[b < p->ivd ? b : b - 1]);
  }
  if (rc) return rc;
  kiln_sbuf fits = KILN_SBUF_INIT;
  for (uint32_t d = 0; d < p->ar; d++)
    kiln_sbuf_printf(&fits, "%s(uint64_t)%s > %lluu", d ? " || " : "", st[d],
                     (unsigned long long)(as->dims[d] - p->wsize[d]));
  if (p->ar) kiln__emit_line(f, "if (%s) continue;", kiln_sbuf_str(&fits));
  kiln_sbuf_free(&fits);
  /* In range (the fit test passed): the update lands in this invocation's
   * rows [klo, klo + kspan) (cpu: all its blocks in one walk) or in block i
   * (a grid thread each); a subtraction and one compare, no division. */
  if (p->part_dim >= 0 && chunked)
    kiln__emit_line(f, "if ((uint64_t)(%s - klo) >= (uint64_t)kspan) continue;", st[p->part_dim]);
  else if (p->part_dim >= 0)
    kiln__emit_line(f, "if ((uint64_t)(%s - i * %lldLL) >= %lluu) continue;", st[p->part_dim],
                    (long long)p->part_block, (unsigned long long)p->part_block);
  for (uint32_t j = 0; j < p->nw; j++) {
    wl[j] = kiln__emit_newvar(f);
    marks[nm++] = kiln__emit_open(f, "for (int64_t r%u = 0; r%u < %lld; r%u++)", wl[j], wl[j],
                                  (long long)p->wsize[p->wd[j]], wl[j]);
  }
  rc = scatter_apply(g, f, k, p, gl, wl, st, fn);
  while (nm-- > 0) kiln__emit_close(f, marks[nm], once && nm == 0 ? " while (0);" : NULL);
  return rc;
}

int kiln__kernel_scatter(kiln__codegen *g, const kiln__kernel_spec *k, uint32_t *kernel,
                         uint64_t *range) {
  scat p;
  const kiln_instr *s = ins_of(g, k->root);
  int rc = scatter_plan(g, s, &p);
  if (rc) return rc;
  if (p.n != k->nouts || p.n > KILN__EMIT_MAXR)
    return fail(g, s, "outputs do not match the inputs");
  uint32_t fn;
  if ((rc = kiln__emit_comp_fn(&g->mod, s->called[0], s, &fn))) return rc;
  kiln_sbuf body = KILN_SBUF_INIT, out = KILN_SBUF_INIT;
  kiln__emit_fn f;
  rc = kiln__kernel_begin(g, k, &body, &f, 1);
  /* On cpu an invocation gets a contiguous run of blocks [begin, end): one
   * walk over the updates applies all of them, so the indices are read once
   * per invocation (a few per thread), not once per block. */
  bool chunked = g->mod.target->code == KILN__CODE_SO;
  if (rc == 0) rc = scatter_body(g, &f, k, &p, fn, chunked);
  if (rc == 0 && f.rc) rc = f.rc;
  if (rc == 0) {
    char head[256];
    if (p.part_dim >= 0 && chunked) {
      int64_t n = k->out_shape[0]->dims[p.part_dim];
      *range = (uint64_t)((n + p.part_block - 1) / p.part_block);
      kiln_sbuf_printf(&out,
                       "  if (begin < end) {\n  const int64_t klo = begin * %lldLL, "
                       "kspan = (end - begin) * %lldLL;\n",
                       (long long)p.part_block, (long long)p.part_block);
      kiln_sbuf_puts(&out, kiln_sbuf_str(&body));
      kiln_sbuf_puts(&out, "  }\n");
    } else if (p.part_dim >= 0) {
      int64_t n = k->out_shape[0]->dims[p.part_dim];
      *range = (uint64_t)((n + p.part_block - 1) / p.part_block);
      g->mod.target->range_loop(head, sizeof head, "i");
      kiln_sbuf_printf(&out, "  %s {\n", head);
      kiln_sbuf_puts(&out, kiln_sbuf_str(&body));
      kiln_sbuf_puts(&out, "  }\n");
    } else {
      *range = 1;
      g->mod.target->single(head, sizeof head);
      kiln_sbuf_printf(&out, "  %s\n", head);
      kiln_sbuf_puts(&out, kiln_sbuf_str(&body));
    }
    *kernel = g->nkernels;
    kiln__kernel_finish(g, k, kiln_sbuf_str(&out), *range);
  }
  kiln__emit_fn_free(&f);
  kiln_sbuf_free(&body);
  kiln_sbuf_free(&out);
  return rc;
}

/* The bucketing kernel of a row scatter (one iteration; see rows_plan).
 * Its scratch argument: kc[blocks + 1], then kr[n] and ko[n]. */
static int rows_sort(kiln__codegen *g, const kiln__kernel_spec *k, const scat *p, uint32_t sa,
                     uint32_t *kernel) {
  const kiln_shape *as = k->out_shape[0];
  int64_t n = p->upd0->shape.dims[p->usd[0]], blocks = rows_blocks(p, as);
  kiln_sbuf body = KILN_SBUF_INIT, out = KILN_SBUF_INIT;
  kiln__emit_fn f;
  int rc = kiln__kernel_begin(g, k, &body, &f, 2);
  uint32_t gl[1] = {kiln__emit_newvar(&f)};
  char st[KILN__EMIT_MAXR][KILN__IX_LEN];
  for (uint32_t d = 0; d < p->ar; d++) snprintf(st[d], KILN__IX_LEN, "0");
  uint32_t loop = kiln__emit_open(&f, "for (int64_t r%u = 0; r%u < %lldLL; r%u++)", gl[0], gl[0],
                                  (long long)n, gl[0]);
  if (rc == 0) rc = scatter_start(&f, p, gl, 0, st[p->part_dim]);
  if (rc == 0) {
    kiln_sbuf fits = KILN_SBUF_INIT;
    for (uint32_t d = 0; d < p->ar; d++)
      kiln_sbuf_printf(&fits, "%s(uint64_t)%s > %lluu", d ? " || " : "", st[d],
                       (unsigned long long)(as->dims[d] - p->wsize[d]));
    kiln__emit_line(&f, "const int64_t x = (%s) ? -1 : %s;", kiln_sbuf_str(&fits), st[p->part_dim]);
    kiln_sbuf_free(&fits);
    kiln__emit_line(&f, "kr[r%u] = (int32_t)x;", gl[0]);
    kiln__emit_line(&f, "if (x >= 0) kc[x / %lldLL + 1]++;", (long long)p->part_block);
  }
  kiln__emit_close(&f, loop, NULL);
  if (rc == 0 && f.rc) rc = f.rc;
  if (rc == 0) {
    char head[256];
    g->mod.target->single(head, sizeof head);
    kiln_sbuf_printf(&out,
                     "  %s\n  int32_t *kc = (int32_t *)b%u, *kr = kc + %lldLL, *ko = kr + %lldLL;\n"
                     "  for (int64_t j = 0; j <= %lldLL; j++) kc[j] = 0;\n  {\n",
                     head, sa, (long long)blocks + 1, (long long)n, (long long)blocks);
    kiln_sbuf_puts(&out, kiln_sbuf_str(&body));
    /* kc[j] counts block j - 1; then the start of block j; the fill moves
     * it to the block's end, which is where block j + 1 starts. */
    kiln_sbuf_printf(&out,
                     "  }\n  for (int64_t j = 1; j <= %lldLL; j++) kc[j] += kc[j - 1];\n"
                     "  for (int64_t r = 0; r < %lldLL; r++)\n"
                     "    if (kr[r] >= 0) ko[kc[kr[r] / %lldLL]++] = (int32_t)r;\n",
                     (long long)blocks, (long long)n, (long long)p->part_block);
    *kernel = g->nkernels;
    kiln__kernel_finish(g, k, kiln_sbuf_str(&out), 1);
  }
  kiln__emit_fn_free(&f);
  kiln_sbuf_free(&body);
  kiln_sbuf_free(&out);
  return rc;
}

/* One application loop of a row scatter's applying kernel: `head` opens
 * the walk, `take` (given q) sets the update r and its row x, and `skip`
 * (or NULL) says when it is not this invocation's. */
static int rows_walk(kiln__codegen *g, kiln__emit_fn *f, const kiln__kernel_spec *k, const scat *p,
                     uint32_t fn, const char *head, bool filter) {
  uint32_t q = kiln__emit_newvar(f), gl[1] = {kiln__emit_newvar(f)}, marks[KILN__EMIT_MAXR + 1];
  char st[KILN__EMIT_MAXR][KILN__IX_LEN];
  for (uint32_t d = 0; d < p->ar; d++) snprintf(st[d], KILN__IX_LEN, "0");
  snprintf(st[p->part_dim], KILN__IX_LEN, "x%u", q);
  marks[0] = kiln__emit_open(f, "%s", head);
  if (filter) {
    kiln__emit_line(f, "const int64_t r%u = q, x%u = kr[q];", gl[0], q);
    kiln__emit_line(f, "if ((uint64_t)(x%u - klo) >= (uint64_t)kspan) continue;", q);
  } else {
    kiln__emit_line(f, "const int64_t r%u = ko[q], x%u = kr[r%u];", gl[0], q, gl[0]);
  }
  uint32_t wl[KILN__EMIT_MAXR], nm = 1;
  for (uint32_t j = 0; j < p->nw; j++) {
    wl[j] = kiln__emit_newvar(f);
    marks[nm++] = kiln__emit_open(f, "for (int64_t r%u = 0; r%u < %lld; r%u++)", wl[j], wl[j],
                                  (long long)p->wsize[p->wd[j]], wl[j]);
  }
  int rc = scatter_apply(g, f, k, p, gl, wl, st, fn);
  while (nm-- > 0) kiln__emit_close(f, marks[nm], NULL);
  return rc;
}

/* The applying kernel of a row scatter: block i applies updates
 * ko[kc[i - 1] .. kc[i]) (from 0 for block 0) in order at rows kr[]. On
 * cpu an invocation given more than half the blocks (all of them when it
 * runs on one thread) walks every update in order instead, skipping by
 * the row those outside its blocks: the updates' rows are read in order,
 * not gathered. */
static int rows_apply(kiln__codegen *g, const kiln__kernel_spec *k, const scat *p, uint32_t sa,
                      uint32_t fn, uint32_t *kernel, uint64_t *range) {
  int64_t n = p->upd0->shape.dims[p->usd[0]], blocks = rows_blocks(p, k->out_shape[0]);
  bool chunked = g->mod.target->code == KILN__CODE_SO;
  kiln_sbuf body = KILN_SBUF_INIT, walk = KILN_SBUF_INIT, out = KILN_SBUF_INIT;
  kiln__emit_fn f, fw;
  int rc = kiln__kernel_begin(g, k, &body, &f, 2);
  if (rc == 0)
    rc = rows_walk(g, &f, k, p, fn, "for (int64_t q = i ? kc[i - 1] : 0; q < kc[i]; q++)", false);
  if (rc == 0 && f.rc) rc = f.rc;
  if (chunked) {
    char head[128];
    snprintf(head, sizeof head, "for (int64_t q = 0; q < %lldLL; q++)", (long long)n);
    int rw = kiln__kernel_begin(g, k, &walk, &fw, 2);
    if (rw == 0) rw = rows_walk(g, &fw, k, p, fn, head, true);
    if (rw == 0 && fw.rc) rw = fw.rc;
    kiln__emit_fn_free(&fw);
    if (rc == 0) rc = rw;
  }
  if (rc == 0) {
    char head[256];
    g->mod.target->range_loop(head, sizeof head, "i");
    kiln_sbuf_printf(&out,
                     "  const int32_t *kc = (const int32_t *)b%u, *kr = kc + %lldLL, "
                     "*ko = kr + %lldLL;\n",
                     sa, (long long)blocks + 1, (long long)n);
    if (chunked)
      kiln_sbuf_printf(&out,
                       "  if (begin < end && (end - begin) * 2 > %lldLL) {\n"
                       "  const int64_t klo = begin * %lldLL, kspan = (end - begin) * %lldLL;\n"
                       "%s  return;\n  }\n",
                       (long long)blocks, (long long)p->part_block, (long long)p->part_block,
                       kiln_sbuf_str(&walk));
    kiln_sbuf_printf(&out, "  %s {\n", head);
    kiln_sbuf_puts(&out, kiln_sbuf_str(&body));
    kiln_sbuf_puts(&out, "  }\n");
    *range = (uint64_t)blocks;
    *kernel = g->nkernels;
    kiln__kernel_finish(g, k, kiln_sbuf_str(&out), *range);
  }
  kiln__emit_fn_free(&f);
  kiln_sbuf_free(&body);
  kiln_sbuf_free(&walk);
  kiln_sbuf_free(&out);
  return rc;
}

int kiln__kernel_scatter_rows(kiln__codegen *g, const kiln__kernel_spec *k, uint32_t scratch,
                              uint32_t kernels[2], uint64_t ranges[2]) {
  scat p;
  const kiln_instr *s = ins_of(g, k->root);
  int rc = scatter_plan(g, s, &p);
  if (rc) return rc;
  if (p.n != k->nouts || p.n > KILN__EMIT_MAXR)
    return fail(g, s, "outputs do not match the inputs");
  if (!rows_plan(&p)) return fail(g, s, "not a row scatter");
  uint32_t fn;
  if ((rc = kiln__emit_comp_fn(&g->mod, s->called[0], s, &fn))) return rc;
  ranges[0] = 1;
  if ((rc = rows_sort(g, k, &p, scratch, &kernels[0]))) return rc;
  return rows_apply(g, k, &p, scratch, fn, &kernels[1], &ranges[1]);
}

/* ---- sort --------------------------------------------------------------- */

/* The comparator over positions a and b of the current row. */
static int sort_less_fn(kiln__codegen *g, const kiln__kernel_spec *k, const kiln_instr *s,
                        uint32_t fn, uint32_t id) {
  kiln_sbuf *b = &g->mod.funcs;
  const kiln_computation *c = g->mod.m->comps[s->called[0]];
  kiln_sbuf_printf(b,
                   "%s int kless%u(void *const *bufs, const int64_t *base, "
                   "const int64_t *st, int64_t a, int64_t b) {\n",
                   g->mod.target->helper_qual, id);
  kiln_sbuf args = KILN_SBUF_INIT;
  for (uint32_t q = 0; q < s->noperands; q++) {
    const kiln_shape *is = k->binds[q].shapes[0];
    const kiln_instr *pa = kiln_computation_param(g->mod.m, c, 2 * q);
    if (pa == NULL || pa->shape.dtype != is->dtype) {
      kiln_sbuf_free(&args);
      return fail(g, s, "comparator parameters must be scalars of the operand types");
    }
    const char *t = kiln__stype(&g->mod, is->dtype);
    kiln_sbuf_printf(b, "  const %s *in%u = (const %s *)bufs[%u];\n", t, q, t, k->binds[q].args[0]);
    for (int side = 0; side < 2; side++) {
      char off[64];
      snprintf(off, sizeof off, "base[%u] + %s * st[%u]", q, side ? "b" : "a", q);
      kiln_sbuf_printf(b, "  %s c%u%c = ", kiln__ctype(&g->mod, is->dtype), q, side ? 'b' : 'a');
      switch (is->dtype) {
      case KILN_PRED: kiln_sbuf_printf(b, "(uint8_t)(in%u[%s] != 0);\n", q, off); break;
      case KILN_F16: kiln_sbuf_printf(b, "kh2f(in%u[%s]);\n", q, off); break;
      case KILN_BF16: kiln_sbuf_printf(b, "kb2f(in%u[%s]);\n", q, off); break;
      default: kiln_sbuf_printf(b, "in%u[%s];\n", q, off); break;
      }
      kiln_sbuf_printf(&args, "%sc%u%c", args.len ? ", " : "", q, side ? 'b' : 'a');
    }
  }
  kiln_sbuf_printf(b, "  return kf%u(%s) != 0;\n}\n\n", fn, kiln_sbuf_str(&args));
  kiln_sbuf_free(&args);
  return 0;
}

/* Writes template `tpl` with each from[r] replaced by to[r] and `@` by
 * the kernel number (the topk and sort fast path templates). */
static void expand(kiln_sbuf *b, const char *tpl, const char *const *from, const char *const *to,
                   uint32_t nrep, uint32_t id) {
  for (const char *p = tpl; *p;) {
    if (*p == '@') {
      kiln_sbuf_printf(b, "%u", id);
      p++;
      continue;
    }
    uint32_t r = 0;
    while (r < nrep && strncmp(p, from[r], strlen(from[r])) != 0) r++;
    if (r < nrep) {
      kiln_sbuf_puts(b, to[r]);
      p += strlen(from[r]);
      continue;
    }
    kiln_sbuf_printf(b, "%c", *p++);
  }
}

/* ---- sort fast paths ---------------------------------------------------- */

/* The comparators JAX and XLA write, compare(a0, b0) with direction LT or
 * GT (either operand order) on operand 0 alone, have a faster sort with
 * the same result as the merge sort under them:
 *  - a strict weak order (integer or pred keys, or float keys compared
 *    with type=TOTALORDER): every stable sort gives the same permutation,
 *    so an LSD radix sort of 32-bit order-preserving keys with int32
 *    indices (bytes on which all keys agree skipped), descending as the
 *    complement of the key;
 *  - float keys without total order: on a row without NaN, LT is a strict
 *    weak order in which -0 equals +0, so the radix sort with -0 read as
 *    +0; a row with a NaN (which compares false both ways, not a weak
 *    order) takes the same bottom-up merge as the general path, so the
 *    same comparisons, on contiguous (key, index) pairs instead of through
 *    the permutation and the comparator function.
 *  - jnp.sort's and jnp.argsort's comparator, a total-order LT of each key
 *    canonicalized (NaN as +NaN, -0 as +0, see uncanon): a strict weak
 *    order, so the radix sort of the canonicalized keys.
 * Keys wider than 32 bits take the general path. Both fit the scratch of
 * 16 bytes per element the general path has. */
typedef enum sort_fast { SORT_GENERAL, SORT_RADIX, SORT_PAIRS, SORT_RADIX_CANON } sort_fast;

/* Whether x is a scalar constant: NaN with the sign clear (nan), or +0. */
static bool is_const(const kiln_module *m, kiln_id id, bool nan) {
  const kiln_instr *x = m->instrs[id];
  if (x->op != KILN_OP_CONSTANT || x->literal == NULL || !kiln_shape_is_array(&x->shape) ||
      x->shape.rank != 0 || !kiln_dtype_is_float(x->shape.dtype))
    return false;
  double v = kiln_literal_get_f64(x->literal, 0);
  return nan ? v != v && !signbit(v) : v == 0 && !signbit(v);
}

static bool is_cmp(const kiln_instr *x, kiln_cmp_dir dir) {
  const kiln_attr *d = kiln_instr_attr(x, KILN_ATTR_DIRECTION);
  return x->op == KILN_OP_COMPARE && x->noperands == 2 && d && d->v.i == (int64_t)dir;
}

/* jnp.sort's canonicalization of a float key, x != x ? nan : x == 0 ? 0 :
 * x (every NaN the positive one, -0 as +0): the parameter it reads, or
 * x itself when it is not that. */
static const kiln_instr *uncanon(const kiln_module *m, const kiln_instr *x, bool *canon) {
  *canon = false;
  if (x->op != KILN_OP_SELECT || x->noperands != 3) return x;
  const kiln_instr *ne = m->instrs[x->operands[0]], *y = m->instrs[x->operands[2]];
  if (!is_cmp(ne, KILN_CMP_NE) || ne->operands[0] != ne->operands[1] ||
      !is_const(m, x->operands[1], true) || y->op != KILN_OP_SELECT || y->noperands != 3)
    return x;
  const kiln_instr *eq = m->instrs[y->operands[0]], *p = m->instrs[y->operands[2]];
  if (p->op != KILN_OP_PARAMETER || ne->operands[0] != p->id || !is_cmp(eq, KILN_CMP_EQ) ||
      !is_const(m, y->operands[1], false))
    return x;
  bool lhs = eq->operands[0] == p->id && is_const(m, eq->operands[1], false);
  bool rhs = eq->operands[1] == p->id && is_const(m, eq->operands[0], false);
  if (!lhs && !rhs) return x;
  *canon = true;
  return p;
}

static sort_fast sort_fast_path(kiln__codegen *g, const kiln_instr *s, kiln_dtype kt, bool *desc) {
  const kiln_module *m = g->mod.m;
  const kiln_computation *c = m->comps[s->called[0]];
  const kiln_instr *root = kiln_computation_root(m, c);
  if (root == NULL || root->op != KILN_OP_COMPARE || root->noperands != 2) return SORT_GENERAL;
  bool ca, cb;
  const kiln_instr *a = uncanon(m, m->instrs[root->operands[0]], &ca);
  const kiln_instr *b = uncanon(m, m->instrs[root->operands[1]], &cb);
  if (ca != cb || (ca && !kiln_dtype_is_float(kt))) return SORT_GENERAL;
  if (a->op != KILN_OP_PARAMETER || b->op != KILN_OP_PARAMETER ||
      a->param_number + b->param_number != 1 || a->param_number * b->param_number != 0 ||
      kiln_shape_is_tuple(&a->shape) || a->shape.dtype != kt)
    return SORT_GENERAL;
  const kiln_attr *d = kiln_instr_attr(root, KILN_ATTR_DIRECTION);
  if (d == NULL || (d->v.i != KILN_CMP_LT && d->v.i != KILN_CMP_GT)) return SORT_GENERAL;
  *desc = (d->v.i == KILN_CMP_GT) == (a->param_number == 0);
  if (kiln_dtype_bits(kt) > 32 ||
      (kt != KILN_PRED && !kiln_dtype_is_float(kt) && !kiln_dtype_is_signed_int(kt) &&
       !kiln_dtype_is_unsigned_int(kt)))
    return SORT_GENERAL;
  if (!kiln_dtype_is_float(kt)) return SORT_RADIX;
  const char *type = kiln_instr_attr_str(root, KILN_ATTR_TYPE);
  bool total = type && strcmp(type, "TOTALORDER") == 0;
  if (ca) return total ? SORT_RADIX_CANON : SORT_GENERAL;
  return total ? SORT_RADIX : SORT_PAIRS;
}

/* The 32-bit ascending key of x (read as type t's storage). */
static const char *radix_key(kiln_dtype t) {
  switch (t) {
  case KILN_F32: return "(x & 0x80000000u) ? ~x : (x | 0x80000000u)";
  case KILN_F16:
  case KILN_BF16: return "(uint32_t)((x & 0x8000u) ? (~x & 0xffffu) : (x | 0x8000u))";
  case KILN_PRED: return "(uint32_t)(x != 0)";
  default:
    return kiln_dtype_is_signed_int(t) ? "(uint32_t)(int32_t)x ^ 0x80000000u" : "(uint32_t)x";
  }
}

static const char radix_row[] =
    "    uint32_t *ka = (uint32_t *)(bSARG + r * 2 * len), *ia = ka + len, *kb = ia + len,"
    " *ib = kb + len;\n"
    "    uint32_t any = 0, all = ~0u;\n"
    "    for (int64_t j = 0; j < len; j++) {\n"
    "      RT x = (RT)in0[base[0] + j * st[0]];\n"
    "      ZEROX\n"
    "      uint32_t k = KEYX;\n"
    "      k = DESC ? ~k : k;\n"
    "      ka[j] = k;\n"
    "      ia[j] = (uint32_t)j;\n"
    "      any |= k;\n"
    "      all &= k;\n"
    "    }\n"
    "    for (int sh = 0; sh < 32; sh += 8) {\n"
    "      if ((((any ^ all) >> sh) & 255u) == 0) continue; /* every key has this byte */\n"
    "      int64_t cnt[257] = {0};\n"
    "      for (int64_t j = 0; j < len; j++) cnt[((ka[j] >> sh) & 255u) + 1]++;\n"
    "      for (int q = 0; q < 256; q++) cnt[q + 1] += cnt[q];\n"
    "      for (int64_t j = 0; j < len; j++) {\n"
    "        int64_t o = cnt[(ka[j] >> sh) & 255u]++;\n"
    "        kb[o] = ka[j];\n"
    "        ib[o] = ia[j];\n"
    "      }\n"
    "      uint32_t *t = ka; ka = kb; kb = t;\n"
    "      t = ia; ia = ib; ib = t;\n"
    "    }\n"
    "    order = ia;\n";

static const char pairs_row[] =
    "    struct kp@ { float k; uint32_t i; } *pa = (struct kp@ *)(bSARG + r * 2 * len),"
    " *pb = pa + len;\n"
    "    for (int64_t j = 0; j < len; j++) {\n"
    "      pa[j].k = (float)LOADX;\n"
    "      pa[j].i = (uint32_t)j;\n"
    "    }\n"
    "    for (int64_t w = 1; w < len; w *= 2) {\n"
    "      for (int64_t lo = 0; lo < len; lo += 2 * w) {\n"
    "        int64_t mid = lo + w < len ? lo + w : len, hi = lo + 2 * w < len ? lo + 2 * w : len;\n"
    "        int64_t a = lo, c = mid, o = lo;\n"
    "        while (a < mid && c < hi) pb[o++] = pa[c].k CMP pa[a].k ? pa[c++] : pa[a++];\n"
    "        while (a < mid) pb[o++] = pa[a++];\n"
    "        while (c < hi) pb[o++] = pa[c++];\n"
    "      }\n"
    "      struct kp@ *t = pa; pa = pb; pb = t;\n"
    "    }\n"
    "    uint32_t *ord = (uint32_t *)pb; /* pb is free now: the indices, in order */\n"
    "    for (int64_t j = 0; j < len; j++) ord[j] = pa[j].i;\n"
    "    order = ord;\n";

static const char sort_loop[] =
    "    for (int64_t j = 0; j < len; j++) perm[j] = j;\n"
    "    for (int64_t w = 1; w < len; w *= 2) {\n"
    "      for (int64_t lo = 0; lo < len; lo += 2 * w) {\n"
    "        int64_t mid = lo + w < len ? lo + w : len, hi = lo + 2 * w < len ? lo + 2 * w : len;\n"
    "        int64_t a = lo, c = mid, o = lo;\n"
    "        while (a < mid && c < hi) tmp[o++] = LESS(perm[c], perm[a]) ? perm[c++] : perm[a++];\n"
    "        while (a < mid) tmp[o++] = perm[a++];\n"
    "        while (c < hi) tmp[o++] = perm[c++];\n"
    "      }\n"
    "      memcpy(perm, tmp, (size_t)len * sizeof *perm);\n"
    "    }\n";

/* The row of a fast-path sort (sort_fast_path): leaves `order`, the
 * row's permutation, for the gather. */
static void sort_fast_row(kiln_sbuf *bp, kiln__codegen *g, const kiln__kernel_spec *k,
                          kiln_dtype t0, sort_fast fast, bool desc, uint32_t scratch) {
  char sarg[16], load[96];
  snprintf(sarg, sizeof sarg, "%u", scratch);
  kiln__emit_load_expr(t0, k->binds[0].args[0], "base[0] + j * st[0]", load, sizeof load);
  /* in0: operand 0 read as bits, for the radix key */
  const char *rt = t0 == KILN_F32                      ? "uint32_t"
                   : t0 == KILN_F16 || t0 == KILN_BF16 ? "uint16_t"
                                                       : kiln__stype(&g->mod, t0);
  kiln_sbuf_printf(bp, "    const %s *in0 = (const %s *)b%u;\n    const uint32_t *order;\n", rt, rt,
                   k->binds[0].args[0]);
  bool w16 = t0 == KILN_F16 || t0 == KILN_BF16;
  const char *zero = "";
  if (fast == SORT_PAIRS)
    zero = w16 ? "if (x == 0x8000u) x = 0;" : "if (x == 0x80000000u) x = 0;";
  else if (fast == SORT_RADIX_CANON && t0 == KILN_F32)
    zero = "if ((x & 0x7fffffffu) > 0x7f800000u) x = 0x7fc00000u; "
           "else if (x == 0x80000000u) x = 0;";
  else if (fast == SORT_RADIX_CANON)
    zero = t0 == KILN_F16
               ? "if ((x & 0x7fffu) > 0x7c00u) x = 0x7e00u; else if (x == 0x8000u) x = 0;"
               : "if ((x & 0x7fffu) > 0x7f80u) x = 0x7fc0u; else if (x == 0x8000u) x = 0;";
  const char *from[] = {"KEYX", "RT", "DESC", "LOADX", "CMP", "SARG", "ZEROX"};
  const char *to[] = {radix_key(t0), rt, desc ? "1" : "0", load, desc ? ">" : "<", sarg, zero};
  if (fast == SORT_PAIRS) {
    const char *nan = t0 == KILN_F32   ? "(x & 0x7fffffffu) > 0x7f800000u"
                      : t0 == KILN_F16 ? "(x & 0x7fffu) > 0x7c00u"
                                       : "(x & 0x7fffu) > 0x7f80u";
    kiln_sbuf_printf(bp,
                     "    int nan = 0;\n"
                     "    for (int64_t j = 0; j < len; j++) {\n"
                     "      %s x = in0[base[0] + j * st[0]];\n"
                     "      nan |= %s;\n"
                     "    }\n"
                     "    if (nan) {\n",
                     rt, nan);
    expand(bp, pairs_row, from, to, 7, g->nkernels);
    kiln_sbuf_puts(bp, "    } else {\n");
  }
  expand(bp, radix_row, from, to, 7, g->nkernels);
  if (fast == SORT_PAIRS) kiln_sbuf_puts(bp, "    }\n");
}

int kiln__kernel_sort(kiln__codegen *g, const kiln__kernel_spec *k, uint32_t scratch,
                      uint32_t *kernel, uint64_t *range) {
  const kiln_instr *s = ins_of(g, k->root);
  uint32_t n = s->noperands, fn;
  if (n == 0 || n != k->nouts || k->nbinds != n || s->ncalled != 1)
    return fail(g, s, "sort operands must be buffers");
  const kiln_shape *s0 = k->binds[0].shapes[0];
  const kiln_i64s *dl = kiln_instr_attr_ints(s, KILN_ATTR_DIMENSIONS);
  int64_t d = dl && dl->n == 1 ? dl->v[0] : (int64_t)s0->rank - 1;
  if (s0->rank == 0 || d < 0 || d >= s0->rank) return fail(g, s, "sort dimension out of range");
  int64_t len = s0->dims[d], total = kiln_shape_elements(s0);
  bool desc = false;
  sort_fast fast = len < ((int64_t)1 << 31) ? sort_fast_path(g, s, s0->dtype, &desc) : SORT_GENERAL;
  int rc = 0;
  if (fast == SORT_GENERAL) {
    if ((rc = kiln__emit_comp_fn(&g->mod, s->called[0], s, &fn))) return rc;
    if ((rc = sort_less_fn(g, k, s, fn, g->nkernels))) return rc;
  }
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_printf(&b, "  const int64_t len = %lld;\n  int64_t base[%u], st[%u], ob[%u];\n",
                   (long long)len, n, n, n);
  char loop[256];
  g->mod.target->range_loop(loop, sizeof loop, "r");
  kiln_sbuf_printf(&b, "  %s {\n", loop);
  /* Rows: the dims other than d, row-major; r splits into them. */
  kiln_shape rows = *s0;
  int64_t rdims[KILN__EMIT_MAXR];
  memcpy(rdims, s0->dims, s0->rank * sizeof *rdims);
  rdims[d] = 1;
  rows.dims = rdims;
  rows.layout = NULL;
  kiln__kernel_decompose(&b, &rows, "r", 0, "o", 2);
  for (uint32_t q = 0; q < n; q++) {
    const kiln_shape *is = k->binds[q].shapes[0], *os = k->out_shape[q];
    int64_t ist[KILN__EMIT_MAXR], ost[KILN__EMIT_MAXR];
    strides_of(is, ist);
    strides_of(os, ost);
    kiln_sbuf_printf(&b, "    base[%u] = 0", q);
    for (uint32_t e = 0; e < s0->rank; e++)
      if (e != d) kiln_sbuf_printf(&b, " + o%u * %lld", e, (long long)ist[e]);
    kiln_sbuf_printf(&b, ";\n    st[%u] = %lld;\n    ob[%u] = 0", q, (long long)ist[d], q);
    for (uint32_t e = 0; e < s0->rank; e++)
      if (e != d) kiln_sbuf_printf(&b, " + o%u * %lld", e, (long long)ost[e]);
    kiln_sbuf_printf(&b, ";\n    const int64_t ost%u = %lld;\n", q, (long long)ost[d]);
  }
  const char *order = "perm";
  if (fast == SORT_GENERAL) {
    kiln_sbuf_printf(
        &b, "    int64_t *perm = (int64_t *)bufs[%u] + r * 2 * len, *tmp = perm + len;\n", scratch);
    kiln_sbuf_printf(&b, "#define LESS(x, y) kless%u(bufs, base, st, x, y)\n", g->nkernels);
    kiln_sbuf_puts(&b, sort_loop);
    kiln_sbuf_puts(&b, "#undef LESS\n");
  } else {
    sort_fast_row(&b, g, k, s0->dtype, fast, desc, scratch);
    order = "order";
  }
  for (uint32_t q = 0; q < n; q++)
    kiln_sbuf_printf(&b,
                     "    for (int64_t j = 0; j < len; j++) b%u[ob[%u] + j * ost%u] = "
                     "b%u[base[%u] + (int64_t)%s[j] * st[%u]];\n",
                     k->out_arg[q], q, q, k->binds[q].args[0], q, order, q);
  kiln_sbuf_puts(&b, "  }\n");
  *kernel = g->nkernels;
  *range = (uint64_t)(len > 0 ? total / len : 0);
  kiln__kernel_finish(g, k, kiln_sbuf_str(&b), *range);
  kiln_sbuf_free(&b);
  return 0;
}

/* ---- topk --------------------------------------------------------------- */

/* A row's k best elements without sorting the row: a binary heap of k
 * indices whose root is the worst kept (held in the index output itself,
 * at its stride), one comparison with the root per further element, and a
 * heap sort of the k at the end, best first. "Better" is XLA's: larger
 * (smaller unless `largest`) in the total order of the element type,
 * ties going to the lower index. Floats compare through an unsigned key
 * with that order (-NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN, the
 * interpreter's ordering of sign and magnitude bits). */
static const char topk_helpers[] =
    "HQ KT ktkkey@(const ST *in, int64_t i) { ST x = in[i]; return KEYX; }\n"
    "HQ int ktkbetter@(KT ka, int64_t ia, KT kb, int64_t ib) {\n"
    "  return ka CMP kb || (ka == kb && ia < ib);\n"
    "}\n"
    "/* h: a heap of n indices at stride hs, each worse than its children;\n"
    " * restores that below position p. */\n"
    "HQ void ktksift@(const ST *in, int64_t base, int64_t st, IT *h, int64_t hs, int64_t n,\n"
    "                 int64_t p) {\n"
    "  int64_t x = h[p * hs];\n"
    "  KT kx = ktkkey@(in, base + x * st);\n"
    "  for (;;) {\n"
    "    int64_t c = 2 * p + 1;\n"
    "    if (c >= n) break;\n"
    "    int64_t y = h[c * hs];\n"
    "    KT ky = ktkkey@(in, base + y * st);\n"
    "    if (c + 1 < n) {\n"
    "      int64_t z = h[(c + 1) * hs];\n"
    "      KT kz = ktkkey@(in, base + z * st);\n"
    "      if (ktkbetter@(ky, y, kz, z)) { c++; y = z; ky = kz; }\n"
    "    }\n"
    "    if (!ktkbetter@(kx, x, ky, y)) break;\n"
    "    h[p * hs] = (IT)y;\n"
    "    p = c;\n"
    "  }\n"
    "  h[p * hs] = (IT)x;\n"
    "}\n\n";

static const char topk_row[] =
    "    for (int64_t j = 0; j < kk; j++) {\n"
    "      KT kj = ktkkey@(in, base + j * st);\n"
    "      int64_t p = j;\n"
    "      while (p > 0) {\n"
    "        int64_t q = (p - 1) / 2, y = h[q * hs];\n"
    "        if (!ktkbetter@(ktkkey@(in, base + y * st), y, kj, j)) break;\n"
    "        h[p * hs] = (IT)y;\n"
    "        p = q;\n"
    "      }\n"
    "      h[p * hs] = (IT)j;\n"
    "    }\n"
    "    KT thr = ktkkey@(in, base + (int64_t)h[0] * st);\n"
    "    for (int64_t j = kk; j < len; j++) {\n"
    "      KT kj = ktkkey@(in, base + j * st);\n"
    "      if (!(kj CMP thr)) continue; /* j is past every kept index: ties lose */\n"
    "      h[0] = (IT)j;\n"
    "      ktksift@(in, base, st, h, hs, kk, 0);\n"
    "      thr = ktkkey@(in, base + (int64_t)h[0] * st);\n"
    "    }\n"
    "    for (int64_t n = kk; n > 1; n--) {\n"
    "      IT t = h[0];\n"
    "      h[0] = h[(n - 1) * hs];\n"
    "      h[(n - 1) * hs] = t;\n"
    "      ktksift@(in, base, st, h, hs, n - 1, 0);\n"
    "    }\n"
    "    for (int64_t j = 0; j < kk; j++) vo[vb + j * vst] = in[base + (int64_t)h[j * hs] * st];\n";

/* The key type, storage type read and key expression of x for dtype t;
 * false when t has no order. */
static bool topk_key(kiln__codegen *g, kiln_dtype t, const char **kt, const char **stt,
                     const char **key) {
  switch (t) {
  case KILN_F16:
  case KILN_BF16:
    *kt = *stt = "uint16_t";
    *key = "(uint16_t)((x & 0x8000u) ? ~x : (x | 0x8000u))";
    return true;
  case KILN_F32:
    *kt = *stt = "uint32_t";
    *key = "(x & 0x80000000u) ? ~x : (x | 0x80000000u)";
    return true;
  case KILN_F64:
    *kt = *stt = "uint64_t";
    *key = "(x & 0x8000000000000000ull) ? ~x : (x | 0x8000000000000000ull)";
    return true;
  case KILN_PRED:
    *kt = *stt = "uint8_t";
    *key = "(uint8_t)(x != 0)";
    return true;
  default:
    if (!kiln_dtype_is_signed_int(t) && !kiln_dtype_is_unsigned_int(t)) return false;
    *kt = *stt = kiln__stype(&g->mod, t);
    *key = "x";
    return true;
  }
}

int kiln__kernel_topk(kiln__codegen *g, const kiln__kernel_spec *k, uint32_t *kernel,
                      uint64_t *range) {
  const kiln_instr *s = ins_of(g, k->root);
  if (k->nbinds != 1 || k->nouts != 2 || s->noperands != 1)
    return fail(g, s, "needs one operand and a (values, indices) result");
  const kiln_shape *is = k->binds[0].shapes[0], *vs = k->out_shape[0], *xs = k->out_shape[1];
  uint32_t d = is->rank ? is->rank - 1 : 0;
  int64_t kk = kiln_instr_attr_int(s, KILN_ATTR_K, -1);
  if (is->rank == 0 || vs->rank != is->rank || xs->rank != is->rank || kk < 0 || kk > is->dims[d] ||
      vs->dims[d] != kk || xs->dims[d] != kk || vs->dtype != is->dtype ||
      !kiln_dtype_is_signed_int(xs->dtype))
    return fail(g, s, "needs k <= the last dim, values of the operand's type and integer indices");
  const char *kt, *stt, *key;
  if (!topk_key(g, is->dtype, &kt, &stt, &key)) {
    char why[96];
    snprintf(why, sizeof why, "element type %s has no order", kiln_dtype_name(is->dtype));
    return fail(g, s, why);
  }
  bool largest = kiln_instr_attr_int(s, KILN_ATTR_LARGEST, 1) != 0;
  const char *from[] = {"KEYX", "KT", "ST", "IT", "CMP", "HQ"};
  const char *to[] = {key,
                      kt,
                      stt,
                      kiln__stype(&g->mod, xs->dtype),
                      largest ? ">" : "<",
                      g->mod.target->helper_qual};
  expand(&g->mod.funcs, topk_helpers, from, to, 6, g->nkernels);
  int64_t len = is->dims[d], total = kiln_shape_elements(is), rows = len ? total / len : 0;
  int64_t ist[KILN__EMIT_MAXR], vst[KILN__EMIT_MAXR], xst[KILN__EMIT_MAXR];
  strides_of(is, ist);
  strides_of(vs, vst);
  strides_of(xs, xst);
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_printf(&b, "  const int64_t len = %lld, kk = %lld;\n", (long long)len, (long long)kk);
  kiln_sbuf_printf(&b, "  const %s *in = (const %s *)b%u;\n  %s *vo = (%s *)b%u;\n", stt, stt,
                   k->binds[0].args[0], stt, stt, k->out_arg[0]);
  char loop[256];
  g->mod.target->range_loop(loop, sizeof loop, "r");
  kiln_sbuf_printf(&b, "  %s {\n", loop);
  kiln_shape rows_shape = *is;
  int64_t rdims[KILN__EMIT_MAXR];
  memcpy(rdims, is->dims, is->rank * sizeof *rdims);
  rdims[d] = 1;
  rows_shape.dims = rdims;
  rows_shape.layout = NULL;
  kiln__kernel_decompose(&b, &rows_shape, "r", 0, "o", 2);
  const char *names[3] = {"base", "vb", "xb"};
  const int64_t *sts[3] = {ist, vst, xst};
  for (uint32_t q = 0; q < 3; q++) {
    kiln_sbuf_printf(&b, "    const int64_t %s = 0", names[q]);
    for (uint32_t e = 0; e < d; e++) kiln_sbuf_printf(&b, " + o%u * %lld", e, (long long)sts[q][e]);
    kiln_sbuf_puts(&b, ";\n");
  }
  kiln_sbuf_printf(&b, "    const int64_t st = %lld, vst = %lld, hs = %lld;\n", (long long)ist[d],
                   (long long)vst[d], (long long)xst[d]);
  kiln_sbuf_printf(&b, "    %s *h = b%u + xb;\n", to[3], k->out_arg[1]);
  expand(&b, topk_row, from, to, 6, g->nkernels);
  kiln_sbuf_puts(&b, "  }\n");
  *kernel = g->nkernels;
  *range = (uint64_t)(kk > 0 ? rows : 0);
  kiln__kernel_finish(g, k, kiln_sbuf_str(&b), *range);
  kiln_sbuf_free(&b);
  return 0;
}

/* ---- select-and-scatter ------------------------------------------------- */

/* The window scan for source position s[]: keeps the preferred position in
 * bp<d> and its value in bv, found set once any position is valid. */
static int sas_scan(kiln__emit_fn *f, const kiln_instr *sas, const kiln_window *w,
                    const uint32_t *sl, uint32_t fsel, uint32_t found, uint32_t bv,
                    const uint32_t *bp) {
  const kiln_instr *a = f->mod->m->instrs[sas->operands[0]];
  uint32_t r = a->shape.rank, wl[KILN__EMIT_MAXR], marks[KILN__EMIT_MAXR], nm = 0;
  for (uint32_t d = 0; d < r; d++) {
    wl[d] = kiln__emit_newvar(f);
    marks[nm++] = kiln__emit_open(f, "for (int64_t r%u = 0; r%u < %lld; r%u++)", wl[d], wl[d],
                                  (long long)w->dims[d].size, wl[d]);
  }
  kiln__ix pos;
  int rc = kiln__ix_new(f, r, &pos);
  kiln_sbuf skip = KILN_SBUF_INIT;
  for (uint32_t d = 0; rc == 0 && d < r; d++) {
    const kiln_window_dim *wd = &w->dims[d];
    char u[KILN__IX_LEN];
    long long dil = wd->lhs_dilate;
    kiln__ix_var(f, u, "r%u * %lld + r%u * %lld - %lld", sl[d], (long long)wd->stride, wl[d],
                 (long long)wd->rhs_dilate, (long long)wd->pad_lo);
    kiln_sbuf_printf(&skip, "%s%s < 0 || %s %% %lld != 0 || %s / %lld >= %lld",
                     skip.len ? " || " : "", u, u, dil, u, dil, (long long)a->shape.dims[d]);
    kiln__ix_var(f, pos.c[d], "%s / %lld", u, dil);
  }
  if (rc == 0 && r) kiln__emit_line(f, "if (%s) continue;", kiln_sbuf_str(&skip));
  kiln_sbuf_free(&skip);
  uint32_t cv = 0;
  if (rc == 0) rc = kiln__emit_value1(f, a->id, &pos, &cv);
  if (rc == 0) {
    uint32_t keep = kiln__emit_newvar(f), args[2] = {bv, cv};
    kiln__emit_line(f, "uint8_t v%u = 1;", keep);
    uint32_t m1 = kiln__emit_open(f, "if (v%u)", found);
    kiln__emit_call_fn(f, fsel, args, 2, &keep, 1);
    kiln__emit_line(f, "v%u = !v%u;", keep, keep);
    kiln__emit_close(f, m1, NULL);
    uint32_t m2 = kiln__emit_open(f, "if (v%u)", keep);
    kiln__emit_line(f, "v%u = 1;", found);
    kiln__emit_line(f, "v%u = v%u;", bv, cv);
    for (uint32_t d = 0; d < r; d++) kiln__emit_line(f, "x%u = %s;", bp[d], pos.c[d]);
    kiln__emit_close(f, m2, NULL);
  }
  while (nm-- > 0) kiln__emit_close(f, marks[nm], NULL);
  return rc;
}

static int sas_body(kiln__codegen *g, kiln__emit_fn *f, const kiln__kernel_spec *k,
                    const kiln_instr *sas, const kiln_window *w, uint32_t fsel, uint32_t fsca) {
  const kiln_module *m = g->mod.m;
  const kiln_instr *a = m->instrs[sas->operands[0]], *src = m->instrs[sas->operands[1]];
  const kiln_shape *os = k->out_shape[0];
  kiln_dtype t = os->dtype;
  uint32_t r = a->shape.rank, init, sl[KILN__EMIT_MAXR], marks[KILN__EMIT_MAXR], nm = 0;
  kiln__ix s0 = {0};
  int rc = kiln__emit_value1(f, sas->operands[2], &s0, &init);
  if (rc) return rc;
  char iv[16], e[64];
  snprintf(iv, sizeof iv, "v%u", init);
  kiln__emit_store_expr(t, iv, e, sizeof e);
  kiln__emit_line(f, "for (int64_t q = 0; q < %lldLL; q++) b%u[q] = %s;",
                  (long long)kiln_shape_elements(os), k->out_arg[0], e);
  for (uint32_t d = 0; d < r; d++) {
    sl[d] = kiln__emit_newvar(f);
    marks[nm++] = kiln__emit_open(f, "for (int64_t r%u = 0; r%u < %lld; r%u++)", sl[d], sl[d],
                                  (long long)src->shape.dims[d], sl[d]);
  }
  uint32_t found = kiln__emit_newvar(f), bv = kiln__emit_newvar(f), bp[KILN__EMIT_MAXR];
  kiln__emit_line(f, "uint8_t v%u = 0;", found);
  kiln__emit_line(f, "%s v%u = 0;", kiln__ctype(f->mod, a->shape.dtype), bv);
  kiln__ix best, si;
  rc = kiln__ix_new(f, r, &best);
  if (rc == 0) rc = kiln__ix_new(f, r, &si);
  for (uint32_t d = 0; rc == 0 && d < r; d++) {
    bp[d] = kiln__emit_newvar(f);
    kiln__emit_line(f, "int64_t x%u = 0;", bp[d]);
    kiln__ix_set(&best, d, "x%u", bp[d]);
    kiln__ix_set(&si, d, "r%u", sl[d]);
  }
  if (rc == 0) rc = sas_scan(f, sas, w, sl, fsel, found, bv, bp);
  if (rc == 0) {
    uint32_t mk = kiln__emit_open(f, "if (v%u)", found), sv, cur = kiln__emit_newvar(f);
    char off[512], le[600];
    kiln__ix_offset(f, &best, os, off, sizeof off);
    kiln__emit_load_expr(t, k->out_arg[0], off, le, sizeof le);
    kiln__emit_line(f, "%s v%u = %s;", kiln__ctype(f->mod, t), cur, le);
    rc = kiln__emit_value1(f, src->id, &si, &sv);
    if (rc == 0) {
      uint32_t args[2] = {cur, sv}, out = kiln__emit_newvar(f);
      kiln__emit_line(f, "%s v%u;", kiln__ctype(f->mod, t), out);
      kiln__emit_call_fn(f, fsca, args, 2, &out, 1);
      char v[16];
      snprintf(v, sizeof v, "v%u", out);
      kiln__emit_store_expr(t, v, e, sizeof e);
      kiln__emit_line(f, "b%u[%s] = %s;", k->out_arg[0], off, e);
    }
    kiln__emit_close(f, mk, NULL);
  }
  while (nm-- > 0) kiln__emit_close(f, marks[nm], NULL);
  return rc;
}

int kiln__kernel_select_scatter(kiln__codegen *g, const kiln__kernel_spec *k, uint32_t *kernel,
                                uint64_t *range) {
  const kiln_module *m = g->mod.m;
  const kiln_instr *s = ins_of(g, k->root);
  const kiln_attr *wa = kiln_instr_attr(s, KILN_ATTR_WINDOW);
  const kiln_window *w = wa ? wa->v.window : NULL;
  if (s->noperands != 3 || s->ncalled != 2 || k->nouts != 1 || w == NULL ||
      w->rank != m->instrs[s->operands[0]]->shape.rank ||
      m->instrs[s->operands[1]]->shape.rank != w->rank)
    return fail(g, s, "malformed select-and-scatter");
  const kiln_instr *a = m->instrs[s->operands[0]], *src = m->instrs[s->operands[1]];
  const kiln_computation *sc = m->comps[s->called[1]], *se = m->comps[s->called[0]];
  const kiln_instr *p0 = kiln_computation_param(m, se, 0), *q0 = kiln_computation_param(m, sc, 0);
  const kiln_instr *q1 = kiln_computation_param(m, sc, 1);
  if (!p0 || !q0 || !q1 || p0->shape.dtype != a->shape.dtype ||
      q0->shape.dtype != k->out_shape[0]->dtype || q1->shape.dtype != src->shape.dtype)
    return fail(g, s, "select and scatter must take the operand's and source's element types");
  uint32_t fsel, fsca;
  int rc = kiln__emit_comp_fn(&g->mod, s->called[0], s, &fsel);
  if (rc == 0) rc = kiln__emit_comp_fn(&g->mod, s->called[1], s, &fsca);
  if (rc) return rc;
  kiln_sbuf body = KILN_SBUF_INIT, out = KILN_SBUF_INIT;
  kiln__emit_fn f;
  rc = kiln__kernel_begin(g, k, &body, &f, 1);
  if (rc == 0) rc = sas_body(g, &f, k, s, w, fsel, fsca);
  if (rc == 0 && f.rc) rc = f.rc;
  if (rc == 0) {
    char once[256];
    g->mod.target->single(once, sizeof once);
    kiln_sbuf_printf(&out, "  %s\n", once);
    kiln_sbuf_puts(&out, kiln_sbuf_str(&body));
    *kernel = g->nkernels;
    *range = 1;
    kiln__kernel_finish(g, k, kiln_sbuf_str(&out), 1);
  }
  kiln__emit_fn_free(&f);
  kiln_sbuf_free(&body);
  kiln_sbuf_free(&out);
  return rc;
}

/* ---- prefix scans (cumulative reductions) ------------------------------- */

static int scan_body(kiln__codegen *g, kiln__emit_fn *f, const kiln__kernel_spec *k,
                     const kiln_instr *s, uint32_t dim, uint32_t fred) {
  const kiln_module *m = g->mod.m;
  const kiln_instr *a = m->instrs[s->operands[0]];
  const kiln_shape *os = k->out_shape[0];
  uint32_t r = a->shape.rank, init;
  kiln__ix s0 = {0};
  int rc = kiln__emit_value1(f, s->operands[1], &s0, &init);
  if (rc) return rc;
  uint32_t acc = kiln__emit_newvar(f);
  kiln__emit_line(f, "%s v%u = v%u;", kiln__ctype(f->mod, os->dtype), acc, init);
  uint32_t j = kiln__emit_newvar(f);
  uint32_t mk = kiln__emit_open(f, "for (int64_t r%u = 0; r%u < %lld; r%u++)", j, j,
                                (long long)a->shape.dims[dim], j);
  kiln__ix x;
  if ((rc = kiln__ix_new(f, r, &x)) == 0) {
    for (uint32_t d = 0; d < r; d++) {
      if (d == dim)
        kiln__ix_set(&x, d, "r%u", j);
      else
        kiln__ix_set(&x, d, "o%u", d);
    }
    uint32_t xv;
    rc = kiln__emit_value1(f, a->id, &x, &xv);
    if (rc == 0) {
      uint32_t args[2] = {acc, xv}, out = kiln__emit_newvar(f);
      kiln__emit_line(f, "%s v%u;", kiln__ctype(f->mod, os->dtype), out);
      kiln__emit_call_fn(f, fred, args, 2, &out, 1);
      kiln__emit_line(f, "v%u = v%u;", acc, out);
      char off[512], v[16], e[64];
      kiln__ix_offset(f, &x, os, off, sizeof off);
      snprintf(v, sizeof v, "v%u", acc);
      kiln__emit_store_expr(os->dtype, v, e, sizeof e);
      kiln__emit_line(f, "b%u[%s] = %s;", k->out_arg[0], off, e);
    }
  }
  kiln__emit_close(f, mk, NULL);
  return rc;
}

int kiln__kernel_scan(kiln__codegen *g, const kiln__kernel_spec *k, uint32_t dim, uint32_t *kernel,
                      uint64_t *range) {
  const kiln_module *m = g->mod.m;
  const kiln_instr *s = ins_of(g, k->root);
  if (k->nouts != 1 || !kiln_reduce_window_is_scan(m, s, &dim))
    return fail(g, s, "not a prefix scan");
  const kiln_instr *a = m->instrs[s->operands[0]];
  const kiln_computation *rc0 = m->comps[s->called[0]];
  const kiln_instr *p0 = kiln_computation_param(m, rc0, 0), *p1 = kiln_computation_param(m, rc0, 1);
  if (!p0 || !p1 || p0->shape.dtype != k->out_shape[0]->dtype ||
      p1->shape.dtype != a->shape.dtype || a->shape.dtype != k->out_shape[0]->dtype)
    return fail(g, s, "the reduction must take the operand's element type");
  uint32_t fred;
  int rc = kiln__emit_comp_fn(&g->mod, s->called[0], s, &fred);
  if (rc) return rc;
  kiln_sbuf body = KILN_SBUF_INIT, out = KILN_SBUF_INIT;
  kiln__emit_fn f;
  rc = kiln__kernel_begin(g, k, &body, &f, 2);
  if (rc == 0) rc = scan_body(g, &f, k, s, dim, fred);
  if (rc == 0 && f.rc) rc = f.rc;
  if (rc == 0) {
    kiln_shape rows_shape = a->shape;
    int64_t rdims[KILN__EMIT_MAXR];
    memcpy(rdims, a->shape.dims, a->shape.rank * sizeof *rdims);
    rdims[dim] = 1;
    rows_shape.dims = rdims;
    rows_shape.layout = NULL;
    char loop[256];
    g->mod.target->range_loop(loop, sizeof loop, "i");
    kiln_sbuf_printf(&out, "  %s {\n", loop);
    kiln__kernel_decompose(&out, &rows_shape, "i", 0, "o", 2);
    kiln_sbuf_puts(&out, kiln_sbuf_str(&body));
    kiln_sbuf_puts(&out, "  }\n");
    *kernel = g->nkernels;
    *range = (uint64_t)(kiln_shape_elements(&a->shape) / a->shape.dims[dim]);
    kiln__kernel_finish(g, k, kiln_sbuf_str(&out), *range);
  }
  kiln__emit_fn_free(&f);
  kiln_sbuf_free(&body);
  kiln_sbuf_free(&out);
  return rc;
}

/* ---- integer dots --------------------------------------------------------- */

static bool int_type(kiln_dtype t) {
  return kiln_dtype_is_signed_int(t) || kiln_dtype_is_unsigned_int(t);
}

bool kiln__idot_ok(const kiln_module *m, const kiln_instr *d) {
  if (d->op != KILN_OP_DOT || d->noperands != 2) return false;
  kiln_dtype t = d->shape.dtype;
  unsigned bits = int_type(t) ? kiln_dtype_bits(t) : 0;
  return (bits == 32 || bits == 64) && int_type(m->instrs[d->operands[0]]->shape.dtype) &&
         int_type(m->instrs[d->operands[1]]->shape.dtype);
}

int kiln__kernel_idot(kiln__codegen *g, const kiln__kernel_spec *k, const kiln_gemm *gm,
                      uint32_t *kernel, uint64_t *range) {
  const kiln_module *m = g->mod.m;
  const kiln_instr *d = ins_of(g, k->root);
  if (k->nouts != 1 || k->nbinds != 2 || !kiln__idot_ok(m, d) || (gm->trans_a && gm->trans_b))
    return fail(g, d, "not an integer matrix product");
  kiln_dtype t = d->shape.dtype;
  const char *acc = kiln_dtype_bits(t) == 32 ? "uint32_t" : "uint64_t";
  const char *rt = kiln__stype(&g->mod, t);
  const char *at = kiln__stype(&g->mod, m->instrs[d->operands[0]]->shape.dtype);
  const char *bt = kiln__stype(&g->mod, m->instrs[d->operands[1]]->shape.dtype);
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_printf(&b, "  const %s *A = (const %s *)b%u;\n  const %s *B = (const %s *)b%u;\n", at,
                   at, k->binds[0].args[0], bt, bt, k->binds[1].args[0]);
  kiln_sbuf_printf(&b, "  %s *C = (%s *)b%u;\n  const int64_t lda = %lld;\n", acc, acc,
                   k->out_arg[0], (long long)gm->lda);
  char loop[256];
  g->mod.target->range_loop(loop, sizeof loop, "r");
  kiln_sbuf_printf(&b, "  %s {\n", loop);
  kiln_sbuf_printf(&b,
                   "    const int64_t bb = r / %lld, i = r %% %lld;\n"
                   "    const %s *a = A + bb * %lld;\n    const %s *bm = B + bb * %lld;\n"
                   "    %s *c = C + bb * %lld + i * %lld;\n",
                   (long long)gm->m, (long long)gm->m, at, (long long)gm->stride_a, bt,
                   (long long)gm->stride_b, acc, (long long)gm->stride_c, (long long)gm->ldc);
  /* Each operand converted to the result type first (as the interpreter
   * does), then to the unsigned accumulator. */
  if (!gm->trans_b) {
    /* C[i,:] = sum_k A[i,k] * B[k,:]: rows of B, contiguous. */
    kiln_sbuf_printf(&b, "    for (int64_t j = 0; j < %lld; j++) c[j] = 0;\n", (long long)gm->n);
    kiln_sbuf_printf(&b, "    for (int64_t kk = 0; kk < %lld; kk++) {\n", (long long)gm->k);
    kiln_sbuf_printf(&b, "      const %s av = (%s)(%s)a[%s];\n", acc, acc, rt,
                     gm->trans_a ? "kk * lda + i" : "i * lda + kk");
    kiln_sbuf_printf(&b, "      const %s *br = bm + kk * %lld;\n", bt, (long long)gm->ldb);
    kiln_sbuf_printf(&b,
                     "      for (int64_t j = 0; j < %lld; j++) c[j] += av * (%s)(%s)br[j];\n"
                     "    }\n",
                     (long long)gm->n, acc, rt);
  } else {
    /* B stored as [N, K]: C[i,j] = dot(A[i,:], B[j,:]), both contiguous. */
    kiln_sbuf_printf(&b, "    const %s *ar = a + i * lda;\n", at);
    kiln_sbuf_printf(&b, "    for (int64_t j = 0; j < %lld; j++) {\n", (long long)gm->n);
    kiln_sbuf_printf(&b, "      const %s *br = bm + j * %lld;\n      %s s = 0;\n", bt,
                     (long long)gm->ldb, acc);
    kiln_sbuf_printf(&b,
                     "      for (int64_t kk = 0; kk < %lld; kk++) s += (%s)(%s)ar[kk] * "
                     "(%s)(%s)br[kk];\n      c[j] = s;\n    }\n",
                     (long long)gm->k, acc, rt, acc, rt);
  }
  kiln_sbuf_puts(&b, "  }\n");
  *kernel = g->nkernels;
  *range = (uint64_t)(gm->batch * gm->m);
  kiln__kernel_finish(g, k, kiln_sbuf_str(&b), *range);
  kiln_sbuf_free(&b);
  return 0;
}
