/* The HLO text parser: module header, computations, instructions, shapes.
 *
 * One pass over the text builds the module directly. What cannot be known
 * where it is read is recorded and settled later, so the text may use names
 * before defining them:
 *  - operand and control-predecessor names are kept as pointers into the text
 *    and resolved when the computation's closing '}' is read (names are
 *    scoped per computation); then the computation's instruction list is put
 *    in dependency order by a depth-first walk over operands in text order,
 *    which leaves an already ordered computation untouched and reports a
 *    cycle with the instructions on it;
 *  - called computations are resolved once the whole module is read;
 *  - missing result shapes are inferred last, callees before callers.
 * Name lookups go through hash maps (common/strmap.h) whose keys point into
 * the text, so nothing is copied and nothing is quadratic.
 */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/strmap.h"
#include "compiler/ir/text.h"
#include "compiler/ir/text_parse.h"
#include "compiler/ir/verify.h"

/* A name used before it is resolved: the text of the name and where it is. */
typedef struct ref {
  const char *s;
  size_t n;
  const char *at;
} ref;

typedef struct pend_instr {
  kiln_id id;
  ref *ops;
  uint32_t nops;
  ref *ctrl;
  uint32_t nctrl;
} pend_instr;

typedef struct pend_call {
  kiln_id id;
  const char *attr; /* role, for messages */
  ref r;
  uint32_t slot; /* index into ins->called */
} pend_call;

/* Roles of called computations, in the order they are stored in
 * kiln_instr.called (see ir.h). */
enum {
  ROLE_CONDITION,
  ROLE_BODY,
  ROLE_TRUE,
  ROLE_FALSE,
  ROLE_BRANCHES,
  ROLE_SELECT,
  ROLE_SCATTER,
  ROLE_TO_APPLY,
  ROLE_CALLS,
  ROLE_CALLED,
  ROLE_COUNT
};
static const char *const role_names[ROLE_COUNT] = {
    "condition",
    "body",
    "true_computation",
    "false_computation",
    "branch_computations",
    "select",
    "scatter",
    "to_apply",
    "calls",
    "called_computations",
};
static const bool role_is_list[ROLE_COUNT] = {
    [ROLE_BRANCHES] = true, [ROLE_CALLS] = true, [ROLE_CALLED] = true};

typedef struct refvec {
  ref *v;
  size_t n, cap;
} refvec;

typedef struct parser {
  kiln__lex lx;
  kiln_module *m;
  int64_t max_elements;
  kiln_arena *tmp;   /* per computation: discarded shapes, operand names */
  kiln_strmap names; /* instruction name -> index in the computation */
  kiln_strmap comps; /* computation name -> id */
  pend_instr *pend;  /* instructions of the computation being read */
  size_t npend, pendcap;
  pend_call *calls; /* unresolved called computations, whole module */
  size_t ncalls, callcap;
  refvec roles[ROLE_COUNT];
  refvec scratch; /* operand names of the instruction being read */
  kiln_id first;  /* id of the first instruction of the computation */
  size_t header_extra_cap;
} parser;

static int oom(parser *P) {
  return kiln__lex_error_code(&P->lx, NULL, KILN_ENOMEM, "out of memory");
}

static int refvec_push(parser *P, refvec *v, kiln__tok t, const char *at) {
  void *p = v->v;
  if (kiln_grow(&p, &v->cap, v->n + 1, sizeof *v->v)) return oom(P);
  v->v = p;
  v->v[v->n++] = (ref){t.s, t.n, at};
  return 0;
}

static char *tok_dup(parser *P, kiln__tok t) { return kiln_arena_strndup(P->m->arena, t.s, t.n); }

static bool tok_is(kiln__tok t, const char *w) {
  return strlen(w) == t.n && memcmp(t.s, w, t.n) == 0;
}

static const char *found(parser *P, char *buf, size_t n) {
  return kiln__lex_found(&P->lx, NULL, buf, n);
}

/* ---- shapes ------------------------------------------------------------- */

bool kiln__at_shape(kiln__lex *lx) {
  int c = kiln__lex_peek(lx);
  if (c == '(') return true;
  if (!kiln__lex_is_name_start(c)) return false;
  const char *save = lx->p;
  kiln__tok t;
  kiln_dtype dt;
  bool yes = kiln__lex_try_name(lx, &t) && kiln_dtype_from_name(t.s, t.n, &dt) &&
             kiln__lex_peek(lx) == '[';
  lx->p = save;
  return yes;
}

typedef struct i64vec {
  int64_t *v;
  size_t n, cap;
  int64_t small[8];
} i64vec;

static void i64vec_init(i64vec *v) {
  v->v = v->small;
  v->n = 0;
  v->cap = 8;
}

static int i64vec_push(i64vec *v, int64_t x) {
  if (v->n == v->cap) {
    if (v->cap > SIZE_MAX / 2 / sizeof(int64_t)) return KILN_ENOMEM;
    int64_t *nv = kiln_malloc(v->cap * 2 * sizeof *nv);
    if (nv == NULL) return KILN_ENOMEM;
    memcpy(nv, v->v, v->n * sizeof *nv);
    if (v->v != v->small) kiln_free(v->v);
    v->v = nv;
    v->cap *= 2;
  }
  v->v[v->n++] = x;
  return 0;
}

static void i64vec_free(i64vec *v) {
  if (v->v != v->small) kiln_free(v->v);
}

/* The layout tail after ':' up to the closing '}', whitespace and comments
 * removed. */
static int parse_layout_tail(kiln__lex *lx, kiln_arena *a, const char *open, kiln_layout *l) {
  const char *p = lx->p, *end = lx->end;
  char *buf = NULL;
  size_t n = 0;
  int depth = 0;
  /* First pass finds the extent, second copies. */
  const char *q = p;
  for (;;) {
    lx->p = q;
    if (kiln__lex_skip(lx)) return KILN_EPARSE;
    q = lx->p;
    if (q >= end) {
      lx->p = end;
      return kiln__lex_error(lx, open, "unbalanced braces: this '{' is never closed");
    }
    if (*q == '(')
      depth++;
    else if (*q == ')')
      depth--;
    else if (*q == '}' && depth <= 0)
      break;
    else if (*q == '{' || *q == '"')
      return kiln__lex_error(lx, q, "unexpected '%c' in layout", *q);
    else if ((unsigned char)*q < 0x21 || (unsigned char)*q > 0x7e)
      return kiln__lex_error(lx, q, "unexpected byte 0x%02x in layout", (unsigned char)*q);
    n++;
    q++;
  }
  const char *stop = q;
  if (n) {
    buf = kiln_arena_alloc(a, n + 1);
    if (buf == NULL) return kiln__lex_error_code(lx, open, KILN_ENOMEM, "out of memory");
    size_t k = 0;
    lx->p = p;
    while (kiln__lex_skip(lx) == 0 && lx->p < stop) buf[k++] = *lx->p++;
    buf[k] = '\0';
    l->tail = buf;
    /* memory space: S(n) at paren depth 0 */
    depth = 0;
    for (size_t i = 0; i < k; i++) {
      if (buf[i] == '(')
        depth++;
      else if (buf[i] == ')')
        depth--;
      else if (depth == 0 && buf[i] == 'S' && i + 1 < k && buf[i + 1] == '(') {
        int64_t v = 0;
        size_t j = i + 2;
        if (j >= k || buf[j] < '0' || buf[j] > '9')
          return kiln__lex_error(lx, open, "bad memory space in layout: %s", buf);
        while (j < k && buf[j] >= '0' && buf[j] <= '9') {
          if (v > (INT64_MAX - 9) / 10)
            return kiln__lex_error(lx, open, "bad memory space in layout: %s", buf);
          v = v * 10 + (buf[j++] - '0');
        }
        if (j >= k || buf[j] != ')')
          return kiln__lex_error(lx, open, "bad memory space in layout: %s", buf);
        l->memory_space = v;
      }
    }
  }
  lx->p = stop;
  return 0;
}

