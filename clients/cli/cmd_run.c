/* kiln run FILE [--backend NAME] [--arg ARG]... [--random-args SEED]
 * [--out DIR] [--timeout SECONDS] [--max-iterations N] [--transform SPEC]...
 * [--target T] [--opt-level N] [--disable-pass NAME]... [--dump-dir DIR]:
 * run the ENTRY computation and print its outputs.
 *
 * Backends come from the registry (kiln_backend_names; default interp). One
 * that runs modules (interp, the reference interpreter) runs the module as
 * written; one that loads executables (cpu) gets it compiled
 * (compiler/compile.h, with the compiler options given) and runs it on its
 * device 0. A serialized executable (FILE ending in .kexe, or starting with
 * its magic) runs as it is on a backend that loads executables. The
 * contract is the same for all: the arguments, the output lines, the .npy
 * files and the exit codes.
 *
 * The order is: check the command line (backend, seed), load and verify the
 * module, apply the transforms (a vmap without size=N takes its batch size
 * from the --arg shapes), build one literal per parameter (from --arg, then
 * --random-args), run, then print every output leaf as HLO literal text, one
 * per line, and write DIR/i.npy when asked. Nothing runs until every
 * argument matched. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/cli/cli.h"
#include "clients/cli/fileio.h"
#include "common/alloc.h"
#include "common/sbuf.h"
#include "compiler/compile.h"
#include "compiler/ir/debug_print.h"
#include "compiler/ir/text.h"
#include "compiler/ir/verify.h"
#include "compiler/spmd/spmd.h"
#include "compiler/transforms/transform.h"
#include "executor/run.h"
#include "executor/run_spmd.h"

/* A non-negative decimal integer (seeds, iteration counts). */
static int parse_seed(const char *s, uint64_t *out) {
  if (s[0] < '0' || s[0] > '9') return -1;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end) return -1;
  *out = v;
  return 0;
}

/* Builds args[0..n) for parameters of `shapes` (what: "ENTRY computation
 * NAME" or "the executable") from --arg values then random fill; 0 or an
 * exit code. */
static int build_args(const char *file, const char *what, const kiln_shape *shapes,
                      const kiln__args *a, kiln_literal **args, uint32_t n) {
  int ngiven;
  const char **given = kiln__args_all(a, "arg", &ngiven);
  const char *seed_text = kiln__args_get(a, "random-args");
  if ((uint32_t)ngiven > n || ((uint32_t)ngiven < n && seed_text == NULL)) {
    fprintf(stderr, "%s: error: %s takes %u parameter%s, %d argument%s given%s\n", file, what, n,
            n == 1 ? "" : "s", ngiven, ngiven == 1 ? "" : "s",
            (uint32_t)ngiven < n ? " (--random-args SEED fills the rest)" : "");
    return KILN_EXIT_INVALID;
  }
  uint64_t state = 0;
  if (seed_text) parse_seed(seed_text, &state); /* validated by the caller */
  kiln_status st;
  kiln_status_clear(&st);
  for (uint32_t i = 0; i < n; i++) {
    if (i < (uint32_t)ngiven)
      kiln__arg_load(given[i], &shapes[i], i, &args[i], &st);
    else
      kiln__arg_random(&shapes[i], &state, &args[i], &st);
    if (st.code) {
      kiln__report(file, NULL, &st);
      return kiln__exit_code(st.code);
    }
  }
  return KILN_EXIT_OK;
}

