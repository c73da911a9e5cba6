/* The cache key (key.h): the five component digests, and the canonical
 * module text behind the first.
 *
 * The canonical module is the printer's text (text_print.c) of a "view": a
 * second kiln_module whose instruction and computation records are shallow
 * copies of the originals with three things changed.
 *
 *   Names are sequential: computation k of the canonical order is "c<k>",
 *   instruction i of its computation "v<i>"; the module is "m". No name
 *   from the input reaches the text.
 *   Order is canonical. Within a computation: a depth-first post-order from
 *   the root over operands (in operand order), then control predecessors;
 *   then what the root does not reach: parameters by number, then every
 *   other instruction in its original relative order, each after its own
 *   unreached operands. Computations: a post-order of the call graph from
 *   ENTRY, callees in the order the (canonically ordered) instructions name
 *   them; computations ENTRY does not reach follow in original order.
 *   Debug annotations are dropped: metadata= (also inside a sharding),
 *   statistics= and origin=, which describe where an instruction came
 *   from, never what it computes.
 *
 * Everything else (shapes with layouts, attributes, literals, called roles,
 * control edges, shardings, frontend and backend configs, the header but
 * the module name) goes through the printer unchanged, so the key tells
 * apart whatever the printer does, with one spelling of every value. The
 * view shares operand lists, attributes and literals with the module: it
 * costs a record copy per instruction, and all the work is linear (the
 * depth-first walks keep explicit stacks: a chain of 10^5 instructions
 * must not exhaust the C stack).
 *
 * The other components are small texts hashed the same way: the ENTRY
 * interface (signature), the caller's option text, "backend/target" and the
 * versions. KILN_COMPILER_VERSION and KILN_EXE_FORMAT_VERSION come from
 * executable.h as macros only: this library does not link the compiler.
 */
#include <stdlib.h>
#include <string.h>

#include "cache/entry.h"
#include "cache/key.h"
#include "common/alloc.h"
#include "common/arena.h"
#include "compiler/codegen/executable.h"
#include "compiler/ir/ir.h"
#include "compiler/ir/sharding.h"
#include "compiler/ir/text.h"

/* Bumped whenever the canonical text or a component's serialization
 * changes on purpose; every key changes with it. */
#define CANONICAL_FORM_VERSION 3

static const char where_key[] = "cache key";

/* ---- debug annotations ------------------------------------------------- */

