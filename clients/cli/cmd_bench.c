/* kiln bench FILE [--backend NAME] [--iters N] [--warmup N]
 * [--random-args SEED] [--target T] [--opt-level N] [--disable-pass NAME]...
 * [--transform SPEC]...: compile once, run many times, print one JSON object.
 *
 * --transform applies function transforms first, innermost first, as
 * `kiln run` does (grad, vjp, jvp, vmap:...,size=N, checkpoint): what is
 * compiled and timed is the transformed program, on random arguments of
 * its signature (so a vmap needs size=N), and the JSON lists the specs in
 * "transforms".
 *
 *   {"file": ..., "backend": "cpu", "target": "cpu", "opt_level": 2,
 *    "iters": 20, "warmup": 1, "mode": "buffers",
 *    "compile_ms": ..., "passes_ms": {"algsimp": ..., ...},
 *    "pipeline_ms": ..., "assign_ms": ..., "codegen_ms": ..., "cc_ms": ...,
 *    "run_us_median": ..., "run_us_p90": ..., "run_us_min": ...,
 *    "peak_bytes": ..., "temp_peak_bytes": ..., "temp_bytes": ...,
 *    "param_bytes": ..., "output_bytes": ...}
 *
 * The backend (default cpu) is created once, before the timed loop. What
 * is timed: on a backend that loads executables (cpu), one execution of the
 * loaded executable on device buffers that already hold the arguments
 * ("mode": "buffers"), including the allocation of its outputs but not
 * copies from or to host literals; when a parameter's binding is not
 * row-major the run goes through host literals instead ("mode":
 * "literals"), which the field says. On one that runs modules (interp), one
 * kiln_device_run_module ("mode": "interpreter"). Warm-up runs come first
 * and are not counted.
 * peak_bytes is what a run holds at once at most: parameters, outputs and
 * the peak of live temporaries from buffer assignment (an upper bound, as
 * outputs need not all be live at that peak); the interpreter does not
 * account its memory, so its byte fields are null.
 *
 * --profile (cpu) also times every step of the timed runs and prints the
 * table of profile.h on stderr; --trace FILE writes the last timed run as
 * Chrome trace JSON (and implies --profile).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clients/cli/cli.h"
#include "clients/cli/profile.h"
#include "common/alloc.h"
#include "compiler/compile.h"
#include "compiler/ir/verify.h"
#include "compiler/spmd/spmd.h"
#include "compiler/transforms/transform.h"
#include "executor/backend.h"
#include "executor/run.h"

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int parse_count(const char *text, const char *opt, long min, long *out) {
  char *end;
  errno = 0;
  long v = text ? strtol(text, &end, 10) : 0;
  if (text && (errno || *end || end == text || v < min || v > 1000000)) {
    fprintf(stderr, "kiln bench: --%s needs an integer from %ld to 1000000, not '%s'\n", opt, min,
            text);
    return KILN_EXIT_USAGE;
  }
  if (text) *out = v;
  return KILN_EXIT_OK;
}

static void json_string(const char *s) {
  putchar('"');
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      printf("\\%c", c);
    else if (c < 0x20)
      printf("\\u%04x", c);
    else
      putchar(c);
  }
  putchar('"');
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef struct bench {
  const char *file;
  const char **transforms; /* --transform specs, as given */
  int ntransforms;
  kiln_module *m;
  kiln_literal **args;
  uint32_t nargs;
  long iters, warmup;
  double *us;   /* iters samples */
  bool buffers; /* timed on device buffers */
  kiln_compile_report rep;
  bool compiled;
  uint64_t param_bytes, output_bytes;
  bool profile;         /* --profile or --trace */
  const char *trace;    /* --trace FILE, or NULL */
  uint32_t partitions;  /* --partitions: a global program on a mesh; 0 otherwise */
  uint32_t replicas;    /* --replicas: each running it on its own partitions (1: none) */
  kiln_spmd_stats coll; /* its collectives per device per run */
  bool auto_shard;      /* --auto-shard: plan is the chosen plan's modelled cost */
  kiln_spmd_cost plan;
  kiln_spmd_options spmd; /* --windowed-einsum ... */
} bench;

static bool row_major(const kiln_shape *s) {
  int64_t m2m[64];
  if (s->rank > 64) return false;
  kiln_shape_minor_to_major(s, m2m);
  for (uint32_t i = 0; i < s->rank; i++)
    if (m2m[i] != (int64_t)(s->rank - 1 - i)) return false;
  return true;
}

