/* One-call runs: module -> (compile) -> load -> run -> release.
 *
 * Each call creates its own backend and releases it before returning, so
 * nothing lingers between calls (no thread pool survives a fork, no cached
 * code outlives its executable). That costs a thread start per device per
 * call, which is fine for the command line and tests; a server keeps its
 * backend.
 */
#include "executor/run.h"

#include <string.h>

#include "common/alloc.h"
#include "compiler/codegen/executable.h"
#include "compiler/compile.h"
#include "compiler/eval/interp.h"
#include "compiler/ir/rewrite.h"
#include "compiler/target.h"

/* The backend for an executable when none is named: its target's backend
 * when that one loads executables, else the first registered backend that
 * does (whose loader then says what is wrong with the target). */
static const char *backend_for(const kiln_executable *e) {
  const kiln_target *t = NULL;
  if (e && e->target && kiln_target_resolve(NULL, e->target, &t, NULL) != 0) t = NULL;
  if (t && (kiln_backend_caps(t->backend) & KILN_BACKEND_LOADS)) return t->backend;
  uint32_t n;
  const char *const *names = kiln_backend_names(&n);
  for (uint32_t i = 0; i < n; i++)
    if (kiln_backend_caps(names[i]) & KILN_BACKEND_LOADS) return names[i];
  return NULL;
}

/* Loads e on device 0 of b and runs it. */
static int run_loaded(kiln_backend *b, const kiln_executable *e, const kiln_run_options *ropts,
                      const kiln_literal *const *args, uint32_t nargs, kiln_literal **out,
                      kiln_status *st) {
  kiln_loaded *l = NULL;
  int rc = kiln_device_load(kiln_backend_device(b, 0), e, &l, st);
  if (rc == 0) rc = kiln_loaded_run(l, args, nargs, ropts, out, st);
  kiln_loaded_destroy(l);
  return rc;
}

int kiln_run_executable_on(const char *backend, const kiln_executable *e,
                           const kiln_backend_options *bopts, const kiln_run_options *ropts,
                           const kiln_literal *const *args, uint32_t nargs, kiln_literal **out,
                           kiln_status *st) {
  if (out) *out = NULL;
  if (e == NULL) return kiln_status_set(st, KILN_EINVAL, "run", "no executable");
  if (backend == NULL && (backend = backend_for(e)) == NULL)
    return kiln_status_set(st, KILN_EUNIMPL, "run", "no backend here loads executables");
  kiln_backend *b = NULL;
  int rc = kiln_backend_create(backend, bopts, &b, st);
  if (rc == 0) rc = run_loaded(b, e, ropts, args, nargs, out, st);
  kiln_backend_destroy(b);
  return rc;
}

int kiln_run_executable(const kiln_executable *e, const kiln_backend_options *bopts,
                        const kiln_run_options *ropts, const kiln_literal *const *args,
                        uint32_t nargs, kiln_literal **out, kiln_status *st) {
  return kiln_run_executable_on(NULL, e, bopts, ropts, args, nargs, out, st);
}

int kiln_run_executable_blob(const uint8_t *blob, size_t len, const kiln_backend_options *bopts,
                             const kiln_run_options *ropts, const kiln_literal *const *args,
                             uint32_t nargs, kiln_literal **out, kiln_status *st) {
  if (out) *out = NULL;
  if (blob == NULL && len > 0)
    return kiln_status_set(st, KILN_EINVAL, "run", "no executable bytes");
  kiln_executable *e = NULL;
  int rc = kiln_executable_deserialize(blob, len, &e, st);
  if (rc == 0) rc = kiln_run_executable(e, bopts, ropts, args, nargs, out, st);
  kiln_executable_destroy(e);
  return rc;
}

int kiln_run_module_with(const kiln_module *m, const char *backend,
                         const kiln_compile_options *copts, const kiln_backend_options *bopts,
                         const kiln_run_options *ropts, const kiln_literal *const *args,
                         uint32_t nargs, kiln_literal **out, kiln_status *st) {
  if (out == NULL) return kiln_status_set(st, KILN_EINVAL, "run", "no result pointer");
  *out = NULL;
  if (m == NULL) return kiln_status_set(st, KILN_EINVAL, "run", "no module");
  if (args == NULL && nargs > 0) return kiln_status_set(st, KILN_EINVAL, "run", "no arguments");
  kiln_backend *b = NULL;
  int rc = kiln_backend_create(backend ? backend : KILN_RUN_DEFAULT_BACKEND, bopts, &b, st);
  if (rc) return rc;
  if (kiln_backend_runs_modules(b)) {
    rc = kiln_device_run_module(kiln_backend_device(b, 0), m, args, nargs, ropts, out, st);
  } else { /* compile first, then load what came out */
    kiln_executable *e = NULL;
    rc = kiln_compile(m, copts, &e, NULL, st);
    if (rc == 0) rc = run_loaded(b, e, ropts, args, nargs, out, st);
    kiln_executable_destroy(e);
  }
  kiln_backend_destroy(b);
  return rc;
}