static void print_m2m(kiln_sbuf *b, const int64_t *v, size_t n) {
  kiln_sbuf_putc(b, '{');
  for (size_t i = 0; i < n; i++) kiln_sbuf_printf(b, "%s%lld", i ? "," : "", (long long)v[i]);
  kiln_sbuf_putc(b, '}');
}

static int parse_layout(kiln__lex *lx, kiln_arena *a, kiln_shape *s) {
  const char *open = lx->p;
  lx->p++; /* '{' */
  i64vec v;
  i64vec_init(&v);
  int rc = 0;
  kiln_layout *l = kiln_arena_calloc(a, 1, sizeof *l);
  if (l == NULL) {
    rc = kiln__lex_error_code(lx, open, KILN_ENOMEM, "out of memory");
    goto out;
  }
  int c = kiln__lex_peek(lx);
  if (c != ':' && c != '}') {
    for (;;) {
      int64_t d;
      if ((rc = kiln__lex_uint(lx, &d, "a dimension number in the layout"))) goto out;
      if (i64vec_push(&v, d)) {
        rc = kiln__lex_error_code(lx, open, KILN_ENOMEM, "out of memory");
        goto out;
      }
      if (!kiln__lex_accept(lx, ',')) break;
    }
  }
  if (kiln__lex_accept(lx, ':') && (rc = parse_layout_tail(lx, a, open, l))) goto out;
  if ((rc = kiln__lex_expect(lx, '}', "to close the layout"))) goto out;
  bool ok = v.n == s->rank;
  for (size_t i = 0; ok && i < v.n; i++) {
    if (v.v[i] >= (int64_t)s->rank) ok = false;
    for (size_t j = 0; ok && j < i; j++)
      if (v.v[j] == v.v[i]) ok = false;
  }
  if (!ok) {
    kiln_sbuf b = KILN_SBUF_INIT;
    kiln_sbuf_puts(&b, "layout ");
    print_m2m(&b, v.v, v.n);
    kiln_sbuf_puts(&b, " of ");
    kiln_shape_print_short(&b, s);
    if (v.n != s->rank)
      kiln_sbuf_printf(&b, " lists %zu dimensions, expected %u", v.n, (unsigned)s->rank);
    else
      kiln_sbuf_printf(&b, " is not a permutation of 0..%u", (unsigned)s->rank - 1);
    rc = kiln__lex_error(lx, open, "%s", kiln_sbuf_str(&b));
    kiln_sbuf_free(&b);
    goto out;
  }
  l->rank = s->rank;
  if (v.n) {
    l->minor_to_major = kiln_arena_memdup(a, v.v, v.n * sizeof *v.v);
    if (l->minor_to_major == NULL) {
      rc = kiln__lex_error_code(lx, open, KILN_ENOMEM, "out of memory");
      goto out;
    }
  }
  s->layout = l;
out:
  i64vec_free(&v);
  return rc;
}

static int parse_tuple_shape(kiln__lex *lx, kiln_arena *a, int64_t max_elements, int depth,
                             unsigned flags, kiln_shape *out) {
  const char *open = lx->p;
  lx->p++; /* '(' */
  kiln_shape *v = NULL;
  size_t n = 0, cap = 0;
  int rc = 0;
  if (!kiln__lex_accept(lx, ')')) {
    for (;;) {
      void *p = v;
      if (kiln_grow(&p, &cap, n + 1, sizeof *v)) {
        rc = kiln__lex_error_code(lx, open, KILN_ENOMEM, "out of memory");
        goto out;
      }
      v = p;
      if ((rc = kiln__parse_shape(lx, a, max_elements, depth + 1, flags, &v[n]))) goto out;
      n++;
      if (kiln__lex_accept(lx, ',')) continue;
      if ((rc = kiln__lex_expect(lx, ')', "to close the tuple shape"))) goto out;
      break;
    }
  }
  if (n > UINT32_MAX) {
    rc = kiln__lex_error(lx, open, "tuple shape has too many elements");
    goto out;
  }
  memset(out, 0, sizeof *out);
  out->dtype = KILN_TUPLE;
  out->rank = (uint32_t)n;
  if (n) {
    out->tuple = kiln_arena_memdup(a, v, n * sizeof *v);
    if (out->tuple == NULL) rc = kiln__lex_error_code(lx, open, KILN_ENOMEM, "out of memory");
  }
out:
  kiln_free(v);
  return rc;
}

static int check_elements(kiln__lex *lx, const kiln_shape *s, int64_t max_elements,
                          const char *at) {
  int64_t n = kiln_shape_elements(s);
  if (n >= 0 && n <= max_elements) return 0;
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_shape_print_short(&b, s);
  int rc = kiln__lex_error_code(lx, at, KILN_ELIMIT, "shape %s has more than %lld elements",
                                kiln_sbuf_str(&b), (long long)max_elements);
  kiln_sbuf_free(&b);
  return rc;
}

/* A '{' after a shape opens a layout only when a dimension number, ':' or
 * '}' follows, as in XLA: "-> f32[] {" in a signature opens the body. */
static bool at_layout(kiln__lex *lx, unsigned flags) {
  if ((flags & KILN__SHAPE_GLUED_LAYOUT) && !(lx->p < lx->end && *lx->p == '{')) return false;
  if (kiln__lex_peek(lx) != '{') return false;
  const char *save = lx->p;
  lx->p++;
  int c = kiln__lex_peek(lx);
  lx->p = save;
  return (c >= '0' && c <= '9') || c == ':' || c == '}';
}

