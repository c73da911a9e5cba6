/* kilnd's logger (log.h): records built on the stack, one write each.
 *
 * The three formats share one builder: begin writes the record's head
 * (time, level, msg, or the "kilnd: " prefix of text), each field appends
 * one key and value quoted as the format wants, end closes the record and
 * writes it. Settings are written once at start-up, before any thread
 * logs, and only read afterwards.
 */
#include "server/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <grpc/support/log.h>

#include "server/server.h"

static kilnd_log_format format = KILND_LOG_TEXT;
/* Changed by a SIGHUP reload on the loop thread while others log. */
static _Atomic int min_level = KILN_LOG_INFO;

/* ---- settings ------------------------------------------------------------------------ */

static void library_sink(kiln_log_level level, const char *component, const char *msg) {
  kilnd_log_rec r;
  kilnd_log_begin(&r, level, msg);
  kilnd_log_str(&r, "component", component);
  kilnd_log_end(&r);
}

int kilnd_log_configure(const char *fmt, const char *level, kiln_status *st) {
  static const char *const formats[] = {"text", "logfmt", "json"};
  static const char *const levels[] = {"debug", "info", "warn", "error"};
  int f = -1, l = -1;
  for (int i = 0; i < 3; i++)
    if (fmt && strcmp(fmt, formats[i]) == 0) f = i;
  for (int i = 0; i < 4; i++)
    if (level && strcmp(level, levels[i]) == 0) l = i;
  if (f < 0)
    return kiln_status_set(st, KILN_EINVAL, "log-format",
                           "'%s' is not a log format (text, logfmt or json)", fmt ? fmt : "");
  if (l < 0)
    return kiln_status_set(st, KILN_EINVAL, "log-level",
                           "'%s' is not a log level (debug, info, warn or error)",
                           level ? level : "");
  format = (kilnd_log_format)f;
  atomic_store(&min_level, l);
  kiln_log_set_sink(library_sink);
  return 0;
}

int kilnd_log_set_level(const char *level, kiln_status *st) {
  return kilnd_log_configure(kilnd_log_format_name(format), level, st);
}

const char *kilnd_log_format_name(kilnd_log_format f) {
  static const char *const names[] = {"text", "logfmt", "json"};
  return names[f];
}

const char *kilnd_log_level_now(void) {
  static const char *const levels[] = {"debug", "info", "warn", "error"};
  return levels[atomic_load(&min_level)];
}

kilnd_log_format kilnd_log_get_format(void) { return format; }

bool kilnd_log_enabled(kiln_log_level level) { return (int)level >= atomic_load(&min_level); }

/* ---- the builder --------------------------------------------------------------------- */

/* Room kept for the record's end (closing brace, newline). */
#define TAIL_ROOM 4

static void put(kilnd_log_rec *r, const char *s, size_t len) {
  size_t room = sizeof r->buf - TAIL_ROOM - r->n;
  if (len > room) len = room, r->cut = true;
  memcpy(r->buf + r->n, s, len);
  r->n += len;
}

static void putc_(kilnd_log_rec *r, char ch) { put(r, &ch, 1); }

static void put_json_string(kilnd_log_rec *r, const char *s) {
  putc_(r, '"');
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    char esc[8];
    if (*p == '"' || *p == '\\') {
      esc[0] = '\\', esc[1] = (char)*p;
      put(r, esc, 2);
    } else if (*p == '\n') {
      put(r, "\\n", 2);
    } else if (*p < 0x20 || *p >= 0x7f) { /* always valid JSON, whatever the bytes */
      snprintf(esc, sizeof esc, "\\u%04x", *p);
      put(r, esc, 6);
    } else {
      putc_(r, (char)*p);
    }
  }
  putc_(r, '"');
}

static bool logfmt_needs_quotes(const char *s) {
  if (*s == '\0') return true;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++)
    if (*p <= ' ' || *p == '=' || *p == '"' || *p == '\\' || *p >= 0x7f) return true;
  return false;
}

