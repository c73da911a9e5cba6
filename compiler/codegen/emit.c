/* The kernel emitter's core: functions being written, indices, values and
 * their memo, inputs, types and literals, and the dispatch from an
 * instruction to its op family (emit_elementwise.c, emit_shape.c,
 * emit_reduce.c). See emit.h for the model.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/fp16.h"
#include "compiler/buffer_assign.h"
#include "compiler/codegen/emit.h"

/* ---- the prelude contract ----------------------------------------------- */

const kiln__prelude_helper kiln__prelude_helpers[] = {
#define X(name, sig) {#name, sig},
    KILN__PRELUDE_HELPERS(X)
#undef X
        {NULL, NULL}};

const char *const kiln__emit_std_funcs[] = {
#define X(name) #name,
    KILN__EMIT_STD_FUNCS(X)
#undef X
        NULL};

/* ---- setup -------------------------------------------------------------- */

int kiln__emit_mod_init(kiln__emit_mod *mod, const kiln_module *m, const kiln__cg_target *target,
                        kiln_status *st) {
  memset(mod, 0, sizeof *mod);
  mod->m = m;
  mod->target = target;
  mod->st = st;
  kiln_sbuf_init(&mod->funcs);
  mod->comp_fn = kiln_malloc((m->ncomps ? m->ncomps : 1) * sizeof *mod->comp_fn);
  if (mod->comp_fn == NULL) return kiln_status_set(st, KILN_ENOMEM, "codegen", "out of memory");
  for (uint32_t i = 0; i < m->ncomps; i++) mod->comp_fn[i] = -1;
  return 0;
}

void kiln__emit_mod_free(kiln__emit_mod *mod) {
  kiln_sbuf_free(&mod->funcs);
  kiln_free(mod->comp_fn);
  kiln_free(mod->fn_tuple);
  mod->comp_fn = NULL;
  mod->fn_tuple = NULL;
}

int kiln__emit_fn_init(kiln__emit_fn *f, kiln__emit_mod *mod, kiln_sbuf *out, int indent) {
  memset(f, 0, sizeof *f);
  f->mod = mod;
  f->out = out;
  f->indent = indent;
  f->nix = 1; /* 0 is every rank-0 index */
  uint32_t n = mod->m->ninstrs ? mod->m->ninstrs : 1;
  f->in_first = kiln_malloc(n * sizeof *f->in_first);
  f->arena = kiln_arena_create();
  if (f->in_first == NULL || f->arena == NULL) {
    kiln_free(f->in_first);
    kiln_arena_destroy(f->arena);
    f->in_first = NULL;
    f->arena = NULL;
    return kiln_status_set(mod->st, KILN_ENOMEM, "codegen", "out of memory");
  }
  memset(f->in_first, 0xff, n * sizeof *f->in_first);
  return 0;
}

void kiln__emit_fn_free(kiln__emit_fn *f) {
  kiln_free(f->in_first);
  kiln_free(f->in);
  kiln_free(f->memo);
  kiln_arena_destroy(f->arena);
  memset(f, 0, sizeof *f);
}

static int oom(kiln__emit_fn *f) {
  if (f->rc == 0) f->rc = kiln_status_set(f->mod->st, KILN_ENOMEM, "codegen", "out of memory");
  return f->rc;
}

int kiln__emit_bind(kiln__emit_fn *f, kiln_id id, const uint32_t *args,
                    const kiln_shape *const *shapes, const char *const *vars, uint32_t nleaves) {
  if (kiln_grow((void **)&f->in, &f->incap, f->nin + nleaves + 1, sizeof *f->in)) return oom(f);
  f->in_first[id] = f->nin;
  for (uint32_t k = 0; k < nleaves; k++) {
    kiln__emit_input *in = &f->in[f->nin++];
    memset(in, 0, sizeof *in);
    in->arg = args ? args[k] : KILN__NO_INPUT;
    in->shape = shapes ? shapes[k] : NULL;
    if (vars) snprintf(in->var, sizeof in->var, "%s", vars[k]);
  }
  return 0;
}

/* ---- writing ------------------------------------------------------------ */

static void put_indent(kiln__emit_fn *f) {
  for (int i = 0; i < f->indent; i++) kiln_sbuf_puts(f->out, "  ");
}

void kiln__emit_line(kiln__emit_fn *f, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  put_indent(f);
  kiln_sbuf_puts(f->out, buf);
  kiln_sbuf_putc(f->out, '\n');
}