static int parse_array_shape(kiln__lex *lx, kiln_arena *a, int64_t max_elements, unsigned flags,
                             kiln_shape *out) {
  char f[64];
  const char *at = lx->p;
  kiln__tok t;
  kiln_dtype dt;
  if (!kiln__lex_try_name(lx, &t)) {
    return kiln__lex_error(lx, NULL, "expected a shape, found %s",
                           kiln__lex_found(lx, NULL, f, sizeof f));
  }
  if (!kiln_dtype_from_name(t.s, t.n, &dt))
    return kiln__lex_error(lx, at, "expected a shape, found '%.*s'", (int)(t.n > 60 ? 60 : t.n),
                           t.s);
  if (kiln__lex_peek(lx) != '[')
    return kiln__lex_error(lx, NULL, "expected '[' after element type %s, found %s",
                           kiln_dtype_name(dt), kiln__lex_found(lx, NULL, f, sizeof f));
  lx->p++;
  i64vec dims, dyn;
  i64vec_init(&dims);
  i64vec_init(&dyn);
  bool any_dyn = false;
  int rc = 0;
  if (!kiln__lex_accept(lx, ']')) {
    for (;;) {
      int64_t d;
      bool isdyn = false;
      int c = kiln__lex_peek(lx);
      if (c == '<' && kiln__lex_peek2(lx) == '=') {
        lx->p += 2;
        isdyn = any_dyn = true;
      } else if (c == '?') {
        rc = kiln__lex_error(lx, NULL, "unbounded dynamic dimensions ('?') are not supported");
        goto out;
      }
      if ((rc = kiln__lex_uint(lx, &d, "a dimension size"))) goto out;
      if (i64vec_push(&dims, d) || i64vec_push(&dyn, isdyn)) {
        rc = kiln__lex_error_code(lx, at, KILN_ENOMEM, "out of memory");
        goto out;
      }
      if (kiln__lex_accept(lx, ',')) continue;
      if ((rc = kiln__lex_expect(lx, ']', "after the dimensions of a shape"))) goto out;
      break;
    }
  }
  if (!kiln_dtype_is_array(dt) && dims.n) {
    rc = kiln__lex_error(lx, at, "%s shape cannot have dimensions", kiln_dtype_name(dt));
    goto out;
  }
  if (dims.n > 65536) {
    rc = kiln__lex_error(lx, at, "shape has %zu dimensions, more than 65536", dims.n);
    goto out;
  }
  memset(out, 0, sizeof *out);
  out->dtype = dt;
  out->rank = (uint32_t)dims.n;
  if (dims.n) {
    out->dims = kiln_arena_memdup(a, dims.v, dims.n * sizeof *dims.v);
    if (out->dims == NULL) {
      rc = kiln__lex_error_code(lx, at, KILN_ENOMEM, "out of memory");
      goto out;
    }
  }
  if (any_dyn) {
    out->dynamic = kiln_arena_alloc(a, dims.n);
    if (out->dynamic == NULL) {
      rc = kiln__lex_error_code(lx, at, KILN_ENOMEM, "out of memory");
      goto out;
    }
    for (size_t i = 0; i < dims.n; i++) out->dynamic[i] = (uint8_t)dyn.v[i];
  }
  if ((rc = check_elements(lx, out, max_elements, at))) goto out;
  if (at_layout(lx, flags)) rc = parse_layout(lx, a, out);
out:
  i64vec_free(&dims);
  i64vec_free(&dyn);
  return rc;
}

int kiln__parse_shape(kiln__lex *lx, kiln_arena *a, int64_t max_elements, int depth, unsigned flags,
                      kiln_shape *out) {
  if (depth >= KILN__MAX_NESTING)
    return kiln__lex_error(lx, NULL, "nesting deeper than %d levels", KILN__MAX_NESTING);
  if (kiln__lex_peek(lx) == '(') return parse_tuple_shape(lx, a, max_elements, depth, flags, out);
  return parse_array_shape(lx, a, max_elements, flags, out);
}

static int parse_shape(parser *P, kiln_arena *a, kiln_shape *out) {
  return kiln__parse_shape(&P->lx, a, P->max_elements, 0, 0, out);
}

/* ---- instructions ------------------------------------------------------- */

static int lookup_opcode(parser *P, kiln__tok t, const char *at, kiln_opcode *op,
                         kiln_opcode *async_op) {
  *async_op = KILN_OP_INVALID;
  if (kiln_opcode_from_name(t.s, t.n, op)) return 0;
  static const struct {
    const char *suffix;
    kiln_opcode op;
  } sugar[] = {{"-start", KILN_OP_ASYNC_START},
               {"-update", KILN_OP_ASYNC_UPDATE},
               {"-done", KILN_OP_ASYNC_DONE}};
  for (size_t i = 0; i < sizeof sugar / sizeof sugar[0]; i++) {
    size_t k = strlen(sugar[i].suffix);
    kiln_opcode inner;
    if (t.n > k && memcmp(t.s + t.n - k, sugar[i].suffix, k) == 0 &&
        kiln_opcode_from_name(t.s, t.n - k, &inner)) {
      *op = sugar[i].op;
      *async_op = inner;
      return 0;
    }
  }
  if (kiln__lex_peek(&P->lx) == '[') /* "x = f33[] ...": a misspelt type, not an opcode */
    return kiln__lex_error(&P->lx, at, "unknown element type '%.*s'", (int)(t.n > 80 ? 80 : t.n),
                           t.s);
  return kiln__lex_error(&P->lx, at, "unknown opcode '%.*s'", (int)(t.n > 80 ? 80 : t.n), t.s);
}

/* "(a, f32[] b, (s32[], pred[]) c)": names into P->scratch; a shape written
 * before an operand is read and dropped (the verifier checks shapes). */
static int parse_operands(parser *P, const char *iname) {
  kiln__lex *lx = &P->lx;
  P->scratch.n = 0;
  if (kiln__lex_accept(lx, ')')) return 0;
  for (;;) {
    int rc;
    if (kiln__at_shape(lx)) {
      kiln_shape ignored;
      if ((rc = parse_shape(P, P->tmp, &ignored))) return rc;
    }
    kiln__lex_skip(lx);
    const char *at = lx->p;
    kiln__tok t;
    if ((rc = kiln__lex_name(lx, &t, "an operand name"))) return rc;
    if ((rc = refvec_push(P, &P->scratch, t, at))) return rc;
    if (kiln__lex_accept(lx, ',')) continue;
    char ctx[160];
    snprintf(ctx, sizeof ctx, "after operands of %s", iname);
    return kiln__lex_expect(lx, ')', ctx);
  }
}

static int copy_refs(parser *P, refvec *v, ref **out, uint32_t *n) {
  *out = NULL;
  *n = 0;
  if (v->n == 0) return 0;
  if (v->n > UINT32_MAX / 2) return kiln__lex_error(&P->lx, NULL, "too many operands");
  *out = kiln_arena_memdup(P->tmp, v->v, v->n * sizeof *v->v);
  if (*out == NULL) return oom(P);
  *n = (uint32_t)v->n;
  return 0;
}

/* "{%a, %b}" or "{}" into v. */
static int parse_name_list(parser *P, refvec *v, const char *what) {
  kiln__lex *lx = &P->lx;
  int rc;
  char ctx[96];
  snprintf(ctx, sizeof ctx, "to open the list of %s", what);
  if ((rc = kiln__lex_expect(lx, '{', ctx))) return rc;
  if (kiln__lex_accept(lx, '}')) return 0;
  for (;;) {
    kiln__lex_skip(lx);
    const char *at = lx->p;
    kiln__tok t;
    if ((rc = kiln__lex_name(lx, &t, what))) return rc;
    if ((rc = refvec_push(P, v, t, at))) return rc;
    if (kiln__lex_accept(lx, ',')) continue;
    snprintf(ctx, sizeof ctx, "to close the list of %s", what);
    return kiln__lex_expect(lx, '}', ctx);
  }
}

