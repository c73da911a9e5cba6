/* The canonical HLO text printer.
 *
 * One module has exactly one text: print -> parse -> print is a fixed point,
 * and the text is XLA's dialect, so XLA's own parser reads it too. The form:
 *
 *   HloModule NAME, is_scheduled=true, entry_computation_layout={(f32[2]{0})->f32[2]{0}},
 *     input_output_alias={ {0}: (0, {}, must-alias) }, replica_count=2,
 *     num_partitions=1, <other header attributes verbatim, in stored order>
 *   (one line; each attribute only when present)
 *   <blank line>
 *   %add (x: f32[], y: f32[]) -> f32[] {
 *     %x = f32[] parameter(0)
 *     %y = f32[] parameter(1)
 *     ROOT %sum = f32[] add(%x, %y)
 *   }
 *   <blank line>
 *   ENTRY %main (...) -> ... {
 *   ...
 *
 * - Computations in module order, entry marked "ENTRY"; each with its
 *   signature: the parameters in parameter-number order, named after their
 *   parameter instructions, and the root's shape. A computation whose
 *   signature has a shape not yet known (parsed without inference) prints
 *   without a signature ("%c {").
 * - Instructions in computation order, two-space indent, "ROOT " on the root
 *   (the last instruction when none is set); operands by name, untyped; the
 *   shape omitted only when it is not known. Names always carry '%'.
 * - Attributes: the structural ones in attrs.def order, then the called
 *   computations with their role spellings (while condition=/body=;
 *   conditional true_computation=/false_computation= when the selector is
 *   pred and there are two branches, else branch_computations={...};
 *   select-and-scatter select=/scatter=; fusion and async calls=;
 *   custom-call called_computations={...}; all others to_apply=, or
 *   called_computations={...} when the count is not the one the role
 *   takes), then control-predecessors={...}, then the annotations
 *   (sharding ... origin) in table order, then unknown attributes in their
 *   stored order. Async ops with a wrapped op print as "negate-start".
 * - Value forms follow XLA's printer: lists without spaces ("{1,2}"),
 *   slices without strides when all are 1, padding without interiors when
 *   all are 0 (and no padding attribute at all for a scalar, which has no
 *   text), windows with only their non-default fields, strings
 *   C-escaped (\" \\ \n \t \r, other control bytes as 3-digit octal).
 *   Values kept verbatim (opaque and unknown attributes, header extras,
 *   sharding extras) print as stored, except that outside quoted strings
 *   comments are dropped and whitespace runs become one space, so every
 *   instruction is one line. Literals: see text_print_literal.c.
 * - A name outside [A-Za-z0-9_.-] (only the builder makes those) prints
 *   with each bad byte as '_' and ".ID" appended, so that it stays one
 *   token and, very likely, unique; an empty name prints as "_.ID".
 *   Signature parameter names are bare as in XLA, with '%' only when the
 *   name starts with a digit, '.' or '-'; a module name starting so gets
 *   a '_' in front.
 *
 * Printing is linear in the output: every piece is appended to one
 * kiln_sbuf, operands are found by id, never by name.
 */
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/text.h"

/* ---- names ----------------------------------------------------------- */

static bool name_char(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '-';
}

/* `tag` distinguishes the uniquifying suffix of computations ('c') from
 * instructions (0); id is the object's index. */
static void put_name(kiln_sbuf *b, const char *name, char tag, uint32_t id) {
  if (name == NULL) name = "";
  size_t n = 0;
  bool clean = true;
  for (; name[n]; n++)
    if (!name_char((unsigned char)name[n])) clean = false;
  if (clean && n) {
    kiln_sbuf_putn(b, name, n);
    return;
  }
  if (n == 0) kiln_sbuf_putc(b, '_');
  for (size_t i = 0; i < n; i++)
    kiln_sbuf_putc(b, name_char((unsigned char)name[i]) ? name[i] : '_');
  if (tag)
    kiln_sbuf_printf(b, ".%c%u", tag, (unsigned)id);
  else
    kiln_sbuf_printf(b, ".%u", (unsigned)id);
}

static void put_instr_ref(kiln_sbuf *b, const kiln_module *m, kiln_id id) {
  kiln_sbuf_putc(b, '%');
  if (id >= m->ninstrs || m->instrs[id] == NULL) {
    kiln_sbuf_printf(b, "_invalid_id.%u", (unsigned)id);
    return;
  }
  put_name(b, m->instrs[id]->name, 0, id);
}