static bool is_debug_attr(kiln_attr_key k) {
  return k == KILN_ATTR_METADATA || k == KILN_ATTR_STATISTICS || k == KILN_ATTR_ORIGIN;
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* End of the verbatim piece starting at p: the next whitespace outside
 * brackets and strings, which is where the parser split a sharding's
 * extras. Always past p when *p is not a space. */
static const char *piece_end(const char *p) {
  int depth = 0;
  while (*p) {
    char c = *p;
    if (c == '"') {
      p++;
      while (*p && *p != '"') p += (p[0] == '\\' && p[1]) ? 2 : 1;
      if (*p) p++;
      continue;
    }
    if (c == '{' || c == '(' || c == '[')
      depth++;
    else if ((c == '}' || c == ')' || c == ']') && depth > 0)
      depth--;
    else if (depth == 0 && is_space(c))
      break;
    p++;
  }
  return p;
}

static bool piece_is_metadata(const char *p, const char *e) {
  return (size_t)(e - p) >= 9 && memcmp(p, "metadata=", 9) == 0;
}

/* Appends (when b is not NULL) the pieces of a sharding's verbatim extras
 * but metadata, one space apart. Returns whether a metadata piece was seen. */
static bool put_extra_kept(kiln_sbuf *b, const char *s) {
  bool dropped = false, first = true;
  while (s && *s) {
    while (is_space(*s)) s++;
    if (*s == '\0') break;
    const char *e = piece_end(s);
    if (piece_is_metadata(s, e)) {
      dropped = true;
    } else if (b) {
      if (!first) kiln_sbuf_putc(b, ' ');
      kiln_sbuf_putn(b, s, (size_t)(e - s));
      first = false;
    }
    s = e;
  }
  return dropped;
}

static bool sharding_has_metadata(const kiln_sharding *s) {
  if (s == NULL) return false;
  if (put_extra_kept(NULL, s->extra)) return true;
  if (s->kind == KILN_SHARD_TUPLE)
    for (uint32_t i = 0; i < s->nelems; i++)
      if (sharding_has_metadata(&s->elems[i])) return true;
  return false;
}

/* A copy of src in arena a without metadata; NULL on out-of-memory. */
static kiln_sharding *strip_sharding(kiln_arena *a, const kiln_sharding *src) {
  kiln_sharding *d = kiln_arena_memdup(a, src, sizeof *src);
  if (d == NULL) return NULL;
  if (src->extra) {
    kiln_sbuf b = KILN_SBUF_INIT;
    put_extra_kept(&b, src->extra);
    bool bad = kiln_sbuf_failed(&b);
    d->extra = NULL;
    if (!bad && b.len) bad = (d->extra = kiln_arena_strndup(a, b.data, b.len)) == NULL;
    kiln_sbuf_free(&b);
    if (bad) return NULL;
  }
  if (src->kind == KILN_SHARD_TUPLE && src->nelems) {
    d->elems = kiln_arena_alloc(a, (size_t)src->nelems * sizeof *d->elems);
    if (d->elems == NULL) return NULL;
    for (uint32_t i = 0; i < src->nelems; i++) {
      kiln_sharding *e = strip_sharding(a, &src->elems[i]);
      if (e == NULL) return NULL;
      d->elems[i] = *e;
    }
  }
  return d;
}

/* Points dst at the attributes the canonical text shows: src's own array
 * when nothing is dropped, else a filtered copy. */
static int view_attrs(kiln_arena *a, const kiln_instr *src, kiln_instr *dst) {
  bool change = false;
  for (uint32_t i = 0; i < src->nattrs && !change; i++) {
    const kiln_attr *at = &src->attrs[i];
    change = is_debug_attr(at->key) || (at->key == KILN_ATTR_SHARDING && at->v.sharding);
  }
  if (!change) return 0;
  kiln_attr *v = kiln_arena_alloc(a, (size_t)src->nattrs * sizeof *v);
  if (v == NULL) return KILN_ENOMEM;
  uint32_t n = 0;
  for (uint32_t i = 0; i < src->nattrs; i++) {
    const kiln_attr *at = &src->attrs[i];
    if (is_debug_attr(at->key)) continue;
    v[n] = *at;
    if (at->key == KILN_ATTR_SHARDING && at->v.sharding) {
      const kiln_sharding *sh = at->v.sharding;
      if (sharding_has_metadata(sh) && (sh = strip_sharding(a, sh)) == NULL) return KILN_ENOMEM;
      /* One spelling per assignment (iota or explicit devices alike); a
       * malformed one keeps its own. */
      kiln_sharding *cs = kiln_sharding_canonical(a, sh);
      v[n].v.sharding = cs ? cs : (kiln_sharding *)sh;
    }
    n++;
  }
  dst->attrs = v;
  dst->nattrs = dst->attrcap = n;
  return 0;
}

/* ---- the canonical order ------------------------------------------------ */

typedef struct param_slot {
  int64_t number;
  uint32_t pos; /* in the computation's original list */
  kiln_id id;
} param_slot;

typedef struct comp_frame {
  uint32_t comp;
  uint32_t pos;  /* instruction of the computation's canonical run */
  uint32_t call; /* next called computation of that instruction */
} comp_frame;

typedef struct canon {
  const kiln_module *m;
  /* Per instruction: 0 outside the computation being ordered, 1 a member
   * not placed yet, 2 placed (or on the stack). A member of two lists (a
   * broken builder) is placed once, in the first. */
  uint8_t *state;
  kiln_id *order; /* placed instructions, one computation's run after another */
  uint32_t norder;
  uint32_t *first, *count; /* per computation: its run in order[] */
  kiln_id *stack;          /* depth-first walk over instructions */
  uint32_t *edge;          /* next edge of the instruction at the same depth */
  param_slot *params;
  uint8_t *cstate;    /* per computation: placed in corder */
  comp_frame *frames; /* depth-first walk over the call graph */
  uint32_t *corder;   /* canonical position -> computation id */
  uint32_t *cpos;     /* computation id -> canonical position */
  uint32_t ncorder;
} canon;

/* Places the members reachable from `start` (itself included), operands
 * then control predecessors, in post-order. */
static void place_from(canon *k, kiln_id start) {
  const kiln_module *m = k->m;
  if (start >= m->ninstrs || k->state[start] != 1) return;
  uint32_t sp = 0;
  k->state[start] = 2;
  k->stack[sp] = start;
  k->edge[sp++] = 0;
  while (sp) {
    const kiln_instr *ins = m->instrs[k->stack[sp - 1]];
    uint64_t j = k->edge[sp - 1]++;
    if (j >= (uint64_t)ins->noperands + ins->ncontrol) {
      k->order[k->norder++] = k->stack[--sp];
      continue;
    }
    kiln_id t = j < ins->noperands ? ins->operands[j] : ins->control_preds[j - ins->noperands];
    if (t < m->ninstrs && k->state[t] == 1) {
      k->state[t] = 2;
      k->stack[sp] = t;
      k->edge[sp++] = 0;
    }
  }
}

static int by_param_number(const void *pa, const void *pb) {
  const param_slot *a = pa, *b = pb;
  if (a->number != b->number) return a->number < b->number ? -1 : 1;
  return a->pos < b->pos ? -1 : a->pos > b->pos;
}

static void order_computation(canon *k, const kiln_computation *c) {
  const kiln_module *m = k->m;
  k->first[c->id] = k->norder;
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    kiln_id id = c->instrs[i];
    if (id < m->ninstrs && m->instrs[id] && k->state[id] == 0) k->state[id] = 1;
  }
  place_from(k, c->root);
  uint32_t np = 0;
  for (uint32_t i = 0; i < c->ninstrs; i++) {
    kiln_id id = c->instrs[i];
    if (id < m->ninstrs && k->state[id] == 1 && m->instrs[id]->op == KILN_OP_PARAMETER)
      k->params[np++] = (param_slot){m->instrs[id]->param_number, i, id};
  }
  qsort(k->params, np, sizeof *k->params, by_param_number);
  for (uint32_t i = 0; i < np; i++) place_from(k, k->params[i].id);
  for (uint32_t i = 0; i < c->ninstrs; i++) place_from(k, c->instrs[i]);
  k->count[c->id] = k->norder - k->first[c->id];
}