uint32_t kiln__emit_open(kiln__emit_fn *f, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  put_indent(f);
  kiln_sbuf_puts(f->out, buf);
  kiln_sbuf_puts(f->out, " {\n");
  f->indent++;
  return f->nmemo;
}

void kiln__emit_close(kiln__emit_fn *f, uint32_t mark, const char *tail) {
  f->indent--;
  put_indent(f);
  kiln_sbuf_puts(f->out, "}");
  if (tail) kiln_sbuf_puts(f->out, tail);
  kiln_sbuf_putc(f->out, '\n');
  if (mark < f->nmemo) f->nmemo = mark;
}

uint32_t kiln__emit_newvar(kiln__emit_fn *f) { return f->nvars++; }

int kiln__emit_fail(kiln__emit_fn *f, const kiln_instr *ins, int code, const char *fmt, ...) {
  if (f->rc) return f->rc;
  char where[KILN_STATUS_WHERE_MAX], msg[KILN_STATUS_MSG_MAX];
  kiln_instr_where(f->mod->m, ins, where, sizeof where);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  f->rc = kiln_status_set(f->mod->st, code, where, "%s", msg);
  return f->rc;
}

/* ---- indices ------------------------------------------------------------ */

int kiln__ix_new(kiln__emit_fn *f, uint32_t rank, kiln__ix *x) {
  memset(x, 0, sizeof *x);
  x->rank = rank;
  x->f = f;
  x->id = rank ? f->nix++ : 0;
  if (rank) {
    x->c = kiln_arena_calloc(f->arena, rank, sizeof *x->c);
    if (x->c == NULL) return oom(f);
  }
  return 0;
}

const char *kiln__ix_get(kiln__emit_fn *f, const kiln__ix *x, uint32_t d) {
  if (x->root) f->used_root = true;
  return x->c[d];
}

void kiln__ix_set(kiln__ix *x, uint32_t d, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  /* Nested strided slices and reshapes compose components longer than the
   * inline room: those were cut short (unbalanced C) before. */
  if (n >= 0 && n < KILN__IX_LEN)
    memcpy(x->c[d], buf, (size_t)n + 1);
  else
    kiln__ix_var(x->f, x->c[d], "%s", buf);
}

void kiln__ix_var(kiln__emit_fn *f, char dst[KILN__IX_LEN], const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  uint32_t v = kiln__emit_newvar(f);
  kiln__emit_line(f, "int64_t x%u = %s;", v, buf);
  snprintf(dst, KILN__IX_LEN, "x%u", v);
}

static void strides_of(const kiln_shape *s, int64_t *st) {
  int64_t m2m[KILN__EMIT_MAXR];
  kiln_shape_minor_to_major(s, m2m);
  int64_t acc = 1;
  for (uint32_t k = 0; k < s->rank; k++) {
    st[m2m[k]] = acc;
    acc *= s->dims[m2m[k]];
  }
}

void kiln__ix_offset(kiln__emit_fn *f, const kiln__ix *x, const kiln_shape *s, char *dst,
                     size_t size) {
  if (x->lin && x->lin_shape && kiln__same_layout(s, x->lin_shape)) {
    snprintf(dst, size, "%s", x->lin);
    return;
  }
  int64_t st[KILN__EMIT_MAXR];
  strides_of(s, st);
  kiln_sbuf b = KILN_SBUF_INIT;
  for (uint32_t d = 0; d < s->rank && d < x->rank; d++) {
    if (s->dims[d] == 1) continue;
    const char *c = kiln__ix_get(f, x, d);
    if (strcmp(c, "0") == 0) continue;
    if (b.len) kiln_sbuf_puts(&b, " + ");
    if (st[d] == 1)
      kiln_sbuf_puts(&b, c);
    else
      kiln_sbuf_printf(&b, "%s * %lld", c, (long long)st[d]);
  }
  snprintf(dst, size, "%s", b.len ? kiln_sbuf_str(&b) : "0");
  kiln_sbuf_free(&b);
}

void kiln__ix_linear(kiln__emit_fn *f, const kiln__ix *x, const int64_t *dims, char *dst,
                     size_t size) {
  kiln_sbuf b = KILN_SBUF_INIT;
  int64_t stride = 1;
  for (uint32_t d = x->rank; d-- > 0;) {
    if (dims[d] != 1) {
      const char *c = kiln__ix_get(f, x, d);
      if (strcmp(c, "0") != 0) {
        if (b.len) kiln_sbuf_puts(&b, " + ");
        if (stride == 1)
          kiln_sbuf_puts(&b, c);
        else
          kiln_sbuf_printf(&b, "%s * %lld", c, (long long)stride);
      }
    }
    stride *= dims[d];
  }
  snprintf(dst, size, "%s", b.len ? kiln_sbuf_str(&b) : "0");
  kiln_sbuf_free(&b);
}

