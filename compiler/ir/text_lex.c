/* The HLO text scanner: a cursor over the text with one reader per lexical
 * form (names, numbers, strings, verbatim values), comment skipping and
 * "file:line:col" error locations. See text_lex.h for why there is no
 * separate token stream. */
#include "compiler/ir/text_lex.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kiln__lex_init(kiln__lex *lx, const char *text, size_t len, const char *file,
                    kiln_status *st) {
  lx->base = lx->p = text;
  lx->end = text + len;
  lx->file = file ? file : "<input>";
  lx->st = st;
  lx->lc_pos = lx->lc_line_start = text;
  lx->lc_line = 1;
}

bool kiln__lex_failed(const kiln__lex *lx) { return lx->st && lx->st->code != 0; }

void kiln__lex_linecol(kiln__lex *lx, const char *at, uint32_t *line, uint32_t *col) {
  if (at == NULL) at = lx->p;
  if (at < lx->base) at = lx->base;
  if (at > lx->end) at = lx->end;
  if (at < lx->lc_pos) { /* rare: go back to the start */
    lx->lc_pos = lx->lc_line_start = lx->base;
    lx->lc_line = 1;
  }
  for (const char *q = lx->lc_pos; q < at; q++) {
    q = memchr(q, '\n', (size_t)(at - q));
    if (q == NULL) break;
    lx->lc_line++;
    lx->lc_line_start = q + 1;
  }
  lx->lc_pos = at;
  *line = lx->lc_line;
  size_t c = (size_t)(at - lx->lc_line_start) + 1;
  *col = c > UINT32_MAX ? UINT32_MAX : (uint32_t)c;
}

void kiln__lex_where(kiln__lex *lx, const char *at, char *buf, size_t size) {
  uint32_t line, col;
  kiln__lex_linecol(lx, at, &line, &col);
  snprintf(buf, size, "%s:%u:%u", lx->file, (unsigned)line, (unsigned)col);
}

static int verror(kiln__lex *lx, const char *at, int code, const char *fmt, va_list ap) {
  if (kiln__lex_failed(lx)) return lx->st->code;
  char where[KILN_STATUS_WHERE_MAX];
  kiln__lex_where(lx, at, where, sizeof where);
  return kiln_status_vset(lx->st, code, where, fmt, ap);
}

int kiln__lex_error(kiln__lex *lx, const char *at, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = verror(lx, at, KILN_EPARSE, fmt, ap);
  va_end(ap);
  return rc;
}

int kiln__lex_error_code(kiln__lex *lx, const char *at, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = verror(lx, at, code, fmt, ap);
  va_end(ap);
  return rc;
}

bool kiln__lex_is_name_start(int c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

bool kiln__lex_is_name_char(int c) {
  return kiln__lex_is_name_start(c) || (c >= '0' && c <= '9') || c == '.' || c == '-';
}

static bool is_digit(int c) { return c >= '0' && c <= '9'; }

const char *kiln__lex_found(const kiln__lex *lx, const char *at, char *buf, size_t size) {
  if (at == NULL) at = lx->p;
  if (at >= lx->end) {
    snprintf(buf, size, "end of input");
    return buf;
  }
  unsigned char c = (unsigned char)*at;
  size_t n = 1;
  if (kiln__lex_is_name_char(c) || c == '%' || c == '+') {
    while (at + n < lx->end && n < 40 && kiln__lex_is_name_char((unsigned char)at[n])) n++;
  }
  if (c < 0x20 || c >= 0x7f) {
    if (c == '\n')
      snprintf(buf, size, "end of line");
    else
      snprintf(buf, size, "byte 0x%02x", c);
    return buf;
  }
  bool more = at + n < lx->end && n == 40 && kiln__lex_is_name_char((unsigned char)at[n]);
  snprintf(buf, size, "'%.*s%s'", (int)n, at, more ? "..." : "");
  return buf;
}

int kiln__lex_skip(kiln__lex *lx) {
  const char *p = lx->p, *end = lx->end;
  while (p < end) {
    char c = *p;
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
      p++;
    } else if (c == '/' && p + 1 < end && p[1] == '/') {
      const char *nl = memchr(p, '\n', (size_t)(end - p));
      p = nl ? nl + 1 : end;
    } else if (c == '/' && p + 1 < end && p[1] == '*') {
      const char *q = p + 2;
      for (;;) {
        q = q < end ? memchr(q, '*', (size_t)(end - q)) : NULL;
        if (q == NULL || q + 1 >= end) {
          int rc = kiln__lex_error(lx, p, "unterminated /* comment");
          lx->p = end;
          return rc;
        }
        if (q[1] == '/') break;
        q++;
      }
      p = q + 2;
    } else {
      break;
    }
  }
  lx->p = p;
  return 0;
}