static int parse_role(parser *P, int role, const char *at) {
  kiln__lex *lx = &P->lx;
  refvec *v = &P->roles[role];
  (void)at;
  if (role_is_list[role] && kiln__lex_peek(lx) == '{')
    return parse_name_list(P, v, "computation names");
  kiln__lex_skip(lx);
  const char *nat = lx->p;
  kiln__tok t;
  int rc = kiln__lex_name(lx, &t, "a computation name");
  if (rc) return rc;
  return refvec_push(P, v, t, nat);
}

static int add_unknown_attr(parser *P, kiln_instr *ins, kiln__tok name) {
  kiln__tok val;
  int rc = kiln__lex_verbatim(&P->lx, &val, "an attribute value");
  if (rc) return rc;
  kiln_attr *a = kiln_instr_add_attr(P->m, ins, KILN_ATTR_UNKNOWN);
  if (a == NULL) return oom(P);
  a->name = tok_dup(P, name);
  a->v.s = tok_dup(P, val);
  if (a->name == NULL || a->v.s == NULL) return oom(P);
  return 0;
}

static int parse_attrs(parser *P, kiln_instr *ins, refvec *ctrl, bool *has_ctrl) {
  kiln__lex *lx = &P->lx;
  uint8_t seen[(KILN_ATTR_COUNT + 7) / 8] = {0};
  bool roles_seen[ROLE_COUNT] = {0};
  while (kiln__lex_accept(lx, ',')) {
    kiln__lex_skip(lx);
    const char *at = lx->p;
    kiln__tok name;
    int rc;
    if ((rc = kiln__lex_bare_name(lx, &name, "an attribute name"))) return rc;
    char ctx[128];
    snprintf(ctx, sizeof ctx, "after attribute name %.*s", (int)(name.n > 80 ? 80 : name.n),
             name.s);
    if ((rc = kiln__lex_expect(lx, '=', ctx))) return rc;
    if (tok_is(name, "control-predecessors")) {
      if (*has_ctrl) return kiln__lex_error(lx, at, "duplicate attribute control-predecessors");
      *has_ctrl = true;
      if ((rc = parse_name_list(P, ctrl, "instruction names"))) return rc;
      continue;
    }
    int role = -1;
    for (int r = 0; r < ROLE_COUNT; r++)
      if (tok_is(name, role_names[r])) role = r;
    if (role >= 0) {
      if (roles_seen[role])
        return kiln__lex_error(lx, at, "duplicate attribute %s", role_names[role]);
      roles_seen[role] = true;
      if ((rc = parse_role(P, role, at))) return rc;
      continue;
    }
    kiln_attr_key key;
    if (!kiln_attr_key_from_name(name.s, name.n, &key)) {
      if ((rc = add_unknown_attr(P, ins, name))) return rc;
      continue;
    }
    if (seen[key / 8] & (1u << (key % 8)))
      return kiln__lex_error(lx, at, "duplicate attribute %s", kiln_attr_key_name(key));
    seen[key / 8] |= (uint8_t)(1u << (key % 8));
    if ((rc = kiln__parse_attr_value(lx, P->m, ins, key))) return rc;
  }
  return 0;
}

/* Lays the role lists out in kiln_instr.called and queues their names. */
static int finish_calls(parser *P, kiln_instr *ins, const char *at) {
  static const int pairs[][2] = {
      {ROLE_CONDITION, ROLE_BODY}, {ROLE_TRUE, ROLE_FALSE}, {ROLE_SELECT, ROLE_SCATTER}};
  for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
    bool a = P->roles[pairs[i][0]].n > 0, b = P->roles[pairs[i][1]].n > 0;
    if (a != b)
      return kiln__lex_error(&P->lx, at, "%s has %s= but no %s=", ins->name,
                             role_names[pairs[i][a ? 0 : 1]], role_names[pairs[i][a ? 1 : 0]]);
  }
  size_t total = 0;
  for (int r = 0; r < ROLE_COUNT; r++) total += P->roles[r].n;
  if (total == 0) return 0;
  if (total > UINT32_MAX / 2) return kiln__lex_error(&P->lx, at, "too many called computations");
  uint32_t *called = kiln_arena_alloc(P->m->arena, total * sizeof *called);
  if (called == NULL) return oom(P);
  void *p = P->calls;
  if (kiln_grow(&p, &P->callcap, P->ncalls + total, sizeof *P->calls)) return oom(P);
  P->calls = p;
  uint32_t k = 0;
  for (int r = 0; r < ROLE_COUNT; r++) {
    for (size_t j = 0; j < P->roles[r].n; j++) {
      called[k] = UINT32_MAX;
      P->calls[P->ncalls++] = (pend_call){ins->id, role_names[r], P->roles[r].v[j], k};
      k++;
    }
  }
  ins->called = called;
  ins->ncalled = k;
  return 0;
}

static int parse_constant(parser *P, kiln_instr *ins, bool has_shape, const char *op_at) {
  kiln__lex *lx = &P->lx;
  if (!has_shape) return kiln__lex_error(lx, op_at, "constant %s needs a result shape", ins->name);
  kiln__lex_skip(lx);
  int rc = kiln__literal_check_size(lx, &ins->shape, lx->p, ins->name, P->max_elements);
  if (rc) return rc;
  kiln_literal *lit;
  kiln_status lst;
  kiln_status_clear(&lst);
  rc = kiln_literal_create(P->m->arena, &ins->shape, 0, &lit, &lst);
  if (rc) return kiln__lex_error_code(lx, op_at, rc, "%s", lst.msg);
  if ((rc = kiln__parse_literal_value(lx, P->m->arena, lit, 0))) return rc;
  ins->literal = lit;
  char ctx[160];
  snprintf(ctx, sizeof ctx, "after the value of constant %s", ins->name);
  return kiln__lex_expect(lx, ')', ctx);
}

static int push_pend(parser *P, pend_instr pi) {
  void *p = P->pend;
  if (kiln_grow(&p, &P->pendcap, P->npend + 1, sizeof *P->pend)) return oom(P);
  P->pend = p;
  P->pend[P->npend++] = pi;
  return 0;
}

