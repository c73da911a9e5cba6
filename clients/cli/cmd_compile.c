/* kiln compile FILE [--server HOST:PORT] [--backend B] [--target T] [-O N]
 * [--transform SPEC]... [--memory-budget BYTES] [-o OUT]: compile a module
 * and say what came out (with a budget: the peak before and after
 * rematerialization and the flops it added).
 *
 * Locally the module is loaded and verified as `kiln check` does, the
 * transforms are applied innermost first, and the native compiler
 * (compiler/compile.h) builds an executable for the target; -o writes the
 * serialized executable. With --server the same request goes to the server
 * (remote.c), which answers with an executable id, the cache's verdict and
 * the calling convention. --partitions P partitions a global program
 * first (--replicas R: on R replicas of P partitions); --auto-shard (and -O 3, which includes
 * auto-sharding) chooses its shardings before that.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/cli/cli.h"
#include "clients/cli/fileio.h"
#include "common/alloc.h"
#include "compiler/compile.h"
#include "compiler/ir/verify.h"
#include "compiler/spmd/spmd.h"
#include "compiler/target.h"
#include "compiler/transforms/transform.h"
#include "executor/backend.h"

static int apply_transforms(const kiln__args *a, kiln_module *m) {
  int n;
  const char **specs = kiln__args_all(a, "transform", &n);
  if (n == 0) return KILN_EXIT_OK;
  kiln_transform *ts = kiln_calloc((size_t)n, sizeof *ts);
  if (ts == NULL) {
    fprintf(stderr, "kiln compile: error: out of memory\n");
    return KILN_EXIT_INTERNAL;
  }
  kiln_status st;
  kiln_status_clear(&st);
  int rc = KILN_EXIT_OK;
  for (int i = 0; i < n && rc == KILN_EXIT_OK; i++)
    if (kiln_transform_parse(specs[i], &ts[i], &st)) {
      fprintf(stderr, "kiln compile: --transform '%s': %s\n", specs[i], st.msg);
      rc = KILN_EXIT_USAGE;
    }
  if (rc == KILN_EXIT_OK && kiln_transforms_apply(m, ts, (uint32_t)n, &st)) {
    kiln__report(a->pos[0], m, &st);
    rc = kiln__exit_code(st.code);
  }
  kiln_free(ts);
  return rc;
}

static int write_executable(const char *path, const kiln_executable *e) {
  kiln_status st;
  kiln_status_clear(&st);
  uint8_t *buf;
  size_t len;
  int rc = kiln_executable_serialize(e, &buf, &len, &st);
  if (rc == 0) {
    rc = kiln__file_write(path, buf, len, &st);
    kiln_free(buf);
  }
  if (rc) kiln__report(path, NULL, &st);
  return kiln__exit_code(rc);
}

/* --target as kilnd resolves it for the backend (--backend, else cpu, and
 * a cuda row named without --backend: compiling for a GPU needs none
 * here), before the module is read, so that a bad name gets what --server
 * prints: "FILE: error: options.target: MESSAGE", exit 1. The canonical
 * name, or NULL after reporting. */
static const char *resolve_target(const kiln__args *a, const char *backend) {
  const kiln_target *t;
  kiln_status st;
  kiln_status_clear(&st);
  const char *name = kiln__args_get(a, "target");
  if (kiln_target_resolve(backend ? backend : "cpu", name, &t, &st) == 0) return t->name;
  if (backend == NULL && kiln_target_resolve("cuda", name, &t, NULL) == 0) return t->name;
  snprintf(st.where, sizeof st.where, "options.target");
  kiln__report(a->pos[0], NULL, &st);
  return NULL;
}

/* A mesh count option: an integer from 1 to 4096; 0 or an exit code. */
static int mesh_count(const char *name, const char *text, long *out) {
  char *end;
  long v = strtol(text, &end, 10);
  if (*text == '\0' || *end || v < 1 || v > 4096) {
    fprintf(stderr, "kiln compile: --%s needs an integer from 1 to 4096, not '%s'\n", name, text);
    return KILN_EXIT_USAGE;
  }
  *out = v;
  return 0;
}

/* The collectives of stats, one line per kind, indented. */
static void print_kinds(const kiln_spmd_stats *s) {
  for (int k = 0; k < KILN_SPMD_NKINDS; k++)
    if (s->count[k])
      printf("  %s: %u, %lld bytes\n", kiln_spmd_kind_name((kiln_spmd_kind)k), s->count[k],
             (long long)s->bytes[k]);
}

/* --partitions P [--replicas R]: m replaced by its per-device program (on
 * R x P devices, every replica running the partitioned program on its own
 * partitions); the collectives each device runs are printed, and on
 * replicas those of the whole mesh too. With --auto-shard (or -O 3) the
 * shardings are chosen first. 0 or an exit code. */