static bool comp_ok(const kiln_module *m, uint32_t id) {
  return id < m->ncomps && m->comps[id] != NULL;
}

/* Places computation `start` after everything it calls, transitively. */
static void place_comp(canon *k, uint32_t start) {
  const kiln_module *m = k->m;
  if (!comp_ok(m, start) || k->cstate[start]) return;
  uint32_t sp = 0;
  k->cstate[start] = 1;
  k->frames[sp++] = (comp_frame){start, 0, 0};
  while (sp) {
    comp_frame *f = &k->frames[sp - 1];
    if (f->pos == k->count[f->comp]) {
      k->cpos[f->comp] = k->ncorder;
      k->corder[k->ncorder++] = f->comp;
      sp--;
      continue;
    }
    const kiln_instr *ins = m->instrs[k->order[k->first[f->comp] + f->pos]];
    if (f->call >= ins->ncalled) {
      f->pos++;
      f->call = 0;
      continue;
    }
    uint32_t callee = ins->called[f->call++];
    if (comp_ok(m, callee) && !k->cstate[callee]) {
      k->cstate[callee] = 1;
      k->frames[sp++] = (comp_frame){callee, 0, 0};
    }
  }
}

static void canon_free(canon *k) {
  kiln_free(k->state);
  kiln_free(k->order);
  kiln_free(k->first);
  kiln_free(k->count);
  kiln_free(k->stack);
  kiln_free(k->edge);
  kiln_free(k->params);
  kiln_free(k->cstate);
  kiln_free(k->frames);
  kiln_free(k->corder);
  kiln_free(k->cpos);
}

