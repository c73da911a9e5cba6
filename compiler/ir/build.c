/* The instruction builder of the passes and the transforms (see build.h).
 *
 * Names: a new instruction is called after its opcode (or, for a copy, after
 * the source instruction with trailing ".N" parts dropped) followed by "."
 * and its own module-wide id: "add.57". A parsed module may already hold
 * such a name (XLA numbers its own), so each candidate is checked against
 * the computation's name set and a counter suffix added until it is free
 * ("add.57.1"). The set of a computation is filled once, on its first
 * build, so naming stays O(1) per instruction.
 *
 * Constants: one conversion per entry point, done by the literal setters
 * (which round once and wrap or saturate as the element type calls for), so
 * that a value means the same constant whichever pass or rule asks. */
#include "compiler/ir/build.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/arena.h"
#include "common/deadline.h"
#include "compiler/ir/rewrite.h"
#include "compiler/ir/verify.h"

int kiln__tx_init(kiln__tx *tx, kiln_module *m, const char *name, kiln_status *st) {
  memset(tx, 0, sizeof *tx);
  tx->m = m;
  tx->st = st;
  tx->name = name;
  tx->scratch = kiln_arena_create();
  if (tx->scratch == NULL) return kiln__tx_oom(tx);
  return 0;
}

void kiln__tx_fini(kiln__tx *tx) {
  kiln_free(tx->zero);
  tx->zero = NULL;
  for (size_t c = 0; c < tx->ncomps_named; c++)
    if (tx->named[c]) kiln_strmap_free(&tx->names[c]);
  kiln_free(tx->names);
  kiln_free(tx->named);
  tx->names = NULL;
  tx->named = NULL;
  tx->ncomps_named = 0;
  kiln_arena_destroy(tx->scratch);
  tx->scratch = NULL;
}

int kiln__tx_fail(kiln__tx *tx, int code, const kiln_instr *ins, const char *fmt, ...) {
  char where[KILN_STATUS_WHERE_MAX] = "";
  if (ins) kiln_instr_where(tx->m, ins, where, sizeof where);
  va_list ap;
  va_start(ap, fmt);
  kiln_status_vset(tx->st, code, ins ? where : NULL, fmt, ap);
  va_end(ap);
  if (tx->err == 0) tx->err = code;
  return tx->err;
}

int kiln__tx_poll(kiln__tx *tx) {
  if (tx->err) return tx->err;
  int rc = kiln__deadline_check(tx->name, tx->st);
  if (rc) tx->err = rc;
  return rc;
}

int kiln__tx_oom(kiln__tx *tx) {
  return kiln__tx_fail(tx, KILN_ENOMEM, NULL, "%s: out of memory", tx->name);
}

bool kiln__b_is_zero(const kiln__tx *tx, kiln_id id) {
  return id != KILN_NO_ID && id < tx->zcap && tx->zero[id];
}

kiln_id *kiln__b_ids(kiln__tx *tx, uint32_t n) {
  if (tx->err) return NULL;
  kiln_id *p = kiln_arena_calloc(tx->scratch, n ? n : 1, sizeof *p);
  if (p == NULL) kiln__tx_oom(tx);
  return p;
}

int64_t *kiln__b_i64s(kiln__tx *tx, uint32_t n) {
  if (tx->err) return NULL;
  int64_t *p = kiln_arena_calloc(tx->scratch, n ? n : 1, sizeof *p);
  if (p == NULL) kiln__tx_oom(tx);
  return p;
}

static void mark_zero(kiln__tx *tx, kiln_id id) {
  if (id == KILN_NO_ID) return;
  if (id >= tx->zcap) {
    size_t cap = tx->zcap ? tx->zcap : 256;
    while (cap <= id) cap *= 2;
    uint8_t *z = kiln_realloc(tx->zero, cap);
    if (z == NULL) {
      kiln__tx_oom(tx);
      return;
    }
    memset(z + tx->zcap, 0, cap - tx->zcap);
    tx->zero = z;
    tx->zcap = cap;
  }
  tx->zero[id] = 1;
}

int kiln__b_new_comp(kiln__tx *tx, const char *base, uint32_t *out) {
  if (tx->err) return tx->err;
  char name[160];
  snprintf(name, sizeof name, "%s", base);
  for (unsigned k = 1; kiln_module_find_computation(tx->m, name) != NULL; k++)
    snprintf(name, sizeof name, "%.120s.%u", base, k);
  if (kiln_module_add_computation(tx->m, name, out)) return kiln__tx_oom(tx);
  return 0;
}

/* "x.1.57" -> "x": the source name without its numeric suffixes. */
static void base_name(const char *src, char *buf, size_t size) {
  size_t n = strlen(src);
  for (;;) {
    size_t i = n;
    while (i > 0 && isdigit((unsigned char)src[i - 1])) i--;
    if (i == n || i < 2 || src[i - 1] != '.') break;
    n = i - 1;
  }
  if (n > 100) n = 100;
  snprintf(buf, size, "%.*s", (int)n, src);
}

/* The name set of b's computation, filled on first use; NULL on
 * out-of-memory (recorded). */