static int emit_outputs(const kiln_literal *result, const char *out_dir) {
  const kiln_literal **leaves;
  uint32_t n;
  if (kiln__literal_leaves(result, &leaves, &n)) {
    fprintf(stderr, "kiln run: error: out of memory\n");
    return KILN_EXIT_INTERNAL;
  }
  int rc = KILN_EXIT_OK;
  kiln_status st;
  kiln_status_clear(&st);
  kiln_sbuf b = KILN_SBUF_INIT;
  if (out_dir && kiln__dir_make(out_dir, &st)) goto out_report;
  for (uint32_t i = 0; i < n; i++) {
    kiln_sbuf_reset(&b);
    /* Literal data is row-major whatever the layout: a compiled result's
     * layout says nothing about the values, so outputs print alike. */
    kiln_literal plain = *leaves[i];
    plain.shape.layout = NULL;
    if (!kiln_literal_print_bounded(&b, &plain, true))
      fprintf(stderr, "kiln run: output %u holds too many empty arrays to print as text%s\n", i,
              out_dir ? "; its .npy file has it" : "; --out DIR writes it as .npy");
    kiln_sbuf_putc(&b, '\n');
    if (kiln_sbuf_failed(&b)) {
      kiln_status_set(&st, KILN_ENOMEM, NULL, "out of memory printing output %u", i);
      break;
    }
    fwrite(b.data, 1, b.len, stdout);
    if (out_dir && kiln_shape_is_array(&leaves[i]->shape)) {
      char path[4096];
      snprintf(path, sizeof path, "%s/%u.npy", out_dir, i);
      if (kiln__literal_write_npy(leaves[i], path, &st)) break;
    }
  }
out_report:
  kiln_sbuf_free(&b);
  if (st.code) {
    kiln__report("kiln run", NULL, &st);
    rc = kiln__exit_code(st.code);
  }
  kiln_free(leaves);
  return rc;
}

/* The batch sizes of vmaps that give none, from the --arg shapes. */
static int infer_sizes(const kiln__args *a, kiln_transform *ts, uint32_t n, kiln_status *st) {
  kiln_arena *ar = kiln_arena_create();
  if (ar == NULL) return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
  const kiln_shape **shapes;
  uint32_t nshapes;
  int rc = kiln__arg_shapes(a, ar, &shapes, &nshapes, st);
  if (rc == 0) rc = kiln_transforms_infer_sizes(ts, n, shapes, nshapes, st);
  kiln_arena_destroy(ar);
  return rc;
}

/* Applies --transform specs in order; 0 or an exit code. */
static int run_transforms(const char *file, const kiln__args *a, kiln_module *m) {
  int n;
  const char **specs = kiln__args_all(a, "transform", &n);
  if (n == 0) return KILN_EXIT_OK;
  kiln_transform *ts = kiln_calloc((size_t)n, sizeof *ts);
  if (ts == NULL) {
    fprintf(stderr, "kiln run: error: out of memory\n");
    return KILN_EXIT_INTERNAL;
  }
  kiln_status st;
  kiln_status_clear(&st);
  int rc = KILN_EXIT_OK;
  bool need = false;
  for (int i = 0; i < n && rc == KILN_EXIT_OK; i++) {
    if (kiln_transform_parse(specs[i], &ts[i], &st)) {
      fprintf(stderr, "kiln run: --transform '%s': %s\n", specs[i], st.msg);
      rc = KILN_EXIT_USAGE;
    }
    need |= ts[i].kind == KILN_TRANSFORM_VMAP && ts[i].axis_size <= 0;
  }
  if (rc == KILN_EXIT_OK && need && infer_sizes(a, ts, (uint32_t)n, &st)) {
    kiln__report(file, NULL, &st);
    rc = kiln__exit_code(st.code);
  }
  if (rc == KILN_EXIT_OK && kiln_transforms_apply(m, ts, (uint32_t)n, &st)) {
    kiln__report(file, m, &st);
    rc = kiln__exit_code(st.code);
  }
  kiln_verify_options vo = {.max_nesting = KILN_VERIFY_MAX_NESTING};
  if (rc == KILN_EXIT_OK && kiln_module_verify(m, &vo, &st)) {
    /* a transform built an invalid program: our bug, not the input's */
    kiln__report(file, m, &st);
    rc = KILN_EXIT_INTERNAL;
  }
  kiln_free(ts);
  return rc;
}

/* A serialized executable: FILE.kexe or a file that starts with the magic. */
static bool is_executable(const char *path) {
  if (kiln__is_executable_file(path, NULL, 0)) return true;
  uint8_t head[8];
  FILE *f = fopen(path, "rb");
  if (f == NULL) return false; /* the loader reports it */
  size_t n = fread(head, 1, sizeof head, f);
  fclose(f);
  return kiln__is_executable_file(path, head, n);
}

/* Builds the arguments for `shapes`, runs `e` (on `backend`; NULL: the one
 * its target names) and prints the outputs; 0 or an exit code. */