static void put_comp_ref(kiln_sbuf *b, const kiln_module *m, uint32_t id) {
  kiln_sbuf_putc(b, '%');
  if (id >= m->ncomps || m->comps[id] == NULL) {
    kiln_sbuf_printf(b, "_invalid_computation.c%u", (unsigned)id);
    return;
  }
  put_name(b, m->comps[id]->name, 'c', id);
}

/* ---- value forms ------------------------------------------------------ */

static void put_i64(kiln_sbuf *b, int64_t v) { kiln_sbuf_printf(b, "%lld", (long long)v); }

/* "1,2,3" with `sep` between. */
static void put_list(kiln_sbuf *b, const int64_t *v, uint32_t n, const char *sep) {
  for (uint32_t i = 0; i < n; i++) {
    if (i) kiln_sbuf_puts(b, sep);
    put_i64(b, v[i]);
  }
}

static void put_braced(kiln_sbuf *b, const kiln_i64s *s) {
  kiln_sbuf_putc(b, '{');
  put_list(b, s->v, s->n, ",");
  kiln_sbuf_putc(b, '}');
}

static void put_string(kiln_sbuf *b, const char *s) {
  kiln_sbuf_putc(b, '"');
  if (s) {
    const char *run = s;
    for (; *s; s++) {
      unsigned char c = (unsigned char)*s;
      const char *esc = NULL;
      char oct[8];
      switch (c) {
      case '"': esc = "\\\""; break;
      case '\\': esc = "\\\\"; break;
      case '\n': esc = "\\n"; break;
      case '\t': esc = "\\t"; break;
      case '\r': esc = "\\r"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          oct[0] = '\\';
          oct[1] = (char)('0' + ((c >> 6) & 7));
          oct[2] = (char)('0' + ((c >> 3) & 7));
          oct[3] = (char)('0' + (c & 7));
          oct[4] = '\0';
          esc = oct;
        }
      }
      if (esc) {
        kiln_sbuf_putn(b, run, (size_t)(s - run));
        kiln_sbuf_puts(b, esc);
        run = s + 1;
      }
    }
    kiln_sbuf_putn(b, run, (size_t)(s - run));
  }
  kiln_sbuf_putc(b, '"');
}

/* A value kept verbatim (opaque attributes, unknown ones, header extras,
 * sharding extras) prints on one line: outside "strings" each comment
 * becomes whitespace and each run of whitespace one space, so a value
 * written over several lines (a JSON backend_config) keeps the one
 * instruction per line rule, and formatting does not change the text. */
static void put_verbatim(kiln_sbuf *b, const char *s) {
  if (s == NULL) return;
  bool space = false, any = false; /* whitespace pending; anything written */
  while (*s) {
    const char *q = s; /* end of the piece at s */
    bool blank = true;
    if (*s == '"') {
      q = s + 1;
      while (*q && *q != '"') q += (q[0] == '\\' && q[1]) ? 2 : 1;
      if (*q) q++;
      blank = false;
    } else if (s[0] == '/' && s[1] == '*') {
      const char *e = strstr(s + 2, "*/");
      q = e ? e + 2 : s + strlen(s);
    } else if (s[0] == '/' && s[1] == '/') {
      q = s + 2 + strcspn(s + 2, "\n");
    } else if (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r') {
      q = s + 1;
    } else {
      q = s + 1 + strcspn(s + 1, "\" /\t\n\r");
      blank = false;
    }
    if (blank) {
      space = true;
    } else {
      if (space && any) kiln_sbuf_putc(b, ' ');
      kiln_sbuf_putn(b, s, (size_t)(q - s));
      space = false;
      any = true;
    }
    s = q;
  }
}

static void put_slice(kiln_sbuf *b, const kiln_i64s *s) {
  uint32_t n = s->n / 3;
  bool strides = false;
  for (uint32_t i = 0; i < n; i++)
    if (s->v[3 * i + 2] != 1) strides = true;
  kiln_sbuf_putc(b, '{');
  for (uint32_t i = 0; i < n; i++) {
    if (i) kiln_sbuf_puts(b, ", ");
    kiln_sbuf_printf(b, "[%lld:%lld", (long long)s->v[3 * i], (long long)s->v[3 * i + 1]);
    if (strides) kiln_sbuf_printf(b, ":%lld", (long long)s->v[3 * i + 2]);
    kiln_sbuf_putc(b, ']');
  }
  kiln_sbuf_putc(b, '}');
}

