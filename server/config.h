/* kilnd's configuration: one table of options, three sources.
 *
 * Every option is one row of KILND_OPTIONS: its flag name, type, field,
 * default and help text. The same name is the flag (--cpu-devices 4 or
 * --cpu-devices=4), the config file key (cpu-devices = 4, or cpu_devices)
 * and, upper-cased with '_' for '-' and a KILN_ prefix, the environment
 * variable (KILN_CPU_DEVICES=4). Later sources win: defaults, then the config
 * file (--config PATH or KILN_CONFIG), then the environment, then flags.
 * `kilnd --help` prints the table, so it documents every option.
 *
 * This file has no dependency on gRPC or libuv, so its tests link it alone.
 */
#ifndef KILN_SERVER_CONFIG_H
#define KILN_SERVER_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILND_MiB (UINT64_C(1) << 20)
#define KILND_GiB (UINT64_C(1) << 30)

/* X(name, KIND, field, default, help). Kinds: STR (char *), U64 (uint64_t,
 * accepts K/M/G/T and Ki/Mi/Gi/Ti suffixes), SEC (double seconds, accepts
 * ms/s/m/h suffixes), BOOL (true/false/1/0/yes/no/on/off). */
#define KILND_OPTIONS(X) \
  X("listen", STR, listen, "127.0.0.1:50051", \
    "gRPC address HOST:PORT; port 0 picks a free port (printed on stdout)") \
  X("metrics-listen", STR, metrics_listen, "127.0.0.1:9464", \
    "Prometheus /metrics HTTP address HOST:PORT; port 0 picks one; 'off' disables it") \
  X("health-listen", STR, health_listen, "", \
    "plaintext HOST:PORT serving only grpc.health.v1 (for probes that send no TLS and no " \
    "token); port 0 picks one (printed on stdout); \"\": none") \
  X("tls-cert", STR, tls_cert, "", \
    "PEM certificate chain of the gRPC port; with --tls-key the port speaks TLS only. " \
    "Reloaded with the key (and client CA) on SIGHUP, for new connections") \
  X("tls-key", STR, tls_key, "", "PEM private key matching --tls-cert") \
  X("tls-client-ca", STR, tls_client_ca, "", \
    "PEM CA certificates: clients must present a certificate they signed (mutual TLS); " \
    "without --tokens the certificate's subject is the client's identity") \
  X("tokens", STR, tokens, "", \
    "bearer token file, lines 'sha256:<hex digest of the token> CLIENT ROLE' (ROLE user or " \
    "admin); calls then need 'authorization: Bearer TOKEN' and the client is CLIENT, not " \
    "its kiln-client metadata; \"\": no authentication") \
  X("cpu-devices", U64, cpu_devices, "1", "CPU worker devices (1 to 256)") \
  X("cpu-threads", U64, cpu_threads, "0", \
    "threads per CPU device; 0 shares the cores among the devices") \
  X("interp-devices", U64, interp_devices, "1", \
    "reference interpreter devices (1 to 256): executions of 'interp' programs at once") \
  X("default-backend", STR, default_backend, "cpu", \
    "backend for Compile requests that name none: cpu or interp (cpu falls back to interp " \
    "for programs it cannot compile)") \
  X("cq-threads", U64, cq_threads, "2", "gRPC completion-queue threads (1 to 64)") \
  X("compile-threads", U64, compile_threads, "2", "compile thread pool size (1 to 128)") \
  X("compile-queue-depth", U64, compile_queue_depth, "64", \
    "compiles queued or running at once; more are RESOURCE_EXHAUSTED") \
  X("queue-depth", U64, queue_depth, "1024", \
    "executions queued for devices, all clients; more are RESOURCE_EXHAUSTED") \
  X("client-queue-depth", U64, client_queue_depth, "256", \
    "executions queued for devices per client") \
  X("max-message-bytes", U64, max_message_bytes, "64Mi", \
    "largest gRPC message received (bulk data goes through PutBuffer/GetBuffer streams)") \
  X("max-module-bytes", U64, max_module_bytes, "16Mi", \
    "largest program (HLO text or serialized module) accepted by Compile") \
  X("max-nesting", U64, max_nesting, "256", \
    "deepest nesting of called computations (calls, whiles, conditionals, fusions) a Compile " \
    "accepts, 1 to 4096; deeper programs are INVALID_ARGUMENT") \
  X("max-elements", U64, max_elements, "256Mi", \
    "largest element count of any one array (shapes, arguments, buffers)") \
  X("max-buffer-bytes", U64, max_buffer_bytes, "4Gi", "largest single uploaded buffer") \
  X("client-memory-bytes", U64, client_memory_bytes, "4Gi", \
    "per-client quota of server-resident buffer memory; 0: none") \
  X("server-memory-bytes", U64, server_memory_bytes, "0", \
    "quota of all server-resident buffers together; 0: half of the physical memory") \
  X("max-buffers-per-client", U64, max_buffers_per_client, "65536", \
    "live buffer handles per client; 0: none") \
  X("buffer-lease-seconds", SEC, buffer_lease_seconds, "600", \
    "a client's buffers are released once it has made no call for this long (any call " \
    "renews the lease; the Python client renews it while it runs), so a client that is " \
    "killed leaks nothing; 0: buffers live until released") \
  X("max-executables", U64, max_executables, "1024", \
    "compiled executables kept; the least recently used unreferenced one is evicted") \
  X("executable-table-bytes", U64, executable_table_bytes, "2Gi", \
    "memory of the compiled executables kept (modules, tables, code); past it the least " \
    "recently used unreferenced one is evicted; 0: no bound but max-executables") \
  X("run-timeout", SEC, run_timeout, "300", \
    "longest one execution may run (the call's deadline may cut it shorter)") \
  X("run-memory-bytes", U64, run_memory_bytes, "4Gi", \
    "memory one execution may hold: the interpreter's live values, a compiled program's " \
    "temporaries and results (checked before they are allocated)") \
  X("compile-timeout", SEC, compile_timeout, "120", \
    "limit on one whole Compile (parse, verify, transforms, passes, code generation, the C " \
    "compiler); the call's deadline may cut it shorter") \
  X("allow-user-kernels", BOOL, allow_user_kernels, "false", \
    "take RegisterKernel: C kernels clients send are compiled and run in this process (admins " \
    "only when tokens are on); off, RegisterKernel is PERMISSION_DENIED") \
  X("user-kernel-max-bytes", U64, user_kernel_max_bytes, "256Ki", \
    "largest user kernel source RegisterKernel takes (its object: 16 times that, 4Mi at least)") \
  X("user-kernel-timeout", SEC, user_kernel_timeout, "30", \
    "limit on the C compiler for one RegisterKernel") \
  X("drain-grace", SEC, drain_grace, "1", \
    "on SIGTERM/SIGINT, how long new calls are still served (health says NOT_SERVING at " \
    "once) before they are refused with UNAVAILABLE") \
  X("drain-timeout", SEC, drain_timeout, "30", \
    "on SIGTERM/SIGINT, how long running calls may finish before they are cancelled") \
  X("chunk-bytes", U64, chunk_bytes, "1Mi", \
    "GetBuffer chunk size when the request sets none (64Ki at least; smaller requests get " \
    "64Ki chunks)") \
  X("stream-idle-timeout", SEC, stream_idle_timeout, "30", \
    "a PutBuffer stream that sends nothing for this long gives back its memory reservation " \
    "and ends with DEADLINE_EXCEEDED; 0: never") \
  X("log-requests", BOOL, log_requests, "false", \
    "with --log-format text, log every finished call on stderr (the structured formats " \
    "always do)") \
  X("log-format", STR, log_format, "text", \
    "stderr log lines: text (\"kilnd: message\"), logfmt or json (one record per line: " \
    "time, level, msg and fields; a request line per finished call and audit lines)") \
  X("log-level", STR, log_level, "info", \
    "least severe log line written: debug, info, warn, error") \
  X("cache-memory-bytes", U64, cache_memory_bytes, "256Mi", \
    "executable cache: bytes of serialized executables kept in memory; 0 disables the tier") \
  X("cache-dir", STR, cache_dir, "", \
    "executable cache: a local directory tier (created 0700); \"\": none") \
  X("cache-disk-bytes", U64, cache_disk_bytes, "4Gi", \
    "executable cache: most bytes the directory tier holds") \
  X("redis-url", STR, redis_url, "", \
    "executable cache shared by servers: host:port, redis://[:password@]host:port[/db] or " \
    "unix:/path[?db=N]; \"\": none. Run Redis with maxmemory-policy allkeys-lru") \
  X("redis-ttl-s", U64, redis_ttl_s, "604800", "lifetime of a Redis cache entry, seconds") \
  X("redis-timeout-ms", U64, redis_timeout_ms, "200", \
    "limit on each Redis operation and connect; a slow or down Redis is a miss, never a " \
    "failed request") \
  X("cache-secret-file", STR, cache_secret_file, "", \
    "file holding the cluster secret that signs cache entries (16 bytes or more; one " \
    "trailing newline is ignored); KILN_CACHE_SECRET gives it directly (environment only). " \
    "None: <cache-dir>/secret, generated there if missing, or a random one per process") \
  X("cache-min-compile-ms", U64, cache_min_compile_ms, "0", \
    "builds faster than this many milliseconds are not stored in the cache") \
  X("cache-lock-ttl-ms", U64, cache_lock_ttl_ms, "30000", \
    "how long a server's Redis build lock lasts: the longest other servers wait for its " \
    "build before building themselves") \
  X("mesh-name", STR, mesh_name, "", \
    "a GPU mesh across hosts (NCCL): its name, letters, digits and ._- (at most 64); every " \
    "host of the mesh gives the same name, ranks, devices, Redis and generation; \"\": none") \
  X("mesh-ranks", U64, mesh_ranks, "1", "hosts in the mesh (1 to 1024)") \
  X("mesh-rank", U64, mesh_rank, "0", \
    "this host's rank in the mesh (0 to mesh-ranks - 1); rank 0 mints the NCCL id") \
  X("mesh-devices", U64, mesh_devices, "0", \
    "GPUs each host gives the mesh (from mesh-first-device on); 0: all of this host's") \
  X("mesh-first-device", U64, mesh_first_device, "0", \
    "the first GPU this host gives the mesh: cuda:N") \
  X("mesh-redis", STR, mesh_redis, "", \
    "HOST:PORT of the Redis where the mesh's ranks agree on the NCCL id at its first use " \
    "(key kiln:nccl:<mesh-name>:<mesh-generation>); needed when mesh-ranks > 1") \
  X("mesh-generation", U64, mesh_generation, "1", \
    "the mesh's generation: a restarted mesh takes a new one, so no rank reads an old id") \
  X("mesh-timeout", SEC, mesh_timeout, "60", \
    "how long the mesh's first use waits for the id and the other ranks' NCCL init")