static int run_compiled(const char *file, const kiln_module *m, const char *what,
                        const char *backend, const kiln_executable *e, const kiln_shape *shapes,
                        uint32_t n, const kiln__args *a, const kiln_run_options *ropts) {
  kiln_literal **args = kiln_calloc(n ? n : 1, sizeof *args);
  if (args == NULL) {
    fprintf(stderr, "kiln run: error: out of memory\n");
    return KILN_EXIT_INTERNAL;
  }
  kiln_literal *result = NULL;
  int rc = build_args(file, what, shapes, a, args, n);
  if (rc == 0) {
    kiln_status st;
    kiln_status_clear(&st);
    int err = kiln_run_executable_on(backend, e, NULL, ropts, (const kiln_literal *const *)args, n,
                                     &result, &st);
    if (err == 0 && result == NULL) err = kiln_status_set(&st, KILN_EINTERNAL, NULL, "no result");
    if (err) {
      kiln__report(file, m, &st);
      rc = kiln__exit_code(err);
    } else {
      rc = emit_outputs(result, kiln__args_get(a, "out"));
    }
  }
  kiln_literal_destroy(result);
  for (uint32_t i = 0; i < n; i++) kiln_literal_destroy(args[i]);
  kiln_free(args);
  return rc;
}

/* kiln run FILE.kexe: the blob is hostile input until deserialize has
 * checked every table in it. */
static int run_executable_file(const char *file, const char *backend, const kiln__args *a,
                               const kiln_run_options *ropts) {
  kiln_status st;
  kiln_status_clear(&st);
  uint8_t *buf;
  size_t len;
  int rc = kiln__file_read(file, &buf, &len, &st);
  kiln_executable *e = NULL;
  if (rc == 0) {
    rc = kiln_executable_deserialize(buf, len, &e, &st);
    kiln_free(buf);
  }
  if (rc) {
    kiln__report(file, NULL, &st);
    return kiln__exit_code(rc);
  }
  /* A bounded-dynamic program takes the caller's parameters (its sizes are
   * the runtime's to pass). */
  const kiln_shape *ps = e->dyn ? e->dyn->user_param_shapes : e->param_shapes;
  uint32_t np = e->dyn ? e->dyn->nuser_params : e->nparams;
  rc = run_compiled(file, NULL, "the executable", backend, e, ps, np, a, ropts);
  kiln_executable_destroy(e);
  return rc;
}

/* The run's settings, from the command line. */
typedef struct run_setup {
  const char *backend;     /* --backend, a registered name */
  bool compiled;           /* the backend runs compiled executables, not modules */
  kiln_compile_options co; /* for a compiling backend */
  bool compile_given;      /* any compiler option was given */
  kiln_run_options opts;   /* limits */
} run_setup;

/* Checks every option before anything is read: 0 or a usage exit code. */
static int check_options(const kiln__args *a, run_setup *r) {
  memset(r, 0, sizeof *r);
  const char *backend = kiln__args_get(a, "backend");
  if (backend == NULL) backend = KILN_RUN_DEFAULT_BACKEND;
  int brc = kiln__backend_check("run", backend, 0, false);
  if (brc) return brc;
  unsigned caps = kiln_backend_caps(backend);
  char names[256];
  r->backend = backend;
  r->compiled = !(caps & KILN_BACKEND_RUNS_MODULES);
  int crc = kiln__compile_options_parse(a, &r->co, &r->compile_given);
  if (crc) return crc;
  if (r->compiled && r->co.target == NULL) { /* the device's own target (cuda-sm_90 ...) */
    kiln_status tst;
    kiln_status_clear(&tst);
    if (kiln_backend_default_target(backend, &r->co.target, &tst)) {
      fprintf(stderr, "kiln run: %s\n", tst.msg);
      return KILN_EXIT_USAGE;
    }
  }
  if (r->compile_given && !r->compiled) {
    kiln_backend_names_join(KILN_BACKEND_LOADS, "|", names, sizeof names);
    fprintf(stderr,
            "kiln run: --target, --opt-level, --disable-pass, --dump-dir, --memory-budget and "
            "--user-kernel need --backend %s\n",
            names);
    return KILN_EXIT_USAGE;
  }
  const char *seed_text = kiln__args_get(a, "random-args");
  uint64_t seed;
  if (seed_text && parse_seed(seed_text, &seed)) {
    fprintf(stderr, "kiln run: --random-args needs a non-negative integer seed, not '%s'\n",
            seed_text);
    return KILN_EXIT_USAGE;
  }

  const char *timeout_text = kiln__args_get(a, "timeout");
  if (timeout_text) {
    char *end;
    errno = 0;
    r->opts.timeout_seconds = strtod(timeout_text, &end);
    if (errno || *end || end == timeout_text || !(r->opts.timeout_seconds > 0) ||
        r->opts.timeout_seconds > 1e9) {
      fprintf(stderr, "kiln run: --timeout needs a positive number of seconds, not '%s'\n",
              timeout_text);
      return KILN_EXIT_USAGE;
    }
  }
  const char *iter_text = kiln__args_get(a, "max-iterations");
  if (iter_text &&
      (parse_seed(iter_text, &r->opts.max_while_iterations) || r->opts.max_while_iterations == 0)) {
    fprintf(stderr, "kiln run: --max-iterations needs a positive integer, not '%s'\n", iter_text);
    return KILN_EXIT_USAGE;
  }
  return KILN_EXIT_OK;
}