static void put_padding(kiln_sbuf *b, const kiln_i64s *s) {
  uint32_t n = s->n / 3;
  bool interior = false;
  for (uint32_t i = 0; i < n; i++)
    if (s->v[3 * i + 2] != 0) interior = true;
  for (uint32_t i = 0; i < n; i++) {
    if (i) kiln_sbuf_putc(b, 'x');
    kiln_sbuf_printf(b, "%lld_%lld", (long long)s->v[3 * i], (long long)s->v[3 * i + 1]);
    if (interior) kiln_sbuf_printf(b, "_%lld", (long long)s->v[3 * i + 2]);
  }
}

static void put_pairs(kiln_sbuf *b, const kiln_i64s *s) {
  kiln_sbuf_putc(b, '{');
  for (uint32_t i = 0; i + 1 < s->n; i += 2) {
    if (i) kiln_sbuf_putc(b, ',');
    kiln_sbuf_printf(b, "{%lld,%lld}", (long long)s->v[i], (long long)s->v[i + 1]);
  }
  kiln_sbuf_putc(b, '}');
}

/* One window field over all dims, 'x'-separated; which field by `f`. */
enum { W_SIZE, W_STRIDE, W_PAD, W_LHS, W_RHS, W_REV };

static int64_t window_field(const kiln_window_dim *d, int f) {
  switch (f) {
  case W_SIZE: return d->size;
  case W_STRIDE: return d->stride;
  case W_LHS: return d->lhs_dilate;
  case W_RHS: return d->rhs_dilate;
  default: return d->reversal ? 1 : 0;
  }
}

static void put_window(kiln_sbuf *b, const kiln_window *w) {
  static const char *const names[] = {"size",       "stride",     "pad",
                                      "lhs_dilate", "rhs_dilate", "rhs_reversal"};
  kiln_sbuf_putc(b, '{');
  bool first = true;
  for (int f = W_SIZE; w && f <= W_REV; f++) {
    bool show = f == W_SIZE;
    for (uint32_t i = 0; i < w->rank && !show; i++) {
      const kiln_window_dim *d = &w->dims[i];
      if (f == W_PAD)
        show = d->pad_lo != 0 || d->pad_hi != 0;
      else
        show = window_field(d, f) != (f == W_REV ? 0 : 1);
    }
    if (!show || w->rank == 0) continue;
    if (!first) kiln_sbuf_putc(b, ' ');
    first = false;
    kiln_sbuf_printf(b, "%s=", names[f]);
    for (uint32_t i = 0; i < w->rank; i++) {
      if (i) kiln_sbuf_putc(b, 'x');
      const kiln_window_dim *d = &w->dims[i];
      if (f == W_PAD)
        kiln_sbuf_printf(b, "%lld_%lld", (long long)d->pad_lo, (long long)d->pad_hi);
      else
        put_i64(b, window_field(d, f));
    }
  }
  kiln_sbuf_putc(b, '}');
}

/* One side of dim_labels: `rank` letters, `a` and `z` at their dims, the
 * spatial dims numbered. A label outside the rank is dropped, a position
 * nobody claims shows '?', so that a broken attribute still prints. */
static void put_labels(kiln_sbuf *b, uint32_t rank, int64_t a, char ca, int64_t z, char cz,
                       const int64_t *spatial, uint32_t nspatial) {
  char small[32];
  char *buf = rank <= sizeof small ? small : kiln_malloc(rank);
  if (buf == NULL) {
    b->failed = true;
    return;
  }
  memset(buf, '?', rank);
  if (a >= 0 && a < rank) buf[a] = ca;
  if (z >= 0 && z < rank) buf[z] = cz;
  for (uint32_t i = 0; i < nspatial; i++)
    if (spatial && spatial[i] >= 0 && spatial[i] < rank)
      buf[spatial[i]] = i < 10 ? (char)('0' + i) : '?';
  kiln_sbuf_putn(b, buf, rank);
  if (buf != small) kiln_free(buf);
}