typedef struct kilnd_config {
#define KILND_FIELD_STR char *
#define KILND_FIELD_U64 uint64_t
#define KILND_FIELD_SEC double
#define KILND_FIELD_BOOL bool
#define X(name, kind, field, dflt, help) KILND_FIELD_##kind field;
  KILND_OPTIONS(X)
#undef X
  char *config_path; /* --config / KILN_CONFIG, or NULL */
  /* KILN_CACHE_SECRET, from the environment only (a flag would show in
   * ps), or NULL. */
  char *cache_secret;
} kilnd_config;

typedef enum kilnd_config_action {
  KILND_CONFIG_RUN,     /* start the server */
  KILND_CONFIG_HELP,    /* --help was given */
  KILND_CONFIG_VERSION, /* --version was given */
} kilnd_config_action;

/* Fills c with the defaults. Release with kilnd_config_free. */
int kilnd_config_init(kilnd_config *c, kiln_status *st);
/* Reads a whole text file of at most max_mib MiB into *out (NUL-terminated,
 * the caller frees it with kiln_free); a file holding a NUL byte is refused.
 * `what` names the file in messages ("config file"). */
int kilnd_read_file(const char *path, const char *what, size_t max_mib, char **out,
                    kiln_status *st);
void kilnd_config_free(kilnd_config *c);

