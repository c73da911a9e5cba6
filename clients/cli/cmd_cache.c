/* kiln cache stats|list|evict|export|import|explain: a server's executable cache, and why
 * two programs do or do not share an entry.
 *
 * stats, list and evict ask the server (--server HOST:PORT) through libkiln.
 * explain compares two cache keys component by component (module,
 * signature, options, target, version): keys of two module files are
 * computed here exactly as kilnd computes them (the same key code and the
 * same target and option texts, cache/key_inputs.c), keys given as 64 hex
 * digits are looked up on the server with CacheList. Like diff, explain exits 0 when the keys are
 * the same, 1 when they differ, 2 on trouble.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "cache/key.h"
#include "clients/cli/cli.h"
#include "clients/cli/fileio.h"
#include "common/alloc.h"
#include "compiler/compile.h"
#include "compiler/target.h"
#include "executor/backend.h"

#define EXPLAIN_SAME 0
#define EXPLAIN_DIFFERS 1
#define EXPLAIN_TROUBLE 2

static bool is_key(const char *s) {
  uint8_t d[KILN_CACHE_DIGEST_LEN];
  return kiln_cache_from_hex(s, d, sizeof d) == 0;
}

/* ---- explain ------------------------------------------------------------------------- */

/* --backend/--target/-O as kilnd resolves them (server/compile_prep.c): the
 * target by kiln_target_resolve, the texts by the cache's key_inputs.c. */
static int key_inputs(const kiln__args *a, const char **backend, char target[KILN_CACHE_TEXT_MAX],
                      char options[KILN_CACHE_TEXT_MAX]) {
  const char *b = kiln__args_get(a, "backend");
  *backend = b ? b : "cpu";
  if (kiln_backend_caps(*backend) == 0) {
    char names[256];
    kiln_backend_names_join(0, " or ", names, sizeof names);
    fprintf(stderr, "kiln cache explain: unknown backend '%s' (%s)\n", *backend, names);
    return KILN_EXIT_USAGE;
  }
  const char *level = kiln__args_get(a, "opt-level");
  int opt = 2;
  if (level && kiln__opt_level_parse("cache explain", level, &opt)) return KILN_EXIT_USAGE;
  kiln_cache_options_text(opt, 1, options);
  target[0] = '\0';
  if (strcmp(*backend, "interp") == 0) return KILN_EXIT_OK; /* kilnd ignores the target */
  const kiln_target *kt;
  kiln_status st;
  kiln_status_clear(&st);
  if (kiln_target_resolve(*backend, kiln__args_get(a, "target"), &kt, &st)) {
    fprintf(stderr, "kiln cache explain: %s\n", st.msg);
    return KILN_EXIT_USAGE;
  }
  char ident[KILN_CACHE_TEXT_MAX];
  kiln_cache_code_target_text(kt->isa, kiln_compile_code_identity(kt->backend, ident, sizeof ident),
                              target);
  return KILN_EXIT_OK;
}

static int file_key(const char *path, const char *backend, const char *target, const char *options,
                    kiln_cache_key *key) {
  kiln_module *m;
  if (kiln__module_load(path, true, &m)) return EXPLAIN_TROUBLE;
  kiln_cache_key_inputs in = {
      .backend = backend, .target = target[0] ? target : NULL, .options = options};
  kiln_status st;
  kiln_status_clear(&st);
  int rc = kiln_cache_key_compute(m, &in, key, &st);
  if (rc) kiln__report(path, m, &st);
  kiln_module_destroy(m);
  return rc ? (rc == KILN_ENOMEM ? KILN_EXIT_INTERNAL : EXPLAIN_TROUBLE) : KILN_EXIT_OK;
}

static int keys_from_server(const kiln__args *a, const char *const *hex, kiln_cache_key *keys);