static int canon_order(canon *k, const kiln_module *m) {
  size_t ni = m->ninstrs ? m->ninstrs : 1, nc = m->ncomps ? m->ncomps : 1;
  memset(k, 0, sizeof *k);
  k->m = m;
  k->state = kiln_calloc(ni, 1);
  k->order = kiln_malloc(ni * sizeof *k->order);
  k->first = kiln_calloc(nc, sizeof *k->first);
  k->count = kiln_calloc(nc, sizeof *k->count);
  k->stack = kiln_malloc(ni * sizeof *k->stack);
  k->edge = kiln_malloc(ni * sizeof *k->edge);
  k->params = kiln_malloc(ni * sizeof *k->params);
  k->cstate = kiln_calloc(nc, 1);
  k->frames = kiln_malloc(nc * sizeof *k->frames);
  k->corder = kiln_malloc(nc * sizeof *k->corder);
  k->cpos = kiln_malloc(nc * sizeof *k->cpos);
  if (!k->state || !k->order || !k->first || !k->count || !k->stack || !k->edge || !k->params ||
      !k->cstate || !k->frames || !k->corder || !k->cpos)
    return KILN_ENOMEM;
  for (uint32_t c = 0; c < m->ncomps; c++)
    if (m->comps[c]) order_computation(k, m->comps[c]);
  if (m->entry != KILN_NO_ID) place_comp(k, m->entry);
  for (uint32_t c = 0; c < m->ncomps; c++) place_comp(k, c);
  return 0;
}

/* ---- layouts ------------------------------------------------------------ */

/* A layout that says nothing beyond the default (major-to-minor dims in
 * order, no tiles, no memory space) is dropped: `f32[2,3]` and
 * `f32[2,3]{1,0}` are one program, as kiln_shape_equal has it. */
static bool layout_is_default(const kiln_shape *s) {
  const kiln_layout *l = s->layout;
  return !l->tail && !l->memory_space && l->rank == s->rank && kiln_shape_is_row_major(s);
}

/* dst = src with default layouts dropped, sharing what does not change. */
static int shape_canon(kiln_arena *a, const kiln_shape *src, kiln_shape *dst) {
  *dst = *src;
  if (src->dtype == KILN_TUPLE && src->rank) {
    kiln_shape *t = kiln_arena_alloc(a, (size_t)src->rank * sizeof *t);
    if (t == NULL) return KILN_ENOMEM;
    for (uint32_t i = 0; i < src->rank; i++)
      if (shape_canon(a, &src->tuple[i], &t[i])) return KILN_ENOMEM;
    dst->tuple = t;
  } else if (src->layout && layout_is_default(src)) {
    dst->layout = NULL;
  }
  return 0;
}

static bool shape_has_layout(const kiln_shape *s) {
  if (s->dtype == KILN_TUPLE) {
    for (uint32_t i = 0; i < s->rank; i++)
      if (shape_has_layout(&s->tuple[i])) return true;
    return false;
  }
  return s->layout != NULL;
}

/* The entry layout with default layouts dropped; NULL (*out) when nothing
 * is left of it: the instructions' own shapes then say all it said. */
static int entry_layout_canon(kiln_arena *a, const kiln_program_shape *src,
                              kiln_program_shape **out) {
  *out = NULL;
  if (src == NULL) return 0;
  kiln_program_shape *p = kiln_arena_alloc(a, sizeof *p);
  if (p == NULL) return KILN_ENOMEM;
  *p = *src;
  if (src->nparams &&
      (p->params = kiln_arena_alloc(a, (size_t)src->nparams * sizeof *p->params)) == NULL)
    return KILN_ENOMEM;
  bool any = false;
  for (uint32_t i = 0; i < src->nparams; i++) {
    if (shape_canon(a, &src->params[i], &p->params[i])) return KILN_ENOMEM;
    any = any || shape_has_layout(&p->params[i]);
  }
  if (shape_canon(a, &src->result, &p->result)) return KILN_ENOMEM;
  any = any || shape_has_layout(&p->result);
  if (any) *out = p;
  return 0;
}

/* ---- the view ----------------------------------------------------------- */

static const char *seq_name(kiln_arena *a, char prefix, uint32_t n) {
  char buf[16], digits[12];
  int nd = 0;
  do {
    digits[nd++] = (char)('0' + n % 10);
    n /= 10;
  } while (n);
  size_t len = 0;
  buf[len++] = prefix;
  while (nd) buf[len++] = digits[--nd];
  return kiln_arena_strndup(a, buf, len);
}

/* Fills v's header from m: everything but the name. */
static void view_header(kiln_module *v, const kiln_module *m, kiln_arena *a) {
  memset(v, 0, sizeof *v);
  v->arena = a;
  v->name = "m";
  v->entry_layout = m->entry_layout;
  v->is_scheduled = m->is_scheduled;
  v->aliases = m->aliases;
  v->naliases = m->naliases;
  v->has_aliases = m->has_aliases;
  v->replica_count = m->replica_count;
  v->num_partitions = m->num_partitions;
  v->header_extra = m->header_extra;
  v->nheader_extra = m->nheader_extra;
}

