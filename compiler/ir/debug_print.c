/* kiln.debug_print: the checks of its format and the one renderer every
 * backend uses (see debug_print.h). Rendering reads only data: the format
 * bytes and the value's literal. */
#include "compiler/ir/debug_print.h"

#include <stdio.h>
#include <string.h>

#include "compiler/ir/text.h"

bool kiln_debug_print_is(const kiln_instr *ins) {
  if (ins == NULL || ins->op != KILN_OP_CUSTOM_CALL) return false;
  const char *t = kiln_instr_attr_str(ins, KILN_ATTR_CUSTOM_CALL_TARGET);
  return t != NULL && strcmp(t, KILN_DEBUG_PRINT_TARGET) == 0;
}

const char *kiln_debug_print_format(const kiln_instr *ins, size_t *n) {
  const char *f = kiln_instr_attr_str(ins, KILN_ATTR_BACKEND_CONFIG);
  if (f == NULL) f = "";
  size_t len = strlen(f);
  /* the attribute keeps its HLO spelling: a quoted string */
  if (len >= 2 && f[0] == '"' && f[len - 1] == '"') {
    f++;
    len -= 2;
  }
  *n = len;
  return f;
}

bool kiln_debug_format_ok(const char *fmt, size_t n, char *why, size_t nwhy) {
  if (n > KILN_DEBUG_FORMAT_MAX) {
    snprintf(why, nwhy, "the format has %zu bytes (at most %d)", n, KILN_DEBUG_FORMAT_MAX);
    return false;
  }
  int holes = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)fmt[i];
    if (ch < 0x20 || ch > 0x7e || ch == '"' || ch == '\\') {
      snprintf(why, nwhy,
               "byte %zu of the format is 0x%02x (printable ASCII only, without quotes or "
               "backslashes)",
               i, ch);
      return false;
    }
    if (ch == '{' && i + 1 < n && (fmt[i + 1] == '{' || fmt[i + 1] == '}')) {
      holes += fmt[i + 1] == '}';
      i++;
    } else if (ch == '}' && i + 1 < n && fmt[i + 1] == '}') {
      i++;
    } else if (ch == '{' || ch == '}') {
      snprintf(why, nwhy,
               "byte %zu of the format is a lone '%c' (write {} for the value, {{ or }})", i, ch);
      return false;
    }
  }
  if (holes > 1) {
    snprintf(why, nwhy, "the format has %d {} (at most one: the operand)", holes);
    return false;
  }
  return true;
}

int kiln_debug_print_check(const kiln_module *m, const kiln_instr *ins, kiln_status *st) {
  char where[KILN_STATUS_WHERE_MAX], why[160];
  kiln_instr_where(m, ins, where, sizeof where);
  if (ins->noperands != 1)
    return kiln_status_set(st, KILN_EINVAL, where, "%s takes one operand, %u given",
                           KILN_DEBUG_PRINT_TARGET, ins->noperands);
  const kiln_shape *os = &kiln_module_instr(m, ins->operands[0])->shape;
  if (!kiln_shape_is_array(os) || !kiln_shape_is_array(&ins->shape) ||
      os->dtype != ins->shape.dtype || !kiln_shape_same_dims(os, &ins->shape))
    return kiln_status_set(st, KILN_EINVAL, where,
                           "%s passes its operand on: one array operand, a result of its shape",
                           KILN_DEBUG_PRINT_TARGET);
  size_t nf;
  const char *f = kiln_debug_print_format(ins, &nf);
  if (!kiln_debug_format_ok(f, nf, why, sizeof why))
    return kiln_status_set(st, KILN_EINVAL, where, "%s: %s", KILN_DEBUG_PRINT_TARGET, why);
  return 0;
}

/* Small values in full, as HLO literals; large ones by their first values.
 * Small counts the arrays the text writes too: f32[2^20,2^20,0] has no
 * element but would print 2^40 "{}". */
static void put_value(kiln_sbuf *out, const kiln_literal *v) {
  int64_t n = kiln_literal_elements(v), arrays = kiln_shape_literal_arrays(&v->shape);
  if (n >= 0 && n <= 1024 && arrays >= 0 && arrays <= 1024) {
    kiln_literal_print(out, v, false);
    return;
  }
  kiln_shape_print_short(out, &v->shape);
  kiln_sbuf_puts(out, " {");
  int64_t k = n < 16 ? n : 16;
  for (int64_t i = 0; i < k; i++)
    kiln_sbuf_printf(out, "%s%.9g", i ? ", " : "", kiln_literal_get_f64(v, i));
  kiln_sbuf_printf(out, "%s... (%lld elements)}", k > 0 ? ", " : "", (long long)n);
}