static int parse_instr(parser *P, uint32_t comp, kiln_id *root) {
  kiln__lex *lx = &P->lx;
  kiln_module *m = P->m;
  int rc;
  bool is_root = kiln__lex_accept_word(lx, "ROOT");
  kiln__lex_skip(lx);
  const char *at = lx->p;
  kiln__tok name;
  if ((rc = kiln__lex_name(lx, &name, "an instruction name or '}'"))) return rc;
  char ctx[160];
  snprintf(ctx, sizeof ctx, "after instruction name %.*s", (int)(name.n > 80 ? 80 : name.n),
           name.s);
  if ((rc = kiln__lex_expect(lx, '=', ctx))) return rc;
  kiln_shape shape;
  bool has_shape = kiln__at_shape(lx);
  if (has_shape && (rc = parse_shape(P, m->arena, &shape))) return rc;
  kiln__lex_skip(lx);
  const char *op_at = lx->p;
  kiln__tok opname;
  if ((rc = kiln__lex_bare_name(lx, &opname, has_shape ? "an opcode" : "a shape or an opcode")))
    return rc;
  kiln_opcode op, async_op;
  if ((rc = lookup_opcode(P, opname, op_at, &op, &async_op))) return rc;

  kiln_instr *ins = kiln_module_add_instr(m, comp, op, "");
  if (ins == NULL) return oom(P);
  ins->name = tok_dup(P, name);
  if (ins->name == NULL) return oom(P);
  ins->async_op = async_op;
  kiln__lex_linecol(lx, at, &ins->line, &ins->col);
  if (has_shape) ins->shape = shape;
  uint32_t local = ins->id - P->first;
  uint32_t prev;
  rc = kiln_strmap_put(&P->names, name.s, name.n, local, &prev);
  if (rc < 0) return oom(P);
  if (rc == 1)
    return kiln__lex_error(lx, at, "duplicate instruction name %%%s in computation %s", ins->name,
                           m->comps[comp]->name);
  if (is_root) {
    if (*root != KILN_NO_ID)
      return kiln__lex_error(lx, at, "computation %s has a second ROOT %s (the first is %s)",
                             m->comps[comp]->name, ins->name, m->instrs[*root]->name);
    *root = ins->id;
  }

  snprintf(ctx, sizeof ctx, "after opcode %s", kiln_opcode_name(op));
  if (async_op != KILN_OP_INVALID)
    snprintf(ctx, sizeof ctx, "after opcode %.*s", (int)(opname.n > 80 ? 80 : opname.n), opname.s);
  if ((rc = kiln__lex_expect(lx, '(', ctx))) return rc;
  pend_instr pi = {ins->id, NULL, 0, NULL, 0};
  if (op == KILN_OP_CONSTANT) {
    if ((rc = parse_constant(P, ins, has_shape, op_at))) return rc;
  } else if (op == KILN_OP_PARAMETER) {
    if ((rc = kiln__lex_uint(lx, &ins->param_number, "a parameter number"))) return rc;
    snprintf(ctx, sizeof ctx, "after the parameter number of %s", ins->name);
    if ((rc = kiln__lex_expect(lx, ')', ctx))) return rc;
  } else {
    if ((rc = parse_operands(P, ins->name))) return rc;
    if ((rc = copy_refs(P, &P->scratch, &pi.ops, &pi.nops))) return rc;
    if (pi.nops) {
      ins->operands = kiln_arena_alloc(m->arena, pi.nops * sizeof *ins->operands);
      if (ins->operands == NULL) return oom(P);
      ins->noperands = pi.nops;
    }
  }
  for (int r = 0; r < ROLE_COUNT; r++) P->roles[r].n = 0;
  P->scratch.n = 0;
  bool has_ctrl = false;
  if ((rc = parse_attrs(P, ins, &P->scratch, &has_ctrl))) return rc;
  if ((rc = copy_refs(P, &P->scratch, &pi.ctrl, &pi.nctrl))) return rc;
  if (pi.nctrl) {
    ins->control_preds = kiln_arena_alloc(m->arena, pi.nctrl * sizeof *ins->control_preds);
    if (ins->control_preds == NULL) return oom(P);
    ins->ncontrol = pi.nctrl;
  }
  if ((rc = finish_calls(P, ins, at))) return rc;
  return push_pend(P, pi);
}

/* ---- computations ------------------------------------------------------- */

static int resolve_refs(parser *P, const ref *refs, uint32_t n, kiln_id *out, const kiln_instr *ins,
                        const char *what) {
  for (uint32_t i = 0; i < n; i++) {
    uint32_t local;
    if (!kiln_strmap_get(&P->names, refs[i].s, refs[i].n, &local))
      return kiln__lex_error(&P->lx, refs[i].at, "unknown %s %%%.*s in %s", what,
                             (int)(refs[i].n > 200 ? 200 : refs[i].n), refs[i].s, ins->name);
    out[i] = P->first + local;
  }
  return 0;
}

static int report_cycle(parser *P, const kiln_computation *c, const uint32_t *stack, size_t top,
                        uint32_t t) {
  kiln_module *m = P->m;
  size_t from = 0;
  while (stack[from] != t) from++;
  kiln_sbuf b = KILN_SBUF_INIT;
  for (size_t i = from; i < top; i++) {
    kiln_sbuf_printf(&b, "%s -> ", m->instrs[P->first + stack[i]]->name);
    if (b.len > 600) {
      kiln_sbuf_puts(&b, "... -> ");
      break;
    }
  }
  kiln_sbuf_puts(&b, m->instrs[P->first + t]->name);
  const kiln_instr *ti = m->instrs[P->first + t];
  char where[KILN_STATUS_WHERE_MAX];
  snprintf(where, sizeof where, "%s:%u:%u", P->lx.file, (unsigned)ti->line, (unsigned)ti->col);
  kiln_status_set(P->lx.st, KILN_EPARSE, where, "cycle in computation %s: %s", c->name,
                  kiln_sbuf_failed(&b) ? "(out of memory)" : kiln_sbuf_str(&b));
  kiln_sbuf_free(&b);
  return KILN_EPARSE;
}

/* Depth-first post-order over operands then control predecessors, roots
 * taken in text order: definitions move up to just before their first use
 * and everything else keeps its place. */
static int order_computation(parser *P, kiln_computation *c) {
  kiln_module *m = P->m;
  uint32_t n = c->ninstrs;
  int rc = 0;
  uint8_t *state = kiln_calloc(n, 1);
  uint32_t *stack = kiln_malloc((size_t)n * sizeof *stack);
  uint32_t *edge = kiln_malloc((size_t)n * sizeof *edge);
  uint32_t *order = kiln_malloc((size_t)n * sizeof *order);
  if (!state || !stack || !edge || !order) {
    rc = oom(P);
    goto out;
  }
  size_t norder = 0;
  for (uint32_t s = 0; s < n; s++) {
    if (state[s]) continue;
    size_t top = 0;
    stack[top] = s;
    edge[top++] = 0;
    state[s] = 1;
    while (top) {
      uint32_t u = stack[top - 1];
      const kiln_instr *ins = m->instrs[P->first + u];
      uint32_t k = edge[top - 1];
      if (k < ins->noperands + ins->ncontrol) {
        edge[top - 1]++;
        kiln_id tid =
            k < ins->noperands ? ins->operands[k] : ins->control_preds[k - ins->noperands];
        uint32_t t = tid - P->first;
        if (state[t] == 0) {
          state[t] = 1;
          stack[top] = t;
          edge[top++] = 0;
        } else if (state[t] == 1) {
          rc = report_cycle(P, c, stack, top, t);
          goto out;
        }
      } else {
        state[u] = 2;
        order[norder++] = u;
        top--;
      }
    }
  }
  for (uint32_t i = 0; i < n; i++) c->instrs[i] = P->first + order[i];
out:
  kiln_free(state);
  kiln_free(stack);
  kiln_free(edge);
  kiln_free(order);
  return rc;
}