int kiln__ix_split(kiln__emit_fn *f, const char *linear, const int64_t *dims, uint32_t rank,
                   kiln__ix *out) {
  int rc = kiln__ix_new(f, rank, out);
  if (rc) return rc;
  char lin[KILN__IX_LEN];
  int nbig = 0;
  for (uint32_t d = 0; d < rank; d++) nbig += dims[d] != 1;
  if (nbig == 0) {
    for (uint32_t d = 0; d < rank; d++) kiln__ix_set(out, d, "0");
    return 0;
  }
  kiln__ix_var(f, lin, "%s", linear);
  int64_t stride = 1;
  uint32_t first = rank;
  for (uint32_t d = 0; d < rank; d++)
    if (dims[d] != 1 && first == rank) first = d;
  for (uint32_t d = rank; d-- > 0;) {
    if (dims[d] == 1) {
      kiln__ix_set(out, d, "0");
      continue;
    }
    if (d == first && stride == 1)
      kiln__ix_set(out, d, "%s", lin);
    else if (d == first)
      kiln__ix_var(f, out->c[d], "%s / %lld", lin, (long long)stride);
    else if (stride == 1)
      kiln__ix_var(f, out->c[d], "%s %% %lld", lin, (long long)dims[d]);
    else
      kiln__ix_var(f, out->c[d], "%s / %lld %% %lld", lin, (long long)stride, (long long)dims[d]);
    stride *= dims[d];
  }
  return 0;
}

/* ---- types and literals ------------------------------------------------- */

bool kiln__emit_dtype_ok(kiln_dtype t) {
  switch (t) {
  case KILN_PRED:
  case KILN_S8:
  case KILN_S16:
  case KILN_S32:
  case KILN_S64:
  case KILN_U8:
  case KILN_U16:
  case KILN_U32:
  case KILN_U64:
  case KILN_F16:
  case KILN_BF16:
  case KILN_F32:
  case KILN_F64:
  case KILN_C64:
  case KILN_C128: return true;
  default: return false;
  }
}

const char *kiln__ctype(const kiln__emit_mod *mod, kiln_dtype t) {
  const char *s = (unsigned)t < KILN_DTYPE_COUNT ? mod->target->ctype[t] : NULL;
  return s ? s : mod->target->ctype[KILN_U8];
}

const char *kiln__stype(const kiln__emit_mod *mod, kiln_dtype t) {
  const char *s = (unsigned)t < KILN_DTYPE_COUNT ? mod->target->stype[t] : NULL;
  return s ? s : mod->target->stype[KILN_U8];
}

void kiln__emit_load_expr(kiln_dtype t, uint32_t arg, const char *off, char *dst, size_t size) {
  switch (t) {
  case KILN_PRED: snprintf(dst, size, "(uint8_t)(b%u[%s] != 0)", arg, off); break;
  case KILN_F16: snprintf(dst, size, "kh2f(b%u[%s])", arg, off); break;
  case KILN_BF16: snprintf(dst, size, "kb2f(b%u[%s])", arg, off); break;
  default: snprintf(dst, size, "b%u[%s]", arg, off); break;
  }
}

void kiln__emit_store_expr(kiln_dtype t, const char *v, char *dst, size_t size) {
  switch (t) {
  case KILN_F16: snprintf(dst, size, "kf2h(%s)", v); break;
  case KILN_BF16: snprintf(dst, size, "kf2b(%s)", v); break;
  default: snprintf(dst, size, "%s", v); break;
  }
}