void kiln_debug_print_render(kiln_sbuf *out, const char *fmt, size_t n, const kiln_literal *value) {
  size_t start = out->len;
  for (size_t i = 0; i < n; i++) {
    char ch = fmt[i];
    if (ch == '{' && i + 1 < n && fmt[i + 1] == '}') {
      put_value(out, value);
      i++;
    } else {
      if ((ch == '{' || ch == '}') && i + 1 < n && fmt[i + 1] == ch) i++;
      kiln_sbuf_putc(out, ch);
    }
    if (out->len - start > KILN_DEBUG_MESSAGE_MAX) break;
  }
  if (out->len - start > KILN_DEBUG_MESSAGE_MAX - 4) {
    out->len = start + KILN_DEBUG_MESSAGE_MAX - 4;
    kiln_sbuf_puts(out, "...");
  }
  kiln_sbuf_putc(out, '\n');
}

/* ---- the record of a compiled step ----------------------------------------- */

size_t kiln_debug_record_size(const kiln_shape *s, size_t nfmt) {
  if (!kiln_shape_is_array(s) || s->rank > KILN_DEBUG_MAX_RANK || nfmt > KILN_DEBUG_FORMAT_MAX)
    return 0;
  return 8 + 8 * (size_t)s->rank + 4 + nfmt;
}

void kiln_debug_record_write(uint8_t *buf, const kiln_shape *s, const char *fmt, size_t nfmt) {
  uint32_t v[2] = {(uint32_t)s->dtype, s->rank}, nf = (uint32_t)nfmt;
  memcpy(buf, v, 8);
  memcpy(buf + 8, s->dims, 8 * (size_t)s->rank);
  memcpy(buf + 8 + 8 * (size_t)s->rank, &nf, 4);
  memcpy(buf + 12 + 8 * (size_t)s->rank, fmt, nfmt);
}

bool kiln_debug_record_read(const uint8_t *buf, uint64_t n, uint64_t value_bytes,
                            kiln_debug_record *out, char *why, size_t nwhy) {
  uint32_t v[2], nf;
  if (n < 12) goto short_;
  memcpy(v, buf, 8);
  if (v[0] >= KILN_DTYPE_COUNT || v[0] == KILN_INVALID || v[0] == KILN_TUPLE ||
      v[0] == KILN_TOKEN || v[1] > KILN_DEBUG_MAX_RANK) {
    snprintf(why, nwhy, "debug record: bad element type %u or rank %u", v[0], v[1]);
    return false;
  }
  if (n < 12 + 8 * (uint64_t)v[1]) goto short_;
  out->dtype = (kiln_dtype)v[0];
  out->rank = v[1];
  memcpy(out->dims, buf + 8, 8 * (size_t)v[1]);
  memcpy(&nf, buf + 8 + 8 * (size_t)v[1], 4);
  if (n != 12 + 8 * (uint64_t)v[1] + nf) goto short_;
  out->fmt = (const char *)buf + 12 + 8 * (size_t)v[1];
  out->nfmt = nf;
  uint64_t elems = 1;
  for (uint32_t i = 0; i < out->rank; i++) {
    if (out->dims[i] < 0 || (out->dims[i] > 0 && elems > UINT64_MAX / (uint64_t)out->dims[i])) {
      snprintf(why, nwhy, "debug record: bad dimension %u", i);
      return false;
    }
    elems *= (uint64_t)out->dims[i];
  }
  size_t es = kiln_dtype_size(out->dtype);
  if (es == 0 || elems > UINT64_MAX / es || elems * es != value_bytes) {
    snprintf(why, nwhy, "debug record: the value does not fill its slot");
    return false;
  }
  char w[120];
  if (!kiln_debug_format_ok(out->fmt, nf, w, sizeof w)) {
    snprintf(why, nwhy, "debug record: %s", w);
    return false;
  }
  return true;
short_:
  snprintf(why, nwhy, "debug record: %llu bytes do not hold its fields", (unsigned long long)n);
  return false;
}

void kiln_debug_record_render(kiln_sbuf *out, const kiln_debug_record *r, const void *data) {
  int64_t dims[KILN_DEBUG_MAX_RANK];
  memcpy(dims, r->dims, sizeof dims);
  kiln_literal lit;
  memset(&lit, 0, sizeof lit);
  lit.shape.dtype = r->dtype;
  lit.shape.rank = r->rank;
  lit.shape.dims = dims;
  lit.data = (void *)data;
  int64_t n = 1;
  for (uint32_t i = 0; i < r->rank; i++) n *= dims[i];
  lit.nbytes = (size_t)n * kiln_dtype_size(r->dtype);
  kiln_debug_print_render(out, r->fmt, r->nfmt, &lit);
}