static void put_dim_labels(kiln_sbuf *b, const kiln_conv_dims *c) {
  if (c == NULL) return;
  uint32_t rank = c->nspatial + 2;
  put_labels(b, rank, c->in_batch, 'b', c->in_feature, 'f', c->in_spatial, c->nspatial);
  kiln_sbuf_putc(b, '_');
  put_labels(b, rank, c->kernel_in, 'i', c->kernel_out, 'o', c->kernel_spatial, c->nspatial);
  kiln_sbuf_puts(b, "->");
  put_labels(b, rank, c->out_batch, 'b', c->out_feature, 'f', c->out_spatial, c->nspatial);
}

/* "[2,2]<=[4]" / "[2,2]<=[2,2]T(1,0)": shared by replica groups and shardings. */
static void put_iota(kiln_sbuf *b, const kiln_i64s *reshape, const kiln_i64s *perm) {
  kiln_sbuf_puts(b, "<=[");
  put_list(b, reshape->v, reshape->n, ",");
  kiln_sbuf_putc(b, ']');
  if (perm->n) {
    kiln_sbuf_puts(b, "T(");
    put_list(b, perm->v, perm->n, ",");
    kiln_sbuf_putc(b, ')');
  }
}

static void put_replica_groups(kiln_sbuf *b, const kiln_replica_groups *g) {
  if (g == NULL) {
    kiln_sbuf_puts(b, "{}");
    return;
  }
  if (g->iota) {
    kiln_sbuf_putc(b, '[');
    put_list(b, g->iota_shape.v, g->iota_shape.n, ",");
    kiln_sbuf_putc(b, ']');
    put_iota(b, &g->iota_reshape, &g->iota_perm);
    return;
  }
  kiln_sbuf_putc(b, '{');
  for (uint32_t i = 0; i < g->ngroups; i++) {
    if (i) kiln_sbuf_putc(b, ',');
    put_braced(b, &g->groups[i]);
  }
  kiln_sbuf_putc(b, '}');
}

static const char *shard_kind_name(int64_t k) {
  switch (k) {
  case KILN_SHARD_REPLICATED: return "replicated";
  case KILN_SHARD_MAXIMAL: return "maximal";
  case KILN_SHARD_TILED: return "other";
  case KILN_SHARD_MANUAL: return "manual";
  case KILN_SHARD_UNKNOWN: return "unknown";
  case KILN_SHARD_TUPLE: return "tuple";
  default: return NULL;
  }
}

static void put_sharding(kiln_sbuf *b, const kiln_sharding *s) {
  kiln_sbuf_putc(b, '{');
  if (s == NULL) {
    kiln_sbuf_putc(b, '}');
    return;
  }
  bool body = true; /* something written before the extras */
  switch (s->kind) {
  case KILN_SHARD_REPLICATED: kiln_sbuf_puts(b, "replicated"); break;
  case KILN_SHARD_MANUAL: kiln_sbuf_puts(b, "manual"); break;
  case KILN_SHARD_UNKNOWN: kiln_sbuf_puts(b, "unknown"); break;
  case KILN_SHARD_MAXIMAL: kiln_sbuf_printf(b, "maximal device=%lld", (long long)s->device); break;
  case KILN_SHARD_TILED:
    kiln_sbuf_puts(b, "devices=[");
    put_list(b, s->tile_dims.v, s->tile_dims.n, ",");
    kiln_sbuf_putc(b, ']');
    if (s->devices.n)
      put_list(b, s->devices.v, s->devices.n, ",");
    else
      put_iota(b, &s->iota_reshape, &s->iota_perm);
    if (s->last_tile_dim_replicate) kiln_sbuf_puts(b, " last_tile_dim_replicate");
    if (s->last_tile_dims.n) {
      kiln_sbuf_puts(b, " last_tile_dims={");
      for (uint32_t i = 0; i < s->last_tile_dims.n; i++) {
        if (i) kiln_sbuf_puts(b, ", ");
        const char *k = shard_kind_name(s->last_tile_dims.v[i]);
        if (k)
          kiln_sbuf_puts(b, k);
        else
          put_i64(b, s->last_tile_dims.v[i]);
      }
      kiln_sbuf_putc(b, '}');
    }
    break;
  case KILN_SHARD_TUPLE:
    for (uint32_t i = 0; i < s->nelems; i++) {
      if (i) kiln_sbuf_puts(b, ", ");
      put_sharding(b, &s->elems[i]);
    }
    body = s->nelems > 0;
    break;
  default: body = false; break;
  }
  if (s->extra && s->extra[0]) {
    if (body) kiln_sbuf_putc(b, ' ');
    put_verbatim(b, s->extra);
  }
  kiln_sbuf_putc(b, '}');
}