static int cache_explain(const kiln__args *a) {
  if (a->npos != 3) {
    fprintf(stderr, "kiln cache explain: needs two module files or two keys, not %d operands\n",
            a->npos - 1);
    return KILN_EXIT_USAGE;
  }
  const char *args[2] = {a->pos[1], a->pos[2]};
  kiln_cache_key keys[2];
  memset(keys, 0, sizeof keys);
  int rc;
  if (is_key(args[0]) && is_key(args[1])) {
    rc = keys_from_server(a, args, keys);
  } else if (is_key(args[0]) || is_key(args[1])) {
    fprintf(stderr, "kiln cache explain: compare two module files or two keys, not one of each\n");
    return KILN_EXIT_USAGE;
  } else {
    const char *backend;
    char target[KILN_CACHE_TEXT_MAX], options[KILN_CACHE_TEXT_MAX];
    rc = key_inputs(a, &backend, target, options);
    for (int i = 0; i < 2 && rc == KILN_EXIT_OK; i++)
      rc = file_key(args[i], backend, target, options, &keys[i]);
  }
  if (rc) return rc;
  for (int i = 0; i < 2; i++) printf("%s  %s\n", keys[i].hex, args[i]);
  bool same = true;
  for (int p = 0; p < KILN_CACHE_NPARTS; p++)
    if (memcmp(keys[0].parts[p], keys[1].parts[p], KILN_CACHE_DIGEST_LEN) != 0) {
      printf("differs: %s\n", kiln_cache_part_name(p));
      same = false;
    }
  if (same) printf("same key\n");
  return same ? EXPLAIN_SAME : EXPLAIN_DIFFERS;
}

#ifdef KILN_HAVE_CLIENT

#include "clients/c/kiln.h"

static bool want_server(const kiln__args *a, const char *sub) {
  if (kiln__args_get(a, "server")) return true;
  fprintf(stderr, "kiln cache %s: --server HOST:PORT is required (the cache is the server's)\n",
          sub);
  return false;
}

/* Components by name into k (in the key's order), digest recomputed. */
static int components_to_key(const kiln_server_cache_entry *e, kiln_cache_key *k) {
  for (int p = 0; p < KILN_CACHE_NPARTS; p++) {
    uint32_t i = 0;
    while (i < e->ncomponents && strcmp(e->components[i].name, kiln_cache_part_name(p)) != 0) i++;
    if (i == e->ncomponents ||
        kiln_cache_from_hex(e->components[i].digest, k->parts[p], KILN_CACHE_DIGEST_LEN) != 0) {
      fprintf(stderr, "kiln cache explain: the server sent no valid %s component for %s\n",
              kiln_cache_part_name(p), e->key);
      return EXPLAIN_TROUBLE;
    }
  }
  kiln_cache_key_from_parts(k);
  return KILN_EXIT_OK;
}

static int keys_from_server(const kiln__args *a, const char *const *hex, kiln_cache_key *keys) {
  if (!want_server(a, "explain")) return KILN_EXIT_USAGE;
  kiln_client *c;
  int rc = kiln__remote_connect(a, &c);
  if (rc) return rc == KILN_EXIT_INVALID ? EXPLAIN_TROUBLE : rc;
  kiln_server_cache_list l;
  kiln_status st;
  kiln_status_clear(&st);
  if (kiln_client_cache_list(c, hex, 2, 0, &l, &st)) {
    rc = kiln__remote_report("kiln cache explain", &st);
    kiln_client_close(c);
    return rc == KILN_EXIT_INVALID ? EXPLAIN_TROUBLE : rc;
  }
  for (int i = 0; i < 2 && rc == KILN_EXIT_OK; i++) {
    uint32_t k = 0;
    while (k < l.nentries && strcasecmp(l.entries[k].key, hex[i]) != 0) k++;
    if (k == l.nentries) {
      fprintf(stderr, "kiln cache explain: %s is not in the server's cache\n", hex[i]);
      rc = EXPLAIN_TROUBLE;
    } else {
      rc = components_to_key(&l.entries[k], &keys[i]);
    }
  }
  kiln_server_cache_list_clear(&l);
  kiln_client_close(c);
  return rc;
}

/* ---- stats, list, evict ------------------------------------------------------------- */

#define MAX_NODES_SHOWN 64