static kiln_strmap *names_of(kiln__b *b) {
  kiln__tx *tx = b->tx;
  uint32_t c = b->comp;
  if (c >= tx->ncomps_named) {
    size_t cap = tx->ncomps_named ? tx->ncomps_named : 8;
    while (cap <= c) cap *= 2;
    kiln_strmap *nm = kiln_realloc(tx->names, cap * sizeof *nm);
    if (nm == NULL) return kiln__tx_oom(tx), NULL;
    tx->names = nm;
    uint8_t *nd = kiln_realloc(tx->named, cap);
    if (nd == NULL) return kiln__tx_oom(tx), NULL;
    memset(nd + tx->ncomps_named, 0, cap - tx->ncomps_named);
    tx->named = nd;
    tx->ncomps_named = cap;
  }
  kiln_strmap *set = &tx->names[c];
  if (!tx->named[c]) {
    kiln_strmap_init(set);
    tx->named[c] = 1;
    const kiln_computation *comp = tx->m->comps[c];
    for (uint32_t i = 0; i < comp->ninstrs; i++) {
      const char *name = tx->m->instrs[comp->instrs[i]]->name;
      if (name && kiln_strmap_put(set, name, strlen(name), 0, NULL) < 0)
        return kiln__tx_oom(tx), NULL;
    }
  }
  return set;
}

/* Writes into buf "<base>.<next id>", or that with ".k" appended for the
 * first k that makes it free in `set`. */
static void fresh_name(const kiln__b *b, const kiln_strmap *set, const char *base, char *buf,
                       size_t size) {
  char bb[128];
  base_name(base, bb, sizeof bb);
  snprintf(buf, size, "%s.%u", bb, (unsigned)b->tx->m->ninstrs);
  size_t len = strlen(buf);
  for (unsigned k = 1; kiln_strmap_get(set, buf, strlen(buf), NULL); k++)
    snprintf(buf + len, size - len, ".%u", k);
}

/* Records the name of a new instruction of b's computation. */
static kiln_instr *named(kiln__b *b, kiln_strmap *set, kiln_instr *ins) {
  if (ins == NULL) return kiln__tx_oom(b->tx), NULL;
  if (kiln_strmap_put(set, ins->name, strlen(ins->name), 0, NULL) < 0)
    return kiln__tx_oom(b->tx), NULL;
  return ins;
}

static kiln_instr *add_named(kiln__b *b, kiln_opcode op, const char *base) {
  kiln_strmap *set = names_of(b);
  if (set == NULL) return NULL;
  char name[160];
  fresh_name(b, set, base, name, sizeof name);
  return named(b, set, kiln_module_add_instr(b->tx->m, b->comp, op, name));
}

static bool ops_ok(kiln__b *b, const kiln_id *ops, uint32_t n) {
  if (b->tx->err) return false;
  for (uint32_t i = 0; i < n; i++) {
    if (ops[i] == KILN_NO_ID || ops[i] >= b->tx->m->ninstrs) {
      kiln__tx_fail(b->tx, KILN_EINTERNAL, NULL, "%s: internal error: missing operand %u",
                    b->tx->name, i);
      return false;
    }
  }
  return true;
}

kiln_instr *kiln__b_start(kiln__b *b, kiln_opcode op, const kiln_id *ops, uint32_t n) {
  if (!ops_ok(b, ops, n)) return NULL;
  kiln_instr *ins = add_named(b, op, kiln_opcode_name(op));
  if (ins == NULL) return NULL;
  if (kiln_instr_set_operands(b->tx->m, ins, ops, n)) {
    kiln__tx_oom(b->tx);
    return NULL;
  }
  return ins;
}

kiln_id kiln__b_finish(kiln__b *b, kiln_instr *ins) {
  if (ins == NULL || b->tx->err) return KILN_NO_ID;
  kiln_shape s;
  kiln_status ist;
  kiln_status_clear(&ist);
  if (kiln_infer_shape(b->tx->m, ins, b->tx->scratch, &s, &ist)) {
    kiln__tx_fail(b->tx, KILN_EINTERNAL, ins, "%s: internal error building %s: %s", b->tx->name,
                  kiln_opcode_name(ins->op), ist.msg);
    return KILN_NO_ID;
  }
  if (kiln_instr_set_shape(b->tx->m, ins, &s)) {
    kiln__tx_oom(b->tx);
    return KILN_NO_ID;
  }
  return ins->id;
}

kiln_id kiln__b_op(kiln__b *b, kiln_opcode op, const kiln_id *ops, uint32_t n) {
  return kiln__b_finish(b, kiln__b_start(b, op, ops, n));
}

kiln_instr *kiln__b_make(kiln__b *b, kiln_opcode op, const kiln_shape *shape, const kiln_id *ops,
                         uint32_t n) {
  kiln_instr *ins = kiln__b_start(b, op, ops, n);
  if (ins && kiln_instr_set_shape(b->tx->m, ins, shape)) {
    kiln__tx_oom(b->tx);
    return NULL;
  }
  return ins;
}

/* Gives ins a written result shape (for ops whose inference reads it). */
static bool set_written(kiln__b *b, kiln_instr *ins, kiln_dtype t, const int64_t *dims,
                        uint32_t rank) {
  if (ins == NULL) return false;
  kiln_shape s;
  if (kiln_shape_make_array(b->tx->m->arena, &s, t, dims, rank) ||
      kiln_instr_set_shape(b->tx->m, ins, &s)) {
    kiln__tx_oom(b->tx);
    return false;
  }
  return true;
}