static void put_float_value(kiln_sbuf *b, double v) {
  /* A scalar f64 literal over the value: the literal printer owns the
   * shortest round-trip float form. */
  kiln_literal lit;
  memset(&lit, 0, sizeof lit);
  lit.shape.dtype = KILN_F64;
  lit.data = &v;
  lit.nbytes = sizeof v;
  kiln_literal_print(b, &lit, false);
}

static void put_attr_value(kiln_sbuf *b, const kiln_attr *a) {
  switch (kiln_attr_key_kind(a->key)) {
  case KILN_AK_INT: put_i64(b, a->v.i); break;
  case KILN_AK_BOOL: kiln_sbuf_puts(b, a->v.i ? "true" : "false"); break;
  case KILN_AK_FLOAT: put_float_value(b, a->v.f); break;
  case KILN_AK_INTS: put_braced(b, &a->v.ints); break;
  case KILN_AK_SLICE: put_slice(b, &a->v.ints); break;
  case KILN_AK_PADDING: put_padding(b, &a->v.ints); break;
  case KILN_AK_PAIRS: put_pairs(b, &a->v.ints); break;
  case KILN_AK_WINDOW: put_window(b, a->v.window); break;
  case KILN_AK_DIM_LABELS: put_dim_labels(b, a->v.conv); break;
  case KILN_AK_CMP_DIR:
    if (a->v.i >= KILN_CMP_EQ && a->v.i <= KILN_CMP_LT)
      kiln_sbuf_puts(b, kiln_cmp_dir_name((kiln_cmp_dir)a->v.i));
    else
      put_i64(b, a->v.i);
    break;
  case KILN_AK_REPLICA_GROUPS: put_replica_groups(b, a->v.groups); break;
  case KILN_AK_SHARDING: put_sharding(b, a->v.sharding); break;
  case KILN_AK_STRING: put_string(b, a->v.s); break;
  case KILN_AK_IDENT:
    if (a->v.s) kiln_sbuf_puts(b, a->v.s);
    break;
  case KILN_AK_OPAQUE: put_verbatim(b, a->v.s); break;
  }
}

static void put_attr(kiln_sbuf *b, const kiln_attr *a) {
  /* The padding of a scalar has no dims and so no text ("padding=" would
   * not parse): it is left out, which reads back as the same (no) padding. */
  if (a->key == KILN_ATTR_PADDING && a->v.ints.n < 3) return;
  kiln_sbuf_puts(b, ", ");
  if (a->key == KILN_ATTR_UNKNOWN) {
    put_name(b, a->name, 0, 0);
    kiln_sbuf_putc(b, '=');
    put_verbatim(b, a->v.s);
    return;
  }
  kiln_sbuf_puts(b, kiln_attr_key_name(a->key));
  kiln_sbuf_putc(b, '=');
  put_attr_value(b, a);
}

/* ---- called computations --------------------------------------------- */

static void put_comp_list(kiln_sbuf *b, const kiln_module *m, const char *key, const uint32_t *ids,
                          uint32_t n) {
  kiln_sbuf_printf(b, ", %s={", key);
  for (uint32_t i = 0; i < n; i++) {
    if (i) kiln_sbuf_puts(b, ", ");
    put_comp_ref(b, m, ids[i]);
  }
  kiln_sbuf_putc(b, '}');
}

static void put_comp_attr(kiln_sbuf *b, const kiln_module *m, const char *key, uint32_t id) {
  kiln_sbuf_printf(b, ", %s=", key);
  put_comp_ref(b, m, id);
}

static bool selector_is_pred(const kiln_module *m, const kiln_instr *ins) {
  if (ins->noperands == 0 || ins->operands[0] >= m->ninstrs) return false;
  const kiln_instr *sel = m->instrs[ins->operands[0]];
  return sel && sel->shape.dtype == KILN_PRED && sel->shape.rank == 0;
}

