/* A real redis-server for tests: started on a free loopback port in its own
 * temporary directory (which also holds its log and a unix socket), waited
 * for until it answers PING, and stopped, killed, paused or restarted on the
 * same port so a test can play every fault a shared cache meets. Tests call
 * kiln_test_redis_available() first and skip with a message when it is false.
 *
 * The server runs with `--bind 127.0.0.1 --save "" --appendonly no` plus the
 * caller's extra arguments, and dies with the process that started it
 * (PR_SET_PDEATHSIG), so a test that crashes under Check's fork mode leaves no
 * server behind. KILN_REDIS_SERVER names another binary than the one on PATH.
 */
#ifndef KILN_TESTS_SUPPORT_REDIS_SERVER_H
#define KILN_TESTS_SUPPORT_REDIS_SERVER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/status.h"

typedef struct kiln_test_redis kiln_test_redis;
struct redisReply; /* hiredis */

/* Whether a redis-server binary can be run here. When it is false and why
 * is not NULL, *why says what is missing (a static string). */
bool kiln_test_redis_available(const char **why);

/* Starts redis-server with extra arguments (a NULL-terminated list, or NULL;
 * e.g. {"--maxmemory", "1mb", "--maxmemory-policy", "noeviction", NULL} or
 * {"--requirepass", "s3cret", NULL}: the password is then used for the
 * readiness PING and by kiln_test_redis_command). Waits up to 10 s for PING.
 * Retries another port when the chosen one turns out to be taken.
 * Returns 0, KILN_EUNAVAIL when redis-server is missing or never answers. */
int kiln_test_redis_start(const char *const *extra_args, kiln_test_redis **out, kiln_status *st);

/* The same with a config file holding conf_text passed first (a sentinel
 * needs one it can rewrite: conf_text "sentinel monitor ...", extra
 * {"--sentinel", NULL}). The file lives in the server's directory. */
int kiln_test_redis_start_conf(const char *conf_text, const char *const *extra_args,
                               kiln_test_redis **out, kiln_status *st);

/* Stops the server if it runs (SIGTERM, waitpid), removes its directory,
 * frees r. NULL is fine. */
void kiln_test_redis_destroy(kiln_test_redis *r);

/* "127.0.0.1:PORT"; valid until destroy, unchanged by restart. */
const char *kiln_test_redis_addr(const kiln_test_redis *r);
uint16_t kiln_test_redis_port(const kiln_test_redis *r);
/* The unix socket the server also listens on (absolute path). */
const char *kiln_test_redis_socket(const kiln_test_redis *r);
/* The server's process id, or 0 while it is not running. */
pid_t kiln_test_redis_pid(const kiln_test_redis *r);

/* SIGTERM and wait for the exit (a clean shutdown). */
void kiln_test_redis_stop(kiln_test_redis *r);
/* SIGKILL and wait (a crash: connections are reset, nothing is flushed). */
void kiln_test_redis_kill(kiln_test_redis *r);
/* SIGSTOP / SIGCONT: the server keeps its socket open but answers nothing
 * (connects complete in the kernel's backlog; commands time out). */
void kiln_test_redis_pause(kiln_test_redis *r);
void kiln_test_redis_resume(kiln_test_redis *r);
/* Starts it again on the same port with the same arguments (stopping it
 * first if it runs) and waits for PING. The data is gone (no persistence). */
int kiln_test_redis_restart(kiln_test_redis *r, kiln_status *st);

/* Runs one command on a fresh connection (AUTH first when a password was
 * given), e.g. kiln_test_redis_command(r, "TTL %s", key). Returns the reply
 * (free it with freeReplyObject from <hiredis/hiredis.h>), or NULL when the
 * server cannot be reached within 2 s. */
struct redisReply *kiln_test_redis_command(kiln_test_redis *r, const char *fmt, ...);

/* A TCP socket listening on 127.0.0.1 that never accepts nor answers:
 * connects succeed (the kernel completes them), every command times out.
 * Returns the listening fd (close it to stop) and sets *port, or -1. */
int kiln_test_silent_listener(uint16_t *port);

/* A TCP port on 127.0.0.1 that nothing listens on right now (connects are
 * refused), or 0. */
uint16_t kiln_test_free_port(void);

#endif /* KILN_TESTS_SUPPORT_REDIS_SERVER_H */
