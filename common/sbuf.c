/* Growable string buffer with sticky out-of-memory. */
#include "common/sbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"

void kiln_sbuf_init(kiln_sbuf *b) {
  b->data = NULL;
  b->len = b->cap = 0;
  b->failed = false;
}

void kiln_sbuf_free(kiln_sbuf *b) {
  kiln_free(b->data);
  kiln_sbuf_init(b);
}

void kiln_sbuf_reset(kiln_sbuf *b) {
  b->len = 0;
  if (b->data) b->data[0] = '\0';
}

static bool reserve(kiln_sbuf *b, size_t extra) {
  if (b->failed) return false;
  if (extra > (size_t)-1 - b->len - 1) {
    b->failed = true;
    return false;
  }
  size_t cap = b->cap;
  void *p = b->data;
  if (kiln_grow(&p, &cap, b->len + extra + 1, 1) != 0) {
    b->failed = true;
    return false;
  }
  b->data = p;
  b->cap = cap;
  return true;
}

void kiln_sbuf_putn(kiln_sbuf *b, const char *s, size_t n) {
  if (!reserve(b, n)) return;
  memcpy(b->data + b->len, s, n);
  b->len += n;
  b->data[b->len] = '\0';
}

void kiln_sbuf_puts(kiln_sbuf *b, const char *s) { kiln_sbuf_putn(b, s, strlen(s)); }

void kiln_sbuf_putc(kiln_sbuf *b, char c) { kiln_sbuf_putn(b, &c, 1); }

void kiln_sbuf_printf(kiln_sbuf *b, const char *fmt, ...) {
  char small[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) {
    b->failed = true;
    return;
  }
  if ((size_t)n < sizeof small) {
    kiln_sbuf_putn(b, small, (size_t)n);
    return;
  }
  if (!reserve(b, (size_t)n)) return;
  va_start(ap, fmt);
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

bool kiln_sbuf_failed(const kiln_sbuf *b) { return b->failed; }

char *kiln_sbuf_detach(kiln_sbuf *b, size_t *len) {
  if (b->failed) {
    kiln_sbuf_free(b);
    return NULL;
  }
  if (b->data == NULL && !reserve(b, 0)) return NULL;
  if (b->data) b->data[b->len] = '\0';
  char *d = b->data;
  if (len) *len = b->len;
  kiln_sbuf_init(b);
  return d;
}

const char *kiln_sbuf_str(const kiln_sbuf *b) { return b->data && !b->failed ? b->data : ""; }
