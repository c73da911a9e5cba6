/* kilnd's configuration: the option table expanded into a descriptor array
 * (name, kind, field offset, default, help), value parsers per kind, and the
 * three sources applied in order of precedence.
 *
 * Every string option owns a heap copy, so a value may be set any number of
 * times (file, then environment, then flag) without leaking.
 */
#include "server/config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "executor/backend.h"

typedef enum kind { K_STR, K_U64, K_SEC, K_BOOL } kind;

typedef struct option {
  const char *name;
  kind k;
  size_t offset;
  const char *dflt;
  const char *help;
} option;

static const option options[] = {
#define X(name, kind, field, dflt, help) \
  {name, K_##kind, offsetof(kilnd_config, field), dflt, help},
    KILND_OPTIONS(X)
#undef X
};
#define NOPTIONS (sizeof options / sizeof options[0])

/* Flag spelling with '_' read as '-', so config files may use either. */
static const option *find_option(const char *name, size_t len) {
  for (size_t i = 0; i < NOPTIONS; i++) {
    const char *o = options[i].name;
    if (strlen(o) != len) continue;
    size_t k = 0;
    while (k < len && (name[k] == o[k] || (name[k] == '_' && o[k] == '-'))) k++;
    if (k == len) return &options[i];
  }
  return NULL;
}

/* ---- value parsers ------------------------------------------------------------------ */

static int bad(kiln_status *st, const char *source, const char *value, const char *expected) {
  return kiln_status_set(st, KILN_EINVAL, source, "'%.64s' is not %s", value, expected);
}

static int parse_u64(const char *v, const char *source, uint64_t *out, kiln_status *st) {
  if (!isdigit((unsigned char)v[0])) return bad(st, source, v, "a non-negative integer");
  errno = 0;
  char *end;
  unsigned long long n = strtoull(v, &end, 10);
  if (errno == ERANGE) return bad(st, source, v, "an integer below 2^64");
  static const struct {
    const char *suffix;
    uint64_t mul;
  } units[] = {
      {"", 1},
      {"K", UINT64_C(1000)},
      {"M", UINT64_C(1000000)},
      {"G", UINT64_C(1000000000)},
      {"T", UINT64_C(1000000000000)},
      {"Ki", UINT64_C(1) << 10},
      {"Mi", UINT64_C(1) << 20},
      {"Gi", UINT64_C(1) << 30},
      {"Ti", UINT64_C(1) << 40},
  };
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    if (strcmp(end, units[i].suffix) != 0) continue;
    if (n > UINT64_MAX / units[i].mul) return bad(st, source, v, "an integer below 2^64");
    *out = (uint64_t)n * units[i].mul;
    return 0;
  }
  return bad(st, source, v, "an integer with an optional K, M, G, T, Ki, Mi, Gi or Ti suffix");
}

static int parse_sec(const char *v, const char *source, double *out, kiln_status *st) {
  if (!isdigit((unsigned char)v[0]) && v[0] != '.')
    return bad(st, source, v, "a non-negative number of seconds");
  char *end;
  double x = strtod(v, &end);
  static const struct {
    const char *suffix;
    double mul;
  } units[] = {
      {"", 1}, {"s", 1}, {"ms", 1e-3}, {"m", 60}, {"h", 3600},
  };
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    if (strcmp(end, units[i].suffix) != 0) continue;
    x *= units[i].mul;
    if (!isfinite(x) || x > 1e9) return bad(st, source, v, "a duration below 10^9 seconds");
    *out = x;
    return 0;
  }
  return bad(st, source, v, "a number of seconds with an optional ms, s, m or h suffix");
}

static int parse_bool(const char *v, const char *source, bool *out, kiln_status *st) {
  static const char *const yes[] = {"true", "1", "yes", "on"};
  static const char *const no[] = {"false", "0", "no", "off"};
  for (size_t i = 0; i < 4; i++) {
    if (strcmp(v, yes[i]) == 0) return *out = true, 0;
    if (strcmp(v, no[i]) == 0) return *out = false, 0;
  }
  return bad(st, source, v, "a boolean (true/false, 1/0, yes/no, on/off)");
}