static void put_logfmt_value(kilnd_log_rec *r, const char *s) {
  if (!logfmt_needs_quotes(s)) {
    put(r, s, strlen(s));
    return;
  }
  putc_(r, '"');
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    char esc[8];
    if (*p == '"' || *p == '\\') {
      esc[0] = '\\', esc[1] = (char)*p;
      put(r, esc, 2);
    } else if (*p == '\n') {
      put(r, "\\n", 2);
    } else if (*p < 0x20 || *p == 0x7f) {
      snprintf(esc, sizeof esc, "\\x%02x", *p);
      put(r, esc, 4);
    } else {
      putc_(r, (char)*p);
    }
  }
  putc_(r, '"');
}

/* Key and separator; the value follows. */
static void put_key(kilnd_log_rec *r, const char *key) {
  if (format == KILND_LOG_JSON) {
    putc_(r, ',');
    put_json_string(r, key);
    putc_(r, ':');
  } else {
    putc_(r, ' ');
    put(r, key, strlen(key));
    putc_(r, '=');
  }
}

static void put_time(kilnd_log_rec *r) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  char t[96];
  snprintf(t, sizeof t, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
           tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ts.tv_nsec / 1000000 % 1000));
  put(r, t, strlen(t));
}

void kilnd_log_begin(kilnd_log_rec *r, kiln_log_level level, const char *msg) {
  r->level = level;
  r->n = r->good = 0;
  r->cut = false;
  r->skip = !kilnd_log_enabled(level);
  if (r->skip) return;
  switch (format) {
  case KILND_LOG_TEXT:
    put(r, "kilnd: ", 7);
    put(r, msg, strlen(msg));
    break;
  case KILND_LOG_LOGFMT:
    put(r, "time=", 5);
    put_time(r);
    put(r, " level=", 7);
    put(r, kiln_log_level_name(level), strlen(kiln_log_level_name(level)));
    put(r, " msg=", 5);
    put_logfmt_value(r, msg);
    break;
  case KILND_LOG_JSON:
    put(r, "{\"time\":\"", 9);
    put_time(r);
    put(r, "\",\"level\":\"", 11);
    put(r, kiln_log_level_name(level), strlen(kiln_log_level_name(level)));
    put(r, "\",\"msg\":", 8);
    put_json_string(r, msg);
    break;
  }
  r->good = r->n;
}

void kilnd_log_str(kilnd_log_rec *r, const char *key, const char *value) {
  if (r->skip) return;
  put_key(r, key);
  if (format == KILND_LOG_JSON)
    put_json_string(r, value ? value : "");
  else
    put_logfmt_value(r, value ? value : "");
  if (!r->cut) r->good = r->n;
}

void kilnd_log_int(kilnd_log_rec *r, const char *key, int64_t value) {
  if (r->skip) return;
  char v[32];
  snprintf(v, sizeof v, "%lld", (long long)value);
  put_key(r, key);
  put(r, v, strlen(v));
  if (!r->cut) r->good = r->n;
}

void kilnd_log_ms(kilnd_log_rec *r, const char *key, double value) {
  if (r->skip) return;
  char v[48];
  snprintf(v, sizeof v, "%.3f", value);
  put_key(r, key);
  put(r, v, strlen(v));
  if (!r->cut) r->good = r->n;
}

void kilnd_log_end(kilnd_log_rec *r) {
  if (r->skip) return;
  /* A cut JSON record loses the fields from the one that did not fit, and
   * stays one parsable object. */
  if (format == KILND_LOG_JSON) {
    if (r->cut) r->n = r->good;
    r->buf[r->n++] = '}';
  }
  r->buf[r->n++] = '\n';
  const char *p = r->buf;
  size_t left = r->n;
  while (left > 0) {
    ssize_t w = write(STDERR_FILENO, p, left);
    if (w <= 0) break;
    p += w;
    left -= (size_t)w;
  }
}

/* ---- free text ----------------------------------------------------------------------- */