/* ---- per-device programs on a mesh ----------------------------------- */

/* --replicas / --partitions: a positive count, or the module's default. */
static int mesh_count(const char *text, int64_t dflt, const char *what, uint32_t *out) {
  uint64_t v = dflt > 0 ? (uint64_t)dflt : 1;
  if (text && (parse_seed(text, &v) || v == 0 || v > 4096)) {
    fprintf(stderr, "kiln run: --%s needs an integer from 1 to 4096, not '%s'\n", what, text);
    return KILN_EXIT_USAGE;
  }
  *out = (uint32_t)v;
  return KILN_EXIT_OK;
}

/* Device K's arguments from "FILE,FILE,..." into dev[0..n); 0 or an exit
 * code. Commas inside braces or brackets belong to an HLO literal value
 * ("s32[2] {1, 2}"), so those are not separators. */
int kiln__device_args(const char *file, const char *k_text, const char *list,
                      const kiln_shape *shapes, uint32_t n, kiln_literal **dev) {
  char *copy = kiln_malloc(strlen(list) + 1);
  if (copy == NULL) {
    fprintf(stderr, "kiln run: error: out of memory\n");
    return KILN_EXIT_INTERNAL;
  }
  uint32_t given = 0;
  int rc = KILN_EXIT_OK;
  kiln_status st;
  kiln_status_clear(&st);
  for (const char *p = list; rc == KILN_EXIT_OK;) {
    size_t len = 0;
    int depth = 0;
    while (p[len] && (p[len] != ',' || depth > 0)) {
      depth += p[len] == '{' || p[len] == '[';
      depth -= (p[len] == '}' || p[len] == ']') && depth > 0;
      len++;
    }
    memcpy(copy, p, len);
    copy[len] = '\0';
    if (given < n && kiln__arg_load(copy, &shapes[given], given, &dev[given], &st)) {
      kiln__report(file, NULL, &st);
      rc = kiln__exit_code(st.code);
    }
    given++;
    if (p[len] == '\0') break;
    p += len + 1;
  }
  if (rc == KILN_EXIT_OK && given != n) {
    fprintf(stderr, "%s: error: --device-args %s gives %u argument%s, the ENTRY takes %u\n", file,
            k_text, given, given == 1 ? "" : "s", n);
    rc = KILN_EXIT_INVALID;
  }
  kiln_free(copy);
  return rc;
}

int kiln__device_args_all(const kiln__args *a, const char *file, uint32_t ndev,
                          const kiln_shape *shapes, uint32_t n, kiln_literal **own, bool *has_own) {
  int npairs, rc = KILN_EXIT_OK;
  const char **pairs = kiln__args_all(a, "device-args", &npairs);
  for (int i = 0; i + 1 < npairs && rc == 0; i += 2) {
    uint64_t k;
    if (parse_seed(pairs[i], &k) || k >= ndev) {
      fprintf(stderr, "kiln run: --device-args needs a device number below %u, not '%s'\n", ndev,
              pairs[i]);
      return KILN_EXIT_USAGE;
    }
    if (has_own[k]) {
      fprintf(stderr, "kiln run: --device-args gives device %llu twice\n", (unsigned long long)k);
      return KILN_EXIT_USAGE;
    }
    has_own[k] = true;
    rc = kiln__device_args(file, pairs[i], pairs[i + 1], shapes, n, own + k * n);
  }
  return rc;
}