static int finish_computation(parser *P, kiln_computation *c, kiln_id root) {
  kiln_module *m = P->m;
  int rc;
  for (size_t i = 0; i < P->npend; i++) {
    pend_instr *pi = &P->pend[i];
    kiln_instr *ins = m->instrs[pi->id];
    if ((rc = resolve_refs(P, pi->ops, pi->nops, ins->operands, ins, "operand"))) return rc;
    if ((rc = resolve_refs(P, pi->ctrl, pi->nctrl, ins->control_preds, ins, "control predecessor")))
      return rc;
  }
  /* Without ROOT the last instruction in the text is the root. */
  c->root = root != KILN_NO_ID ? root : P->first + c->ninstrs - 1;
  return order_computation(P, c);
}

static int expect_arrow(parser *P, const char *ctx) {
  kiln__lex *lx = &P->lx;
  if (kiln__lex_peek(lx) == '-' && kiln__lex_peek2(lx) == '>') {
    lx->p += 2;
    return 0;
  }
  char f[64];
  return kiln__lex_error(lx, NULL, "expected '->' %s, found %s", ctx, found(P, f, sizeof f));
}

/* "(x: f32[], y: f32[]) -> f32[]": read and dropped; parameters carry
 * their own shapes. */
static int parse_signature(parser *P, const char *cname) {
  kiln__lex *lx = &P->lx;
  int rc;
  lx->p++; /* '(' */
  if (!kiln__lex_accept(lx, ')')) {
    for (;;) {
      kiln__tok t;
      kiln_shape ignored;
      if ((rc = kiln__lex_name(lx, &t, "a parameter name"))) return rc;
      if ((rc = kiln__lex_expect(lx, ':', "after a parameter name in the signature"))) return rc;
      if ((rc = parse_shape(P, P->tmp, &ignored))) return rc;
      if (kiln__lex_accept(lx, ',')) continue;
      if ((rc = kiln__lex_expect(lx, ')', "after the parameters of the signature"))) return rc;
      break;
    }
  }
  char ctx[160];
  snprintf(ctx, sizeof ctx, "after the parameters of computation %s", cname);
  if ((rc = expect_arrow(P, ctx))) return rc;
  kiln_shape ignored;
  return parse_shape(P, P->tmp, &ignored);
}

static int parse_computation(parser *P, bool *saw_entry) {
  kiln__lex *lx = &P->lx;
  kiln_module *m = P->m;
  int rc;
  kiln__lex_skip(lx);
  const char *entry_at = lx->p;
  bool is_entry = kiln__lex_accept_word(lx, "ENTRY");
  kiln__lex_skip(lx);
  const char *at = lx->p;
  kiln__tok name;
  if ((rc = kiln__lex_name(lx, &name, "a computation"))) return rc;
  char *cname = kiln_arena_strndup(P->tmp, name.s, name.n);
  if (cname == NULL) return oom(P);
  if (is_entry && *saw_entry)
    return kiln__lex_error(lx, entry_at, "second ENTRY computation %s", cname);
  uint32_t prev;
  rc = kiln_strmap_put(&P->comps, name.s, name.n, m->ncomps, &prev);
  if (rc < 0) return oom(P);
  if (rc == 1) return kiln__lex_error(lx, at, "duplicate computation name %s", cname);
  uint32_t cid;
  if (kiln_module_add_computation(m, cname, &cid)) return oom(P);
  kiln_computation *c = m->comps[cid];
  kiln__lex_linecol(lx, at, &c->line, &c->col);
  if (is_entry) {
    *saw_entry = true;
    c->is_entry = true;
    m->entry = cid;
  }
  if (kiln__lex_peek(lx) == '(' && (rc = parse_signature(P, cname))) return rc;
  char ctx[160];
  snprintf(ctx, sizeof ctx, "to open computation %s", cname);
  if ((rc = kiln__lex_expect(lx, '{', ctx))) return rc;

  kiln_strmap_clear(&P->names);
  P->npend = 0;
  P->first = m->ninstrs;
  kiln_id root = KILN_NO_ID;
  for (;;) {
    int c0 = kiln__lex_peek(lx);
    if (kiln__lex_failed(lx)) return KILN_EPARSE;
    if (c0 == '}') break;
    if (c0 < 0) {
      return kiln__lex_error(
          lx, NULL, "expected an instruction or '}' in computation %s, found end of input", cname);
    }
    if ((rc = parse_instr(P, cid, &root))) return rc;
  }
  lx->p++;
  if (c->ninstrs == 0) return kiln__lex_error(lx, at, "computation %s has no instructions", cname);
  return finish_computation(P, c, root);
}

/* ---- module header ------------------------------------------------------ */

static int parse_entry_layout(parser *P) {
  kiln__lex *lx = &P->lx;
  kiln_module *m = P->m;
  int rc;
  if ((rc = kiln__lex_expect(lx, '{', "to open entry_computation_layout"))) return rc;
  if (kiln__lex_peek(lx) != '(') {
    char f[64];
    return kiln__lex_error(lx, NULL, "expected '(' to open the parameter shapes, found %s",
                           found(P, f, sizeof f));
  }
  lx->p++;
  kiln_program_shape *ps = kiln_arena_calloc(m->arena, 1, sizeof *ps);
  if (ps == NULL) return oom(P);
  kiln_shape *v = NULL;
  size_t n = 0, cap = 0;
  if (!kiln__lex_accept(lx, ')')) {
    for (;;) {
      void *p = v;
      if (kiln_grow(&p, &cap, n + 1, sizeof *v)) {
        kiln_free(v);
        return oom(P);
      }
      v = p;
      if ((rc = parse_shape(P, m->arena, &v[n]))) {
        kiln_free(v);
        return rc;
      }
      n++;
      if (kiln__lex_accept(lx, ',')) continue;
      if ((rc = kiln__lex_expect(lx, ')', "after the parameter shapes"))) {
        kiln_free(v);
        return rc;
      }
      break;
    }
  }
  if (n) {
    ps->params = kiln_arena_memdup(m->arena, v, n * sizeof *v);
    kiln_free(v);
    if (ps->params == NULL) return oom(P);
    ps->nparams = (uint32_t)n;
  }
  if ((rc = expect_arrow(P, "in entry_computation_layout"))) return rc;
  if ((rc = parse_shape(P, m->arena, &ps->result))) return rc;
  if ((rc = kiln__lex_expect(lx, '}', "to close entry_computation_layout"))) return rc;
  m->entry_layout = ps;
  return 0;
}