static void put_called(kiln_sbuf *b, const kiln_module *m, const kiln_instr *ins) {
  uint32_t n = ins->ncalled;
  const uint32_t *c = ins->called;
  if (n == 0) return;
  switch (ins->op) {
  case KILN_OP_WHILE:
    if (n != 2) break;
    put_comp_attr(b, m, "condition", c[0]);
    put_comp_attr(b, m, "body", c[1]);
    return;
  case KILN_OP_CONDITIONAL:
    if (n == 2 && selector_is_pred(m, ins)) {
      put_comp_attr(b, m, "true_computation", c[0]);
      put_comp_attr(b, m, "false_computation", c[1]);
    } else {
      put_comp_list(b, m, "branch_computations", c, n);
    }
    return;
  case KILN_OP_SELECT_AND_SCATTER:
    if (n != 2) break;
    put_comp_attr(b, m, "select", c[0]);
    put_comp_attr(b, m, "scatter", c[1]);
    return;
  case KILN_OP_FUSION:
  case KILN_OP_ASYNC_START:
  case KILN_OP_ASYNC_UPDATE:
  case KILN_OP_ASYNC_DONE:
    if (n != 1) break;
    put_comp_attr(b, m, "calls", c[0]);
    return;
  case KILN_OP_CUSTOM_CALL: break;
  default:
    if (n != 1) break;
    put_comp_attr(b, m, "to_apply", c[0]);
    return;
  }
  put_comp_list(b, m, "called_computations", c, n);
}

/* ---- instructions ------------------------------------------------------ */

static bool shape_known(const kiln_shape *s) {
  if (s->dtype == KILN_INVALID) return false;
  if (s->dtype == KILN_TUPLE)
    for (uint32_t i = 0; i < s->rank; i++)
      if (!shape_known(&s->tuple[i])) return false;
  return true;
}

static void put_opcode(kiln_sbuf *b, const kiln_instr *ins) {
  static const char *const suffix[] = {"-start", "-update", "-done"};
  bool async = ins->op == KILN_OP_ASYNC_START || ins->op == KILN_OP_ASYNC_UPDATE ||
               ins->op == KILN_OP_ASYNC_DONE;
  if (async && ins->async_op != KILN_OP_INVALID && ins->async_op < KILN_OP_COUNT) {
    kiln_sbuf_puts(b, kiln_opcode_name(ins->async_op));
    kiln_sbuf_puts(b, suffix[ins->op - KILN_OP_ASYNC_START]);
    return;
  }
  kiln_sbuf_puts(b, ins->op < KILN_OP_COUNT ? kiln_opcode_name(ins->op) : "invalid");
}

/* Sorts attribute indices by key, stably: unknown attributes (the last key)
 * keep their stored order. Each key but UNKNOWN occurs at most once, so the
 * insertion sort moves each element past at most KILN_ATTR_COUNT others. */
static void sort_attrs(const kiln_instr *ins, uint32_t *idx) {
  for (uint32_t i = 0; i < ins->nattrs; i++) {
    uint32_t j = i;
    while (j > 0 && ins->attrs[idx[j - 1]].key > ins->attrs[i].key) {
      idx[j] = idx[j - 1];
      j--;
    }
    idx[j] = i;
  }
}

static void put_attrs(kiln_sbuf *b, const kiln_module *m, const kiln_instr *ins) {
  uint32_t small[16];
  uint32_t *idx = small;
  if (ins->nattrs > 16) {
    idx = kiln_malloc((size_t)ins->nattrs * sizeof *idx);
    if (idx == NULL) {
      b->failed = true;
      return;
    }
  }
  sort_attrs(ins, idx);
  uint32_t i = 0, n = ins->nattrs;
  for (; i < n && ins->attrs[idx[i]].key < KILN_ATTR_SHARDING; i++)
    if (ins->attrs[idx[i]].key != KILN_ATTR_INVALID) put_attr(b, &ins->attrs[idx[i]]);
  put_called(b, m, ins);
  if (ins->ncontrol) {
    kiln_sbuf_puts(b, ", control-predecessors={");
    for (uint32_t k = 0; k < ins->ncontrol; k++) {
      if (k) kiln_sbuf_puts(b, ", ");
      put_instr_ref(b, m, ins->control_preds[k]);
    }
    kiln_sbuf_putc(b, '}');
  }
  for (; i < n; i++)
    if (ins->attrs[idx[i]].key < KILN_ATTR_COUNT) put_attr(b, &ins->attrs[idx[i]]);
  if (idx != small) kiln_free(idx);
}