/* Runs m on R x P devices and prints each device's outputs; 0 or an exit
 * code. The --arg values (built once) are shared by the devices that have
 * no --device-args. */
static int run_mesh(const char *file, const kiln_module *m, const char *what, const char *backend,
                    const kiln_shape *shapes, uint32_t n, const kiln__args *a,
                    const kiln_run_options *ropts) {
  uint32_t R, P;
  int rc = mesh_count(kiln__args_get(a, "replicas"), m->replica_count, "replicas", &R);
  if (rc == 0)
    rc = mesh_count(kiln__args_get(a, "partitions"), m->num_partitions, "partitions", &P);
  if (rc) return rc;
  uint32_t ndev = R * P;
  if (ndev > 4096) {
    fprintf(stderr, "kiln run: a mesh of %u x %u devices is too large (at most 4096)\n", R, P);
    return KILN_EXIT_USAGE;
  }
  kiln_literal **base = kiln_calloc(n ? n : 1, sizeof *base);
  kiln_literal **own = kiln_calloc((size_t)ndev * (n ? n : 1), sizeof *own);
  const kiln_literal **views = kiln_calloc((size_t)ndev * (n ? n : 1), sizeof *views);
  const kiln_literal *const **per = kiln_calloc(ndev, sizeof *per);
  kiln_literal **outs = kiln_calloc(ndev, sizeof *outs);
  bool *has_own = kiln_calloc(ndev, sizeof *has_own);
  if (!base || !own || !views || !per || !outs || !has_own) {
    fprintf(stderr, "kiln run: error: out of memory\n");
    rc = KILN_EXIT_INTERNAL;
    goto out_free;
  }
  if (rc == 0) rc = kiln__device_args_all(a, file, ndev, shapes, n, own, has_own);
  bool need_base = false;
  for (uint32_t k = 0; k < ndev; k++) need_base = need_base || !has_own[k];
  if (rc == 0 && need_base) rc = build_args(file, what, shapes, a, base, n);
  if (rc) goto out_free;
  for (uint32_t k = 0; k < ndev; k++) {
    for (uint32_t i = 0; i < n; i++) views[k * n + i] = has_own[k] ? own[k * n + i] : base[i];
    per[k] = views + k * n;
  }
  kiln_status st;
  kiln_status_clear(&st);
  if (kiln_run_module_mesh(m, backend, ropts, R, P, per, n, outs, &st)) {
    kiln__report(file, m, &st);
    rc = kiln__exit_code(st.code);
    goto out_free;
  }
  const char *out_dir = kiln__args_get(a, "out");
  for (uint32_t k = 0; k < ndev && rc == 0; k++) {
    char dir[4096];
    if (out_dir) snprintf(dir, sizeof dir, "%s/device%u", out_dir, k);
    printf("device %u:\n", k);
    if (out_dir) {
      kiln_status_clear(&st);
      if (kiln__dir_make(out_dir, &st)) {
        kiln__report("kiln run", NULL, &st);
        rc = kiln__exit_code(st.code);
        break;
      }
    }
    rc = emit_outputs(outs[k], out_dir ? dir : NULL);
  }
out_free:
  for (uint32_t k = 0; outs && k < ndev; k++) kiln_literal_destroy(outs[k]);
  for (uint32_t i = 0; base && i < n; i++) kiln_literal_destroy(base[i]);
  for (size_t i = 0; own && i < (size_t)ndev * n; i++) kiln_literal_destroy(own[i]);
  kiln_free(has_own);
  kiln_free(outs);
  kiln_free(per);
  kiln_free(views);
  kiln_free(own);
  kiln_free(base);
  return rc;
}

/* kiln.debug_print messages of a local run go to stderr (stdout holds the
 * outputs); a server's come back in the call's trailing metadata. */