typedef struct node_row {
  char addr[160];
  int64_t up, slots, requests, errors, redirects, latency_us;
} node_row;

/* The shared tier's nodes, from the kiln_cache_redis_node_* counters, as a
 * table: one Redis shows one line; a cluster its primaries and the nodes it
 * learnt of; a sentinel setup the primaries it followed. */
static void print_nodes(const kiln_server_stats *s) {
  static const char *const fam[] = {"kiln_cache_redis_node_up",
                                    "kiln_cache_redis_node_slots",
                                    "kiln_cache_redis_node_requests_total",
                                    "kiln_cache_redis_node_errors_total",
                                    "kiln_cache_redis_node_redirects_total",
                                    "kiln_cache_redis_node_latency_microseconds_total"};
  node_row rows[MAX_NODES_SHOWN];
  size_t n = 0;
  for (uint32_t i = 0; i < s->ncounters; i++) {
    const kiln_server_counter *k = &s->counters[i];
    int f = -1;
    for (int j = 0; j < 6; j++)
      if (strcmp(k->name, fam[j]) == 0) f = j;
    const char *q = strncmp(k->labels, "node=\"", 6) == 0 ? k->labels + 6 : NULL;
    const char *end = q ? strchr(q, '"') : NULL;
    if (f < 0 || !end || (size_t)(end - q) >= sizeof rows[0].addr) continue;
    size_t r = 0;
    while (r < n && (strlen(rows[r].addr) != (size_t)(end - q) ||
                     strncmp(rows[r].addr, q, (size_t)(end - q)) != 0))
      r++;
    if (r == n) {
      if (n == MAX_NODES_SHOWN) continue;
      memset(&rows[n], 0, sizeof rows[n]);
      memcpy(rows[n].addr, q, (size_t)(end - q));
      n++;
    }
    int64_t *v[] = {&rows[r].up,     &rows[r].slots,     &rows[r].requests,
                    &rows[r].errors, &rows[r].redirects, &rows[r].latency_us};
    *v[f] = k->value;
  }
  if (n == 0) return;
  printf("shared tier: %zu node%s\n", n, n == 1 ? "" : "s");
  printf("  %-28s %-5s %6s %10s %8s %9s %12s\n", "node", "state", "slots", "requests", "errors",
         "redirects", "avg latency");
  for (size_t r = 0; r < n; r++) {
    const node_row *x = &rows[r];
    char lat[32] = "-";
    if (x->requests > 0)
      snprintf(lat, sizeof lat, "%.0f us", (double)x->latency_us / (double)x->requests);
    printf("  %-28s %-5s %6lld %10lld %8lld %9lld %12s\n", x->addr, x->up ? "up" : "down",
           (long long)x->slots, (long long)x->requests, (long long)x->errors,
           (long long)x->redirects, lat);
  }
}

static int cache_stats(const kiln__args *a) {
  if (a->npos != 1) {
    fprintf(stderr, "kiln cache stats: unexpected operand '%s'\n", a->pos[1]);
    return KILN_EXIT_USAGE;
  }
  if (!want_server(a, "stats")) return KILN_EXIT_USAGE;
  kiln_client *c;
  int rc = kiln__remote_connect(a, &c);
  if (rc) return rc;
  kiln_server_stats s;
  kiln_status st;
  kiln_status_clear(&st);
  if (kiln_client_stats(c, &s, &st)) {
    rc = kiln__remote_report("kiln cache stats", &st);
    kiln_client_close(c);
    return rc;
  }
  printf("cache hits %lld, misses %lld, compiles %lld\n", (long long)s.cache_hits,
         (long long)s.cache_misses, (long long)s.compiles);
  for (uint32_t i = 0; i < s.ncounters; i++) {
    const kiln_server_counter *k = &s.counters[i];
    if (strncmp(k->name, "kiln_cache_", 11) != 0) continue;
    printf("%s%s%s%s %lld\n", k->name, k->labels[0] ? "{" : "", k->labels, k->labels[0] ? "}" : "",
           (long long)k->value);
  }
  print_nodes(&s);
  kiln_server_stats_clear(&s);
  kiln_client_close(c);
  return KILN_EXIT_OK;
}