void kiln__emit_literal(const kiln__emit_mod *mod, kiln_dtype t, const kiln_literal *lit, int64_t i,
                        char *dst, size_t size) {
  switch (kiln_dtype_kind_of(t)) {
  case KILN_KIND_PRED: snprintf(dst, size, "%d", kiln_literal_get_pred(lit, i) ? 1 : 0); break;
  case KILN_KIND_SINT: {
    int64_t v = kiln_literal_get_s64(lit, i);
    if (v == INT64_MIN)
      snprintf(dst, size, "((int64_t)(-9223372036854775807LL - 1))");
    else
      snprintf(dst, size, "((%s)%lldLL)", kiln__ctype(mod, t), (long long)v);
    break;
  }
  case KILN_KIND_UINT:
    snprintf(dst, size, "((%s)%lluULL)", kiln__ctype(mod, t),
             (unsigned long long)kiln_literal_get_u64(lit, i));
    break;
  default: {
    const uint8_t *p = (const uint8_t *)lit->data + (size_t)i * kiln_dtype_size(t);
    if (t == KILN_F16 || t == KILN_BF16) {
      uint16_t h;
      memcpy(&h, p, 2);
      snprintf(dst, size, "%s(0x%04x)", t == KILN_F16 ? "kh2f" : "kb2f", h);
    } else if (t == KILN_F32) {
      uint32_t u;
      memcpy(&u, p, 4);
      snprintf(dst, size, "kbf32(0x%08xu)", u);
    } else if (t == KILN_C64) {
      uint32_t u[2];
      memcpy(u, p, 8);
      snprintf(dst, size, "kcx(kbf32(0x%08xu), kbf32(0x%08xu))", u[0], u[1]);
    } else if (t == KILN_C128) {
      uint64_t u[2];
      memcpy(u, p, 16);
      snprintf(dst, size, "kcx(kbf64(0x%016llxULL), kbf64(0x%016llxULL))", (unsigned long long)u[0],
               (unsigned long long)u[1]);
    } else {
      uint64_t u;
      memcpy(&u, p, 8);
      snprintf(dst, size, "kbf64(0x%016llxULL)", (unsigned long long)u);
    }
    break;
  }
  }
}

/* ---- memo --------------------------------------------------------------- */

static const kiln__memo *memo_get(kiln__emit_fn *f, kiln_id id, uint32_t ix) {
  for (uint32_t i = f->nmemo; i-- > 0;)
    if (f->memo[i].id == id && f->memo[i].ix == ix) return &f->memo[i];
  return NULL;
}

int kiln__emit_memo_put(kiln__emit_fn *f, kiln_id id, const kiln__ix *x, const uint32_t *vars,
                        uint32_t n) {
  if (kiln_grow((void **)&f->memo, &f->memocap, f->nmemo + 1, sizeof *f->memo)) return oom(f);
  uint32_t *v = kiln_arena_memdup(f->arena, vars, (n ? n : 1) * sizeof *vars);
  if (v == NULL) return oom(f);
  f->memo[f->nmemo++] = (kiln__memo){id, x->id, n, v};
  return 0;
}

/* ---- values ------------------------------------------------------------- */

static uint32_t leaves_of(const kiln_shape *s);

/* Inputs first..first+n (of a bound instruction, or the part of one a
 * chain of get-tuple-elements selects) read at x. */
static int load_input(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x, uint32_t first,
                      uint32_t *vars, uint32_t n) {
  const kiln_shape *s = &ins->shape;
  for (uint32_t k = 0; k < n; k++) {
    const kiln__emit_input *in = &f->in[first + k];
    const kiln_shape *ls = in->shape ? in->shape : s;
    uint32_t v = kiln__emit_newvar(f);
    if (in->arg == KILN__NO_INPUT) {
      kiln__emit_line(f, "%s v%u = %s;", kiln__ctype(f->mod, ls->dtype), v, in->var);
    } else if (!kiln_shape_is_array(ls)) {
      kiln__emit_line(f, "uint8_t v%u = 0;", v);
    } else {
      char off[512], e[600];
      if (ls->rank != x->rank && kiln_shape_elements(ls) != 1)
        return kiln__emit_fail(f, ins, KILN_EINTERNAL, "input %s read at an index of rank %u",
                               ins->name, x->rank);
      if (ls->rank != x->rank)
        snprintf(off, sizeof off, "0");
      else
        kiln__ix_offset(f, x, ls, off, sizeof off);
      kiln__emit_load_expr(ls->dtype, in->arg, off, e, sizeof e);
      kiln__emit_line(f, "%s v%u = %s;", kiln__ctype(f->mod, ls->dtype), v, e);
    }
    vars[k] = v;
  }
  return 0;
}

/* Whether id's value comes from bound inputs (directly or through
 * get-tuple-elements of a bound tuple): *first and *n select the leaves. */