int kiln__lex_peek(kiln__lex *lx) {
  kiln__lex_skip(lx);
  return lx->p < lx->end ? (unsigned char)*lx->p : -1;
}

int kiln__lex_peek2(kiln__lex *lx) {
  kiln__lex_skip(lx);
  return lx->p + 1 < lx->end ? (unsigned char)lx->p[1] : -1;
}

bool kiln__lex_accept(kiln__lex *lx, char c) {
  if (kiln__lex_peek(lx) != (unsigned char)c) return false;
  lx->p++;
  return true;
}

int kiln__lex_expect(kiln__lex *lx, char c, const char *context) {
  if (kiln__lex_accept(lx, c)) return 0;
  char f[64];
  return kiln__lex_error(lx, NULL, "expected '%c' %s, found %s", c, context,
                         kiln__lex_found(lx, NULL, f, sizeof f));
}

bool kiln__lex_accept_word(kiln__lex *lx, const char *w) {
  kiln__lex_skip(lx);
  size_t n = strlen(w);
  if ((size_t)(lx->end - lx->p) < n || memcmp(lx->p, w, n) != 0) return false;
  if (lx->p + n < lx->end && kiln__lex_is_name_char((unsigned char)lx->p[n])) return false;
  lx->p += n;
  return true;
}

/* Length of the name run at p (after any '%'); a '-' is not taken before '>'
 * so that "a->b" and "x)->f32[]" split where a reader expects. */
static size_t name_run(const char *p, const char *end) {
  size_t n = 0;
  while (p + n < end && kiln__lex_is_name_char((unsigned char)p[n])) {
    if (p[n] == '-' && p + n + 1 < end && p[n + 1] == '>') break;
    n++;
  }
  return n;
}

bool kiln__lex_try_name(kiln__lex *lx, kiln__tok *tok) {
  kiln__lex_skip(lx);
  const char *p = lx->p;
  bool pct = p < lx->end && *p == '%';
  if (pct) p++;
  if (p >= lx->end) return false;
  unsigned char c = (unsigned char)*p;
  if (!(kiln__lex_is_name_start(c) || (pct && (is_digit(c) || c == '.' || c == '-')))) return false;
  size_t n = name_run(p, lx->end);
  if (n == 0) return false;
  tok->s = p;
  tok->n = n;
  lx->p = p + n;
  return true;
}

int kiln__lex_name(kiln__lex *lx, kiln__tok *tok, const char *what) {
  if (kiln__lex_try_name(lx, tok)) return 0;
  char f[64];
  return kiln__lex_error(lx, NULL, "expected %s, found %s", what,
                         kiln__lex_found(lx, NULL, f, sizeof f));
}

int kiln__lex_bare_name(kiln__lex *lx, kiln__tok *tok, const char *what) {
  if (kiln__lex_peek(lx) != '%' && kiln__lex_try_name(lx, tok)) return 0;
  char f[64];
  return kiln__lex_error(lx, NULL, "expected %s, found %s", what,
                         kiln__lex_found(lx, NULL, f, sizeof f));
}

int kiln__lex_word(kiln__lex *lx, kiln__tok *tok, const char *what) {
  kiln__lex_skip(lx);
  const char *p = lx->p;
  size_t n = 0;
  while (p + n < lx->end) {
    unsigned char c = (unsigned char)p[n];
    if (!(kiln__lex_is_name_char(c) || c == '$')) break;
    if (c == '-' && p + n + 1 < lx->end && p[n + 1] == '>') break;
    n++;
  }
  if (n == 0) {
    char f[64];
    return kiln__lex_error(lx, NULL, "expected %s, found %s", what,
                           kiln__lex_found(lx, NULL, f, sizeof f));
  }
  tok->s = p;
  tok->n = n;
  lx->p = p + n;
  return 0;
}

static int int_error(kiln__lex *lx, const char *at, const char *what) {
  char f[64];
  return kiln__lex_error(lx, at, "expected %s, found %s", what,
                         kiln__lex_found(lx, at, f, sizeof f));
}

/* Reads digits at p into a magnitude; returns the count of digits, or -1 on
 * overflow past UINT64_MAX. */
static long read_digits(const char *p, const char *end, uint64_t *out) {
  uint64_t v = 0;
  long n = 0;
  bool over = false;
  while (p + n < end && is_digit((unsigned char)p[n])) {
    unsigned d = (unsigned)(p[n] - '0');
    if (v > (UINT64_MAX - d) / 10)
      over = true;
    else
      v = v * 10 + d;
    n++;
  }
  *out = v;
  return over ? -n : n;
}