static int add_header_extra(parser *P, kiln__tok name) {
  kiln_module *m = P->m;
  kiln__tok val;
  int rc = kiln__lex_verbatim(&P->lx, &val, "an attribute value");
  if (rc) return rc;
  if (m->nheader_extra == P->header_extra_cap) {
    size_t ncap = P->header_extra_cap ? P->header_extra_cap * 2 : 4;
    kiln_raw_attr *na = kiln_arena_calloc(m->arena, ncap, sizeof *na);
    if (na == NULL) return oom(P);
    if (m->nheader_extra) memcpy(na, m->header_extra, m->nheader_extra * sizeof *na);
    m->header_extra = na;
    P->header_extra_cap = ncap;
  }
  kiln_raw_attr *ra = &m->header_extra[m->nheader_extra++];
  ra->name = tok_dup(P, name);
  ra->text = tok_dup(P, val);
  if (ra->name == NULL || ra->text == NULL) return oom(P);
  return 0;
}

static int parse_header(parser *P) {
  kiln__lex *lx = &P->lx;
  kiln_module *m = P->m;
  char f[64];
  int rc;
  if (!kiln__lex_accept_word(lx, "HloModule"))
    return kiln__lex_error(lx, NULL, "expected 'HloModule', found %s", found(P, f, sizeof f));
  kiln__tok name;
  if ((rc = kiln__lex_name(lx, &name, "a module name"))) return rc;
  m->name = tok_dup(P, name);
  if (m->name == NULL) return oom(P);
  kiln__lex_accept(lx, ':'); /* "HloModule comments:" in XLA's tests */
  enum { H_LAYOUT, H_SCHED, H_ALIAS, H_REPLICAS, H_PARTS, H_COUNT };
  static const char *const hnames[H_COUNT] = {"entry_computation_layout", "is_scheduled",
                                              "input_output_alias", "replica_count",
                                              "num_partitions"};
  bool seen[H_COUNT] = {0};
  while (kiln__lex_accept(lx, ',')) {
    kiln__lex_skip(lx);
    const char *at = lx->p;
    kiln__tok an;
    if ((rc = kiln__lex_bare_name(lx, &an, "a module attribute name"))) return rc;
    char ctx[128];
    snprintf(ctx, sizeof ctx, "after attribute name %.*s", (int)(an.n > 80 ? 80 : an.n), an.s);
    if ((rc = kiln__lex_expect(lx, '=', ctx))) return rc;
    int h = -1;
    for (int i = 0; i < H_COUNT; i++)
      if (tok_is(an, hnames[i])) h = i;
    if (h < 0) {
      if ((rc = add_header_extra(P, an))) return rc;
      continue;
    }
    if (seen[h]) return kiln__lex_error(lx, at, "duplicate module attribute %s", hnames[h]);
    seen[h] = true;
    switch (h) {
    case H_LAYOUT: rc = parse_entry_layout(P); break;
    case H_SCHED:
      if (kiln__lex_accept_word(lx, "true"))
        m->is_scheduled = 1;
      else if (kiln__lex_accept_word(lx, "false"))
        m->is_scheduled = 0;
      else
        rc = kiln__lex_error(lx, NULL, "expected true or false for is_scheduled, found %s",
                             found(P, f, sizeof f));
      break;
    case H_ALIAS: rc = kiln__parse_aliases(lx, m); break;
    case H_REPLICAS: rc = kiln__lex_uint(lx, &m->replica_count, "a replica count"); break;
    case H_PARTS: rc = kiln__lex_uint(lx, &m->num_partitions, "a number of partitions"); break;
    }
    if (rc) return rc;
  }
  return 0;
}

/* The debug-info sections XLA writes after the header of a compiled
 * module: a section name on a line of its own, then "ID VALUE" entries (a
 * "string" or a {...} group). A computation of that name would be followed
 * by '{' or '(' instead, so the two never mix up. Kept verbatim. */
static const char *const section_names[] = {"FileNames", "FunctionNames", "FileLocations",
                                            "StackFrames"};

static int parse_sections(parser *P) {
  kiln__lex *lx = &P->lx;
  kiln_module *m = P->m;
  size_t cap = 0;
  for (;;) {
    kiln__lex_skip(lx);
    const char *save = lx->p;
    kiln__tok w;
    if (!kiln__lex_try_name(lx, &w)) return 0;
    const char *name = NULL;
    for (size_t i = 0; i < sizeof section_names / sizeof *section_names; i++)
      if (tok_is(w, section_names[i])) name = section_names[i];
    int c = kiln__lex_peek(lx);
    if (name == NULL || c == '{' || c == '(') {
      lx->p = save;
      return 0;
    }
    kiln_sbuf text = KILN_SBUF_INIT;
    int rc = 0;
    while (kiln__lex_skip(lx), lx->p < lx->end && *lx->p >= '0' && *lx->p <= '9') {
      int64_t id;
      kiln__tok v;
      if ((rc = kiln__lex_uint(lx, &id, "a section entry id")) ||
          (rc = kiln__lex_verbatim(lx, &v, "a section entry value")))
        break;
      if (v.n == 0 || (v.s[0] != '"' && v.s[0] != '{')) {
        rc = kiln__lex_error(lx, v.s, "%s entry %lld: expected a \"string\" or {...}", name,
                             (long long)id);
        break;
      }
      if (text.len) kiln_sbuf_putc(&text, '\n');
      kiln_sbuf_printf(&text, "%lld ", (long long)id);
      kiln_sbuf_putn(&text, v.s, v.n);
    }
    if (rc == 0 && m->nsections == cap) {
      size_t ncap = cap ? cap * 2 : 4;
      kiln_raw_attr *na = kiln_arena_alloc(m->arena, ncap * sizeof *na);
      if (na == NULL)
        rc = oom(P);
      else {
        if (m->nsections) memcpy(na, m->sections, m->nsections * sizeof *na);
        m->sections = na;
        cap = ncap;
      }
    }
    if (rc == 0 && kiln_sbuf_failed(&text)) rc = oom(P);
    if (rc == 0) {
      kiln_raw_attr *ra = &m->sections[m->nsections];
      ra->name = name;
      ra->text = kiln_arena_strdup(m->arena, text.data ? kiln_sbuf_str(&text) : "");
      if (ra->text == NULL)
        rc = oom(P);
      else
        m->nsections++;
    }
    kiln_sbuf_free(&text);
    if (rc) return rc;
  }
}

/* ---- after the whole module is read ------------------------------------- */

static int resolve_calls(parser *P) {
  kiln_module *m = P->m;
  for (size_t i = 0; i < P->ncalls; i++) {
    pend_call *pc = &P->calls[i];
    uint32_t cid;
    kiln_instr *ins = m->instrs[pc->id];
    if (!kiln_strmap_get(&P->comps, pc->r.s, pc->r.n, &cid))
      return kiln__lex_error(&P->lx, pc->r.at, "unknown computation %%%.*s in %s of %s",
                             (int)(pc->r.n > 200 ? 200 : pc->r.n), pc->r.s, pc->attr, ins->name);
    ins->called[pc->slot] = cid;
  }
  return 0;
}