/* Device buffers holding the arguments' leaves, in the executable's order;
 * false (and nothing allocated) when a binding is not row-major. */
static int upload(bench *b, kiln_device *d, const kiln_executable *e, kiln_buffer **bufs, bool *ok,
                  kiln_status *st) {
  *ok = false;
  if (e->dyn) return 0; /* runtime sizes travel with literals (kiln_loaded_run) */
  for (uint32_t i = 0; i < e->nparam_leaves; i++)
    if (!row_major(&e->params[i].shape)) return 0;
  uint32_t k = 0;
  for (uint32_t i = 0; i < b->nargs; i++) {
    const kiln_literal **leaves;
    uint32_t n;
    if (kiln__literal_leaves(b->args[i], &leaves, &n))
      return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
    for (uint32_t j = 0; j < n && k < e->nparam_leaves; j++, k++) {
      int rc = kiln_buffer_alloc(d, leaves[j]->nbytes, &bufs[k], st);
      if (rc == 0) rc = kiln_buffer_write(bufs[k], 0, leaves[j]->data, leaves[j]->nbytes, st);
      if (rc) {
        kiln_free(leaves);
        return rc;
      }
    }
    kiln_free(leaves);
  }
  if (k != e->nparam_leaves)
    return kiln_status_set(st, KILN_EINTERNAL, NULL, "%u argument leaves for %u bindings", k,
                           e->nparam_leaves);
  *ok = true;
  return 0;
}

static int one_cpu_run(bench *b, kiln_loaded *l, const kiln_executable *e, kiln_buffer **in,
                       kiln_buffer **outs, const kiln_run_options *ro, kiln_status *st) {
  if (b->buffers) {
    int rc = kiln_loaded_execute(l, in, e->nparam_leaves, ro, outs, e->nresults, st);
    for (uint32_t i = 0; i < e->nresults && rc == 0; i++) {
      kiln_buffer_free(outs[i]);
      outs[i] = NULL;
    }
    return rc;
  }
  kiln_literal *out = NULL;
  int rc = kiln_loaded_run(l, (const kiln_literal *const *)b->args, b->nargs, ro, &out, st);
  kiln_literal_destroy(out);
  return rc;
}

static int run_compiled(bench *b, kiln_backend *be, const kiln_compile_options *co,
                        kiln_status *st) {
  kiln_executable *e = NULL;
  kiln_loaded *l = NULL;
  kiln_buffer **in = NULL, **outs = NULL;
  kiln__profile *prof = NULL;
  int rc = kiln_compile(b->m, co, &e, &b->rep, st);
  if (rc) return rc;
  b->compiled = true;
  for (uint32_t i = 0; i < e->nparam_leaves; i++)
    b->param_bytes += (uint64_t)kiln_shape_bytes(&e->params[i].shape);
  for (uint32_t i = 0; i < e->nresults; i++)
    b->output_bytes += (uint64_t)kiln_shape_bytes(&e->results[i].shape);
  in = kiln_calloc(e->nparam_leaves + 1, sizeof *in);
  outs = kiln_calloc(e->nresults + 1, sizeof *outs);
  if (in == NULL || outs == NULL) {
    rc = kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
    goto out;
  }
  kiln_device *d = kiln_backend_device(be, 0);
  if ((rc = kiln_device_load(d, e, &l, st))) goto out;
  if ((rc = upload(b, d, e, in, &b->buffers, st))) goto out;
  kiln_run_options ro = {0};
  if (b->profile) {
    if ((prof = kiln__profile_create(e)) == NULL) {
      rc = kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
      goto out;
    }
    ro.observer = kiln__profile_observer(prof);
  }
  for (long i = 0; i < b->warmup + b->iters && rc == 0; i++) {
    if (prof) kiln__profile_begin(prof, i >= b->warmup);
    double t0 = now_us();
    rc = one_cpu_run(b, l, e, in, outs, b->profile ? &ro : NULL, st);
    if (i >= b->warmup) b->us[i - b->warmup] = now_us() - t0;
    if (prof) kiln__profile_end(prof);
  }
  if (rc == 0 && prof) {
    kiln__profile_print(prof, stderr);
    if (b->trace && kiln__profile_write_trace(prof, b->trace) != 0)
      rc = kiln_status_set(st, KILN_EIO, b->trace, "cannot write the trace: %s", strerror(errno));
  }
out:
  kiln__profile_destroy(prof);
  for (uint32_t i = 0; in && i < e->nparam_leaves; i++) kiln_buffer_free(in[i]);
  for (uint32_t i = 0; outs && i < e->nresults; i++) kiln_buffer_free(outs[i]);
  kiln_free(in);
  kiln_free(outs);
  kiln_loaded_destroy(l);
  kiln_executable_destroy(e);
  return rc;
}

