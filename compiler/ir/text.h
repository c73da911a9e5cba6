/* HLO text: the parser and the canonical printer.
 *
 * The parser accepts what XLA's own dumps and tests contain (see
 * tests/unit/test_parse.c for the forms); the printer writes one canonical
 * form, so print -> parse -> print is a fixed point. Errors carry
 * "file:line:col" in kiln_status.where.
 */
#ifndef KILN_COMPILER_IR_TEXT_H
#define KILN_COMPILER_IR_TEXT_H

#include <stddef.h>

#include "compiler/ir/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_parse_options {
  /* Largest number of elements any one array shape may have (0: default,
   * 2^40). Bigger shapes are a parse error, not an allocation attempt. */
  int64_t max_elements;
  /* Parse only: skip inferring missing result shapes. */
  int no_infer;
} kiln_parse_options;

/* Parses a whole module. `filename` is used in error locations (may be
 * NULL: "<input>"). The text need not be NUL-terminated. On success *out is
 * a new module owned by the caller. Missing result shapes are inferred
 * (kiln_infer_shape) unless options say otherwise. `opts` may be NULL. */
int kiln_module_parse_text(const char *text, size_t len, const char *filename,
                           const kiln_parse_options *opts, kiln_module **out, kiln_status *st);

/* Parses a literal in HLO text form, with its shape: "f32[2] {1, 2}",
 * "(s32[], pred[]) (1, true)", "bf16[] 1.5". *out is heap-owned. */
int kiln_literal_parse_text(const char *text, size_t len, kiln_literal **out, kiln_status *st);

/* Canonical module text. Returns a kiln_malloc'd NUL-terminated string (free
 * with kiln_free) or NULL on out-of-memory; *len (may be NULL) its length. */
char *kiln_module_print(const kiln_module *m, size_t *len);
void kiln_module_print_to(kiln_sbuf *b, const kiln_module *m);

/* A literal as HLO text with its shape ("f32[2] {1, 2}"), or without it
 * ("{1, 2}") as inside constant(...). Floats use the fewest digits that read
 * back to the same value of their type. */
void kiln_literal_print(kiln_sbuf *b, const kiln_literal *lit, bool with_shape);
/* kiln_literal_print when the text stays within the bound decoding and
 * parsing put on it (64 arrays, "{...}", per element and 2^16 beyond),
 * else the shape and " {...}" and false: f32[2^30,0] holds nothing and
 * would print 2^30 "{}", which no reader takes back. Every array literal
 * that came in through a module or a request prints in full. */
bool kiln_literal_print_bounded(kiln_sbuf *b, const kiln_literal *lit, bool with_shape);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMPILER_IR_TEXT_H */
