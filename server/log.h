/* kilnd's logger: every line kilnd writes on stderr goes through here.
 *
 * Three formats (--log-format): `text`, the plain "kilnd: message" lines
 * kilnd always wrote (fields appended as key=value); `logfmt`, one
 * key=value record per line; `json`, one JSON object per line. Structured
 * records always begin with time (RFC 3339, UTC, milliseconds), level and
 * msg. --log-level drops records below it.
 *
 * What is logged:
 *   msg=request   one per finished call: request_id (also sent to the
 *                 caller as the trailing metadata kiln-request-id), client,
 *                 method, code, duration_ms, cache (memory, disk, redis,
 *                 single-flight, compiled, or none for calls that look up no
 *                 executable) and key (the executable key, "" when none).
 *                 Written in the structured formats, and in text with
 *                 --log-requests.
 *   msg=audit     event=compile (an executable built), event=evict (a
 *                 CacheEvict), event=auth_failure and event=permission_denied
 *                 (a call refused by authentication or by its role), with the
 *                 request id and client of the call that caused it;
 *                 event=tls_failure (a TLS handshake that failed, reported
 *                 by the gRPC core, which names no call).
 *   anything else kilnd or its libraries (common/log.h) report.
 *
 * A record is built in a fixed buffer on the caller's stack and written
 * with one write(2), so lines of concurrent threads never interleave; a
 * record too long for the buffer is cut, never split.
 */
#ifndef KILN_SERVER_LOG_H
#define KILN_SERVER_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/log.h"
#include "common/status.h"

typedef struct kilnd_call kilnd_call;

typedef enum kilnd_log_format {
  KILND_LOG_TEXT,
  KILND_LOG_LOGFMT,
  KILND_LOG_JSON,
} kilnd_log_format;

/* Sets the format ("text", "logfmt", "json") and the level ("debug",
 * "info", "warn", "error"), and makes this logger the sink of common/log.h.
 * KILN_EINVAL naming the option for any other spelling. */
int kilnd_log_configure(const char *format, const char *level, kiln_status *st);
/* Changes the level alone (SIGHUP's reload); the format stays. */
int kilnd_log_set_level(const char *level, kiln_status *st);
const char *kilnd_log_level_now(void);
const char *kilnd_log_format_name(kilnd_log_format f);
kilnd_log_format kilnd_log_get_format(void);
bool kilnd_log_enabled(kiln_log_level level);

#define KILND_LOG_LINE_MAX 4096

/* One record under construction. */
typedef struct kilnd_log_rec {
  kiln_log_level level;
  size_t n;
  size_t good; /* length up to the last field that fitted whole */
  bool cut;    /* a field did not fit */
  bool skip;   /* below the level: nothing is built */
  char buf[KILND_LOG_LINE_MAX];
} kilnd_log_rec;

void kilnd_log_begin(kilnd_log_rec *r, kiln_log_level level, const char *msg);
void kilnd_log_str(kilnd_log_rec *r, const char *key, const char *value);
void kilnd_log_int(kilnd_log_rec *r, const char *key, int64_t value);
/* A float with three decimals (durations in milliseconds). */
void kilnd_log_ms(kilnd_log_rec *r, const char *key, double value);
void kilnd_log_end(kilnd_log_rec *r);

/* Free text at a level (msg is the formatted text). */
void kilnd_logl(kiln_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Info, or warn when the text begins "warning: " (how kilnd marked them). */
void kilnd_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The request line of a finished call that took `ns`. */
void kilnd_log_call(const kilnd_call *c, int64_t ns);
/* Starts an audit record for call c (event, request_id, client, method);
 * the caller adds fields and ends it. c may be NULL. */
void kilnd_log_audit(kilnd_log_rec *r, const kilnd_call *c, const char *event);

/* The gRPC core's own lines (gpr_set_log_function), in the structured
 * formats: component=grpc with file and line; a failed TLS handshake (a
 * client without a certificate, or one the CA did not sign) is an audit
 * line, event=tls_failure. In text format kilnd leaves gRPC's lines as
 * gRPC writes them. */
struct gpr_log_func_args;
void kilnd_log_grpc(struct gpr_log_func_args *args);

/* A new request id: 16 lowercase hex digits, unique in this process and
 * unpredictable across processes. */
void kilnd_log_request_id(char out[17]);

/* The name of a gRPC status code ("NOT_FOUND"). */
const char *kilnd_log_code_name(int code);

#endif /* KILN_SERVER_LOG_H */