static void print_entry(const kiln_server_cache_entry *e, bool components) {
  char tiers[64] = "";
  for (uint32_t t = 0; t < e->ntiers; t++)
    snprintf(tiers + strlen(tiers), sizeof tiers - strlen(tiers), "%s%s", t ? "," : "",
             e->tiers[t]);
  char created[32] = "-";
  time_t secs = (time_t)(e->created_unix_ms / 1000);
  struct tm tm;
  if (e->created_unix_ms > 0 && gmtime_r(&secs, &tm))
    strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", &tm);
  printf("%s %s %lld %.3f %s\n", e->key, tiers[0] ? tiers : "-", (long long)e->bytes,
         (double)e->compile_ns / 1e6, created);
  if (components)
    for (uint32_t i = 0; i < e->ncomponents; i++)
      printf("  %-9s %s\n", e->components[i].name, e->components[i].digest);
}

static int cache_list(const kiln__args *a) {
  if (!want_server(a, "list")) return KILN_EXIT_USAGE;
  for (int i = 1; i < a->npos; i++)
    if (!is_key(a->pos[i])) {
      fprintf(stderr, "kiln cache list: '%s' is not a cache key (64 hex digits)\n", a->pos[i]);
      return KILN_EXIT_USAGE;
    }
  int32_t limit = 0;
  const char *ls = kiln__args_get(a, "limit");
  if (ls) {
    char *end;
    long v = strtol(ls, &end, 10);
    if (*ls < '0' || *ls > '9' || *end || v < 1 || v > 100000) {
      fprintf(stderr, "kiln cache list: --limit needs a count from 1 to 100000, not '%s'\n", ls);
      return KILN_EXIT_USAGE;
    }
    limit = (int32_t)v;
  }
  kiln_client *c;
  int rc = kiln__remote_connect(a, &c);
  if (rc) return rc;
  kiln_server_cache_list l;
  kiln_status st;
  kiln_status_clear(&st);
  if (kiln_client_cache_list(c, a->pos + 1, (uint32_t)(a->npos - 1), limit, &l, &st)) {
    rc = kiln__remote_report("kiln cache list", &st);
    kiln_client_close(c);
    return rc;
  }
  bool components = kiln__args_get(a, "components") != NULL;
  for (uint32_t i = 0; i < l.nentries; i++) print_entry(&l.entries[i], components);
  if (l.truncated)
    fprintf(stderr, "kiln cache list: the server holds more entries than the %u shown (--limit)\n",
            l.nentries);
  kiln_server_cache_list_clear(&l);
  kiln_client_close(c);
  return KILN_EXIT_OK;
}

static int cache_evict(const kiln__args *a) {
  if (!want_server(a, "evict")) return KILN_EXIT_USAGE;
  bool all = kiln__args_get(a, "all") != NULL;
  if (all == (a->npos > 1)) {
    fprintf(stderr, "kiln cache evict: give KEY... or --all\n");
    return KILN_EXIT_USAGE;
  }
  for (int i = 1; i < a->npos; i++)
    if (!is_key(a->pos[i])) {
      fprintf(stderr, "kiln cache evict: '%s' is not a cache key (64 hex digits)\n", a->pos[i]);
      return KILN_EXIT_USAGE;
    }
  kiln_client *c;
  int rc = kiln__remote_connect(a, &c);
  if (rc) return rc;
  int64_t n = 0;
  kiln_status st;
  kiln_status_clear(&st);
  if (kiln_client_cache_evict(c, a->pos + 1, (uint32_t)(a->npos - 1), all,
                              kiln__args_get(a, "shared") != NULL, &n, &st))
    rc = kiln__remote_report("kiln cache evict", &st);
  else
    printf("evicted %lld\n", (long long)n);
  kiln_client_close(c);
  return rc;
}

/* export FILE [KEY...]: the entries (all local ones without keys) as one
 * signed file; import FILE: into the server's tiers. */