/* The copy of instruction `id` as instruction `pos` of view computation p. */
static int view_instr(const canon *k, kiln_arena *a, kiln_instr *rec, kiln_id id, uint32_t p,
                      uint32_t pos) {
  const kiln_module *m = k->m;
  const kiln_instr *src = m->instrs[id];
  *rec = *src;
  rec->comp = p;
  rec->line = rec->col = 0;
  if ((rec->name = seq_name(a, 'v', pos)) == NULL) return KILN_ENOMEM;
  if (shape_canon(a, &src->shape, &rec->shape)) return KILN_ENOMEM;
  if (src->ncalled) {
    uint32_t *called = kiln_arena_alloc(a, (size_t)src->ncalled * sizeof *called);
    if (called == NULL) return KILN_ENOMEM;
    for (uint32_t j = 0; j < src->ncalled; j++)
      called[j] = comp_ok(m, src->called[j]) ? k->cpos[src->called[j]] : KILN_NO_ID;
    rec->called = called;
  }
  return view_attrs(a, src, rec);
}

static int build_view(const canon *k, kiln_arena *a, kiln_module *v) {
  const kiln_module *m = k->m;
  view_header(v, m, a);
  if (entry_layout_canon(a, m->entry_layout, &v->entry_layout)) return KILN_ENOMEM;
  v->ninstrs = m->ninstrs;
  v->instrs = kiln_arena_calloc(a, m->ninstrs ? m->ninstrs : 1, sizeof *v->instrs);
  kiln_instr *recs = kiln_arena_alloc(a, (k->norder ? k->norder : 1) * sizeof *recs);
  v->comps = kiln_arena_alloc(a, (k->ncorder ? k->ncorder : 1) * sizeof *v->comps);
  kiln_computation *crecs = kiln_arena_calloc(a, k->ncorder ? k->ncorder : 1, sizeof *crecs);
  if (!v->instrs || !recs || !v->comps || !crecs) return KILN_ENOMEM;
  v->ncomps = k->ncorder;
  v->entry = comp_ok(m, m->entry) ? k->cpos[m->entry] : KILN_NO_ID;
  for (uint32_t p = 0; p < k->ncorder; p++) {
    const kiln_computation *src = m->comps[k->corder[p]];
    kiln_computation *c = &crecs[p];
    uint32_t first = k->first[src->id], n = k->count[src->id];
    c->id = p;
    if ((c->name = seq_name(a, 'c', p)) == NULL) return KILN_ENOMEM;
    c->instrs = &k->order[first];
    c->ninstrs = c->cap = n;
    c->is_entry = p == v->entry;
    for (uint32_t i = 0; i < n; i++) {
      kiln_id id = k->order[first + i];
      int rc = view_instr(k, a, &recs[first + i], id, p, i);
      if (rc) return rc;
      v->instrs[id] = &recs[first + i];
    }
    kiln_id r = src->root;
    c->root = r < m->ninstrs && v->instrs[r] && v->instrs[r]->comp == p ? r : KILN_NO_ID;
    v->comps[p] = c;
  }
  return 0;
}

int kiln_cache_canonical_module(const kiln_module *m, kiln_sbuf *out, kiln_status *st) {
  if (m == NULL || out == NULL)
    return kiln_status_set(st, KILN_EINVAL, where_key, "no module or no output buffer");
  canon k;
  kiln_arena *a = kiln_arena_create();
  int rc = a ? canon_order(&k, m) : KILN_ENOMEM;
  kiln_module view;
  if (rc == 0) rc = build_view(&k, a, &view);
  if (rc == 0) {
    kiln_module_print_to(out, &view);
    if (kiln_sbuf_failed(out)) rc = KILN_ENOMEM;
  }
  if (a) canon_free(&k);
  kiln_arena_destroy(a);
  if (rc) return kiln_status_set(st, rc, where_key, "out of memory writing the canonical module");
  return 0;
}

/* ---- the signature ------------------------------------------------------ */

static void put_ints(kiln_sbuf *b, const kiln_i64s *s) {
  kiln_sbuf_putc(b, '[');
  for (uint32_t i = 0; i < s->n; i++) kiln_sbuf_printf(b, i ? ",%lld" : "%lld", (long long)s->v[i]);
  kiln_sbuf_putc(b, ']');
}