static int set_value(kilnd_config *c, const option *o, const char *v, const char *source,
                     kiln_status *st) {
  void *field = (char *)c + o->offset;
  switch (o->k) {
  case K_STR: {
    char *copy = kiln_strdup(v);
    if (copy == NULL) return kiln_status_set(st, KILN_ENOMEM, source, "out of memory");
    kiln_free(*(char **)field);
    *(char **)field = copy;
    return 0;
  }
  case K_U64: return parse_u64(v, source, field, st);
  case K_SEC: return parse_sec(v, source, field, st);
  case K_BOOL: return parse_bool(v, source, field, st);
  }
  return KILN_EINTERNAL;
}

/* ---- sources ----------------------------------------------------------------------- */

int kilnd_config_init(kilnd_config *c, kiln_status *st) {
  memset(c, 0, sizeof *c);
  for (size_t i = 0; i < NOPTIONS; i++) {
    int rc = set_value(c, &options[i], options[i].dflt, "default", st);
    if (rc) return rc;
  }
  return 0;
}

void kilnd_config_free(kilnd_config *c) {
  for (size_t i = 0; i < NOPTIONS; i++)
    if (options[i].k == K_STR) {
      char **p = (char **)((char *)c + options[i].offset);
      kiln_free(*p);
      *p = NULL;
    }
  kiln_free(c->config_path);
  c->config_path = NULL;
  kiln_free(c->cache_secret);
  c->cache_secret = NULL;
}

int kilnd_config_set(kilnd_config *c, const char *name, const char *value, const char *source,
                     kiln_status *st) {
  const option *o = find_option(name, strlen(name));
  if (o == NULL)
    return kiln_status_set(st, KILN_EINVAL, source, "unknown option '%.64s' (see kilnd --help)",
                           name);
  return set_value(c, o, value, source, st);
}

static char *trim(char *s) {
  while (*s == ' ' || *s == '\t') s++;
  char *e = s + strlen(s);
  while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r')) *--e = '\0';
  return s;
}

/* One "key = value" line, already without its comment. */
static int apply_line(kilnd_config *c, char *line, const char *where, kiln_status *st) {
  char *s = trim(line);
  if (*s == '\0') return 0;
  char *eq = strchr(s, '=');
  if (eq == NULL)
    return kiln_status_set(st, KILN_EINVAL, where, "expected 'key = value', found '%.64s'", s);
  *eq = '\0';
  char *key = trim(s), *value = trim(eq + 1);
  size_t vlen = strlen(value);
  if (vlen >= 2 && value[0] == '"' && value[vlen - 1] == '"') {
    value[vlen - 1] = '\0';
    value++;
  }
  if (strcmp(key, "config") == 0)
    return kiln_status_set(st, KILN_EINVAL, where, "a config file cannot name another one");
  return kilnd_config_set(c, key, value, where, st);
}

int kilnd_config_apply_file_text(kilnd_config *c, const char *text, const char *filename,
                                 kiln_status *st) {
  char *copy = kiln_strdup(text);
  if (copy == NULL) return kiln_status_set(st, KILN_ENOMEM, filename, "out of memory");
  int rc = 0;
  unsigned lineno = 0;
  for (char *line = copy, *next; line && rc == 0; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = '\0';
    lineno++;
    char *hash = strchr(line, '#');
    if (hash) *hash = '\0';
    char where[320];
    snprintf(where, sizeof where, "%.256s:%u", filename, lineno);
    rc = apply_line(c, line, where, st);
  }
  kiln_free(copy);
  return rc;
}

/* `what` names the file in messages ("config file"). */
int kilnd_read_file(const char *path, const char *what, size_t max_mib, char **out,
                    kiln_status *st) {
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return kiln_status_set(st, KILN_EIO, path, "cannot open %s: %s", what, strerror(errno));
  char *buf = NULL;
  size_t len = 0, cap = 0;
  int rc = 0;
  for (;;) {
    if (kiln_grow((void **)&buf, &cap, len + 4097, 1)) {
      rc = kiln_status_set(st, KILN_ENOMEM, path, "out of memory");
      break;
    }
    size_t n = fread(buf + len, 1, 4096, f);
    len += n;
    if (n < 4096) break;
    if (len > (max_mib << 20)) {
      rc = kiln_status_set(st, KILN_ELIMIT, path, "%s larger than %zu MiB", what, max_mib);
      break;
    }
  }
  if (rc == 0 && ferror(f)) rc = kiln_status_set(st, KILN_EIO, path, "cannot read %s", what);
  fclose(f);
  if (rc) {
    kiln_free(buf);
    return rc;
  }
  buf[len] = '\0';
  if (memchr(buf, '\0', len))
    rc = kiln_status_set(st, KILN_EINVAL, path, "%s contains a NUL byte", what);
  if (rc)
    kiln_free(buf);
  else
    *out = buf;
  return rc;
}