bool kiln__b_drop_attr(kiln_instr *ins, kiln_attr_key key) {
  for (uint32_t i = 0; i < ins->nattrs; i++) {
    if (ins->attrs[i].key == key) {
      memmove(&ins->attrs[i], &ins->attrs[i + 1], (ins->nattrs - i - 1) * sizeof *ins->attrs);
      ins->nattrs--;
      return true;
    }
  }
  return false;
}

/* A copy of src on new operands; keep_name: named src->name when free. */
static kiln_instr *clone_raw(kiln__b *b, const kiln_instr *src, const kiln_id *ops, uint32_t n,
                             bool keep_name) {
  if (!ops_ok(b, ops, n)) return NULL;
  kiln_strmap *set = names_of(b);
  if (set == NULL) return NULL;
  char buf[160];
  const char *name = src->name;
  if (!keep_name || name == NULL || kiln_strmap_get(set, name, strlen(name), NULL)) {
    /* A plain copy is named after its source, a moved one that could not
     * keep its name after its opcode, as a new instruction is. */
    const char *base = keep_name || src->name == NULL ? kiln_opcode_name(src->op) : src->name;
    fresh_name(b, set, base, buf, sizeof buf);
    name = buf;
  }
  return named(b, set, kiln_instr_clone(b->tx->m, b->comp, src, ops, n, NULL, name));
}

kiln_instr *kiln__b_clone_start(kiln__b *b, const kiln_instr *src, const kiln_id *ops, uint32_t n) {
  kiln_instr *ins = clone_raw(b, src, ops, n, false);
  if (ins) kiln__b_drop_attr(ins, KILN_ATTR_SHARDING);
  return ins;
}

kiln_id kiln__b_clone(kiln__b *b, const kiln_instr *src, const kiln_id *ops, uint32_t n) {
  return kiln__b_finish(b, kiln__b_clone_start(b, src, ops, n));
}

kiln_id kiln__b_clone_same(kiln__b *b, const kiln_instr *src, const kiln_id *ops, uint32_t n) {
  kiln_instr *ins = clone_raw(b, src, ops, n, false);
  return ins ? ins->id : KILN_NO_ID;
}

kiln_id kiln__b_clone_keep_name(kiln__b *b, const kiln_instr *src, const kiln_id *ops, uint32_t n) {
  kiln_instr *ins = clone_raw(b, src, ops, n, true);
  return ins ? ins->id : KILN_NO_ID;
}

kiln_id kiln__b_param(kiln__b *b, int64_t number, const kiln_shape *shape, const char *base) {
  if (b->tx->err) return KILN_NO_ID;
  kiln_instr *ins = add_named(b, KILN_OP_PARAMETER, base ? base : "param");
  if (ins == NULL) return KILN_NO_ID;
  ins->param_number = number;
  if (kiln_instr_set_shape(b->tx->m, ins, shape)) {
    kiln__tx_oom(b->tx);
    return KILN_NO_ID;
  }
  return ins->id;
}

/* ---- elementwise -------------------------------------------------------- */

kiln_id kiln__b_un(kiln__b *b, kiln_opcode op, kiln_id x) { return kiln__b_op(b, op, &x, 1); }

kiln_id kiln__b_bin(kiln__b *b, kiln_opcode op, kiln_id x, kiln_id y) {
  kiln_id o[2] = {x, y};
  return kiln__b_op(b, op, o, 2);
}

kiln_id kiln__b_add(kiln__b *b, kiln_id x, kiln_id y) {
  if (kiln__b_is_zero(b->tx, x)) return y;
  if (kiln__b_is_zero(b->tx, y)) return x;
  return kiln__b_bin(b, KILN_OP_ADD, x, y);
}
kiln_id kiln__b_sub(kiln__b *b, kiln_id x, kiln_id y) {
  if (kiln__b_is_zero(b->tx, y)) return x;
  return kiln__b_bin(b, KILN_OP_SUBTRACT, x, y);
}
kiln_id kiln__b_mul(kiln__b *b, kiln_id x, kiln_id y) {
  return kiln__b_bin(b, KILN_OP_MULTIPLY, x, y);
}
kiln_id kiln__b_div(kiln__b *b, kiln_id x, kiln_id y) {
  return kiln__b_bin(b, KILN_OP_DIVIDE, x, y);
}
kiln_id kiln__b_neg(kiln__b *b, kiln_id x) {
  if (kiln__b_is_zero(b->tx, x)) return x;
  return kiln__b_un(b, KILN_OP_NEGATE, x);
}

kiln_id kiln__b_cmp(kiln__b *b, kiln_id x, kiln_id y, kiln_cmp_dir dir) {
  kiln_id o[2] = {x, y};
  kiln_instr *ins = kiln__b_start(b, KILN_OP_COMPARE, o, 2);
  if (ins && kiln_instr_set_attr_int(b->tx->m, ins, KILN_ATTR_DIRECTION, dir)) kiln__tx_oom(b->tx);
  return kiln__b_finish(b, ins);
}