/* --partitions P [--replicas R]: the global program partitioned (on R
 * replicas of P partitions, device K = replica x P + partition, every
 * replica from the same global arguments), its arguments sharded, and each
 * timed run one gang launch of all R x P devices on host literals (interp:
 * a mesh of interpreters). */
static int run_partitioned(bench *b, const char *backend, bool compiles,
                           const kiln_compile_options *co, kiln_status *st) {
  uint32_t R = b->replicas, P = b->partitions * R, n = b->nargs; /* P: every device */
  kiln_spmd_program *prog;
  int rc = kiln_spmd_partition_opts(b->m, R, b->partitions, co->dump_dir, &b->spmd, &prog, st);
  if (rc) return rc;
  b->coll = prog->stats;
  kiln_literal **shards = kiln_calloc((size_t)P * (n + 1), sizeof *shards);
  const kiln_literal *const **per = kiln_calloc(P, sizeof *per);
  kiln_literal **outs = kiln_calloc(P, sizeof *outs);
  kiln_device **devs = kiln_calloc(P, sizeof *devs);
  kiln_executable *e = NULL;
  kiln_backend *be = NULL;
  kiln_comm *comm = NULL;
  kiln_mesh *mesh = NULL;
  if (!shards || !per || !outs || !devs)
    rc = kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
  for (uint32_t k = 0; rc == 0 && k < P; k++) {
    for (uint32_t i = 0; rc == 0 && i < n; i++)
      rc = kiln_spmd_shard_arg(prog, i, b->args[i], k % b->partitions,
                               &shards[(size_t)k * (n + 1) + i], st);
    per[k] = (const kiln_literal *const *)&shards[(size_t)k * (n + 1)];
  }
  if (rc == 0 && compiles) {
    kiln_backend_options bo = {.ndevices = P};
    rc = kiln_compile(prog->module, co, &e, &b->rep, st);
    b->compiled = rc == 0;
    if (rc == 0) rc = kiln_backend_create(backend, &bo, &be, st);
    for (uint32_t k = 0; rc == 0 && k < P; k++)
      if ((devs[k] = kiln_backend_device(be, k)) == NULL)
        rc = kiln_status_set(st, KILN_ELIMIT, "bench", "backend %s has no device %u", backend, k);
    if (rc == 0) rc = kiln_comm_create(be, devs, P, &comm, st);
    if (rc == 0) rc = kiln_comm_load(comm, e, &mesh, st);
  }
  for (long i = 0; rc == 0 && i < b->warmup + b->iters; i++) {
    double t0 = now_us();
    rc = compiles ? kiln_mesh_run(mesh, per, n, NULL, outs, st)
                  : kiln_run_module_mesh(prog->module, backend, NULL, R, b->partitions, per, n,
                                         outs, st);
    if (i >= b->warmup) b->us[i - b->warmup] = now_us() - t0;
    for (uint32_t k = 0; k < P; k++) {
      kiln_literal_destroy(outs[k]);
      outs[k] = NULL;
    }
  }
  kiln_mesh_destroy(mesh);
  kiln_comm_destroy(comm);
  kiln_backend_destroy(be);
  kiln_executable_destroy(e);
  for (size_t i = 0; shards && i < (size_t)P * (n + 1); i++) kiln_literal_destroy(shards[i]);
  kiln_free(shards);
  kiln_free(per);
  kiln_free(outs);
  kiln_free(devs);
  kiln_spmd_program_destroy(prog);
  return rc;
}