/* Sets option `name` (flag spelling; '_' accepted for '-') from text.
 * `source` names where the value came from, for messages ("--cpu-devices",
 * "KILN_CPU_DEVICES", "kilnd.conf:3"). KILN_EINVAL for an unknown name or a
 * bad value. */
int kilnd_config_set(kilnd_config *c, const char *name, const char *value, const char *source,
                     kiln_status *st);

/* Applies config-file text (key = value lines, '#' comments, blank lines). */
int kilnd_config_apply_file_text(kilnd_config *c, const char *text, const char *filename,
                                 kiln_status *st);
/* Applies KILN_* variables from envp (NULL-terminated "NAME=value" strings). */
int kilnd_config_apply_env(kilnd_config *c, char *const *envp, kiln_status *st);

/* The whole sequence: defaults, the file (from --config or KILN_CONFIG in
 * envp), envp, then argv. *action says what main should do. */
int kilnd_config_load(kilnd_config *c, int argc, char *const *argv, char *const *envp,
                      kilnd_config_action *action, kiln_status *st);

/* Checks ranges that span options (device counts, queue depths). */
int kilnd_config_check(const kilnd_config *c, kiln_status *st);

/* The cluster secret of the executable cache: KILN_CACHE_SECRET, else the
 * contents of --cache-secret-file without one trailing newline, else NULL
 * (*out kiln_malloc'd). KILN_EIO naming the file when it cannot be read. */
int kilnd_config_cache_secret(const kilnd_config *c, char **out, kiln_status *st);

/* --server-memory-bytes, or half of the physical memory when it is 0
 * (sysconf; 4 GiB when that cannot be read). */
uint64_t kilnd_config_server_memory(const kilnd_config *c);

/* Writes the usage text, one paragraph per option. */
void kilnd_config_usage(FILE *out);

#ifdef __cplusplus
}
#endif
#endif /* KILN_SERVER_CONFIG_H */