kiln_id kiln__b_select(kiln__b *b, kiln_id p, kiln_id x, kiln_id y) {
  kiln_id o[3] = {p, x, y};
  return kiln__b_op(b, KILN_OP_SELECT, o, 3);
}

kiln_id kiln__b_convert(kiln__b *b, kiln_id x, kiln_dtype t) {
  if (b->tx->err) return KILN_NO_ID;
  const kiln_shape *s = kiln__b_shape(b->tx, x);
  kiln_instr *ins = kiln__b_start(b, KILN_OP_CONVERT, &x, 1);
  if (!set_written(b, ins, t, s->dims, s->rank)) return KILN_NO_ID;
  return kiln__b_finish(b, ins);
}

kiln_id kiln__b_as(kiln__b *b, kiln_id x, kiln_dtype t) {
  if (b->tx->err) return KILN_NO_ID;
  if (kiln__b_shape(b->tx, x)->dtype == t) return x;
  return kiln__b_convert(b, x, t);
}

kiln_id kiln__b_complex(kiln__b *b, kiln_id re, kiln_id im) {
  return kiln__b_bin(b, KILN_OP_COMPLEX, re, im);
}

kiln_id kiln__b_conj(kiln__b *b, kiln_id x) {
  return kiln__b_complex(b, kiln__b_un(b, KILN_OP_REAL, x),
                         kiln__b_neg(b, kiln__b_un(b, KILN_OP_IMAG, x)));
}

/* ---- constants ---------------------------------------------------------- */

/* A scalar constant of type t, zero until the caller sets its element;
 * NULL after an error. */
static kiln_literal *constant(kiln__b *b, kiln_dtype t, kiln_id *out) {
  *out = KILN_NO_ID;
  if (b->tx->err) return NULL;
  if (!kiln_dtype_is_array(t)) {
    kiln__tx_fail(b->tx, KILN_EINTERNAL, NULL, "%s: internal error: scalar constant of type %s",
                  b->tx->name, kiln_dtype_name(t));
    return NULL;
  }
  kiln_module *m = b->tx->m;
  kiln_instr *ins = add_named(b, KILN_OP_CONSTANT, "constant");
  if (ins == NULL) return NULL;
  kiln_shape s;
  kiln_literal *lit = NULL;
  if (kiln_shape_make_array(m->arena, &s, t, NULL, 0) ||
      kiln_literal_create(m->arena, &s, 0, &lit, NULL) || kiln_instr_set_shape(m, ins, &s)) {
    kiln__tx_oom(b->tx);
    return NULL;
  }
  ins->literal = lit;
  *out = ins->id;
  return lit;
}

kiln_id kiln__b_scalar(kiln__b *b, kiln_dtype t, double v) {
  kiln_id id;
  kiln_literal *lit = constant(b, t, &id);
  if (lit) kiln_literal_set_f64(lit, 0, v);
  return id;
}

kiln_id kiln__b_iscalar(kiln__b *b, kiln_dtype t, int64_t v) {
  kiln_id id;
  kiln_literal *lit = constant(b, t, &id);
  if (lit) kiln_literal_set_s64(lit, 0, v);
  return id;
}

kiln_id kiln__b_uscalar(kiln__b *b, kiln_dtype t, uint64_t v) {
  kiln_id id;
  kiln_literal *lit = constant(b, t, &id);
  if (lit) kiln_literal_set_u64(lit, 0, v);
  return id;
}

kiln_id kiln__b_splat(kiln__b *b, kiln_id scalar, const kiln_shape *shape) {
  if (b->tx->err) return KILN_NO_ID;
  if (shape->rank == 0) return scalar;
  kiln_instr *ins = kiln__b_make(b, KILN_OP_BROADCAST, shape, &scalar, 1);
  if (ins == NULL) return KILN_NO_ID;
  if (kiln_instr_set_attr_ints(b->tx->m, ins, KILN_ATTR_DIMENSIONS, NULL, 0)) {
    kiln__tx_oom(b->tx);
    return KILN_NO_ID;
  }
  return ins->id;
}

kiln_id kiln__b_full(kiln__b *b, kiln_dtype t, const int64_t *dims, uint32_t rank, double v) {
  kiln_id c = kiln__b_scalar(b, t, v);
  if (rank == 0) return c;
  return kiln__b_broadcast(b, c, dims, rank, NULL, 0);
}

kiln_id kiln__b_full_like(kiln__b *b, kiln_id x, double v) {
  if (b->tx->err) return KILN_NO_ID;
  const kiln_shape *s = kiln__b_shape(b->tx, x);
  return kiln__b_full(b, s->dtype, s->dims, s->rank, v);
}

kiln_id kiln__b_zeros(kiln__b *b, const kiln_shape *s) {
  if (b->tx->err) return KILN_NO_ID;
  kiln_id r;
  if (kiln_shape_is_tuple(s)) {
    kiln_id *el = kiln_arena_alloc(b->tx->scratch, (s->rank ? s->rank : 1) * sizeof *el);
    if (el == NULL) return kiln__tx_oom(b->tx), KILN_NO_ID;
    for (uint32_t i = 0; i < s->rank; i++) el[i] = kiln__b_zeros(b, &s->tuple[i]);
    r = kiln__b_tuple(b, el, s->rank);
  } else if (kiln_shape_is_token(s)) {
    r = kiln__b_op(b, KILN_OP_AFTER_ALL, NULL, 0);
  } else {
    r = kiln__b_full(b, s->dtype, s->dims, s->rank, 0);
  }
  mark_zero(b->tx, r);
  return r;
}