static int partition(const kiln__args *a, const char *text, bool auto_shard, kiln_module **m) {
  long p, r = 1;
  int rc;
  const char *rtext = kiln__args_get(a, "replicas");
  if ((rc = mesh_count("partitions", text, &p)) ||
      (rtext && (rc = mesh_count("replicas", rtext, &r))))
    return rc;
  if (r * p > 4096) {
    fprintf(stderr, "kiln compile: a mesh of %ld x %ld devices is too large (at most 4096)\n", r,
            p);
    return KILN_EXIT_USAGE;
  }
  if (auto_shard && (rc = kiln__auto_shard(a, a->pos[0], *m, p, stdout, NULL))) return rc;
  if (!kiln_spmd_module_is_sharded(*m)) {
    fprintf(stderr, "%s: error: --partitions needs a module whose ENTRY carries shardings\n",
            a->pos[0]);
    return KILN_EXIT_INVALID;
  }
  kiln_spmd_options so;
  if ((rc = kiln__spmd_options(a, &so))) return rc;
  kiln_status st;
  kiln_status_clear(&st);
  kiln_spmd_program *prog;
  if (kiln_spmd_partition_opts(*m, r, p, kiln__args_get(a, "dump-dir"), &so, &prog, &st)) {
    kiln__report(a->pos[0], *m, &st);
    return kiln__exit_code(st.code);
  }
  const kiln_spmd_stats *s = &prog->stats;
  uint32_t total = 0;
  for (int k = 0; k < KILN_SPMD_NKINDS; k++) total += s->count[k];
  if (r == 1)
    printf("%s: partitioned over %ld devices: %u collective%s per device per run\n", a->pos[0], p,
           total, total == 1 ? "" : "s");
  else
    printf("%s: partitioned over %ld replicas x %ld partitions (%ld devices): %u collective%s per "
           "device per run\n",
           a->pos[0], r, p, r * p, total, total == 1 ? "" : "s");
  print_kinds(s);
  if (r > 1) {
    /* every device runs the same program: the mesh moves R x P times as
     * much, each replica's collectives among its own partitions */
    kiln_spmd_stats all;
    int64_t bytes = 0;
    for (int k = 0; k < KILN_SPMD_NKINDS; k++) {
      all.count[k] = s->count[k] * (uint32_t)(r * p);
      all.bytes[k] = s->bytes[k] * r * p;
      bytes += all.bytes[k];
    }
    printf("the mesh of %ld devices: %u collectives, %lld bytes per run, each replica's within "
           "its %ld partitions\n",
           r * p, total * (uint32_t)(r * p), (long long)bytes, p);
    print_kinds(&all);
  }
  kiln_module_destroy(*m);
  *m = prog->module;
  prog->module = NULL;
  kiln_spmd_program_destroy(prog);
  return 0;
}

int kiln__cmd_compile(const kiln__args *a) {
  if (kiln__args_get(a, "server")) return kiln__remote_compile(a);
  if (kiln__args_get(a, "shapes")) {
    fprintf(stderr, "kiln compile: --shapes fills a server's cache: give --server HOST:PORT\n");
    return KILN_EXIT_USAGE;
  }
  const char *file = a->pos[0];
  const char *backend = kiln__args_get(a, "backend");
  if (backend) {
    int brc = kiln__backend_check("compile", backend, KILN_BACKEND_LOADS, false);
    if (brc) return brc;
  }
  kiln_compile_options o;
  kiln_compile_options_init(&o);
  o.max_nesting = KILN_VERIFY_MAX_NESTING; /* the input's is checked at load */
  if ((o.target = resolve_target(a, backend)) == NULL) return KILN_EXIT_INVALID;
  const char *level = kiln__args_get(a, "opt-level");
  if (level) {
    if (strlen(level) != 1 || level[0] < '0' || level[0] > '3') {
      fprintf(stderr, "kiln compile: -O needs a level from 0 to 3, not '%s'\n", level);
      return KILN_EXIT_USAGE;
    }
    o.opt_level = level[0] - '0';
  }
  const char *budget = kiln__args_get(a, "memory-budget");
  if (budget && kiln__memory_budget_parse("compile", budget, &o.memory_budget))
    return KILN_EXIT_USAGE;
  kiln_module *m;
  int rc = kiln__module_load(file, true, &m);
  if (rc) return rc;
  if ((rc = apply_transforms(a, m))) goto out_free_module;
  const char *parts = kiln__args_get(a, "partitions");
  if (parts == NULL && kiln__args_get(a, "replicas")) {
    fprintf(stderr, "kiln compile: --replicas R goes with --partitions P (a global program)\n");
    rc = KILN_EXIT_USAGE;
    goto out_free_module;
  }
  if (parts && (rc = partition(a, parts, kiln__auto_shard_wanted(a), &m))) goto out_free_module;
  kiln_status st;
  kiln_status_clear(&st);
  kiln_executable *e;
  kiln_compile_report rep;
  if (kiln_compile(m, &o, &e, &rep, &st)) {
    kiln__report(file, m, &st);
    rc = kiln__exit_code(st.code);
    goto out_free_module;
  }
  printf("%s: compiled for %s: %u kernels, %u steps, %zu bytes of code\n", file, e->target,
         rep.nkernels, rep.nsteps, rep.code_bytes);
  printf("peak %llu bytes of temporaries, %.3f ms (passes %.3f ms, %s %.3f ms)\n",
         (unsigned long long)rep.peak_bytes, rep.total_ms, rep.pipeline_ms,
         e->code_kind == KILN_CODE_CUBIN ? "NVRTC" : "C compiler", rep.cc_ms);
  if (o.memory_budget)
    printf("remat: budget %llu bytes: peak %llu -> %llu bytes of temporaries, %u values "
           "recomputed (+%.0f flops), %u moved\n",
           (unsigned long long)o.memory_budget, (unsigned long long)rep.remat.peak_before,
           (unsigned long long)rep.remat.peak_after, rep.remat.recomputed, rep.remat.extra_flops,
           rep.remat.moved);
  const char *out = kiln__args_get(a, "output");
  if (out) rc = write_executable(out, e);
  kiln_executable_destroy(e);
out_free_module:
  kiln_module_destroy(m);
  return rc;
}