/* Applies the --transform specs, innermost first; 0 or an exit code. */
static int apply_transforms(bench *b) {
  if (b->ntransforms == 0) return KILN_EXIT_OK;
  kiln_transform *ts = kiln_calloc((size_t)b->ntransforms, sizeof *ts);
  if (ts == NULL) {
    fprintf(stderr, "kiln bench: error: out of memory\n");
    return KILN_EXIT_INTERNAL;
  }
  kiln_status st;
  kiln_status_clear(&st);
  int rc = KILN_EXIT_OK;
  for (int i = 0; i < b->ntransforms && rc == KILN_EXIT_OK; i++) {
    if (kiln_transform_parse(b->transforms[i], &ts[i], &st)) {
      fprintf(stderr, "kiln bench: --transform '%s': %s\n", b->transforms[i], st.msg);
      rc = KILN_EXIT_USAGE;
    } else if (ts[i].kind == KILN_TRANSFORM_VMAP && ts[i].axis_size <= 0) {
      fprintf(stderr,
              "kiln bench: --transform '%s': the arguments are random, so vmap needs its batch "
              "size (size=N)\n",
              b->transforms[i]);
      rc = KILN_EXIT_USAGE;
    }
  }
  if (rc == KILN_EXIT_OK && kiln_transforms_apply(b->m, ts, (uint32_t)b->ntransforms, &st)) {
    kiln__report(b->file, b->m, &st);
    rc = kiln__exit_code(st.code);
  }
  kiln_verify_options vo = {.max_nesting = KILN_VERIFY_MAX_NESTING};
  if (rc == KILN_EXIT_OK && kiln_module_verify(b->m, &vo, &st)) {
    kiln__report(b->file, b->m, &st); /* a transform built an invalid program: our bug */
    rc = KILN_EXIT_INTERNAL;
  }
  kiln_free(ts);
  return rc;
}

static int run_module(bench *b, kiln_backend *be, kiln_status *st) {
  kiln_device *d = kiln_backend_device(be, 0);
  int rc = 0;
  for (long i = 0; i < b->warmup + b->iters && rc == 0; i++) {
    kiln_literal *out = NULL;
    double t0 = now_us();
    rc = kiln_device_run_module(d, b->m, (const kiln_literal *const *)b->args, b->nargs, NULL, &out,
                                st);
    if (i >= b->warmup) b->us[i - b->warmup] = now_us() - t0;
    kiln_literal_destroy(out);
  }
  return rc;
}

