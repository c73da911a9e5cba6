/* The HLO text scanner shared by the parser's files.
 *
 * HLO text is not regular enough for one token stream: a dim_labels value
 * ("b01f_01io->b01f"), a padding ("0_0x1_2_1") or an opaque backend_config
 * JSON blob each need their own rules. So the scanner is a cursor over the
 * text with small "read one X here" functions, and the parser, which knows
 * what it expects, picks the function. Every reader first skips whitespace
 * and comments. The text need not be NUL-terminated: nothing reads past
 * `end`.
 *
 * Errors go to the kiln_status with where = "file:line:col" of the offending
 * position; the first one wins. After an error readers keep returning
 * failures, so callers just propagate the return code.
 */
#ifndef KILN_COMPILER_IR_TEXT_LEX_H
#define KILN_COMPILER_IR_TEXT_LEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/arena.h"
#include "common/status.h"

#define KILN__MAX_NESTING 256

typedef struct kiln__tok {
  const char *s; /* points into the text */
  size_t n;
} kiln__tok;

typedef struct kiln__lex {
  const char *base, *p, *end;
  const char *file;
  kiln_status *st;
  /* Line cache: positions are mostly asked for in increasing order, so
   * line numbers are found by counting forward from the last answer. */
  const char *lc_pos, *lc_line_start;
  uint32_t lc_line;
} kiln__lex;

void kiln__lex_init(kiln__lex *lx, const char *text, size_t len, const char *file, kiln_status *st);
bool kiln__lex_failed(const kiln__lex *lx);

/* Records a parse error at `at` (a position in the text; NULL = current).
 * Returns KILN_EPARSE (or `code` for the _code variant). */
int kiln__lex_error(kiln__lex *lx, const char *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int kiln__lex_error_code(kiln__lex *lx, const char *at, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void kiln__lex_linecol(kiln__lex *lx, const char *at, uint32_t *line, uint32_t *col);
void kiln__lex_where(kiln__lex *lx, const char *at, char *buf, size_t size);
/* A short quote of what is at `at` for "found ..." ("'}'", "'foo'", "end of
 * input"), written into buf. */
const char *kiln__lex_found(const kiln__lex *lx, const char *at, char *buf, size_t size);

/* Skips whitespace, // and / * comments. Returns 0 or an error for an
 * unterminated comment (then the cursor is at the end). */
int kiln__lex_skip(kiln__lex *lx);
/* Skips, then the next byte, or -1 at the end of the text. */
int kiln__lex_peek(kiln__lex *lx);
/* Skips, then the byte after the next one (-1 past the end). */
int kiln__lex_peek2(kiln__lex *lx);
/* Skips; consumes `c` if it is next. */
bool kiln__lex_accept(kiln__lex *lx, char c);
/* Skips; consumes `c` or fails with "expected 'c' CONTEXT, found X". */
int kiln__lex_expect(kiln__lex *lx, char c, const char *context);
/* Skips; consumes the word `w` if it is next and not followed by a name
 * character. */
bool kiln__lex_accept_word(kiln__lex *lx, const char *w);

bool kiln__lex_is_name_start(int c);
bool kiln__lex_is_name_char(int c);
/* A name: optional '%', then [A-Za-z_][A-Za-z0-9_.-]* ('%' also allows a
 * leading digit; a '-' is never taken before '>'). tok excludes the '%'.
 * Fails with "expected WHAT, found X". */
int kiln__lex_name(kiln__lex *lx, kiln__tok *tok, const char *what);
/* Like kiln__lex_name but returns false (consuming nothing) when no name. */
bool kiln__lex_try_name(kiln__lex *lx, kiln__tok *tok);
/* A name without '%': opcodes, attribute and field names. */
int kiln__lex_bare_name(kiln__lex *lx, kiln__tok *tok, const char *what);
/* A bare word for identifier values: [A-Za-z0-9_.$-]+. */
int kiln__lex_word(kiln__lex *lx, kiln__tok *tok, const char *what);

/* Signed decimal integer that fits int64 ("expected WHAT, found X"). */
int kiln__lex_int(kiln__lex *lx, int64_t *out, const char *what);
/* Non-negative decimal integer that fits int64. */
int kiln__lex_uint(kiln__lex *lx, int64_t *out, const char *what);
/* A floating-point number: decimal with optional exponent, inf, nan,
 * optionally signed. */
int kiln__lex_float(kiln__lex *lx, double *out, const char *what);
/* A "quoted string", unescaped (C escapes) into arena a, NUL-terminated. */
int kiln__lex_string(kiln__lex *lx, kiln_arena *a, const char **out, size_t *len);
/* Skips a "quoted string" starting at the cursor (no skip before), leaving
 * the cursor after it. */
int kiln__lex_skip_string(kiln__lex *lx);
/* A verbatim value: a {...}, (...) or [...] group balanced over all three
 * kinds of brackets and quote-aware, a "string", or a run of characters up
 * to ',' or whitespace or an unmatched closer, all at nesting depth 0.
 * tok spans the value text exactly. */
int kiln__lex_verbatim(kiln__lex *lx, kiln__tok *tok, const char *what);

#endif /* KILN_COMPILER_IR_TEXT_LEX_H */
