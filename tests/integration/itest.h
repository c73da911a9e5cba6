/* Helpers for the integration tests: a real kilnd on a free loopback port,
 * a tiny HTTP client for /metrics and a Prometheus text-format parser.
 *
 * kilnd is found through the environment variable KILND (ctest sets it to
 * the built binary); when it is not there the tests exit 77, which ctest
 * reports as skipped. The server is started once per test program, before
 * Check forks its test cases, and is told to pick its own ports (port 0):
 * it prints them on stdout, which goes to a log file the harness reads.
 * The parent process never initializes gRPC, so forked cases start clean.
 */
#ifndef KILN_TESTS_INTEGRATION_ITEST_H
#define KILN_TESTS_INTEGRATION_ITEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct itest_kilnd {
  pid_t pid;
  char addr[128];    /* gRPC "127.0.0.1:PORT" */
  char metrics[128]; /* HTTP "127.0.0.1:PORT", or "" when not printed */
  char dir[256];     /* temporary directory with kilnd.out and kilnd.err */
} itest_kilnd;

/* The kilnd binary (env KILND), or NULL when it is not built. */
const char *itest_kilnd_path(void);
/* Exits 77 (skipped) with a message when kilnd is not built. */
void itest_require_kilnd(const char *test_name);

/* Starts kilnd --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 plus
 * `extra` (NULL-terminated, may be NULL) and waits until it has printed
 * its address. 0, or -1 after printing why. */
int itest_kilnd_start(itest_kilnd *k, const char *const *extra);
/* Sends `sig` and waits up to timeout_s for the exit. Returns the wait
 * status, or -1 when it did not exit in time (it is then killed). */
int itest_kilnd_stop(itest_kilnd *k, int sig, double timeout_s);
bool itest_kilnd_alive(const itest_kilnd *k);
/* Prints the server's stderr log (for failures). */
void itest_kilnd_dump_log(const itest_kilnd *k);

struct Suite; /* Check's */
/* Runs suite s (fork mode) against the started kilnd k, then stops k with
 * SIGTERM. A kilnd that died during the tests or does not exit 0 is a
 * failure too; on any failure its log is printed. Returns main's exit
 * status: 0 or 1. */
int itest_run_suite(const char *test_name, struct Suite *s, itest_kilnd *k);

/* HLO text of a counting loop: ENTRY (n: s32[]) -> s32[] runs n iterations
 * and returns n, so a test chooses how long a run takes. */
extern const char itest_spin_hlo[];

/* Seconds on a monotonic clock. */
double itest_now(void);

/* HTTP GET http://addr/path. *body is malloc'd (NUL-terminated); *status
 * is the HTTP status code. 0 or -1. */
int itest_http_get(const char *addr, const char *path, int *status, char **body, size_t *len);

/* A parsed Prometheus text exposition. */
typedef struct itest_sample {
  char name[128];
  char labels[512]; /* as written between the braces, "" when none */
  double value;
} itest_sample;

typedef struct itest_metrics {
  itest_sample *samples;
  size_t n;
  size_t ntypes; /* # TYPE lines */
} itest_metrics;

/* Parses the text format strictly: metric and label names, quoted label
 * values with escapes, a float value (NaN, +Inf, -Inf allowed), an optional
 * timestamp, # HELP / # TYPE lines with known types. On error, -1 and a
 * message in err naming the line. */
int itest_metrics_parse(const char *text, itest_metrics *out, char *err, size_t errlen);
void itest_metrics_free(itest_metrics *m);
/* The value of the first sample named `name` whose labels contain
 * `labels_sub` (NULL: any); NAN when there is none. */
double itest_metrics_value(const itest_metrics *m, const char *name, const char *labels_sub);
/* The sum over every sample named `name` (0 when none). */
double itest_metrics_sum(const itest_metrics *m, const char *name);

/* Runs argv (argv[0] a path) and captures stdout and stderr (malloc'd);
 * returns the exit status (or -1). */
int itest_run(char *const *argv, char **out, char **err);

#endif /* KILN_TESTS_INTEGRATION_ITEST_H */