int kiln__lex_int(kiln__lex *lx, int64_t *out, const char *what) {
  kiln__lex_skip(lx);
  const char *start = lx->p, *p = start;
  bool neg = false;
  if (p < lx->end && (*p == '-' || *p == '+')) neg = *p++ == '-';
  uint64_t mag;
  long n = read_digits(p, lx->end, &mag);
  if (n == 0) return int_error(lx, start, what);
  size_t len = (size_t)(n < 0 ? -n : n);
  if (n < 0 || mag > (neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX))
    return kiln__lex_error(lx, start, "integer %.*s does not fit in 64 bits",
                           (int)(p + len - start > 60 ? 60 : p + len - start), start);
  *out = neg ? (int64_t)(0 - mag) : (int64_t)mag;
  lx->p = p + len;
  return 0;
}

int kiln__lex_uint(kiln__lex *lx, int64_t *out, const char *what) {
  kiln__lex_skip(lx);
  if (lx->p >= lx->end || !is_digit((unsigned char)*lx->p)) return int_error(lx, NULL, what);
  return kiln__lex_int(lx, out, what);
}

int kiln__lex_float(kiln__lex *lx, double *out, const char *what) {
  kiln__lex_skip(lx);
  const char *start = lx->p, *p = start, *end = lx->end;
  bool neg = false;
  if (p < end && (*p == '-' || *p == '+')) neg = *p++ == '-';
  if (end - p >= 3 && memcmp(p, "inf", 3) == 0 &&
      !(p + 3 < end && kiln__lex_is_name_char((unsigned char)p[3]))) {
    *out = neg ? -INFINITY : INFINITY;
    lx->p = p + 3;
    return 0;
  }
  if (end - p >= 3 && memcmp(p, "nan", 3) == 0) {
    p += 3;
    /* XLA writes NaN payloads as nan(0x...); the payload is not kept. */
    if (p < end && *p == '(') {
      const char *q = p + 1;
      while (q < end && (kiln__lex_is_name_char((unsigned char)*q))) q++;
      if (q >= end || *q != ')') return int_error(lx, start, what);
      p = q + 1;
    }
    if (p < end && kiln__lex_is_name_char((unsigned char)*p)) return int_error(lx, start, what);
    *out = neg ? -NAN : NAN;
    lx->p = p;
    return 0;
  }
  const char *q = p;
  size_t digits = 0;
  while (q < end && is_digit((unsigned char)*q)) q++, digits++;
  if (q < end && *q == '.') {
    q++;
    while (q < end && is_digit((unsigned char)*q)) q++, digits++;
  }
  if (digits == 0) return int_error(lx, start, what);
  if (q < end && (*q == 'e' || *q == 'E')) {
    const char *e = q + 1;
    if (e < end && (*e == '+' || *e == '-')) e++;
    if (e < end && is_digit((unsigned char)*e)) {
      while (e < end && is_digit((unsigned char)*e)) e++;
      q = e;
    }
  }
  if (q < end && kiln__lex_is_name_char((unsigned char)*q) && *q != '-')
    return int_error(lx, start, what);
  size_t n = (size_t)(q - start);
  char buf[512];
  if (n >= sizeof buf) return kiln__lex_error(lx, start, "number of %zu characters is too long", n);
  memcpy(buf, start, n);
  buf[n] = '\0';
  *out = strtod(buf, NULL);
  lx->p = q;
  return 0;
}

int kiln__lex_skip_string(kiln__lex *lx) {
  const char *start = lx->p, *p = start + 1;
  while (p < lx->end && *p != '"') {
    if (*p == '\\') p++;
    /* a NUL would cut the C string the value is stored as */
    if (p < lx->end && *p == '\0') return kiln__lex_error(lx, p, "NUL byte in a string");
    p++;
  }
  if (p >= lx->end) {
    int rc = kiln__lex_error(lx, start, "unterminated string");
    lx->p = lx->end;
    return rc;
  }
  lx->p = p + 1;
  return 0;
}