kiln_id kiln__b_zeros_like(kiln__b *b, kiln_id x) {
  if (b->tx->err) return KILN_NO_ID;
  return kiln__b_zeros(b, kiln__b_shape(b->tx, x));
}

kiln_id kiln__b_const_ints(kiln__b *b, kiln_dtype t, const int64_t *v, uint32_t n) {
  if (b->tx->err) return KILN_NO_ID;
  kiln_module *m = b->tx->m;
  kiln_instr *ins = add_named(b, KILN_OP_CONSTANT, "constant");
  if (ins == NULL) return KILN_NO_ID;
  kiln_shape s;
  kiln_literal *lit = NULL;
  int64_t dim = n;
  if (kiln_shape_make_array(m->arena, &s, t, &dim, 1) ||
      kiln_literal_create(m->arena, &s, 0, &lit, NULL) || kiln_instr_set_shape(m, ins, &s)) {
    kiln__tx_oom(b->tx);
    return KILN_NO_ID;
  }
  for (uint32_t i = 0; i < n; i++) kiln_literal_set_s64(lit, i, v[i]);
  ins->literal = lit;
  return ins->id;
}

kiln_id kiln__b_iota(kiln__b *b, kiln_dtype t, const int64_t *dims, uint32_t rank, int64_t dim) {
  kiln_instr *ins = kiln__b_start(b, KILN_OP_IOTA, NULL, 0);
  if (!set_written(b, ins, t, dims, rank)) return KILN_NO_ID;
  if (kiln_instr_set_attr_int(b->tx->m, ins, KILN_ATTR_IOTA_DIMENSION, dim)) kiln__tx_oom(b->tx);
  return kiln__b_finish(b, ins);
}

/* ---- shapes ------------------------------------------------------------- */

kiln_id kiln__b_broadcast(kiln__b *b, kiln_id x, const int64_t *dims, uint32_t rank,
                          const int64_t *map, uint32_t nmap) {
  if (b->tx->err) return KILN_NO_ID;
  kiln_dtype t = kiln__b_shape(b->tx, x)->dtype;
  kiln_instr *ins = kiln__b_start(b, KILN_OP_BROADCAST, &x, 1);
  if (!set_written(b, ins, t, dims, rank)) return KILN_NO_ID;
  if (kiln_instr_set_attr_ints(b->tx->m, ins, KILN_ATTR_DIMENSIONS, map, nmap)) kiln__tx_oom(b->tx);
  return kiln__b_finish(b, ins);
}

kiln_id kiln__b_broadcast_like(kiln__b *b, kiln_id x, kiln_id like) {
  if (b->tx->err) return KILN_NO_ID;
  const kiln_shape *xs = kiln__b_shape(b->tx, x), *ls = kiln__b_shape(b->tx, like);
  if (kiln_shape_same_dims(xs, ls)) return x;
  if (xs->rank == 0) return kiln__b_broadcast(b, x, ls->dims, ls->rank, NULL, 0);
  kiln__tx_fail(b->tx, KILN_EINTERNAL, NULL, "%s: internal error: broadcast of rank %u to rank %u",
                b->tx->name, xs->rank, ls->rank);
  return KILN_NO_ID;
}

kiln_id kiln__b_reshape(kiln__b *b, kiln_id x, const int64_t *dims, uint32_t rank) {
  if (b->tx->err) return KILN_NO_ID;
  const kiln_shape *s = kiln__b_shape(b->tx, x);
  if (s->rank == rank && (rank == 0 || memcmp(s->dims, dims, rank * sizeof *dims) == 0)) return x;
  kiln_dtype t = s->dtype;
  kiln_instr *ins = kiln__b_start(b, KILN_OP_RESHAPE, &x, 1);
  if (!set_written(b, ins, t, dims, rank)) return KILN_NO_ID;
  return kiln__b_finish(b, ins);
}

kiln_id kiln__b_transpose(kiln__b *b, kiln_id x, const int64_t *perm, uint32_t rank) {
  if (b->tx->err) return KILN_NO_ID;
  bool id = true;
  for (uint32_t i = 0; i < rank; i++) id &= perm[i] == (int64_t)i;
  if (id) return x;
  kiln_instr *ins = kiln__b_start(b, KILN_OP_TRANSPOSE, &x, 1);
  if (ins && kiln_instr_set_attr_ints(b->tx->m, ins, KILN_ATTR_DIMENSIONS, perm, rank))
    kiln__tx_oom(b->tx);
  return kiln__b_finish(b, ins);
}