/* The first array inside s with more than max elements (or overflowing). */
static const kiln_shape *over_limit(const kiln_shape *s, int64_t max) {
  if (kiln_shape_is_tuple(s)) {
    for (uint32_t i = 0; i < s->rank; i++) {
      const kiln_shape *b = over_limit(&s->tuple[i], max);
      if (b) return b;
    }
    return NULL;
  }
  int64_t n = kiln_shape_elements(s);
  return n < 0 || n > max ? s : NULL;
}

static int infer_one(parser *P, kiln_instr *ins) {
  kiln_status ist;
  kiln_status_clear(&ist);
  kiln_shape out;
  memset(&out, 0, sizeof out);
  int rc = kiln_infer_shape(P->m, ins, P->m->arena, &out, &ist);
  char where[KILN_STATUS_WHERE_MAX];
  snprintf(where, sizeof where, "%s:%u:%u", P->lx.file, (unsigned)ins->line, (unsigned)ins->col);
  if (rc == 0) {
    /* An inferred shape obeys the same limit as a written one, so that what
     * the parser accepts it also accepts when printed back. */
    const kiln_shape *big = over_limit(&out, P->max_elements);
    if (big) {
      kiln_sbuf b = KILN_SBUF_INIT;
      kiln_shape_print_short(&b, big);
      kiln_status_set(P->lx.st, KILN_ELIMIT, where,
                      "the inferred shape %s of %s has more than %lld elements", kiln_sbuf_str(&b),
                      ins->name, (long long)P->max_elements);
      kiln_sbuf_free(&b);
      return KILN_ELIMIT;
    }
    ins->shape = out;
    return 0;
  }
  return kiln_status_set(P->lx.st, rc, where, "cannot infer the shape of %s: %s", ins->name,
                         ist.msg[0] ? ist.msg : kiln_strerror(rc));
}

/* Infers missing shapes, callees before callers (a while's shape may need
 * its body's root), each computation in its dependency order. */
static int infer_shapes(parser *P) {
  kiln_module *m = P->m;
  bool any = false;
  for (uint32_t i = 0; i < m->ninstrs && !any; i++) any = m->instrs[i]->shape.dtype == KILN_INVALID;
  if (!any) return 0;
  uint32_t n = m->ncomps;
  int rc = 0;
  uint8_t *state = kiln_calloc(n ? n : 1, 1);
  uint32_t *stack = kiln_malloc((n ? n : 1) * sizeof *stack);
  uint32_t *ipos = kiln_malloc((n ? n : 1) * sizeof *ipos); /* instruction cursor */
  uint32_t *cpos = kiln_malloc((n ? n : 1) * sizeof *cpos); /* called cursor */
  if (!state || !stack || !ipos || !cpos) {
    rc = oom(P);
    goto out;
  }
  for (uint32_t s = 0; s < n && rc == 0; s++) {
    if (state[s]) continue;
    size_t top = 0;
    stack[top] = s;
    ipos[top] = cpos[top] = 0;
    top++;
    state[s] = 1;
    while (top && rc == 0) {
      kiln_computation *c = m->comps[stack[top - 1]];
      uint32_t *ip = &ipos[top - 1], *cp = &cpos[top - 1];
      if (*ip < c->ninstrs) {
        kiln_instr *ins = m->instrs[c->instrs[*ip]];
        if (*cp < ins->ncalled) {
          uint32_t t = ins->called[(*cp)++];
          if (state[t] == 0) {
            state[t] = 1;
            stack[top] = t;
            ipos[top] = cpos[top] = 0;
            top++;
          } else if (state[t] == 1) {
            char where[KILN_STATUS_WHERE_MAX];
            snprintf(where, sizeof where, "%s:%u:%u", P->lx.file, (unsigned)ins->line,
                     (unsigned)ins->col);
            rc = kiln_status_set(P->lx.st, KILN_EPARSE, where,
                                 "computation %s calls itself through %s", m->comps[t]->name,
                                 ins->name);
          }
          continue;
        }
        (*ip)++;
        *cp = 0;
        continue;
      }
      for (uint32_t i = 0; i < c->ninstrs && rc == 0; i++) {
        kiln_instr *ins = m->instrs[c->instrs[i]];
        if (ins->shape.dtype == KILN_INVALID) rc = infer_one(P, ins);
      }
      state[stack[top - 1]] = 2;
      top--;
    }
  }
out:
  kiln_free(state);
  kiln_free(stack);
  kiln_free(ipos);
  kiln_free(cpos);
  return rc;
}

/* ---- entry point -------------------------------------------------------- */

static int parse_module(parser *P, const kiln_parse_options *opts) {
  kiln__lex *lx = &P->lx;
  kiln_module *m = P->m;
  int rc;
  if ((rc = parse_header(P))) return rc;
  if ((rc = parse_sections(P))) return rc;
  bool saw_entry = false;
  for (;;) {
    int c = kiln__lex_peek(lx);
    if (kiln__lex_failed(lx)) return KILN_EPARSE;
    if (c < 0) break;
    kiln_arena_destroy(P->tmp);
    P->tmp = kiln_arena_create();
    if (P->tmp == NULL) return oom(P);
    if ((rc = parse_computation(P, &saw_entry))) return rc;
  }
  if (m->ncomps == 0)
    return kiln__lex_error(lx, NULL, "expected a computation, found end of input");
  if (!saw_entry) { /* without ENTRY the last computation is the entry */
    m->entry = m->ncomps - 1;
    m->comps[m->entry]->is_entry = true;
  }
  if ((rc = resolve_calls(P))) return rc;
  if (opts && opts->no_infer) return 0;
  return infer_shapes(P);
}

int kiln_module_parse_text(const char *text, size_t len, const char *filename,
                           const kiln_parse_options *opts, kiln_module **out, kiln_status *st) {
  *out = NULL;
  kiln_status local;
  if (st == NULL) {
    kiln_status_clear(&local);
    st = &local;
  }
  if (st->code) return st->code; /* first error wins: do not hide it */
  if (text == NULL && len) return kiln_status_set(st, KILN_EINVAL, NULL, "text is NULL");
  parser P;
  memset(&P, 0, sizeof P);
  kiln__lex_init(&P.lx, text ? text : "", text ? len : 0, filename, st);
  P.max_elements = opts && opts->max_elements > 0 ? opts->max_elements : KILN__DEFAULT_MAX_ELEMENTS;
  kiln_strmap_init(&P.names);
  kiln_strmap_init(&P.comps);
  int rc;
  P.m = kiln_module_create(NULL);
  if (P.m == NULL) {
    rc = kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
    goto out;
  }
  rc = parse_module(&P, opts);
  if (rc == 0 && st->code) rc = st->code;
  if (rc) {
    if (st->code == 0) kiln_status_set(st, rc, NULL, "%s", kiln_strerror(rc));
    kiln_module_destroy(P.m);
  } else {
    *out = P.m;
  }
out:
  kiln_arena_destroy(P.tmp);
  kiln_strmap_free(&P.names);
  kiln_strmap_free(&P.comps);
  kiln_free(P.pend);
  kiln_free(P.calls);
  kiln_free(P.scratch.v);
  for (int r = 0; r < ROLE_COUNT; r++) kiln_free(P.roles[r].v);
  return rc;
}