static void debug_to_stderr(void *ctx, const char *text, size_t n) {
  (void)ctx;
  fwrite(text, 1, n, stderr);
  fflush(stderr);
}

static const kiln_debug_sink stderr_sink = {debug_to_stderr, NULL};

/* A global program (its ENTRY carries shardings) on P partitions: global
 * arguments in, the global result out, as PJRT runs it. With --replicas R
 * each replica runs it on its own P devices (device K = replica * P +
 * partition) from the same --arg values and prints its result after a
 * line `replica r:` (--out DIR: DIR/replicaR/i.npy). */
static int run_global(const char *file, const kiln_module *m, const char *what,
                      const run_setup *setup, const kiln_shape *shapes, uint32_t n,
                      const kiln__args *a) {
  uint32_t R, P;
  int rc = mesh_count(kiln__args_get(a, "replicas"), m->replica_count, "replicas", &R);
  if (rc == 0)
    rc = mesh_count(kiln__args_get(a, "partitions"), m->num_partitions, "partitions", &P);
  if (rc) return rc;
  if ((uint64_t)R * P > 4096) {
    fprintf(stderr, "kiln run: a mesh of %u x %u devices is too large (at most 4096)\n", R, P);
    return KILN_EXIT_USAGE;
  }
  kiln_literal **args = kiln_calloc(n ? n : 1, sizeof *args);
  const kiln_literal *const **per = kiln_calloc(R, sizeof *per);
  kiln_literal **results = kiln_calloc(R, sizeof *results);
  if (args == NULL || per == NULL || results == NULL) {
    fprintf(stderr, "kiln run: error: out of memory\n");
    rc = KILN_EXIT_INTERNAL;
    goto out_free;
  }
  rc = build_args(file, what, shapes, a, args, n);
  for (uint32_t r = 0; r < R; r++) per[r] = (const kiln_literal *const *)args;
  kiln_status st;
  kiln_status_clear(&st);
  if (rc == 0 && kiln_run_module_global_mesh(m, setup->backend, &setup->opts, R, P,
                                             setup->co.dump_dir, per, n, results, NULL, &st)) {
    kiln__report(file, m, &st);
    rc = kiln__exit_code(st.code);
  }
  const char *out_dir = kiln__args_get(a, "out");
  if (rc == 0 && R == 1) rc = emit_outputs(results[0], out_dir);
  for (uint32_t r = 0; rc == 0 && R > 1 && r < R; r++) {
    char dir[4096];
    if (out_dir) {
      snprintf(dir, sizeof dir, "%s/replica%u", out_dir, r);
      kiln_status_clear(&st);
      if (kiln__dir_make(out_dir, &st)) {
        kiln__report("kiln run", NULL, &st);
        rc = kiln__exit_code(st.code);
        break;
      }
    }
    printf("replica %u:\n", r);
    rc = emit_outputs(results[r], out_dir ? dir : NULL);
  }
out_free:
  for (uint32_t r = 0; results && r < R; r++) kiln_literal_destroy(results[r]);
  for (uint32_t i = 0; args && i < n; i++) kiln_literal_destroy(args[i]);
  kiln_free(results);
  kiln_free(per);
  kiln_free(args);
  return rc;
}