kiln_id kiln__b_slice(kiln__b *b, kiln_id x, const int64_t *start, const int64_t *limit,
                      const int64_t *stride) {
  if (b->tx->err) return KILN_NO_ID;
  const kiln_shape *s = kiln__b_shape(b->tx, x);
  uint32_t r = s->rank;
  int64_t *v = kiln_arena_alloc(b->tx->scratch, (3 * r + 1) * sizeof *v);
  if (v == NULL) return kiln__tx_oom(b->tx), KILN_NO_ID;
  bool full = true;
  for (uint32_t i = 0; i < r; i++) {
    v[3 * i] = start[i];
    v[3 * i + 1] = limit[i];
    v[3 * i + 2] = stride ? stride[i] : 1;
    full &= start[i] == 0 && limit[i] == s->dims[i] && v[3 * i + 2] == 1;
  }
  if (full) return x;
  kiln_instr *ins = kiln__b_start(b, KILN_OP_SLICE, &x, 1);
  if (ins && kiln_instr_set_attr_ints(b->tx->m, ins, KILN_ATTR_SLICE, v, 3 * r))
    kiln__tx_oom(b->tx);
  return kiln__b_finish(b, ins);
}

kiln_id kiln__b_slice_dim(kiln__b *b, kiln_id x, uint32_t dim, int64_t start, int64_t limit) {
  if (b->tx->err) return KILN_NO_ID;
  const kiln_shape *s = kiln__b_shape(b->tx, x);
  int64_t st[64] = {0}, li[64];
  if (s->rank > 64)
    return kiln__tx_fail(b->tx, KILN_EUNIMPL, NULL, "%s: rank over 64", b->tx->name), KILN_NO_ID;
  for (uint32_t i = 0; i < s->rank; i++) li[i] = s->dims[i];
  st[dim] = start;
  li[dim] = limit;
  return kiln__b_slice(b, x, st, li, NULL);
}

kiln_id kiln__b_pad(kiln__b *b, kiln_id x, kiln_id v, const int64_t *lo, const int64_t *hi,
                    const int64_t *interior) {
  if (b->tx->err) return KILN_NO_ID;
  uint32_t r = kiln__b_shape(b->tx, x)->rank;
  int64_t *p = kiln_arena_alloc(b->tx->scratch, (3 * r + 1) * sizeof *p);
  if (p == NULL) return kiln__tx_oom(b->tx), KILN_NO_ID;
  bool none = true;
  for (uint32_t i = 0; i < r; i++) {
    p[3 * i] = lo[i];
    p[3 * i + 1] = hi[i];
    p[3 * i + 2] = interior ? interior[i] : 0;
    none &= p[3 * i] == 0 && p[3 * i + 1] == 0 && p[3 * i + 2] == 0;
  }
  if (none) return x;
  kiln_id o[2] = {x, v};
  kiln_instr *ins = kiln__b_start(b, KILN_OP_PAD, o, 2);
  if (ins && kiln_instr_set_attr_ints(b->tx->m, ins, KILN_ATTR_PADDING, p, 3 * r))
    kiln__tx_oom(b->tx);
  return kiln__b_finish(b, ins);
}

kiln_id kiln__b_concat(kiln__b *b, const kiln_id *xs, uint32_t n, int64_t dim) {
  if (n == 1) return xs[0];
  kiln_instr *ins = kiln__b_start(b, KILN_OP_CONCATENATE, xs, n);
  if (ins && kiln_instr_set_attr_ints(b->tx->m, ins, KILN_ATTR_DIMENSIONS, &dim, 1))
    kiln__tx_oom(b->tx);
  return kiln__b_finish(b, ins);
}

kiln_id kiln__b_reverse(kiln__b *b, kiln_id x, const int64_t *dims, uint32_t n) {
  if (n == 0) return x;
  kiln_instr *ins = kiln__b_start(b, KILN_OP_REVERSE, &x, 1);
  if (ins && kiln_instr_set_attr_ints(b->tx->m, ins, KILN_ATTR_DIMENSIONS, dims, n))
    kiln__tx_oom(b->tx);
  return kiln__b_finish(b, ins);
}

kiln_id kiln__b_dyn_slice(kiln__b *b, kiln_id x, const kiln_id *idx, uint32_t n,
                          const int64_t *sizes) {
  if (b->tx->err) return KILN_NO_ID;
  kiln_id *o = kiln_arena_alloc(b->tx->scratch, (n + 1) * sizeof *o);
  if (o == NULL) return kiln__tx_oom(b->tx), KILN_NO_ID;
  o[0] = x;
  if (n) memcpy(o + 1, idx, n * sizeof *idx);
  kiln_instr *ins = kiln__b_start(b, KILN_OP_DYNAMIC_SLICE, o, n + 1);
  if (ins && kiln_instr_set_attr_ints(b->tx->m, ins, KILN_ATTR_DYNAMIC_SLICE_SIZES, sizes, n))
    kiln__tx_oom(b->tx);
  return kiln__b_finish(b, ins);
}

kiln_id kiln__b_dyn_update(kiln__b *b, kiln_id x, kiln_id u, const kiln_id *idx, uint32_t n) {
  if (b->tx->err) return KILN_NO_ID;
  kiln_id *o = kiln_arena_alloc(b->tx->scratch, (n + 2) * sizeof *o);
  if (o == NULL) return kiln__tx_oom(b->tx), KILN_NO_ID;
  o[0] = x;
  o[1] = u;
  if (n) memcpy(o + 2, idx, n * sizeof *idx);
  return kiln__b_op(b, KILN_OP_DYNAMIC_UPDATE_SLICE, o, n + 2);
}

/* ---- tuples ------------------------------------------------------------- */

