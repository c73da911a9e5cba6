/* Status codes and the user-facing error record.
 *
 * Actions return int: 0 or a negative KILN_E* code. When a user must read what
 * went wrong, the action also fills a kiln_status: the code, where it happened
 * ("file:line:col" for text, "computation/instruction" for the verifier) and a
 * message. The first error recorded wins, so a caller can pass one status down
 * a chain of calls and report the root cause. (The shape of libuv's UV_ERRNO_MAP.)
 */
#ifndef KILN_COMMON_STATUS_H
#define KILN_COMMON_STATUS_H

#include <stdarg.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* X(NAME, value, description) */
#define KILN_ERRNO_MAP(X) \
  X(INVAL, -1, "invalid argument") \
  X(NOMEM, -2, "out of memory") \
  X(PARSE, -3, "parse error") \
  X(VERIFY, -4, "verification failed") \
  X(UNIMPL, -5, "not implemented") \
  X(RANGE, -6, "value out of range") \
  X(IO, -7, "input/output error") \
  X(LIMIT, -8, "resource limit exceeded") \
  X(INTERNAL, -9, "internal error") \
  X(NOTFOUND, -10, "not found") \
  X(DEADLINE, -11, "deadline exceeded") \
  X(CANCELED, -12, "canceled") \
  X(UNAVAIL, -13, "unavailable")

typedef enum kiln_errno {
  KILN_OK = 0,
#define KILN_X_(name, val, desc) KILN_E##name = val,
  KILN_ERRNO_MAP(KILN_X_)
#undef KILN_X_
} kiln_errno;

#define KILN_STATUS_WHERE_MAX 256
#define KILN_STATUS_MSG_MAX 1024

typedef struct kiln_status {
  int code;                          /* 0 while no error was recorded */
  char where[KILN_STATUS_WHERE_MAX]; /* "file:1:2", "computation/instr", or "" */
  char msg[KILN_STATUS_MSG_MAX];     /* what is wrong: expected vs found */
} kiln_status;

/* Short description of a KILN_E* code ("parse error"). Never NULL. */
const char *kiln_strerror(int code);

/* Symbolic name of a code ("KILN_EPARSE"). Never NULL. */
const char *kiln_err_name(int code);

void kiln_status_clear(kiln_status *st);

bool kiln_status_is_ok(const kiln_status *st);

/* Record an error unless one is already recorded (first error wins). `st` may
 * be NULL. `where` may be NULL. Returns `code`, so callers can write
 * `return kiln_status_set(st, KILN_EINVAL, w, "...")`. */
int kiln_status_set(kiln_status *st, int code, const char *where, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int kiln_status_vset(kiln_status *st, int code, const char *where, const char *fmt, va_list ap);

/* Format "where: error: msg" (or "error: msg" without where) into buf. */
void kiln_status_format(const kiln_status *st, char *buf, unsigned long size);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMMON_STATUS_H */
