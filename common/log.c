/* kiln_log: format once, hand the line to the process's sink (log.h). */
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>

static kiln_log_sink the_sink;

const char *kiln_log_level_name(kiln_log_level level) {
  switch (level) {
  case KILN_LOG_DEBUG: return "debug";
  case KILN_LOG_INFO: return "info";
  case KILN_LOG_WARN: return "warn";
  default: return "error";
  }
}

void kiln_log_set_sink(kiln_log_sink sink) { the_sink = sink; }

void kiln_log(kiln_log_level level, const char *component, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (the_sink)
    the_sink(level, component, msg);
  else
    fprintf(stderr, "%s: %s\n", component, msg);
}