/* "KILN_CPU_DEVICES" -> "cpu-devices" in buf; false when not a KILN_ name. */
static bool env_to_option(const char *var, size_t len, char *buf, size_t size) {
  if (len <= 5 || strncmp(var, "KILN_", 5) != 0 || len - 5 >= size) return false;
  for (size_t i = 5; i < len; i++) {
    char ch = var[i];
    buf[i - 5] = ch == '_' ? '-' : (char)tolower((unsigned char)ch);
  }
  buf[len - 5] = '\0';
  return true;
}

int kilnd_config_apply_env(kilnd_config *c, char *const *envp, kiln_status *st) {
  for (size_t i = 0; envp && envp[i]; i++) {
    const char *eq = strchr(envp[i], '=');
    char name[64];
    if (eq && strncmp(envp[i], "KILN_CACHE_SECRET=", 18) == 0) {
      char *copy = kiln_strdup(eq + 1);
      if (copy == NULL)
        return kiln_status_set(st, KILN_ENOMEM, "KILN_CACHE_SECRET", "out of memory");
      kiln_free(c->cache_secret);
      c->cache_secret = copy;
      continue;
    }
    if (eq == NULL || !env_to_option(envp[i], (size_t)(eq - envp[i]), name, sizeof name)) continue;
    /* KILN_CONFIG names the file; other KILN_ variables belong to other
     * parts of Kiln (KILN_CC, KILN_CORPUS_DIR): only known options apply. */
    const option *o = find_option(name, strlen(name));
    if (o == NULL) continue;
    char source[80];
    snprintf(source, sizeof source, "%.*s", (int)(eq - envp[i]), envp[i]);
    int rc = set_value(c, o, eq + 1, source, st);
    if (rc) return rc;
  }
  return 0;
}

/* ---- the command line -------------------------------------------------------------- */

/* Finds --config in argv (it must apply before the environment and flags). */
static int find_config_flag(int argc, char *const *argv, const char **path, kiln_status *st) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--config") == 0) {
      if (i + 1 >= argc) return kiln_status_set(st, KILN_EINVAL, "--config", "needs a path");
      *path = argv[++i];
    } else if (strncmp(argv[i], "--config=", 9) == 0) {
      *path = argv[i] + 9;
    }
  }
  return 0;
}

static int apply_config_file(kilnd_config *c, int argc, char *const *argv, char *const *envp,
                             kiln_status *st) {
  const char *path = NULL;
  for (size_t i = 0; envp && envp[i]; i++)
    if (strncmp(envp[i], "KILN_CONFIG=", 12) == 0) path = envp[i] + 12;
  int rc = find_config_flag(argc, argv, &path, st);
  if (rc || path == NULL || path[0] == '\0') return rc;
  c->config_path = kiln_strdup(path);
  char *text = NULL;
  if (c->config_path == NULL) return kiln_status_set(st, KILN_ENOMEM, path, "out of memory");
  rc = kilnd_read_file(path, "config file", 1, &text, st);
  if (rc == 0) rc = kilnd_config_apply_file_text(c, text, path, st);
  kiln_free(text);
  return rc;
}

/* One argument at argv[*i]; consumes its value. */
static int apply_flag(kilnd_config *c, int argc, char *const *argv, int *i,
                      kilnd_config_action *action, kiln_status *st) {
  const char *arg = argv[*i];
  if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) return *action = KILND_CONFIG_HELP, 0;
  if (strcmp(arg, "--version") == 0) return *action = KILND_CONFIG_VERSION, 0;
  if (strncmp(arg, "--", 2) != 0)
    return kiln_status_set(st, KILN_EINVAL, arg, "unexpected argument (options start with --)");
  const char *name = arg + 2, *eq = strchr(name, '=');
  size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
  if (nlen == 6 && strncmp(name, "config", 6) == 0) {
    if (eq == NULL) (*i)++; /* already applied */
    return 0;
  }
  const option *o = find_option(name, nlen);
  if (o == NULL) return kiln_status_set(st, KILN_EINVAL, arg, "unknown option (see kilnd --help)");
  const char *value = eq ? eq + 1 : NULL;
  if (value == NULL && o->k == K_BOOL) value = "true";
  if (value == NULL) {
    if (*i + 1 >= argc) return kiln_status_set(st, KILN_EINVAL, arg, "needs a value");
    value = argv[++*i];
  }
  char source[80];
  snprintf(source, sizeof source, "--%s", o->name);
  return set_value(c, o, value, source, st);
}

