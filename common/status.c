/* Status codes and the first-error-wins status record. */
#include "common/status.h"

#include <stdio.h>
#include <string.h>

const char *kiln_strerror(int code) {
  switch (code) {
  case KILN_OK: return "ok";
#define KILN_X_(name, val, desc) \
  case KILN_E##name: return desc;
    KILN_ERRNO_MAP(KILN_X_)
#undef KILN_X_
  }
  return "unknown error";
}

const char *kiln_err_name(int code) {
  switch (code) {
  case KILN_OK: return "KILN_OK";
#define KILN_X_(name, val, desc) \
  case KILN_E##name: return "KILN_E" #name;
    KILN_ERRNO_MAP(KILN_X_)
#undef KILN_X_
  }
  return "KILN_E?";
}

void kiln_status_clear(kiln_status *st) {
  if (st == NULL) return;
  st->code = 0;
  st->where[0] = '\0';
  st->msg[0] = '\0';
}

bool kiln_status_is_ok(const kiln_status *st) { return st == NULL || st->code == 0; }

int kiln_status_vset(kiln_status *st, int code, const char *where, const char *fmt, va_list ap) {
  if (st == NULL || st->code != 0) return code;
  st->code = code;
  snprintf(st->where, sizeof st->where, "%s", where ? where : "");
  vsnprintf(st->msg, sizeof st->msg, fmt, ap);
  return code;
}

int kiln_status_set(kiln_status *st, int code, const char *where, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  kiln_status_vset(st, code, where, fmt, ap);
  va_end(ap);
  return code;
}

void kiln_status_format(const kiln_status *st, char *buf, unsigned long size) {
  if (size == 0) return;
  if (st == NULL || st->code == 0) {
    snprintf(buf, size, "ok");
  } else if (st->where[0]) {
    snprintf(buf, size, "%s: error: %s", st->where, st->msg);
  } else {
    snprintf(buf, size, "error: %s", st->msg);
  }
}