int kiln__cmd_run(const kiln__args *a) {
  const char *file = a->pos[0];
  run_setup setup;
  int crc = check_options(a, &setup);
  if (crc) return crc;
  bool compiled = setup.compiled, compile_given = setup.compile_given;
  kiln_compile_options co = setup.co;
  kiln_run_options ropts = setup.opts;
  ropts.debug = &stderr_sink;
  if (is_executable(file)) {
    int ntransforms;
    kiln__args_all(a, "transform", &ntransforms);
    const char *named = kiln__args_get(a, "backend");
    if (named && !(kiln_backend_caps(named) & KILN_BACKEND_LOADS)) {
      char names[256];
      kiln_backend_names_join(KILN_BACKEND_LOADS, " or ", names, sizeof names);
      fprintf(stderr, "kiln run: %s is a compiled executable; it runs on the %s backend\n", file,
              names);
      return KILN_EXIT_USAGE;
    }
    if (compile_given || ntransforms) {
      fprintf(stderr,
              "kiln run: %s is already compiled: compiler options and --transform "
              "need a module\n",
              file);
      return KILN_EXIT_USAGE;
    }
    return run_executable_file(file, named, a, &ropts);
  }

  kiln_module *m;
  int rc = kiln__module_load(file, true, &m);
  if (rc) return rc;
  if ((rc = run_transforms(file, a, m))) {
    kiln_module_destroy(m);
    return rc;
  }
  const kiln_computation *entry = kiln_module_entry(m);
  uint32_t n = entry ? kiln_computation_nparams(m, entry) : 0;
  kiln_literal **args = kiln_calloc(n ? n : 1, sizeof *args);
  kiln_shape *shapes = kiln_calloc(n ? n : 1, sizeof *shapes);
  kiln_literal *result = NULL;
  kiln_executable *e = NULL;
  char what[300];
  if (args == NULL || shapes == NULL) {
    fprintf(stderr, "kiln run: error: out of memory\n");
    rc = KILN_EXIT_INTERNAL;
    goto out_free_module;
  }
  if (entry == NULL) {
    fprintf(stderr, "%s: error: module has no ENTRY computation\n", file);
    rc = KILN_EXIT_INVALID;
    goto out_free_args;
  }
  snprintf(what, sizeof what, "ENTRY computation %s", entry->name);
  for (uint32_t i = 0; i < n; i++) {
    const kiln_instr *p = kiln_computation_param(m, entry, i);
    if (p == NULL) {
      fprintf(stderr, "%s: error: parameter %u missing after verification\n", file, i);
      rc = KILN_EXIT_INTERNAL;
      goto out_free_args;
    }
    shapes[i] = p->shape;
  }
  if (kiln__auto_shard_wanted(a)) {
    /* Shardings chosen here make m a global program. */
    const char *rt = kiln__args_get(a, "replicas");
    uint32_t P;
    if ((rt && strcmp(rt, "1") != 0) || kiln__args_get(a, "device-args")) {
      fprintf(stderr, "kiln run: --auto-shard makes a global program: it takes neither "
                      "--replicas nor --device-args\n");
      rc = KILN_EXIT_USAGE;
      goto out_free_args;
    }
    rc = mesh_count(kiln__args_get(a, "partitions"), m->num_partitions, "partitions", &P);
    if (rc == 0) rc = kiln__auto_shard(a, file, m, P, stderr, NULL);
    if (rc) goto out_free_args;
  }
  if (kiln__args_get(a, "replicas") || kiln__args_get(a, "partitions") ||
      kiln__args_get(a, "device-args")) {
    if (!kiln__args_get(a, "device-args") && kiln_spmd_module_is_sharded(m))
      rc = run_global(file, m, what, &setup, shapes, n, a);
    else
      rc = run_mesh(file, m, what, setup.backend, shapes, n, a, &ropts);
    goto out_free_args;
  }
  kiln_status st;
  kiln_status_clear(&st);
  if (compiled) { /* compile first: an unsupported op fails before arguments are read */
    if (kiln_compile(m, &co, &e, NULL, &st)) {
      kiln__report(file, m, &st);
      rc = kiln__exit_code(st.code);
    } else {
      rc = run_compiled(file, m, what, setup.backend, e, shapes, n, a, &ropts);
    }
    goto out_free_args;
  }
  rc = build_args(file, what, shapes, a, args, n);
  if (rc) goto out_free_args;

  int err = kiln_run_module_with(m, setup.backend, NULL, NULL, &ropts,
                                 (const kiln_literal *const *)args, n, &result, &st);
  if (err == 0 && result == NULL) err = kiln_status_set(&st, KILN_EINTERNAL, NULL, "no result");
  if (err) {
    kiln__report(file, m, &st);
    rc = kiln__exit_code(err);
    goto out_free_args;
  }
  rc = emit_outputs(result, kiln__args_get(a, "out"));
  kiln_literal_destroy(result);
out_free_args:
  for (uint32_t i = 0; args && i < n; i++) kiln_literal_destroy(args[i]);
  kiln_free(args);
  kiln_free(shapes);
  kiln_executable_destroy(e);
out_free_module:
  kiln_module_destroy(m);
  return rc;
}