static bool input_leaves(kiln__emit_fn *f, kiln_id id, uint32_t *first, uint32_t *n) {
  const kiln_instr *ins = f->mod->m->instrs[id];
  if (f->in_first[id] != KILN__NO_INPUT) {
    *first = f->in_first[id];
    *n = leaves_of(&ins->shape);
    return true;
  }
  if (ins->op != KILN_OP_GET_TUPLE_ELEMENT || ins->noperands != 1) return false;
  const kiln_instr *t = f->mod->m->instrs[ins->operands[0]];
  int64_t idx = kiln_instr_attr_int(ins, KILN_ATTR_INDEX, -1);
  if (!kiln_shape_is_tuple(&t->shape) || idx < 0 || idx >= t->shape.rank) return false;
  if (!input_leaves(f, t->id, first, n)) return false;
  for (int64_t i = 0; i < idx; i++) *first += leaves_of(&t->shape.tuple[i]);
  *n = leaves_of(&t->shape.tuple[idx]);
  return true;
}

static int tuple_value(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x, uint32_t **out,
                       uint32_t *nout) {
  uint32_t total = 0, cap = 8;
  uint32_t *all = kiln_arena_alloc(f->arena, cap * sizeof *all);
  if (all == NULL) return oom(f);
  for (uint32_t j = 0; j < ins->noperands; j++) {
    const uint32_t *v;
    uint32_t n;
    int rc = kiln__emit_value(f, ins->operands[j], x, &v, &n);
    if (rc) return rc;
    if (total + n > cap) {
      uint32_t *bigger = kiln_arena_alloc(f->arena, (cap = (total + n) * 2) * sizeof *all);
      if (bigger == NULL) return oom(f);
      memcpy(bigger, all, total * sizeof *all);
      all = bigger;
    }
    memcpy(all + total, v, n * sizeof *v);
    total += n;
  }
  *out = all;
  *nout = total;
  return 0;
}

static uint32_t leaves_of(const kiln_shape *s) {
  if (!kiln_shape_is_tuple(s)) return 1;
  uint32_t n = 0;
  for (uint32_t i = 0; i < s->rank; i++) n += leaves_of(&s->tuple[i]);
  return n;
}

static int gte_value(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x, uint32_t **out,
                     uint32_t *nout) {
  const kiln_instr *t = f->mod->m->instrs[ins->operands[0]];
  int64_t idx = kiln_instr_attr_int(ins, KILN_ATTR_INDEX, -1);
  if (!kiln_shape_is_tuple(&t->shape) || idx < 0 || idx >= t->shape.rank)
    return kiln__emit_fail(f, ins, KILN_EINVAL, "get-tuple-element %s: index out of range",
                           ins->name);
  const uint32_t *v;
  uint32_t n, first = 0;
  int rc = kiln__emit_value(f, t->id, x, &v, &n);
  if (rc) return rc;
  for (int64_t i = 0; i < idx; i++) first += leaves_of(&t->shape.tuple[i]);
  *nout = leaves_of(&t->shape.tuple[idx]);
  if (first + *nout > n) return kiln__emit_fail(f, ins, KILN_EINTERNAL, "tuple leaves mismatch");
  *out = (uint32_t *)v + first;
  return 0;
}

static int constant_value(kiln__emit_fn *f, const kiln_instr *ins, uint32_t *var) {
  if (!kiln_shape_is_array(&ins->shape) || ins->literal == NULL ||
      kiln_shape_elements(&ins->shape) != 1)
    return kiln__emit_fail(f, ins, KILN_EINTERNAL, "constant %s is not bound to a buffer",
                           ins->name);
  char lit[128];
  kiln__emit_literal(f->mod, ins->shape.dtype, ins->literal, 0, lit, sizeof lit);
  *var = kiln__emit_newvar(f);
  kiln__emit_line(f, "%s v%u = %s;", kiln__ctype(f->mod, ins->shape.dtype), *var, lit);
  return 0;
}

/* The op classes of ops.def pick the kernel: index mappings (flag I) are
 * movement kernels, the reduction family reduction kernels. */
static bool is_movement(kiln_opcode op) { return (kiln_opcode_flags(op) & KILN_OPF_INDEXING) != 0; }

static bool is_reduction(kiln_opcode op) { return kiln_opcode_family(op) == KILN_FAM_REDUCTION; }