/* A sharding in a form of its own (the printer's is not public): every
 * field, metadata dropped. */
static void put_sharding(kiln_sbuf *b, const kiln_sharding *s) {
  static const char *const kinds[] = {"replicated", "maximal", "tiled",
                                      "manual",     "unknown", "tuple"};
  if (s == NULL) {
    kiln_sbuf_puts(b, "none");
    return;
  }
  if ((unsigned)s->kind <= KILN_SHARD_TUPLE)
    kiln_sbuf_puts(b, kinds[s->kind]);
  else
    kiln_sbuf_printf(b, "kind%d", (int)s->kind);
  if (s->kind == KILN_SHARD_MAXIMAL) kiln_sbuf_printf(b, " device=%lld", (long long)s->device);
  if (s->kind == KILN_SHARD_TILED) {
    kiln_sbuf_puts(b, " tiles=");
    put_ints(b, &s->tile_dims);
    kiln_sbuf_puts(b, " devices=");
    put_ints(b, &s->devices);
    kiln_sbuf_puts(b, " iota=");
    put_ints(b, &s->iota_reshape);
    kiln_sbuf_puts(b, " perm=");
    put_ints(b, &s->iota_perm);
    kiln_sbuf_puts(b, s->last_tile_dim_replicate ? " last_tile_dim_replicate" : "");
    kiln_sbuf_puts(b, " last_tile_dims=");
    put_ints(b, &s->last_tile_dims);
  }
  if (s->kind == KILN_SHARD_TUPLE) {
    kiln_sbuf_puts(b, " {");
    for (uint32_t i = 0; i < s->nelems; i++) {
      if (i) kiln_sbuf_puts(b, ", ");
      put_sharding(b, &s->elems[i]);
    }
    kiln_sbuf_putc(b, '}');
  }
  if (s->extra) {
    kiln_sbuf_puts(b, " extra={");
    put_extra_kept(b, s->extra);
    kiln_sbuf_putc(b, '}');
  }
}

static void put_instr_sharding(kiln_sbuf *b, const kiln_instr *ins) {
  const kiln_attr *at = kiln_instr_attr(ins, KILN_ATTR_SHARDING);
  kiln_sbuf_puts(b, " sharding=");
  const kiln_sharding *s = at ? at->v.sharding : NULL;
  kiln_arena *a = s ? kiln_arena_create() : NULL;
  const kiln_sharding *cs = a ? kiln_sharding_canonical(a, s) : NULL;
  if (s && a == NULL) b->failed = true; /* out of memory: the key fails */
  put_sharding(b, cs ? cs : s);
  kiln_arena_destroy(a);
  kiln_sbuf_putc(b, '\n');
}

static void put_aliases(kiln_sbuf *b, const kiln_module *m) {
  for (uint32_t i = 0; i < m->naliases; i++) {
    const kiln_alias *al = &m->aliases[i];
    kiln_sbuf_puts(b, "alias ");
    put_ints(b, &al->output_index);
    kiln_sbuf_printf(b, " <- %lld ", (long long)al->param_number);
    put_ints(b, &al->param_index);
    kiln_sbuf_puts(b, al->kind == KILN_ALIAS_MUST ? " must\n" : " may\n");
  }
}

/* The ENTRY interface: parameters by number, the result, the entry layout
 * when given, the aliases. */
static void put_shape(kiln_sbuf *b, kiln_arena *a, const kiln_shape *s) {
  kiln_shape c;
  if (shape_canon(a, s, &c) == 0)
    kiln_shape_print(b, &c);
  else
    b->failed = true;
}