static int cache_export(const kiln__args *a) {
  if (!want_server(a, "export")) return KILN_EXIT_USAGE;
  if (a->npos < 2) {
    fprintf(stderr, "kiln cache export: give the FILE to write (and KEYs, or every entry)\n");
    return KILN_EXIT_USAGE;
  }
  for (int i = 2; i < a->npos; i++)
    if (!is_key(a->pos[i])) {
      fprintf(stderr, "kiln cache export: '%s' is not a cache key (64 hex digits)\n", a->pos[i]);
      return KILN_EXIT_USAGE;
    }
  kiln_client *c;
  int rc = kiln__remote_connect(a, &c);
  if (rc) return rc;
  uint8_t *file = NULL;
  size_t len = 0;
  int64_t n = 0;
  kiln_status st;
  kiln_status_clear(&st);
  if (kiln_client_cache_export(c, a->pos + 2, (uint32_t)(a->npos - 2), &file, &len, &n, &st)) {
    rc = kiln__remote_report("kiln cache export", &st);
  } else if (kiln__file_write(a->pos[1], file, len, &st)) {
    kiln__report(a->pos[1], NULL, &st);
    rc = kiln__exit_code(st.code);
  } else {
    printf("exported %lld entries, %zu bytes\n", (long long)n, len);
  }
  kiln_free(file);
  kiln_client_close(c);
  return rc;
}

static int cache_import(const kiln__args *a) {
  if (!want_server(a, "import")) return KILN_EXIT_USAGE;
  if (a->npos != 2) {
    fprintf(stderr, "kiln cache import: give one FILE written by kiln cache export\n");
    return KILN_EXIT_USAGE;
  }
  kiln_status st;
  kiln_status_clear(&st);
  uint8_t *file;
  size_t len;
  if (kiln__file_read(a->pos[1], &file, &len, &st)) {
    kiln__report(a->pos[1], NULL, &st);
    return kiln__exit_code(st.code);
  }
  kiln_client *c;
  int rc = kiln__remote_connect(a, &c);
  if (rc) {
    kiln_free(file);
    return rc;
  }
  int64_t n = 0;
  if (kiln_client_cache_import(c, file, len, &n, &st))
    rc = kiln__remote_report("kiln cache import", &st);
  else
    printf("imported %lld entries\n", (long long)n);
  kiln_free(file);
  kiln_client_close(c);
  return rc;
}

#else /* !KILN_HAVE_CLIENT */

static int no_client(const char *sub) {
  fprintf(stderr,
          "kiln cache %s: this kiln was built without libkiln (no gRPC core found); "
          "--server is not available\n",
          sub);
  return KILN_EXIT_USAGE;
}

static int keys_from_server(const kiln__args *a, const char *const *hex, kiln_cache_key *keys) {
  (void)a, (void)hex, (void)keys;
  return no_client("explain");
}
static int cache_stats(const kiln__args *a) { return (void)a, no_client("stats"); }
static int cache_list(const kiln__args *a) { return (void)a, no_client("list"); }
static int cache_evict(const kiln__args *a) { return (void)a, no_client("evict"); }
static int cache_export(const kiln__args *a) { return (void)a, no_client("export"); }
static int cache_import(const kiln__args *a) { return (void)a, no_client("import"); }

#endif

int kiln__cmd_cache(const kiln__args *a) {
  const char *sub = a->pos[0];
  if (strcmp(sub, "explain") == 0) return cache_explain(a);
  if (strcmp(sub, "stats") == 0) return cache_stats(a);
  if (strcmp(sub, "list") == 0) return cache_list(a);
  if (strcmp(sub, "evict") == 0) return cache_evict(a);
  if (strcmp(sub, "export") == 0) return cache_export(a);
  if (strcmp(sub, "import") == 0) return cache_import(a);
  fprintf(stderr,
          "kiln cache: unknown subcommand '%s' (stats, list, evict, export, import, explain)\n",
          sub);
  return KILN_EXIT_USAGE;
}
