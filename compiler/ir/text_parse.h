/* Internal interface between the HLO text parser's files: text_parse.c
 * (module, computations, instructions, shapes), text_parse_attrs.c
 * (attribute values) and text_literal.c (literals). Not a public header.
 */
#ifndef KILN_COMPILER_IR_TEXT_PARSE_H
#define KILN_COMPILER_IR_TEXT_PARSE_H

#include "compiler/ir/ir.h"
#include "compiler/ir/text_lex.h"

#define KILN__DEFAULT_MAX_ELEMENTS (INT64_C(1) << 40)

/* Layouts must follow ']' directly, as in a literal "f32[2] {1, 2}" whose
 * value would otherwise read as a layout. */
#define KILN__SHAPE_GLUED_LAYOUT 1u

/* A shape: "f32[2,<=3]{1,0:T(8)}", "(s32[], token[])", "()". Arrays are
 * checked against max_elements. Storage comes from arena a. `depth` is the
 * current tuple nesting (0 at the top); flags are KILN__SHAPE_*. */
int kiln__parse_shape(kiln__lex *lx, kiln_arena *a, int64_t max_elements, int depth, unsigned flags,
                      kiln_shape *out);
/* Whether a shape starts at the cursor: '(' or an element type name followed
 * by '['. */
bool kiln__at_shape(kiln__lex *lx);

/* Reads the value of a known attribute `key` of `ins` (the cursor is after
 * '=') and stores it. `at` is the attribute name's position. */
int kiln__parse_attr_value(kiln__lex *lx, kiln_module *m, kiln_instr *ins, kiln_attr_key key);
/* A list of integers in braces: "{}", "{1, 2}". Stored in arena a. */
int kiln__parse_int_list(kiln__lex *lx, kiln_arena *a, kiln_i64s *out, const char *what);
/* input_output_alias={ {0}: (0, {}, must-alias), ... } into m->aliases. */
int kiln__parse_aliases(kiln__lex *lx, kiln_module *m);

/* Fails unless a literal of `shape` fits in what is left of the text (every
 * element takes at least one character, every empty "{}" two) and has at
 * most max_leaves elements and empty arrays, so that a short text cannot
 * make the parser allocate a huge literal, nor the printer write one. The
 * message names constant `name` (NULL: none). */
int kiln__literal_check_size(kiln__lex *lx, const kiln_shape *shape, const char *at,
                             const char *name, int64_t max_leaves);
/* Reads a literal value (no shape prefix) into `lit`, created zero-filled
 * with its shape. Dynamic sizes, if any, are allocated in arena a. */
int kiln__parse_literal_value(kiln__lex *lx, kiln_arena *a, kiln_literal *lit, int depth);

#endif /* KILN_COMPILER_IR_TEXT_PARSE_H */