kiln_id kiln__b_tuple(kiln__b *b, const kiln_id *xs, uint32_t n) {
  kiln_id r = kiln__b_op(b, KILN_OP_TUPLE, xs, n);
  if (r == KILN_NO_ID) return r;
  bool all_zero = n > 0;
  for (uint32_t i = 0; i < n; i++) all_zero &= kiln__b_is_zero(b->tx, xs[i]);
  if (all_zero) mark_zero(b->tx, r);
  return r;
}

kiln_id kiln__b_gte(kiln__b *b, kiln_id x, int64_t i) {
  if (b->tx->err) return KILN_NO_ID;
  const kiln_instr *t = kiln__b_ins(b->tx, x);
  if (t->op == KILN_OP_TUPLE && i >= 0 && (uint64_t)i < t->noperands) return t->operands[i];
  kiln_instr *ins = kiln__b_start(b, KILN_OP_GET_TUPLE_ELEMENT, &x, 1);
  if (ins && kiln_instr_set_attr_int(b->tx->m, ins, KILN_ATTR_INDEX, i)) kiln__tx_oom(b->tx);
  kiln_id r = kiln__b_finish(b, ins);
  if (kiln__b_is_zero(b->tx, x)) mark_zero(b->tx, r);
  return r;
}

/* ---- contractions and reductions ---------------------------------------- */

kiln_id kiln__b_dot(kiln__b *b, kiln_id x, kiln_id y, const kiln_i64s *lb, const kiln_i64s *lc,
                    const kiln_i64s *rb, const kiln_i64s *rc) {
  kiln_id o[2] = {x, y};
  kiln_instr *ins = kiln__b_start(b, KILN_OP_DOT, o, 2);
  if (ins == NULL) return KILN_NO_ID;
  kiln_module *m = b->tx->m;
  if ((lb->n && kiln_instr_set_attr_ints(m, ins, KILN_ATTR_LHS_BATCH_DIMS, lb->v, lb->n)) ||
      (lc->n && kiln_instr_set_attr_ints(m, ins, KILN_ATTR_LHS_CONTRACTING_DIMS, lc->v, lc->n)) ||
      (rb->n && kiln_instr_set_attr_ints(m, ins, KILN_ATTR_RHS_BATCH_DIMS, rb->v, rb->n)) ||
      (rc->n && kiln_instr_set_attr_ints(m, ins, KILN_ATTR_RHS_CONTRACTING_DIMS, rc->v, rc->n)))
    kiln__tx_oom(b->tx);
  return kiln__b_finish(b, ins);
}

static uint32_t scalar_comp(kiln__tx *tx, const char *base, kiln_opcode op, kiln_cmp_dir dir,
                            kiln_dtype t) {
  if (tx->err) return KILN_NO_ID;
  char name[96];
  snprintf(name, sizeof name, "%s.%s", base, kiln_dtype_name(t));
  const kiln_computation *have = kiln_module_find_computation(tx->m, name);
  if (have) return have->id;
  uint32_t c;
  if (kiln_module_add_computation(tx->m, name, &c)) return kiln__tx_oom(tx), KILN_NO_ID;
  kiln__b b = {tx, c};
  kiln_shape s;
  if (kiln_shape_make_array(tx->m->arena, &s, t, NULL, 0)) return kiln__tx_oom(tx), KILN_NO_ID;
  kiln_id p0 = kiln__b_param(&b, 0, &s, NULL), p1 = kiln__b_param(&b, 1, &s, NULL);
  kiln_id r = op == KILN_OP_INVALID   ? p1
              : op == KILN_OP_COMPARE ? kiln__b_cmp(&b, p0, p1, dir)
                                      : kiln__b_bin(&b, op, p0, p1);
  if (r == KILN_NO_ID) return KILN_NO_ID;
  tx->m->comps[c]->root = r;
  return c;
}

uint32_t kiln__b_reducer(kiln__tx *tx, kiln_opcode op, kiln_dtype t) {
  const char *base = op == KILN_OP_INVALID ? "kiln.replace" : NULL;
  char buf[64];
  if (base == NULL) {
    snprintf(buf, sizeof buf, "kiln.%s", kiln_opcode_name(op));
    base = buf;
  }
  return scalar_comp(tx, base, op, KILN_CMP_EQ, t);
}

uint32_t kiln__b_comparator(kiln__tx *tx, kiln_cmp_dir dir, kiln_dtype t) {
  char buf[64];
  snprintf(buf, sizeof buf, "kiln.%s", kiln_cmp_dir_name(dir));
  return scalar_comp(tx, buf, KILN_OP_COMPARE, dir, t);
}

kiln_id kiln__b_reduce(kiln__b *b, kiln_id x, kiln_id init, const int64_t *dims, uint32_t n,
                       kiln_opcode op) {
  if (b->tx->err) return KILN_NO_ID;
  if (n == 0) return x;
  uint32_t c = kiln__b_reducer(b->tx, op, kiln__b_shape(b->tx, x)->dtype);
  kiln_id o[2] = {x, init};
  kiln_instr *ins = kiln__b_start(b, KILN_OP_REDUCE, o, 2);
  if (ins && (kiln_instr_set_attr_ints(b->tx->m, ins, KILN_ATTR_DIMENSIONS, dims, n) ||
              kiln_instr_set_called(b->tx->m, ins, &c, 1)))
    kiln__tx_oom(b->tx);
  return kiln__b_finish(b, ins);
}