int kilnd_config_load(kilnd_config *c, int argc, char *const *argv, char *const *envp,
                      kilnd_config_action *action, kiln_status *st) {
  *action = KILND_CONFIG_RUN;
  int rc = kilnd_config_init(c, st);
  if (rc == 0) rc = apply_config_file(c, argc, argv, envp, st);
  if (rc == 0) rc = kilnd_config_apply_env(c, envp, st);
  for (int i = 1; rc == 0 && i < argc && *action == KILND_CONFIG_RUN; i++)
    rc = apply_flag(c, argc, argv, &i, action, st);
  if (rc == 0 && *action == KILND_CONFIG_RUN) rc = kilnd_config_check(c, st);
  return rc;
}

static int range(kiln_status *st, const char *name, uint64_t v, uint64_t lo, uint64_t hi) {
  if (v >= lo && v <= hi) return 0;
  return kiln_status_set(st, KILN_EINVAL, name, "%llu is out of range (%llu to %llu)",
                         (unsigned long long)v, (unsigned long long)lo, (unsigned long long)hi);
}

uint64_t kilnd_config_server_memory(const kilnd_config *c) {
  if (c->server_memory_bytes) return c->server_memory_bytes;
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 4 * KILND_GiB;
  return (uint64_t)pages * (uint64_t)page / 2;
}

/* The mesh options: a name safe in a Redis key, ranks that fit, and a
 * Redis when there are other hosts. */
static int kilnd_config_check_mesh(const kilnd_config *c, kiln_status *st) {
  const char *n = c->mesh_name;
  size_t len = strlen(n);
  if (len == 0) return 0;
  if (len > 64)
    return kiln_status_set(st, KILN_EINVAL, "mesh-name", "%zu characters (at most 64)", len);
  for (size_t i = 0; i < len; i++)
    if (!(isalnum((unsigned char)n[i]) || n[i] == '.' || n[i] == '_' || n[i] == '-'))
      return kiln_status_set(st, KILN_EINVAL, "mesh-name",
                             "character %zu is not a letter, digit, '.', '_' or '-'", i + 1);
  int rc;
  if ((rc = range(st, "mesh-ranks", c->mesh_ranks, 1, 1024)) ||
      (rc = range(st, "mesh-rank", c->mesh_rank, 0, c->mesh_ranks - 1)) ||
      (rc = range(st, "mesh-devices", c->mesh_devices, 0, 16)) ||
      (rc = range(st, "mesh-first-device", c->mesh_first_device, 0, 15)) ||
      (rc = range(st, "mesh-generation", c->mesh_generation, 0, UINT64_C(1) << 53)))
    return rc;
  if (c->mesh_ranks > 1 && c->mesh_redis[0] == '\0')
    return kiln_status_set(st, KILN_EINVAL, "mesh-redis",
                           "a mesh of %llu hosts needs the HOST:PORT of a Redis for its id",
                           (unsigned long long)c->mesh_ranks);
  if (!(c->mesh_timeout > 0))
    return kiln_status_set(st, KILN_EINVAL, "mesh-timeout", "must be more than 0 seconds");
  return 0;
}