static void logv(kiln_log_level level, const char *fmt, va_list ap) {
  if (!kilnd_log_enabled(level)) return;
  char msg[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  kilnd_log_rec r;
  kilnd_log_begin(&r, level, msg);
  kilnd_log_end(&r);
}

void kilnd_logl(kiln_log_level level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  logv(level, fmt, ap);
  va_end(ap);
}

void kilnd_log(const char *fmt, ...) {
  bool warning = strncmp(fmt, "warning: ", 9) == 0;
  va_list ap;
  va_start(ap, fmt);
  /* The structured formats say it with level=warn. */
  logv(warning ? KILN_LOG_WARN : KILN_LOG_INFO, warning && format != KILND_LOG_TEXT ? fmt + 9 : fmt,
       ap);
  va_end(ap);
}

/* ---- calls --------------------------------------------------------------------------- */

const char *kilnd_log_code_name(int code) {
  static const char *const names[] = {"OK",
                                      "CANCELLED",
                                      "UNKNOWN",
                                      "INVALID_ARGUMENT",
                                      "DEADLINE_EXCEEDED",
                                      "NOT_FOUND",
                                      "ALREADY_EXISTS",
                                      "PERMISSION_DENIED",
                                      "RESOURCE_EXHAUSTED",
                                      "FAILED_PRECONDITION",
                                      "ABORTED",
                                      "OUT_OF_RANGE",
                                      "UNIMPLEMENTED",
                                      "INTERNAL",
                                      "UNAVAILABLE",
                                      "DATA_LOSS",
                                      "UNAUTHENTICATED"};
  return code >= 0 && code <= 16 ? names[code] : "UNKNOWN";
}

static const char *method_of(const kilnd_call *c) {
  return c->method ? c->method->name : "unknown";
}

void kilnd_log_call(const kilnd_call *c, int64_t ns) {
  if (format == KILND_LOG_TEXT && !c->srv->cfg.log_requests) return;
  kilnd_log_rec r;
  kilnd_log_begin(&r, KILN_LOG_INFO, "request");
  kilnd_log_str(&r, "request_id", c->request_id);
  kilnd_log_str(&r, "client", c->client);
  kilnd_log_str(&r, "method", method_of(c));
  kilnd_log_str(&r, "code", kilnd_log_code_name((int)c->code));
  kilnd_log_ms(&r, "duration_ms", (double)ns / 1e6);
  kilnd_log_str(&r, "cache", c->log_cache ? c->log_cache : "none");
  kilnd_log_str(&r, "key", c->log_key);
  kilnd_log_end(&r);
}

void kilnd_log_audit(kilnd_log_rec *r, const kilnd_call *c, const char *event) {
  kilnd_log_begin(r, KILN_LOG_INFO, "audit");
  kilnd_log_str(r, "event", event);
  kilnd_log_str(r, "request_id", c ? c->request_id : "");
  kilnd_log_str(r, "client", c ? c->client : "");
  kilnd_log_str(r, "method", c ? method_of(c) : "");
}

void kilnd_log_grpc(struct gpr_log_func_args *args) {
  kiln_log_level level = args->severity == GPR_LOG_SEVERITY_ERROR  ? KILN_LOG_ERROR
                         : args->severity == GPR_LOG_SEVERITY_INFO ? KILN_LOG_INFO
                                                                   : KILN_LOG_DEBUG;
  const char *msg = args->message ? args->message : "";
  kilnd_log_rec r;
  if (strstr(msg, "Handshake failed")) {
    kilnd_log_audit(&r, NULL, "tls_failure");
    kilnd_log_str(&r, "reason", msg);
  } else {
    kilnd_log_begin(&r, level, msg);
    kilnd_log_str(&r, "component", "grpc");
  }
  const char *file = args->file ? strrchr(args->file, '/') : NULL;
  kilnd_log_str(&r, "file", file ? file + 1 : args->file);
  kilnd_log_int(&r, "line", args->line);
  kilnd_log_end(&r);
}

/* splitmix64 over a random seed and a counter: distinct for every call of
 * this process, not guessable from another's. */
void kilnd_log_request_id(char out[17]) {
  static _Atomic uint64_t seed, counter;
  uint64_t s = atomic_load(&seed);
  if (s == 0) {
    uint64_t fresh = 0;
    if (getrandom(&fresh, sizeof fresh, GRND_NONBLOCK) != (ssize_t)sizeof fresh)
      fresh = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    fresh |= 1;
    uint64_t expected = 0;
    s = atomic_compare_exchange_strong(&seed, &expected, fresh) ? fresh : expected;
  }
  uint64_t z = s + atomic_fetch_add(&counter, 1) * UINT64_C(0x9e3779b97f4a7c15);
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  z ^= z >> 31;
  snprintf(out, 17, "%016llx", (unsigned long long)z);
}