static void print_json(const bench *b, const char *backend, const kiln_compile_options *co) {
  qsort(b->us, (size_t)b->iters, sizeof *b->us, cmp_double);
  long n = b->iters;
  double median = n % 2 ? b->us[n / 2] : (b->us[n / 2 - 1] + b->us[n / 2]) / 2;
  long p90 = (n * 9 + 9) / 10 - 1; /* ceil(0.9 n) - 1 */
  printf("{\"file\": ");
  json_string(b->file);
  printf(", \"backend\": \"%s\"", backend);
  bool compiled = b->compiled;
  if (compiled) {
    printf(", \"target\": ");
    json_string(co->target ? co->target : "cpu");
    printf(", \"opt_level\": %d", co->opt_level);
  }
  if (b->ntransforms) {
    printf(", \"transforms\": [");
    for (int i = 0; i < b->ntransforms; i++) {
      if (i) printf(", ");
      json_string(b->transforms[i]);
    }
    printf("]");
  }
  printf(", \"iters\": %ld, \"warmup\": %ld, \"mode\": \"%s\"", b->iters, b->warmup,
         b->partitions ? "mesh-literals"
         : !compiled   ? "interpreter"
         : b->buffers  ? "buffers"
                       : "literals");
  if (b->partitions) {
    printf(", \"partitions\": %u, \"collectives\": {", b->partitions);
    for (int k = 0, j = 0; k < KILN_SPMD_NKINDS; k++)
      if (b->coll.count[k])
        printf("%s\"%s\": {\"count\": %u, \"bytes\": %lld}", j++ ? ", " : "",
               kiln_spmd_kind_name((kiln_spmd_kind)k), b->coll.count[k],
               (long long)b->coll.bytes[k]);
    printf("}");
  }
  if (b->partitions && b->replicas > 1) {
    /* every device runs the same program, each replica among its own partitions */
    uint32_t nd = b->replicas * b->partitions;
    printf(", \"replicas\": %u, \"devices\": %u, \"mesh_collectives\": {", b->replicas, nd);
    for (int k = 0, j = 0; k < KILN_SPMD_NKINDS; k++)
      if (b->coll.count[k])
        printf("%s\"%s\": {\"count\": %u, \"bytes\": %lld}", j++ ? ", " : "",
               kiln_spmd_kind_name((kiln_spmd_kind)k), b->coll.count[k] * nd,
               (long long)b->coll.bytes[k] * nd);
    printf("}");
  }
  if (b->auto_shard) {
    const kiln_spmd_cost *c = &b->plan;
    printf(", \"auto_shard\": {\"modelled_ms\": %.6f, \"compute_ms\": %.6f, "
           "\"collectives_ms\": %.6f, \"memory_bytes\": %lld, \"optimal\": %s}",
           1e3 * c->seconds, 1e3 * c->compute_s, 1e3 * c->comm_s, (long long)c->memory,
           c->optimal ? "true" : "false");
  }
  if (compiled) {
    const kiln_compile_report *r = &b->rep;
    printf(", \"compile_ms\": %.3f, \"passes_ms\": {", r->total_ms);
    for (uint32_t i = 0, k = 0; i < r->npasses; i++)
      if (r->passes[i].ran)
        printf("%s\"%s\": %.3f", k++ ? ", " : "", r->passes[i].name, r->passes[i].ms);
    printf("}, \"verify_ms\": %.3f, \"pipeline_ms\": %.3f, \"assign_ms\": %.3f, "
           "\"codegen_ms\": %.3f, \"cc_ms\": %.3f",
           r->verify_ms, r->pipeline_ms, r->assign_ms, r->codegen_ms, r->cc_ms);
  } else {
    printf(", \"compile_ms\": 0");
  }
  printf(", \"run_us_median\": %.3f, \"run_us_p90\": %.3f, \"run_us_min\": %.3f", median,
         b->us[p90], b->us[0]);
  if (compiled && co->memory_budget) {
    const kiln_remat_stats *rs = &b->rep.remat;
    printf(", \"remat\": {\"budget\": %" PRIu64 ", \"temp_peak_before\": %" PRIu64
           ", \"temp_peak_after\": %" PRIu64 ", \"extra_flops\": %.0f, \"flops\": %.0f, "
           "\"recomputed\": %u, \"moved\": %u}",
           rs->budget, rs->peak_before, rs->peak_after, rs->extra_flops, rs->flops, rs->recomputed,
           rs->moved);
  }
  if (compiled && !b->partitions)
    printf(", \"peak_bytes\": %" PRIu64 ", \"temp_peak_bytes\": %" PRIu64
           ", \"temp_bytes\": %" PRIu64 ", \"param_bytes\": %" PRIu64 ", \"output_bytes\": %" PRIu64
           ", \"kernels\": %u, \"steps\": %u}\n",
           b->param_bytes + b->output_bytes + b->rep.peak_bytes, b->rep.peak_bytes,
           b->rep.temp_bytes, b->param_bytes, b->output_bytes, b->rep.nkernels, b->rep.nsteps);
  else if (compiled)
    printf(", \"peak_bytes\": null, \"temp_peak_bytes\": %" PRIu64 "}\n", b->rep.peak_bytes);
  else
    printf(", \"peak_bytes\": null}\n");
}