kiln_id kiln__b_reduce_sum(kiln__b *b, kiln_id x, const int64_t *dims, uint32_t n) {
  if (b->tx->err) return KILN_NO_ID;
  if (n == 0) return x;
  kiln_id z = kiln__b_scalar(b, kiln__b_shape(b->tx, x)->dtype, 0);
  kiln_id r = kiln__b_reduce(b, x, z, dims, n, KILN_OP_ADD);
  if (kiln__b_is_zero(b->tx, x)) mark_zero(b->tx, r);
  return r;
}

kiln_id kiln__b_sum_to_like(kiln__b *b, kiln_id x, kiln_id like) {
  if (b->tx->err) return KILN_NO_ID;
  const kiln_shape *xs = kiln__b_shape(b->tx, x), *ls = kiln__b_shape(b->tx, like);
  if (kiln_shape_same_dims(xs, ls)) return x;
  if (ls->rank != 0) {
    kiln__tx_fail(b->tx, KILN_EINTERNAL, NULL, "%s: internal error: sum of rank %u to rank %u",
                  b->tx->name, xs->rank, ls->rank);
    return KILN_NO_ID;
  }
  int64_t dims[64];
  if (xs->rank > 64)
    return kiln__tx_fail(b->tx, KILN_EUNIMPL, NULL, "%s: rank over 64", b->tx->name), KILN_NO_ID;
  for (uint32_t i = 0; i < xs->rank; i++) dims[i] = i;
  return kiln__b_reduce_sum(b, x, dims, xs->rank);
}

kiln_id kiln__b_call(kiln__b *b, uint32_t comp, const kiln_id *ops, uint32_t n) {
  kiln_instr *ins = kiln__b_start(b, KILN_OP_CALL, ops, n);
  if (ins && kiln_instr_set_called(b->tx->m, ins, &comp, 1)) kiln__tx_oom(b->tx);
  return kiln__b_finish(b, ins);
}

/* ---- shapes ------------------------------------------------------------- */

bool kiln__b_has_float(const kiln_shape *s) {
  if (kiln_shape_is_tuple(s)) {
    for (uint32_t i = 0; i < s->rank; i++)
      if (kiln__b_has_float(&s->tuple[i])) return true;
    return false;
  }
  return kiln__b_is_float_shape(s);
}

uint32_t kiln__b_leaf_count(const kiln_shape *s) {
  if (!kiln_shape_is_tuple(s)) return 1;
  uint32_t n = 0;
  for (uint32_t i = 0; i < s->rank; i++) n += kiln__b_leaf_count(&s->tuple[i]);
  return n;
}

int kiln__b_shape_batched(kiln__tx *tx, const kiln_shape *s, int64_t bsize, kiln_shape *out) {
  int64_t dims[65];
  if (s->rank > 64) return kiln__tx_fail(tx, KILN_EUNIMPL, NULL, "%s: rank over 64", tx->name);
  dims[0] = bsize;
  for (uint32_t i = 0; i < s->rank; i++) dims[i + 1] = s->dims[i];
  if (kiln_shape_make_array(tx->m->arena, out, s->dtype, dims, s->rank + 1))
    return kiln__tx_oom(tx);
  return 0;
}

/* ---- purity ------------------------------------------------------------- */

static bool has_token(const kiln_shape *s) {
  if (s->dtype == KILN_TOKEN) return true;
  if (!kiln_shape_is_tuple(s)) return false;
  for (uint32_t i = 0; i < s->rank; i++)
    if (has_token(&s->tuple[i])) return true;
  return false;
}

/* The instruction alone, not what it calls: its op (ops.def) and whether
 * it carries a token. */
static bool self_pure(const kiln_instr *ins) {
  return kiln_opcode_is_pure(ins->op) && !has_token(&ins->shape);
}

bool kiln__instr_is_pure(const kiln_module *m, const kiln_instr *ins, const bool *impure) {
  if (!self_pure(ins)) return false;
  for (uint32_t i = 0; i < ins->ncalled; i++) {
    if (ins->called[i] >= m->ncomps) return false;
    if (impure && impure[ins->called[i]]) return false;
  }
  return true;
}

bool *kiln__impure_computations(const kiln_module *m) {
  bool *impure = kiln_malloc((m->ncomps ? m->ncomps : 1) * sizeof *impure);
  if (impure == NULL) return NULL;
  /* Unreachable computations stay impure: nothing reachable calls them. */
  for (uint32_t c = 0; c < m->ncomps; c++) impure[c] = true;
  uint32_t *order = NULL, n = 0;
  if (kiln_module_post_order(m, &order, &n)) {
    kiln_free(order);
    return impure; /* a call cycle or no entry: everything impure */
  }
  for (uint32_t k = 0; k < n; k++) {
    const kiln_computation *c = m->comps[order[k]];
    bool bad = false;
    for (uint32_t i = 0; i < c->ninstrs && !bad; i++)
      bad = !kiln__instr_is_pure(m, m->instrs[c->instrs[i]], impure);
    impure[order[k]] = bad;
  }
  kiln_free(order);
  return impure;
}