static void put_instr(kiln_sbuf *b, const kiln_module *m, const kiln_instr *ins, bool root) {
  kiln_sbuf_puts(b, root ? "  ROOT %" : "  %");
  put_name(b, ins->name, 0, ins->id);
  kiln_sbuf_puts(b, " = ");
  if (shape_known(&ins->shape)) {
    kiln_shape_print(b, &ins->shape);
    kiln_sbuf_putc(b, ' ');
  }
  put_opcode(b, ins);
  kiln_sbuf_putc(b, '(');
  if (ins->op == KILN_OP_PARAMETER) {
    put_i64(b, ins->param_number);
  } else if (ins->op == KILN_OP_CONSTANT) {
    if (ins->literal) kiln_literal_print(b, ins->literal, false);
  } else {
    for (uint32_t i = 0; i < ins->noperands; i++) {
      if (i) kiln_sbuf_puts(b, ", ");
      put_instr_ref(b, m, ins->operands[i]);
    }
  }
  kiln_sbuf_putc(b, ')');
  put_attrs(b, m, ins);
  kiln_sbuf_putc(b, '\n');
}

/* ---- computations ------------------------------------------------------ */

static int by_param_number(const void *pa, const void *pb) {
  const kiln_instr *a = *(const kiln_instr *const *)pa, *b = *(const kiln_instr *const *)pb;
  if (a->param_number != b->param_number) return a->param_number < b->param_number ? -1 : 1;
  return a->id < b->id ? -1 : a->id > b->id;
}

/* "(x: f32[], y: f32[]) -> f32[] " or nothing when a shape is unknown. */
static void put_signature(kiln_sbuf *b, const kiln_module *m, const kiln_computation *c,
                          const kiln_instr *root) {
  if (root == NULL || !shape_known(&root->shape)) return;
  uint32_t np = 0;
  for (uint32_t i = 0; i < c->ninstrs; i++)
    if (c->instrs[i] < m->ninstrs && m->instrs[c->instrs[i]]->op == KILN_OP_PARAMETER) np++;
  const kiln_instr **params = NULL;
  if (np) {
    params = kiln_malloc((size_t)np * sizeof *params);
    if (params == NULL) {
      b->failed = true;
      return;
    }
    uint32_t k = 0;
    for (uint32_t i = 0; i < c->ninstrs; i++) {
      if (c->instrs[i] >= m->ninstrs) continue;
      const kiln_instr *ins = m->instrs[c->instrs[i]];
      if (ins->op == KILN_OP_PARAMETER) params[k++] = ins;
    }
    for (uint32_t i = 0; i < np; i++) {
      if (!shape_known(&params[i]->shape)) goto out;
    }
    qsort(params, np, sizeof *params, by_param_number);
  }
  kiln_sbuf_putc(b, '(');
  for (uint32_t i = 0; i < np; i++) {
    if (i) kiln_sbuf_puts(b, ", ");
    /* Bare, as XLA writes it, unless the name cannot start a bare word. */
    const char *pn = params[i]->name;
    if (pn == NULL || !((*pn >= 'a' && *pn <= 'z') || (*pn >= 'A' && *pn <= 'Z') || *pn == '_'))
      kiln_sbuf_putc(b, '%');
    put_name(b, pn, 0, params[i]->id);
    kiln_sbuf_puts(b, ": ");
    kiln_shape_print(b, &params[i]->shape);
  }
  kiln_sbuf_puts(b, ") -> ");
  kiln_shape_print(b, &root->shape);
  kiln_sbuf_putc(b, ' ');
out:
  kiln_free(params);
}

/* The root as the printer sees it: the computation's root when it is one of
 * its instructions' ids, else the last instruction. Builder mistakes (ids out
 * of range) print as something, never crash. */
static const kiln_instr *comp_root(const kiln_module *m, const kiln_computation *c) {
  if (c->root != KILN_NO_ID && c->root < m->ninstrs) return m->instrs[c->root];
  if (c->ninstrs && c->instrs[c->ninstrs - 1] < m->ninstrs)
    return m->instrs[c->instrs[c->ninstrs - 1]];
  return NULL;
}

