/* A growable string buffer for printers and messages.
 *
 * Errors are sticky: after an out-of-memory every append is a no-op and
 * kiln_sbuf_failed() says so; check once at the end.
 */
#ifndef KILN_COMMON_SBUF_H
#define KILN_COMMON_SBUF_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_sbuf {
  char *data; /* NUL-terminated while !failed; owned */
  size_t len;
  size_t cap;
  bool failed;
} kiln_sbuf;

#define KILN_SBUF_INIT \
  { NULL, 0, 0, false }

void kiln_sbuf_init(kiln_sbuf *b);
void kiln_sbuf_free(kiln_sbuf *b);
void kiln_sbuf_reset(kiln_sbuf *b); /* len = 0, keeps storage */
void kiln_sbuf_putn(kiln_sbuf *b, const char *s, size_t n);
void kiln_sbuf_puts(kiln_sbuf *b, const char *s);
void kiln_sbuf_putc(kiln_sbuf *b, char c);
void kiln_sbuf_printf(kiln_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool kiln_sbuf_failed(const kiln_sbuf *b);
/* Hands the buffer to the caller (free with kiln_free); NULL if failed. */
char *kiln_sbuf_detach(kiln_sbuf *b, size_t *len);
/* The contents ("" when empty); valid until the next append. */
const char *kiln_sbuf_str(const kiln_sbuf *b);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMMON_SBUF_H */