int kiln__cmd_bench(const kiln__args *a) {
  bench b;
  memset(&b, 0, sizeof b);
  b.file = a->pos[0];
  b.iters = 20;
  b.warmup = 1;
  const char *backend = kiln__args_get(a, "backend");
  if (backend == NULL) backend = "cpu";
  int brc = kiln__backend_check("bench", backend, 0, false);
  if (brc) return brc;
  unsigned caps = kiln_backend_caps(backend);
  bool compiles = !(caps & KILN_BACKEND_RUNS_MODULES);
  long seed = 0;
  int rc;
  if ((rc = parse_count(kiln__args_get(a, "iters"), "iters", 1, &b.iters)) ||
      (rc = parse_count(kiln__args_get(a, "warmup"), "warmup", 0, &b.warmup)) ||
      (rc = parse_count(kiln__args_get(a, "random-args"), "random-args", 0, &seed)))
    return rc;
  long parts = 0;
  if ((rc = parse_count(kiln__args_get(a, "partitions"), "partitions", 1, &parts))) return rc;
  if (parts > 4096) {
    fprintf(stderr, "kiln bench: --partitions takes at most 4096 devices\n");
    return KILN_EXIT_USAGE;
  }
  b.partitions = (uint32_t)parts;
  long reps = 1;
  if ((rc = parse_count(kiln__args_get(a, "replicas"), "replicas", 1, &reps))) return rc;
  if (kiln__args_get(a, "replicas") && !parts) {
    fprintf(stderr, "kiln bench: --replicas R goes with --partitions P (a global program)\n");
    return KILN_EXIT_USAGE;
  }
  if (reps * parts > 4096) {
    fprintf(stderr, "kiln bench: a mesh of %ld x %ld devices is too large (at most 4096)\n", reps,
            parts);
    return KILN_EXIT_USAGE;
  }
  b.replicas = (uint32_t)reps;
  if ((rc = kiln__spmd_options(a, &b.spmd))) return rc;
  kiln_compile_options co;
  bool given;
  if ((rc = kiln__compile_options_parse(a, &co, &given))) return rc;
  if (compiles && co.target == NULL) { /* the device's own target (cuda-sm_90 ...) */
    kiln_status tst;
    kiln_status_clear(&tst);
    if (kiln_backend_default_target(backend, &co.target, &tst)) {
      fprintf(stderr, "kiln bench: %s\n", tst.msg);
      return KILN_EXIT_USAGE;
    }
  }
  if (given && !compiles) {
    char names[256];
    kiln_backend_names_join(KILN_BACKEND_LOADS, "|", names, sizeof names);
    fprintf(stderr,
            "kiln bench: --target, --opt-level, --disable-pass, --dump-dir, --memory-budget and "
            "--user-kernel need --backend %s\n",
            names);
    return KILN_EXIT_USAGE;
  }
  b.transforms = kiln__args_all(a, "transform", &b.ntransforms);
  b.trace = kiln__args_get(a, "trace");
  b.profile = b.trace != NULL || kiln__args_get(a, "profile") != NULL;
  if (b.profile && !compiles) {
    fprintf(stderr, "kiln bench: --profile and --trace time the steps of a compiled run: use "
                    "--backend cpu\n");
    return KILN_EXIT_USAGE;
  }
  if ((rc = kiln__module_load(b.file, true, &b.m))) return rc;
  if ((rc = apply_transforms(&b))) {
    kiln_module_destroy(b.m);
    return rc;
  }
  b.auto_shard = b.partitions && kiln__auto_shard_wanted(a);
  if (b.auto_shard && (rc = kiln__auto_shard(a, b.file, b.m, b.partitions, stderr, &b.plan))) {
    kiln_module_destroy(b.m);
    return rc;
  }
  kiln_status st;
  kiln_status_clear(&st);
  kiln_backend *be = NULL;
  const kiln_computation *entry = kiln_module_entry(b.m);
  b.nargs = entry ? kiln_computation_nparams(b.m, entry) : 0;
  b.args = kiln_calloc(b.nargs + 1, sizeof *b.args);
  b.us = kiln_calloc((size_t)b.iters, sizeof *b.us);
  if (b.args == NULL || b.us == NULL) {
    rc = kiln_status_set(&st, KILN_ENOMEM, NULL, "out of memory");
    goto out;
  }
  uint64_t state = (uint64_t)seed;
  int ngiven;
  const char **argv_given = kiln__args_all(a, "arg", &ngiven);
  if ((uint32_t)ngiven > b.nargs)
    rc = kiln_status_set(&st, KILN_EINVAL, NULL,
                         "the ENTRY computation takes %u parameter%s, %d --arg given", b.nargs,
                         b.nargs == 1 ? "" : "s", ngiven);
  for (uint32_t i = 0; i < b.nargs && rc == 0; i++) {
    const kiln_shape *ps = &kiln_computation_param(b.m, entry, i)->shape;
    rc = i < (uint32_t)ngiven ? kiln__arg_load(argv_given[i], ps, i, &b.args[i], &st)
                              : kiln__arg_random(ps, &state, &b.args[i], &st);
  }
  if (rc == 0 && b.partitions) {
    if (!kiln_spmd_module_is_sharded(b.m))
      rc = kiln_status_set(&st, KILN_EINVAL, NULL,
                           "--partitions needs a module whose ENTRY carries shardings");
    else
      rc = run_partitioned(&b, backend, compiles, &co, &st);
  } else {
    if (rc == 0) rc = kiln_backend_create(backend, NULL, &be, &st);
    if (rc == 0) rc = compiles ? run_compiled(&b, be, &co, &st) : run_module(&b, be, &st);
  }
  if (rc == 0) print_json(&b, backend, &co);
out:
  if (rc) kiln__report(b.file, b.m, &st);

  for (uint32_t i = 0; b.args && i < b.nargs; i++) kiln_literal_destroy(b.args[i]);
  kiln_free(b.args);
  kiln_free(b.us);
  kiln_backend_destroy(be);
  kiln_module_destroy(b.m);
  return kiln__exit_code(rc);
}