static void put_computation(kiln_sbuf *b, const kiln_module *m, const kiln_computation *c) {
  const kiln_instr *root = comp_root(m, c);
  bool entry = m->entry != KILN_NO_ID ? c->id == m->entry : c->is_entry;
  if (entry) kiln_sbuf_puts(b, "ENTRY ");
  kiln_sbuf_putc(b, '%');
  put_name(b, c->name, 'c', c->id);
  kiln_sbuf_putc(b, ' ');
  put_signature(b, m, c, root);
  kiln_sbuf_puts(b, "{\n");
  for (uint32_t i = 0; i < c->ninstrs && !b->failed; i++) {
    if (c->instrs[i] >= m->ninstrs) continue;
    const kiln_instr *ins = m->instrs[c->instrs[i]];
    put_instr(b, m, ins, ins == root);
  }
  kiln_sbuf_puts(b, "}\n");
}

/* ---- the header -------------------------------------------------------- */

static void put_shape_index(kiln_sbuf *b, const kiln_i64s *s) { put_braced(b, s); }

static void put_header(kiln_sbuf *b, const kiln_module *m) {
  kiln_sbuf_puts(b, "HloModule ");
  const char *mn = m->name;
  if (mn && ((*mn >= '0' && *mn <= '9') || *mn == '.' || *mn == '-')) kiln_sbuf_putc(b, '_');
  put_name(b, mn, 'm', 0);
  if (m->is_scheduled >= 0)
    kiln_sbuf_puts(b, m->is_scheduled ? ", is_scheduled=true" : ", is_scheduled=false");
  if (m->entry_layout) {
    const kiln_program_shape *ps = m->entry_layout;
    kiln_sbuf_puts(b, ", entry_computation_layout={(");
    for (uint32_t i = 0; i < ps->nparams; i++) {
      if (i) kiln_sbuf_puts(b, ", ");
      kiln_shape_print(b, &ps->params[i]);
    }
    kiln_sbuf_puts(b, ")->");
    kiln_shape_print(b, &ps->result);
    kiln_sbuf_putc(b, '}');
  }
  if (m->has_aliases || m->naliases) {
    kiln_sbuf_puts(b, ", input_output_alias={");
    for (uint32_t i = 0; i < m->naliases; i++) {
      const kiln_alias *a = &m->aliases[i];
      kiln_sbuf_puts(b, i ? ", " : " ");
      put_shape_index(b, &a->output_index);
      kiln_sbuf_printf(b, ": (%lld, ", (long long)a->param_number);
      put_shape_index(b, &a->param_index);
      kiln_sbuf_puts(b, a->kind == KILN_ALIAS_MUST ? ", must-alias)" : ")");
    }
    kiln_sbuf_puts(b, m->naliases ? " }" : "}");
  }
  if (m->replica_count) kiln_sbuf_printf(b, ", replica_count=%lld", (long long)m->replica_count);
  if (m->num_partitions) kiln_sbuf_printf(b, ", num_partitions=%lld", (long long)m->num_partitions);
  for (uint32_t i = 0; i < m->nheader_extra; i++) {
    kiln_sbuf_puts(b, ", ");
    put_name(b, m->header_extra[i].name, 0, i);
    kiln_sbuf_putc(b, '=');
    put_verbatim(b, m->header_extra[i].text);
  }
  kiln_sbuf_putc(b, '\n');
}

void kiln_module_print_to(kiln_sbuf *b, const kiln_module *m) {
  put_header(b, m);
  for (uint32_t i = 0; i < m->nsections; i++) {
    const char *t = m->sections[i].text;
    kiln_sbuf_printf(b, "\n%s\n", m->sections[i].name);
    if (t && *t) {
      kiln_sbuf_puts(b, t);
      kiln_sbuf_putc(b, '\n');
    }
  }
  for (uint32_t i = 0; i < m->ncomps && !b->failed; i++) {
    kiln_sbuf_putc(b, '\n');
    put_computation(b, m, m->comps[i]);
  }
}

char *kiln_module_print(const kiln_module *m, size_t *len) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_module_print_to(&b, m);
  if (kiln_sbuf_failed(&b)) {
    kiln_sbuf_free(&b);
    if (len) *len = 0;
    return NULL;
  }
  if (b.data == NULL) kiln_sbuf_putn(&b, "", 0);
  return kiln_sbuf_detach(&b, len);
}