int kilnd_config_check(const kilnd_config *c, kiln_status *st) {
  int rc;
  if ((rc = range(st, "cpu-devices", c->cpu_devices, 1, 256)) ||
      (rc = range(st, "interp-devices", c->interp_devices, 1, 256)) ||
      (rc = range(st, "cpu-threads", c->cpu_threads, 0, 1024)) ||
      (rc = range(st, "cq-threads", c->cq_threads, 1, 64)) ||
      (rc = range(st, "compile-threads", c->compile_threads, 1, 128)) ||
      (rc = range(st, "compile-queue-depth", c->compile_queue_depth, 1, 1u << 20)) ||
      (rc = range(st, "queue-depth", c->queue_depth, 1, 1u << 20)) ||
      (rc = range(st, "client-queue-depth", c->client_queue_depth, 1, 1u << 20)) ||
      (rc = range(st, "max-message-bytes", c->max_message_bytes, 4096, INT32_MAX)) ||
      (rc = range(st, "max-module-bytes", c->max_module_bytes, 1, INT32_MAX)) ||
      (rc = range(st, "max-elements", c->max_elements, 1, UINT64_C(1) << 40)) ||
      (rc = range(st, "max-nesting", c->max_nesting, 1, 4096)) || /* KILN_VERIFY_MAX_NESTING */
      (rc = range(st, "max-executables", c->max_executables, 1, 1u << 20)) ||
      (rc = range(st, "chunk-bytes", c->chunk_bytes, 65536, INT32_MAX)) ||
      (rc = range(st, "redis-ttl-s", c->redis_ttl_s, 0, UINT32_MAX)) ||
      (rc = range(st, "redis-timeout-ms", c->redis_timeout_ms, 1, 600000)) ||
      (rc = range(st, "cache-min-compile-ms", c->cache_min_compile_ms, 0, UINT64_C(1) << 40)) ||
      (rc = range(st, "cache-lock-ttl-ms", c->cache_lock_ttl_ms, 100, 86400000)) ||
      (rc = kilnd_config_check_mesh(c, st)))
    return rc;
  if (c->cache_secret && c->cache_secret_file[0])
    return kiln_status_set(st, KILN_EINVAL, "cache-secret-file",
                           "KILN_CACHE_SECRET is set too: give the secret one way");
  if (kiln_backend_caps(c->default_backend) == 0) {
    char names[256];
    kiln_backend_names_join(0, " or ", names, sizeof names);
    return kiln_status_set(st, KILN_EINVAL, "default-backend", "'%.64s' is not %s",
                           c->default_backend, names);
  }
  if (c->listen[0] == '\0')
    return kiln_status_set(st, KILN_EINVAL, "listen", "needs an address HOST:PORT");
  return 0;
}

void kilnd_config_usage(FILE *out) {
  fprintf(out, "usage: kilnd [OPTION...]\n"
               "\n"
               "The Kiln compile-and-execute server: gRPC service kiln.v1.Kiln and\n"
               "grpc.health.v1.Health on --listen, Prometheus metrics on --metrics-listen.\n"
               "SIGTERM or SIGINT drains: no new calls, running ones finish, then exit 0.\n"
               "SIGHUP reloads the TLS certificates and the --tokens file, draining nothing\n"
               "(a file that fails to load keeps the old one); SIGUSR1, SIGUSR2 and SIGPIPE\n"
               "are ignored.\n"
               "\n"
               "Every option is also a config file key (--config PATH, or KILN_CONFIG; lines\n"
               "'key = value', '#' comments) and an environment variable KILN_<NAME> (upper\n"
               "case, '_' for '-'). Flags override the environment, which overrides the file.\n"
               "\n"
               "  --config PATH\n      read options from this file first\n"
               "  KILN_CACHE_SECRET   (environment only)\n"
               "      the cluster secret that signs executable cache entries, 16 bytes or more;\n"
               "      servers sharing a --cache-dir or --redis-url need the same one\n"
               "  --help, --version\n      print this text, or the version, and exit\n");
  static const char *const kinds[] = {"TEXT", "N", "SECONDS", "BOOL"};
  for (size_t i = 0; i < NOPTIONS; i++) {
    const option *o = &options[i];
    char env[64];
    size_t k = 0;
    for (const char *p = o->name; *p && k < sizeof env - 1; p++)
      env[k++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
    env[k] = '\0';
    fprintf(out, "  --%s %s   (KILN_%s, default %s)\n      %s\n", o->name, kinds[o->k], env,
            o->dflt[0] ? o->dflt : "\"\"", o->help);
  }
}

int kilnd_config_cache_secret(const kilnd_config *c, char **out, kiln_status *st) {
  *out = NULL;
  if (c->cache_secret) {
    *out = kiln_strdup(c->cache_secret);
    return *out ? 0 : kiln_status_set(st, KILN_ENOMEM, "KILN_CACHE_SECRET", "out of memory");
  }
  if (c->cache_secret_file[0] == '\0') return 0;
  char *text = NULL;
  int rc = kilnd_read_file(c->cache_secret_file, "cache secret file", 1, &text, st);
  if (rc) return rc;
  /* `echo secret > file` writes a newline that is no part of the secret. */
  size_t n = strlen(text);
  if (n && text[n - 1] == '\n') text[--n] = '\0';
  if (n && text[n - 1] == '\r') text[--n] = '\0';
  if (n == 0) {
    kiln_free(text);
    return kiln_status_set(st, KILN_EINVAL, c->cache_secret_file, "the cache secret file is empty");
  }
  *out = text;
  return 0;
}
