/* The one place Kiln's libraries write a diagnostic line.
 *
 * Libraries (the cache's Redis tier, the CPU backend's start-up) do not know
 * whether they run inside kilnd, which writes structured logs, or inside
 * the kiln command, which writes plain text: they call kiln_log() with a
 * level and a component, and whoever owns the process decides how the line
 * looks by installing a sink. With no sink the line goes to stderr as
 * "COMPONENT: MESSAGE" (what they wrote before the sink existed).
 */
#ifndef KILN_COMMON_LOG_H
#define KILN_COMMON_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kiln_log_level {
  KILN_LOG_DEBUG,
  KILN_LOG_INFO,
  KILN_LOG_WARN,
  KILN_LOG_ERROR,
} kiln_log_level;

/* "debug", "info", "warn", "error". */
const char *kiln_log_level_name(kiln_log_level level);

/* Receives every line: `component` names the library ("kiln cache"),
 * `msg` is the formatted text without a newline. Called on any thread. */
typedef void (*kiln_log_sink)(kiln_log_level level, const char *component, const char *msg);

/* Installs the process's sink (NULL: back to stderr). Set it once at
 * start-up, before threads that log exist. */
void kiln_log_set_sink(kiln_log_sink sink);

void kiln_log(kiln_log_level level, const char *component, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMMON_LOG_H */