static int check_types(kiln__emit_fn *f, const kiln_instr *ins) {
  const kiln_shape *s = &ins->shape;
  if (kiln_shape_is_tuple(s)) {
    for (uint32_t i = 0; i < s->rank; i++)
      if (kiln_shape_is_array(&s->tuple[i]) && !kiln__emit_dtype_ok(s->tuple[i].dtype)) goto bad;
    return 0;
  }
  if (kiln_shape_is_array(s) && !kiln__emit_dtype_ok(s->dtype)) goto bad;
  if (kiln_shape_is_array(s) && s->rank > KILN__EMIT_MAXR)
    return kiln__emit_fail(f, ins, KILN_EUNIMPL, "the %s backend cannot compile rank-%u arrays",
                           f->mod->target->name, s->rank);
  return 0;
bad:
  return kiln__emit_fail(f, ins, KILN_EUNIMPL,
                         "the %s backend cannot compile %s %s: element type %s is not supported",
                         f->mod->target->name, kiln_opcode_name(ins->op), ins->name,
                         kiln_dtype_name(kiln_shape_is_tuple(s) ? KILN_C64 : s->dtype));
}

static int compute(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x, uint32_t **vars,
                   uint32_t *n) {
  uint32_t *one = kiln_arena_alloc(f->arena, sizeof *one);
  if (one == NULL) return oom(f);
  *vars = one;
  *n = 1;
  switch (ins->op) {
  case KILN_OP_PARAMETER:
    return kiln__emit_fail(f, ins, KILN_EINTERNAL, "parameter %s has no input", ins->name);
  case KILN_OP_CONSTANT: return constant_value(f, ins, one);
  case KILN_OP_TUPLE: return tuple_value(f, ins, x, vars, n);
  case KILN_OP_GET_TUPLE_ELEMENT: return gte_value(f, ins, x, vars, n);
  default: break;
  }
  if (is_movement(ins->op)) return kiln__emit_movement(f, ins, x, one);
  if (is_reduction(ins->op)) {
    const uint32_t *v;
    int rc = kiln__emit_reduction(f, ins, x, &v, n);
    *vars = (uint32_t *)v;
    return rc;
  }
  if (kiln_opcode_flags(ins->op) & KILN_OPF_ELEMENTWISE)
    return kiln__emit_elementwise(f, ins, x, one);
  char where[KILN_STATUS_WHERE_MAX];
  kiln_instr_where(f->mod->m, ins, where, sizeof where);
  return kiln__emit_fail(f, ins, KILN_EUNIMPL, "the %s backend cannot compile %s %s yet",
                         f->mod->target->name, kiln_opcode_name(ins->op), where);
}

int kiln__emit_value(kiln__emit_fn *f, kiln_id id, const kiln__ix *x, const uint32_t **vars,
                     uint32_t *n) {
  if (f->rc) return f->rc;
  const kiln_instr *ins = f->mod->m->instrs[id];
  uint32_t ixid = kiln_shape_is_array(&ins->shape) && ins->shape.rank == 0 ? 0 : x->id;
  const kiln__memo *mm = memo_get(f, id, ixid);
  if (mm) {
    *vars = mm->vars;
    *n = mm->n;
    return 0;
  }
  kiln__ix scalar_ix = {0};
  const kiln__ix *use = ixid == 0 ? &scalar_ix : x;
  if (ixid == 0 && x->rank == 0) use = x;
  uint32_t *v = NULL, nv = 0;
  int rc = check_types(f, ins);
  if (rc) return rc;
  uint32_t first;
  if (input_leaves(f, id, &first, &nv)) {
    v = kiln_arena_alloc(f->arena, (nv ? nv : 1) * sizeof *v);
    if (v == NULL) return oom(f);
    rc = load_input(f, ins, use, first, v, nv);
  } else {
    rc = compute(f, ins, use, &v, &nv);
  }
  if (rc == 0 && f->rc) rc = f->rc;
  if (rc) return rc;
  if (f->row_store && f->row_store[id] != KILN__NO_INPUT && nv == 1 && use->rank > f->row_dim)
    kiln__emit_line(f, "b%u[%s] = v%u;", f->row_store[id], kiln__ix_get(f, use, f->row_dim), v[0]);
  if ((rc = kiln__emit_memo_put(f, id, use, v, nv))) return rc;
  *vars = v;
  *n = nv;
  return 0;
}

int kiln__emit_value1(kiln__emit_fn *f, kiln_id id, const kiln__ix *x, uint32_t *var) {
  const uint32_t *v;
  uint32_t n;
  int rc = kiln__emit_value(f, id, x, &v, &n);
  if (rc) return rc;
  if (n != 1)
    return kiln__emit_fail(f, f->mod->m->instrs[id], KILN_EINTERNAL, "expected an array value");
  *var = v[0];
  return 0;
}