static int put_signature(kiln_sbuf *b, kiln_arena *a, const kiln_module *m, kiln_status *st) {
  const kiln_computation *e = comp_ok(m, m->entry) ? m->comps[m->entry] : NULL;
  if (e == NULL) return kiln_status_set(st, KILN_EINVAL, where_key, "the module has no ENTRY");
  if (e->root >= m->ninstrs || m->instrs[e->root] == NULL)
    return kiln_status_set(st, KILN_EINVAL, where_key, "the ENTRY computation has no root");
  param_slot *ps = kiln_malloc((e->ninstrs ? e->ninstrs : 1) * sizeof *ps);
  if (ps == NULL) return kiln_status_set(st, KILN_ENOMEM, where_key, "out of memory");
  uint32_t np = 0;
  for (uint32_t i = 0; i < e->ninstrs; i++) {
    kiln_id id = e->instrs[i];
    if (id < m->ninstrs && m->instrs[id] && m->instrs[id]->op == KILN_OP_PARAMETER)
      ps[np++] = (param_slot){m->instrs[id]->param_number, i, id};
  }
  qsort(ps, np, sizeof *ps, by_param_number);
  kiln_sbuf_printf(b, "params %u\n", (unsigned)np);
  for (uint32_t i = 0; i < np; i++) {
    const kiln_instr *p = m->instrs[ps[i].id];
    kiln_sbuf_printf(b, "param %lld ", (long long)p->param_number);
    put_shape(b, a, &p->shape);
    put_instr_sharding(b, p);
  }
  kiln_free(ps);
  const kiln_instr *root = m->instrs[e->root];
  kiln_sbuf_puts(b, "result ");
  put_shape(b, a, &root->shape);
  put_instr_sharding(b, root);
  kiln_program_shape *l = NULL;
  if (entry_layout_canon(a, m->entry_layout, &l)) b->failed = true;
  if (l) {
    kiln_sbuf_puts(b, "layout (");
    for (uint32_t i = 0; i < l->nparams; i++) {
      if (i) kiln_sbuf_puts(b, ", ");
      kiln_shape_print(b, &l->params[i]);
    }
    kiln_sbuf_puts(b, ")->");
    kiln_shape_print(b, &l->result);
    kiln_sbuf_putc(b, '\n');
  }
  put_aliases(b, m);
  return 0;
}

/* ---- the key ------------------------------------------------------------ */

static void hash_buf(const kiln_sbuf *b, uint8_t out[KILN_CACHE_DIGEST_LEN]) {
  kiln_cache_sha256(b->data ? b->data : "", b->len, out);
}

int kiln_cache_key_compute(const kiln_module *m, const kiln_cache_key_inputs *in,
                           kiln_cache_key *out, kiln_status *st) {
  if (out) memset(out, 0, sizeof *out);
  if (m == NULL || in == NULL || out == NULL || in->backend == NULL)
    return kiln_status_set(st, KILN_EINVAL, where_key, "no module, inputs, backend or output");
  kiln_sbuf b = KILN_SBUF_INIT;
  int rc = kiln_cache_canonical_module(m, &b, st);
  if (rc) goto out;
  hash_buf(&b, out->parts[KILN_CACHE_PART_MODULE]);

  kiln_sbuf_reset(&b);
  kiln_arena *a = kiln_arena_create();
  rc = a ? put_signature(&b, a, m, st) : KILN_ENOMEM;
  kiln_arena_destroy(a);
  if (rc == KILN_ENOMEM) goto out_nomem;
  if (rc) goto out;
  if (kiln_sbuf_failed(&b)) goto out_nomem;
  hash_buf(&b, out->parts[KILN_CACHE_PART_SIGNATURE]);

  const char *opts = in->options ? in->options : "";
  kiln_cache_sha256(opts, strlen(opts), out->parts[KILN_CACHE_PART_OPTIONS]);

  kiln_sbuf_reset(&b);
  kiln_sbuf_printf(&b, "%s/%s", in->backend, in->target ? in->target : "");
  if (kiln_sbuf_failed(&b)) goto out_nomem;
  hash_buf(&b, out->parts[KILN_CACHE_PART_TARGET]);

  kiln_sbuf_reset(&b);
  kiln_sbuf_printf(&b, "compiler=%s\nexe_format=%u\ncache_entry=%u\ncanonical_form=%d\n",
                   KILN_COMPILER_VERSION, (unsigned)KILN_EXE_FORMAT_VERSION,
                   (unsigned)KILN_CACHE_ENTRY_VERSION, CANONICAL_FORM_VERSION);
  if (kiln_sbuf_failed(&b)) goto out_nomem;
  hash_buf(&b, out->parts[KILN_CACHE_PART_VERSION]);

  kiln_cache_key_from_parts(out);
  kiln_sbuf_free(&b);
  return 0;
out_nomem:
  rc = kiln_status_set(st, KILN_ENOMEM, where_key, "out of memory");
out:
  kiln_sbuf_free(&b);
  memset(out, 0, sizeof *out);
  return rc;
}