int kiln_run_module(const kiln_module *m, const char *backend, const kiln_compile_options *copts,
                    const kiln_literal *const *args, uint32_t nargs, kiln_literal **out,
                    kiln_status *st) {
  return kiln_run_module_with(m, backend, copts, NULL, NULL, args, nargs, out, st);
}

/* A compiled backend's mesh: the module compiled once for replicas x
 * partitions (its own counts are replaced by those), loaded on that many
 * devices of one backend (backend option ndevices), run as one gang. */
static int run_compiled_mesh(const kiln_module *m, const char *backend,
                             const kiln_run_options *ropts, uint32_t replicas, uint32_t partitions,
                             const kiln_literal *const *const *args, uint32_t nargs,
                             kiln_literal **outs, kiln_status *st) {
  if (m == NULL || outs == NULL || (nargs && args == NULL))
    return kiln_status_set(st, KILN_EINVAL, "mesh", "missing module, arguments or results");
  if (replicas == 0 || partitions == 0 || (uint64_t)replicas * partitions > 4096)
    return kiln_status_set(st, KILN_EINVAL, "mesh",
                           "a mesh of %u replicas x %u partitions: each must be at least 1 and "
                           "the product at most 4096",
                           replicas, partitions);
  uint32_t n = replicas * partitions;
  for (uint32_t k = 0; k < n; k++) outs[k] = NULL;
  if (!(kiln_backend_caps(backend) & KILN_BACKEND_LOADS))
    return kiln_status_set(st, kiln_backend_caps(backend) ? KILN_EUNIMPL : KILN_ENOTFOUND, "run",
                           "backend %s does not run compiled per-device programs", backend);
  kiln_module *mm = NULL;
  kiln_executable *e = NULL;
  kiln_backend *b = NULL;
  kiln_comm *comm = NULL;
  kiln_mesh *mesh = NULL;
  kiln_device **devs = kiln_calloc(n, sizeof *devs);
  int rc = devs ? kiln_module_clone(m, &mm) : KILN_ENOMEM;
  if (rc) {
    kiln_free(devs);
    return kiln_status_set(st, KILN_ENOMEM, "mesh", "out of memory");
  }
  mm->replica_count = replicas;
  mm->num_partitions = partitions;
  kiln_backend_options bo = {.ndevices = n};
  rc = kiln_compile(mm, NULL, &e, NULL, st);
  if (rc == 0) rc = kiln_backend_create(backend, &bo, &b, st);
  for (uint32_t k = 0; rc == 0 && k < n; k++)
    if ((devs[k] = kiln_backend_device(b, k)) == NULL)
      rc = kiln_status_set(st, KILN_ELIMIT, "mesh", "backend %s has no device %u", backend, k);
  if (rc == 0) rc = kiln_comm_create(b, devs, n, &comm, st);
  if (rc == 0) rc = kiln_comm_load(comm, e, &mesh, st);
  if (rc == 0) rc = kiln_mesh_run(mesh, args, nargs, ropts, outs, st);
  kiln_mesh_destroy(mesh);
  kiln_comm_destroy(comm);
  kiln_backend_destroy(b);
  kiln_executable_destroy(e);
  kiln_module_destroy(mm);
  kiln_free(devs);
  return rc;
}

int kiln_run_module_mesh(const kiln_module *m, const char *backend, const kiln_run_options *ropts,
                         uint32_t replicas, uint32_t partitions,
                         const kiln_literal *const *const *args, uint32_t nargs,
                         kiln_literal **outs, kiln_status *st) {
  if (backend == NULL) backend = KILN_RUN_DEFAULT_BACKEND;
  if (strcmp(backend, "interp") != 0)
    return run_compiled_mesh(m, backend, ropts, replicas, partitions, args, nargs, outs, st);
  kiln_interp_options io = {0};
  if (ropts) {
    io.max_while_iterations = ropts->max_while_iterations;
    io.timeout_seconds = ropts->timeout_seconds;
    io.cancel = ropts->cancel;
    io.max_live_bytes = ropts->max_live_bytes;
    io.debug = ropts->debug;
  }
  return kiln_interp_run_mesh(m, replicas, partitions, args, nargs, &io, outs, st);
}