static int hexval(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

int kiln__lex_string(kiln__lex *lx, kiln_arena *a, const char **out, size_t *len) {
  if (kiln__lex_peek(lx) != '"') {
    char f[64];
    return kiln__lex_error(lx, NULL, "expected a quoted string, found %s",
                           kiln__lex_found(lx, NULL, f, sizeof f));
  }
  const char *start = lx->p;
  int rc = kiln__lex_skip_string(lx);
  if (rc) return rc;
  const char *s = start + 1, *e = lx->p - 1;
  char *buf = kiln_arena_alloc(a, (size_t)(e - s) + 1);
  if (buf == NULL) return kiln__lex_error_code(lx, start, KILN_ENOMEM, "out of memory");
  size_t n = 0;
  while (s < e) {
    if (*s != '\\') {
      buf[n++] = *s++;
      continue;
    }
    const char *esc = s++;
    char c = *s++;
    switch (c) {
    case 'n': buf[n++] = '\n'; break;
    case 't': buf[n++] = '\t'; break;
    case 'r': buf[n++] = '\r'; break;
    case 'a': buf[n++] = '\a'; break;
    case 'b': buf[n++] = '\b'; break;
    case 'f': buf[n++] = '\f'; break;
    case 'v': buf[n++] = '\v'; break;
    case '\\':
    case '"':
    case '\'':
    case '?': buf[n++] = c; break;
    case 'x': {
      int v = 0, k = 0;
      while (s < e && k < 2 && hexval((unsigned char)*s) >= 0)
        v = v * 16 + hexval((unsigned char)*s++), k++;
      if (k == 0) return kiln__lex_error(lx, esc, "bad escape sequence '\\x' in string");
      if (v == 0) return kiln__lex_error(lx, esc, "NUL character in a string");
      buf[n++] = (char)v;
      break;
    }
    default:
      if (c >= '0' && c <= '7') {
        int v = c - '0', k = 1;
        while (s < e && k < 3 && *s >= '0' && *s <= '7') v = v * 8 + (*s++ - '0'), k++;
        if (v > 255) return kiln__lex_error(lx, esc, "octal escape out of range in string");
        if (v == 0) return kiln__lex_error(lx, esc, "NUL character in a string");
        buf[n++] = (char)v;
        break;
      }
      return kiln__lex_error(lx, esc, "bad escape sequence '\\%c' in string", c);
    }
  }
  buf[n] = '\0';
  *out = buf;
  if (len) *len = n;
  return 0;
}

static char closer_of(char c) { return c == '{' ? '}' : c == '(' ? ')' : ']'; }

int kiln__lex_verbatim(kiln__lex *lx, kiln__tok *tok, const char *what) {
  kiln__lex_skip(lx);
  const char *start = lx->p, *p = start, *end = lx->end;
  const char *open[KILN__MAX_NESTING];
  int depth = 0;
  while (p < end) {
    char c = *p;
    if (c == '"') {
      lx->p = p;
      int rc = kiln__lex_skip_string(lx);
      if (rc) return rc;
      p = lx->p;
      continue;
    }
    if (c == '/' && p + 1 < end && (p[1] == '*' || p[1] == '/')) {
      if (depth == 0) break;
      lx->p = p;
      int rc = kiln__lex_skip(lx);
      if (rc) return rc;
      p = lx->p;
      continue;
    }
    if (c == '{' || c == '(' || c == '[') {
      if (depth == KILN__MAX_NESTING)
        return kiln__lex_error(lx, p, "nesting deeper than %d levels", KILN__MAX_NESTING);
      open[depth++] = p++;
      continue;
    }
    if (c == '}' || c == ')' || c == ']') {
      if (depth == 0) break;
      char want = closer_of(*open[depth - 1]);
      if (c != want) {
        uint32_t l, col;
        kiln__lex_linecol(lx, open[depth - 1], &l, &col);
        return kiln__lex_error(
            lx, p, "unbalanced brackets: expected '%c' to close '%c' at %u:%u, found '%c'", want,
            *open[depth - 1], (unsigned)l, (unsigned)col, c);
      }
      depth--;
      p++;
      continue;
    }
    if (depth == 0 && (c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r')) break;
    p++;
  }
  if (depth > 0) {
    int rc = kiln__lex_error(lx, open[0], "unbalanced %s: this '%c' is never closed",
                             *open[0] == '{' ? "braces" : "brackets", *open[0]);
    lx->p = end;
    return rc;
  }
  if (p == start) {
    char f[64];
    return kiln__lex_error(lx, start, "expected %s, found %s", what,
                           kiln__lex_found(lx, start, f, sizeof f));
  }
  /* Comments inside a value are kept with it; they must not hide a NUL. */
  const char *nul = memchr(start, '\0', (size_t)(p - start));
  if (nul) return kiln__lex_error(lx, nul, "NUL byte in %s", what);
  tok->s = start;
  tok->n = (size_t)(p - start);
  lx->p = p;
  return 0;
}
