/* Execute: run a compiled executable on inline literals and buffer handles.
 *
 * On the completion-queue thread the request is resolved completely before
 * any device is involved: the executable, each argument (decoded, or a
 * reference to the caller's buffer), every shape against the signature, the
 * outputs to keep. Only a request that can run is queued, so a device never
 * spends time on a malformed one. Donated buffers leave the handle table
 * when the job is queued (nobody can use the handle after), and their memory
 * goes when the run is over.
 *
 * The job runs on a device worker of the scheduler, which honours the call's
 * deadline and skips it if the caller went away while it waited. A running
 * job stops too: the run's cancel flag is the call's `cancelled`, which the
 * close watch raises when the caller goes away or gRPC ends the call at its
 * deadline, and the run's time limit is the time left. The device is handed
 * back before the reply is built (exec_done). Outputs come back inline or
 * stay on the server as new handles of the caller.
 *
 * Buffer handles name device memory. A cpu program whose call names a
 * handle or keeps an output runs on device buffers (kiln_loaded_execute):
 * a handle's buffer is passed as it is (cpu devices share the host's
 * memory), inline arguments are written into fresh device buffers, and an
 * output kept on the server is the result buffer itself, stored with its
 * layout; inline outputs are sent from the result buffers' host memory.
 * Programs with tuple parameters or nested tuple results, handles whose
 * layout is not the program's, and interpreter runs take host literals
 * instead: a handle in host memory is viewed as a literal in place (a copy
 * only when its bytes are not row-major), and a kept output is written into
 * a device buffer. Calls with inline arguments only and nothing kept run on
 * literals as they always did: zero-copy binding, the fastest path.
 *
 * Tiny programs skip the hand-off: when an executable's recent runs were
 * short, its device is free and nobody is queued for the class, the job runs
 * right here on the completion-queue thread (kiln_sched_run_now). Waking a
 * worker and waking a cq thread again for the reply cost more than such a
 * run. At most cq-threads - 1 calls run that way at once, so one cq thread
 * always keeps serving the queue (cancellations, health checks). Such a call
 * starts its close watch first like any other: a program whose recent runs
 * were short may run long on this call's arguments, and only the watch
 * (served by another cq thread) tells its run that the caller went away.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/codegen/executable.h"
#include "compiler/ir/debug_print.h"
#include "compiler/ir/ir.h"
#include "compiler/ir/proto_internal.h"
#include "compiler/spmd/spmd.h"
#include "executor/backend.h"
#include "executor/buffers.h"
#include "executor/run.h"
#include "executor/scheduler.h"
#include "kiln/v1/kiln.pb-c.h"
#include "server/convert.h"
#include "server/executables.h"
#include "server/server.h"

#define MAX_ARGS 4096
/* Programs whose recent runs took less than this run on the cq thread. */
#define INLINE_RUN_NS 200000

/* Calls running on cq threads now (kilnd serves one server per process). */
static atomic_int inline_runs;

typedef struct exec_state {
  kilnd_exe *e;
  kiln_arena *arena; /* decoded arguments, reply pieces */
  const kiln_literal **args;
  uint32_t nargs;
  kiln_stored **held; /* buffer references, one per handle argument */
  uint32_t nheld;
  kiln_stored **arg_buf; /* per parameter: its handle's buffer, or NULL (inline) */
  bool *arg_donated;     /* per parameter: the caller donated it */
  /* The device path (see the top of the file): parameter buffers (those not
   * a handle's are owned, freed in exec_free) and result buffers. */
  bool on_device;
  kiln_buffer **dargs;
  bool *dargs_owned;
  kiln_buffer **dres;
  uint32_t ndres;
  int64_t queued_at;
  kiln_literal *out;
  /* SPMD runs (ndevices > 1): the order the devices run in (device_ids, or
   * the scheduler's), a global program's argument shards, a per-device
   * program's results (ndouts, device-major; a global program's on R
   * replicas: each replica's global result), and its argument count per
   * device (nargs is a multiple of it, or equal). */
  uint32_t *order;
  kiln_literal **shards;
  uint32_t nshards;
  kiln_literal **douts;
  uint32_t ndouts;
  uint32_t nparams;
  /* The run's outcome, from exec_run to exec_done. */
  int rc;
  kiln_status st;
  int64_t t0, t1;
  bool counted_inline; /* in inline_runs until the run is over */
} exec_state;

/* Spare states with their (reset) arenas: an Execute allocates no arena
 * block of its own, and glibc does not consolidate and trim its heap after
 * every call for the 64 KiB block it would free. Bounded, so memory stays
 * flat. */
#define SPARE_STATES 32
static pthread_mutex_t spare_mu = PTHREAD_MUTEX_INITIALIZER;
static exec_state *spare[SPARE_STATES];
static uint32_t nspare;

static exec_state *exec_new(void) {
  exec_state *es = NULL;
  pthread_mutex_lock(&spare_mu);
  if (nspare) es = spare[--nspare];
  pthread_mutex_unlock(&spare_mu);
  if (es) return es;
  es = kiln_calloc(1, sizeof *es);
  if (es) es->arena = kiln_arena_create();
  if (es && es->arena == NULL) {
    kiln_free(es);
    es = NULL;
  }
  return es;
}

static void exec_free(kilnd_call *c) {
  exec_state *es = c->state;
  for (uint32_t i = 0; es->dargs && i < es->nargs; i++)
    if (es->dargs_owned[i]) kiln_buffer_free(es->dargs[i]);
  for (uint32_t i = 0; es->dres && i < es->ndres; i++) kiln_buffer_free(es->dres[i]);
  for (uint32_t i = 0; i < es->nheld; i++) kiln_buffer_store_unref(c->srv->buffers, es->held[i]);
  kiln_literal_destroy(es->out);
  for (uint32_t i = 0; es->shards && i < es->nshards; i++) kiln_literal_destroy(es->shards[i]);
  for (uint32_t i = 0; es->douts && i < es->ndouts; i++) kiln_literal_destroy(es->douts[i]);
  kiln_free(es->shards);
  kiln_free(es->douts);
  kilnd_exe_unref(es->e);
  kiln_arena *arena = es->arena;
  kiln_arena_reset(arena);
  memset(es, 0, sizeof *es);
  es->arena = arena;
  pthread_mutex_lock(&spare_mu);
  if (nspare < SPARE_STATES) {
    spare[nspare++] = es;
    es = NULL;
  }
  pthread_mutex_unlock(&spare_mu);
  if (es == NULL) return;
  kiln_arena_destroy(arena);
  kiln_free(es);
}

/* ---- resolving the request ----------------------------------------------------------- */

static const kiln_shape *param_shape(const kiln_module *m, uint32_t i) {
  const kiln_instr *p = kiln_computation_param(m, kiln_module_entry(m), i);
  return p ? &p->shape : NULL;
}

static uint32_t output_count(const kiln_module *m) {
  const kiln_instr *root = kiln_computation_root(m, kiln_module_entry(m));
  return kiln_shape_is_tuple(&root->shape) ? root->shape.rank : 1;
}

static int check_shape(const kiln_shape *want, const kiln_shape *got, uint32_t i, kiln_status *st) {
  if (want == NULL)
    return kiln_status_set(st, KILN_EINTERNAL, "arguments", "parameter %u is missing", i);
  if (kiln_shape_equal(want, got, false)) return 0;
  char w[160], g[160];
  kilnd_shape_str(want, w, sizeof w);
  kilnd_shape_str(got, g, sizeof g);
  return kiln_status_set(st, KILN_EINVAL, "arguments", "argument %u: expected %s, got %s", i, w, g);
}

static bool donated_twice(const Kiln__V1__ExecuteRequest *r, uint32_t i) {
  for (uint32_t k = 0; k < r->n_arguments; k++) {
    const Kiln__V1__Argument *a = r->arguments[k];
    if (k != i && a->value_case == KILN__V1__ARGUMENT__VALUE_BUFFER_HANDLE &&
        strcmp(a->buffer_handle, r->arguments[i]->buffer_handle) == 0)
      return true;
  }
  return false;
}

/* "arguments[i]", without the cost of snprintf on every call. */
static void arg_path(char out[48], uint32_t i) {
  char digits[12];
  int n = 0;
  do digits[n++] = (char)('0' + i % 10);
  while ((i /= 10) != 0);
  memcpy(out, "arguments[", 10);
  char *p = out + 10;
  while (n) *p++ = digits[--n];
  memcpy(p, "]", 2);
}

/* A handle's array as a host literal for the literal path (and the shape
 * checks): a view of its host memory, or a row-major copy in the arena. */
static int handle_literal(exec_state *es, const kiln_stored *b, const char *path,
                          const kiln_literal **out, kiln_status *st) {
  kiln_literal *view = kiln_arena_alloc(es->arena, sizeof *view);
  if (view == NULL) return kiln_status_set(st, KILN_ENOMEM, path, "out of memory");
  if (kiln_stored_view(b, view, NULL) != 0) {
    memset(view, 0, sizeof *view);
    view->shape = *b->shape;
    view->shape.layout = NULL;
    view->nbytes = (size_t)b->bytes;
    view->data = kiln_arena_alloc(es->arena, view->nbytes ? view->nbytes : 1);
    if (view->data == NULL) return kiln_status_set(st, KILN_ENOMEM, path, "out of memory");
    int rc = kiln_array_read_row_major(b->buf, b->shape, view->data, st);
    if (rc) return rc;
  }
  *out = view;
  return 0;
}

static int resolve_arg(kilnd_call *c, exec_state *es, const Kiln__V1__ExecuteRequest *r, uint32_t i,
                       uint32_t param, kiln_status *st) {
  const Kiln__V1__Argument *a = r->arguments[i];
  char path[48];
  arg_path(path, i);
  const kiln_literal *lit = NULL;
  if (a->value_case == KILN__V1__ARGUMENT__VALUE_LITERAL) {
    if (a->donate)
      return kiln_status_set(st, KILN_EINVAL, path, "only buffer handles can be donated");
    kiln_literal *l = NULL;
    int rc = kiln__proto_literal_decode(es->arena, a->literal, path, &l, st);
    if (rc) return rc;
    lit = l;
  } else if (a->value_case == KILN__V1__ARGUMENT__VALUE_BUFFER_HANDLE) {
    if (a->donate && donated_twice(r, i))
      return kiln_status_set(st, KILN_EINVAL, path,
                             "a donated buffer cannot also be passed as another argument");
    kiln_stored *b = NULL;
    int rc = kiln_buffer_store_acquire(c->srv->buffers, c->client, a->buffer_handle, false, &b, st);
    if (rc) return rc;
    es->held[es->nheld++] = b;
    es->arg_buf[i] = b;
    es->arg_donated[i] = a->donate;
    if ((rc = handle_literal(es, b, path, &lit, st)) != 0) return rc;
  } else {
    return kiln_status_set(st, KILN_EINVAL, path, "neither literal nor buffer_handle is set");
  }
  int64_t n = kiln_literal_elements(lit);
  if (kiln_shape_is_array(&lit->shape) && (n < 0 || (uint64_t)n > c->srv->cfg.max_elements))
    return kiln_status_set(st, KILN_ELIMIT, path, "more than %llu elements (max-elements)",
                           (unsigned long long)c->srv->cfg.max_elements);
  const kiln_shape *want = param_shape(es->e->module, param);
  if (want && kiln_shape_is_dynamic(want) && es->arg_buf[i] == NULL &&
      !kiln_shape_equal(want, &lit->shape, false)) {
    /* A bounded-dynamic parameter takes an array of at most its bounds. */
    kiln_status fs;
    kiln_status_clear(&fs);
    const kiln_literal *fit = NULL;
    if (kiln_literal_fit_bounds(es->arena, lit, want, &fit, &fs)) {
      char w[160], g[160];
      kilnd_shape_str(want, w, sizeof w);
      kilnd_shape_str(&lit->shape, g, sizeof g);
      return kiln_status_set(st, KILN_EINVAL, path, "argument %u: expected %s, got %s: %s", i, w, g,
                             fs.msg);
    }
    lit = fit;
  }
  es->args[i] = lit;
  return check_shape(want, &lit->shape, i, st);
}

/* ExecuteRequest.device_ids: checked, then honoured or refused. */
static int check_devices(kilnd *srv, const kilnd_exe *e, const Kiln__V1__ExecuteRequest *r,
                         kiln_status *st) {
  if (r->n_device_ids == 0) return 0;
  if (r->n_device_ids != e->ndevices)
    return kiln_status_set(st, KILN_EINVAL, "device_ids", "%zu devices for a %u-device program",
                           r->n_device_ids, e->ndevices);
  uint32_t first = kiln_sched_class_first(srv->sched, (uint32_t)e->dev_class);
  uint32_t n = kiln_sched_class_devices(srv->sched, (uint32_t)e->dev_class);
  for (size_t i = 0; i < r->n_device_ids; i++) {
    if (r->device_ids[i] < (int32_t)first || r->device_ids[i] >= (int32_t)(first + n))
      return kiln_status_set(st, KILN_EINVAL, "device_ids",
                             "device %d cannot run this program (its devices are %u to %u)",
                             r->device_ids[i], first, first + n - 1);
    for (size_t k = 0; k < i; k++)
      if (r->device_ids[k] == r->device_ids[i])
        return kiln_status_set(st, KILN_EINVAL, "device_ids",
                               "device %d is named twice (entries %zu and %zu)", r->device_ids[i],
                               k, i);
  }
  /* The scheduler places runs itself: a list is honoured only where it
   * names the one placement there is (the order of an SPMD program's
   * devices is honoured too), never accepted and then ignored. An
   * interpreter mesh runs on one scheduler slot, so only its own order
   * could be chosen: refused. */
  bool interp_mesh = e->ndevices > 1 && e->dev_class == KILND_CLASS_INTERP;
  bool cpu_mesh = e->ndevices > 1 && !interp_mesh; /* sched_devices: the whole class */
  if ((n != e->ndevices && !cpu_mesh) || interp_mesh)
    return kiln_status_set(st, KILN_EUNIMPL, "device_ids",
                           "choosing devices is not supported yet (%u devices can run this "
                           "program; leave device_ids empty and the scheduler chooses)",
                           n);
  return 0;
}

/* Scheduler devices one run takes: the program's, except an interpreter
 * mesh, whose devices are interpreters meeting in one slot's threads, and
 * a cpu mesh whose call names its devices among more: it takes every device
 * of the class (claimed at once, as any gang) and runs on those named. */
static uint32_t sched_devices(kilnd *srv, const kilnd_exe *e, const Kiln__V1__ExecuteRequest *r) {
  if (e->ndevices > 1 && e->dev_class == KILND_CLASS_INTERP) return 1;
  if (e->ndevices > 1 && r->n_device_ids)
    return kiln_sched_class_devices(srv->sched, (uint32_t)e->dev_class);
  return e->ndevices;
}

/* An SPMD program's request (ndevices > 1; see ExecuteRequest.arguments):
 * global arrays, or arguments for every device or per device. Runs on host
 * literals. */
static int resolve_mesh(kilnd_call *c, exec_state *es, const Kiln__V1__ExecuteRequest *r,
                        kiln_status *st) {
  const kilnd_exe *e = es->e;
  const kiln_module *m = e->module;
  uint32_t nparams = kiln_computation_nparams(m, kiln_module_entry(m));
  uint32_t ndev = e->ndevices;
  /* a global program on R replicas: each replica's global arrays */
  uint32_t R = e->per_device || e->replicas < 1 ? 1 : e->replicas;
  uint32_t nout = output_count(m) * (e->per_device ? ndev : R);
  if (e->per_device) {
    if (r->n_arguments != nparams && r->n_arguments != (size_t)nparams * ndev)
      return kiln_status_set(st, KILN_EINVAL, "arguments",
                             "the per-device program takes %u arguments on each of %u devices: "
                             "give %u (every device the same) or %u (grouped by device), not %zu",
                             nparams, ndev, nparams, nparams * ndev, r->n_arguments);
  } else if (R > 1 && r->n_arguments != nparams && r->n_arguments != (size_t)nparams * R) {
    return kiln_status_set(st, KILN_EINVAL, "arguments",
                           "the global program takes %u arguments on each of %u replicas: give "
                           "%u (every replica the same) or %u (grouped by replica), not %zu",
                           nparams, R, nparams, nparams * R, r->n_arguments);
  } else if (R == 1 && r->n_arguments != nparams) {
    return kiln_status_set(st, KILN_EINVAL, "arguments",
                           "the program takes %u (global) arguments, got %zu", nparams,
                           r->n_arguments);
  }
  if (r->n_keep_on_server > nout)
    return kiln_status_set(st, KILN_EINVAL, "keep_on_server", "%zu entries for %u outputs",
                           r->n_keep_on_server, nout);
  int rc = check_devices(c->srv, e, r, st);
  if (rc) return rc;
  uint32_t na = (uint32_t)r->n_arguments;
  size_t np = na ? na : 1;
  es->args = kiln_arena_calloc(es->arena, np, sizeof *es->args);
  es->held = kiln_arena_calloc(es->arena, np, sizeof *es->held);
  es->arg_buf = kiln_arena_calloc(es->arena, np, sizeof *es->arg_buf);
  es->arg_donated = kiln_arena_calloc(es->arena, np, sizeof *es->arg_donated);
  es->order = kiln_arena_calloc(es->arena, ndev, sizeof *es->order);
  if (!es->args || !es->held || !es->arg_buf || !es->arg_donated || !es->order)
    return kiln_status_set(st, KILN_ENOMEM, "Execute", "out of memory");
  es->nargs = na;
  es->nparams = nparams;
  for (uint32_t i = 0; i < na; i++)
    if ((rc = resolve_arg(c, es, r, i, nparams ? i % nparams : 0, st))) return rc;
  es->on_device = false;
  return 0;
}

/* Whether the run goes on device buffers (see the top of the file): a cpu
 * program with array parameters and array (or tuple of arrays) results,
 * called with a handle or keeping an output, every handle in the layout of
 * its parameter's binding, every inline argument's binding row-major. */
static int choose_path(exec_state *es, const Kiln__V1__ExecuteRequest *r, kiln_status *st) {
  es->on_device = false;
  const kiln_executable *e = es->e->exe;
  if (es->e->dev_class != KILND_CLASS_CPU || e == NULL) return 0;
  bool wanted = es->nheld > 0;
  for (size_t i = 0; i < r->n_keep_on_server; i++) wanted |= r->keep_on_server[i];
  if (!wanted || e->dyn || e->nparam_leaves != e->nparams || e->nparams != es->nargs) return 0;
  const kiln_shape *rs = &e->result_shape;
  if (kiln_shape_is_tuple(rs)) {
    if (e->nresults != rs->rank) return 0;
    for (uint32_t i = 0; i < rs->rank; i++)
      if (!kiln_shape_is_array(&rs->tuple[i])) return 0;
  } else if (!kiln_shape_is_array(rs) || e->nresults != 1) {
    return 0;
  }
  for (uint32_t i = 0; i < e->nparams; i++) {
    const kiln_shape *bs = &e->params[i].shape;
    if (!kiln_shape_is_array(&e->param_shapes[i])) return 0;
    if (es->arg_buf[i] ? !kiln_shape_equal(es->arg_buf[i]->shape, bs, true)
                       : !kiln_shape_is_row_major(bs) || es->args[i]->dynamic_sizes)
      return 0;
  }
  size_t np = e->nparams ? e->nparams : 1, nr = e->nresults ? e->nresults : 1;
  es->dargs = kiln_arena_calloc(es->arena, np, sizeof *es->dargs);
  es->dargs_owned = kiln_arena_calloc(es->arena, np, sizeof *es->dargs_owned);
  es->dres = kiln_arena_calloc(es->arena, nr, sizeof *es->dres);
  if (es->dargs == NULL || es->dargs_owned == NULL || es->dres == NULL)
    return kiln_status_set(st, KILN_ENOMEM, "Execute", "out of memory");
  es->on_device = true;
  return 0;
}

static int resolve(kilnd_call *c, exec_state *es, const Kiln__V1__ExecuteRequest *r,
                   kiln_status *st) {
  if (r->executable_id == NULL || r->executable_id[0] == '\0')
    return kiln_status_set(st, KILN_EINVAL, "executable_id", "required");
  int rc = kilnd_exes_get(c->srv->exes, r->executable_id, &es->e, st);
  if (rc) return rc;
  if (es->e->ndevices > 1) return resolve_mesh(c, es, r, st);
  const kiln_module *m = es->e->module;
  uint32_t nparams = kiln_computation_nparams(m, kiln_module_entry(m));
  if (r->n_arguments != nparams)
    return kiln_status_set(st, KILN_EINVAL, "arguments", "the program takes %u arguments, got %zu",
                           nparams, r->n_arguments);
  uint32_t nout = output_count(m);
  if (r->n_keep_on_server > nout)
    return kiln_status_set(st, KILN_EINVAL, "keep_on_server", "%zu entries for %u outputs",
                           r->n_keep_on_server, nout);
  if ((rc = check_devices(c->srv, es->e, r, st))) return rc;
  size_t np = nparams ? nparams : 1;
  es->args = kiln_arena_calloc(es->arena, np, sizeof *es->args);
  es->held = kiln_arena_calloc(es->arena, np, sizeof *es->held);
  es->arg_buf = kiln_arena_calloc(es->arena, np, sizeof *es->arg_buf);
  es->arg_donated = kiln_arena_calloc(es->arena, np, sizeof *es->arg_donated);
  if (es->args == NULL || es->held == NULL || es->arg_buf == NULL || es->arg_donated == NULL)
    return kiln_status_set(st, KILN_ENOMEM, "Execute", "out of memory");
  es->nargs = nparams;
  for (uint32_t i = 0; i < nparams; i++)
    if ((rc = resolve_arg(c, es, r, i, i, st))) return rc;
  return choose_path(es, r, st);
}

/* Takes donated handles out of the table; the references stay held. */
static int take_donated(kilnd_call *c, const Kiln__V1__ExecuteRequest *r, kiln_status *st) {
  for (size_t i = 0; i < r->n_arguments; i++) {
    const Kiln__V1__Argument *a = r->arguments[i];
    if (a->value_case != KILN__V1__ARGUMENT__VALUE_BUFFER_HANDLE || !a->donate) continue;
    if (kiln_buffer_store_release(c->srv->buffers, c->client, a->buffer_handle, NULL) != 0)
      return kiln_status_set(st, KILN_ENOTFOUND, "arguments",
                             "argument %zu: buffer '%.40s' was released or donated meanwhile", i,
                             a->buffer_handle);
  }
  return 0;
}

/* ---- running ------------------------------------------------------------------------- */

/* Parameter i's buffer on l's device: the handle's own when the device can
 * use it and the run may write it (the caller donated it, or the program
 * does not write it), else a copy; inline arguments are written into fresh
 * buffers. */
static int device_arg(exec_state *es, kiln_loaded *l, uint32_t i, kiln_status *st) {
  kiln_device *dev = kiln_loaded_device(l);
  const kiln_stored *b = es->arg_buf[i];
  if (b && kiln_device_can_access(dev, b->buf) &&
      (es->arg_donated[i] || !kiln_loaded_donates(l, i))) {
    es->dargs[i] = b->buf;
    return 0;
  }
  size_t bytes = b ? (size_t)b->bytes : es->args[i]->nbytes;
  int rc = kiln_buffer_alloc(dev, bytes, &es->dargs[i], st);
  if (rc) return rc;
  es->dargs_owned[i] = true;
  if (b) return kiln_buffer_copy(es->dargs[i], 0, b->buf, 0, bytes, st);
  return kiln_buffer_write(es->dargs[i], 0, es->args[i]->data, bytes, st);
}

static int run_on_device(exec_state *es, kiln_loaded *l, const kiln_run_options *ro,
                         kiln_status *st) {
  for (uint32_t i = 0; i < es->nargs; i++) {
    int rc = device_arg(es, l, i, st);
    if (rc) return rc;
  }
  es->ndres = kiln_loaded_executable(l)->nresults;
  return kiln_loaded_execute(l, es->dargs, es->nargs, ro, es->dres, es->ndres, st);
}

/* kiln.debug_print output goes back to the caller in the kiln-debug
 * trailer: gRPC metadata values are printable ASCII, so each message's
 * newline becomes the two characters "\n" (formats hold no backslash);
 * past KILND_DEBUG_MAX bytes the text is cut and ends in "...". */
static void debug_collect(void *ctx, const char *text, size_t n) {
  kilnd_call *c = ctx;
  int unlocked = 0;
  while (!atomic_compare_exchange_weak(&c->debug_lock, &unlocked, 1)) unlocked = 0;
  const size_t room = KILND_DEBUG_MAX - 3; /* "..." always fits */
  for (size_t i = 0; i < n && c->ndebug <= room; i++) {
    unsigned char ch = (unsigned char)text[i];
    if (ch == '\n') {
      if (c->ndebug + 2 > room) break;
      c->debug[c->ndebug++] = '\\';
      c->debug[c->ndebug++] = 'n';
    } else if (c->ndebug < room) {
      c->debug[c->ndebug++] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
    } else {
      break;
    }
  }
  if (c->ndebug >= room && c->ndebug < KILND_DEBUG_MAX) {
    memcpy(c->debug + c->ndebug, "...", 3);
    c->ndebug = KILND_DEBUG_MAX;
  }
  atomic_store(&c->debug_lock, 0);
}

/* Runs on the backend of the executable's device class, through the
 * backend vtable: a backend that interprets gets the module, any other the
 * executable loaded on the scheduler's device. */
static int run_program(kilnd_call *c, exec_state *es, uint32_t device, kiln_status *st) {
  kilnd *srv = c->srv;
  kiln_debug_sink sink = {debug_collect, c};
  kiln_run_options ro = {.timeout_seconds = kilnd_call_time_left(c, srv->cfg.run_timeout),
                         .cancel = &c->cancelled,
                         .max_live_bytes = srv->cfg.run_memory_bytes,
                         .debug = &sink};
  int dev_class = es->e->dev_class;
  kiln_backend *b = kilnd_class_backend(srv, dev_class);
  uint32_t index = device - kiln_sched_class_first(srv->sched, (uint32_t)dev_class);
  if (kiln_backend_runs_modules(b)) {
    /* the class may have more scheduler slots than the backend devices */
    kiln_device *d = kiln_backend_device(b, index % kiln_backend_device_count(b));
    return kiln_device_run_module(d, es->e->module, es->args, es->nargs, &ro, &es->out, st);
  }
  if (es->e->exe && es->e->exe->code_kind == KILN_CODE_CUBIN) {
    /* CUDA code runs on cuda:0 (loaded there once, in the executable's
     * first load slot: its code never loads on a cpu device), from the
     * scheduler slot's thread. */
    if (srv->cuda == NULL)
      return kiln_status_set(st, KILN_EUNAVAIL, "execute",
                             "the executable is CUDA code for %.32s and this server cannot run "
                             "it: it has no CUDA device: %s",
                             es->e->exe->target ? es->e->exe->target : "a GPU", srv->cuda_why);
    if (es->on_device)
      return kiln_status_set(st, KILN_EUNIMPL, "execute",
                             "device-resident buffers are host buffers here: a cuda executable "
                             "takes its arguments inline");
    kiln_loaded *cl = NULL;
    int crc = kilnd_exe_loaded(es->e, srv->cuda, 0, &cl, st);
    if (crc == 0) crc = kiln_loaded_run(cl, es->args, es->nargs, &ro, &es->out, st);
    return crc;
  }
  kiln_loaded *l = NULL;
  int rc = kilnd_exe_loaded(es->e, b, index, &l, st);
  if (rc == 0 && es->on_device) return run_on_device(es, l, &ro, st);
  if (rc == 0) rc = kiln_loaded_run(l, es->args, es->nargs, &ro, &es->out, st);
  return rc;
}

/* An SPMD program's run on the devices the scheduler gave (in the order
 * device_ids asks, when it does): a global program's arguments are cut
 * into shards, the devices run as one gang (the cpu backend's devices
 * sharing memory, or interpreters meeting in threads on one slot), and a
 * global result is put together; a per-device program's results stay per
 * device. */
static int run_mesh_program(kilnd_call *c, exec_state *es, const uint32_t *devices, uint32_t ndev,
                            kiln_status *st) {
  kilnd *srv = c->srv;
  const kilnd_exe *e = es->e;
  const Kiln__V1__ExecuteRequest *r = (const void *)c->req;
  uint32_t n = e->ndevices, np = es->nparams;
  int dev_class = e->dev_class;
  uint32_t first = kiln_sched_class_first(srv->sched, (uint32_t)dev_class);
  for (uint32_t k = 0; k < n; k++)
    es->order[k] = r->n_device_ids == n ? (uint32_t)r->device_ids[k]
                   : k < ndev           ? devices[k]
                                        : devices[0];
  kiln_debug_sink sink = {debug_collect, c};
  kiln_run_options ro = {.timeout_seconds = kilnd_call_time_left(c, srv->cfg.run_timeout),
                         .cancel = &c->cancelled,
                         .max_live_bytes = srv->cfg.run_memory_bytes,
                         .debug = &sink};
  size_t cells = (size_t)n * (np ? np : 1);
  const kiln_literal **views = kiln_arena_calloc(es->arena, cells, sizeof *views);
  const kiln_literal *const **per = kiln_arena_calloc(es->arena, n, sizeof *per);
  es->douts = kiln_calloc(n, sizeof *es->douts);
  if (e->spmd) es->shards = kiln_calloc(cells, sizeof *es->shards);
  if (!views || !per || !es->douts || (e->spmd && !es->shards))
    return kiln_status_set(st, KILN_ENOMEM, "Execute", "out of memory");
  es->ndouts = n;
  int rc = 0;
  for (uint32_t k = 0; k < n && rc == 0; k++) {
    for (uint32_t i = 0; i < np && rc == 0; i++) {
      size_t cell = (size_t)k * np + i;
      if (e->spmd) { /* device k: partition k % P of replica k / P */
        uint32_t P = e->partitions ? e->partitions : n;
        const kiln_literal *g = es->args[es->nargs == np ? i : (k / P) * np + i];
        rc = kiln_spmd_shard_arg(e->spmd, i, g, k % P, &es->shards[cell], st);
        es->nshards = (uint32_t)cell + 1;
        views[cell] = es->shards[cell];
      } else {
        views[cell] = es->args[es->nargs == np ? i : cell];
      }
    }
    per[k] = views + (size_t)k * np;
  }
  if (rc) return rc;
  const kiln_module *dm = kilnd_exe_device_module(e);
  if (dev_class == KILND_CLASS_INTERP || e->exe == NULL) {
    rc =
        kiln_run_module_mesh(dm, "interp", &ro, e->replicas, e->partitions, per, np, es->douts, st);
  } else {
    kiln_backend *b = kilnd_class_backend(srv, dev_class);
    uint32_t *index = kiln_arena_calloc(es->arena, n, sizeof *index);
    if (index == NULL) return kiln_status_set(st, KILN_ENOMEM, "Execute", "out of memory");
    for (uint32_t k = 0; k < n; k++) index[k] = es->order[k] - first;
    kiln_mesh *mesh = NULL;
    int slot = -1;
    rc = kilnd_exe_mesh_acquire(es->e, b, index, n, &mesh, &slot, st);
    if (rc == 0) rc = kiln_mesh_run(mesh, per, np, &ro, es->douts, st);
    kilnd_exe_mesh_release(es->e, slot);
  }
  if (rc || !e->spmd) return rc;
  if (e->replicas > 1) {
    /* replica r's global result in douts[r] (read from douts[r*P, r*P+P)) */
    uint32_t P = e->partitions;
    for (uint32_t q = 0; q < e->replicas && rc == 0; q++) {
      kiln_literal *g = NULL;
      rc = kiln_spmd_assemble(e->spmd, es->douts + (size_t)q * P, &g, st);
      for (uint32_t k = q * P; k < (q + 1) * P; k++) {
        kiln_literal_destroy(es->douts[k]);
        es->douts[k] = NULL;
      }
      es->douts[q] = g;
    }
    es->ndouts = e->replicas;
    return rc;
  }
  rc = kiln_spmd_assemble(e->spmd, es->douts, &es->out, st);
  for (uint32_t k = 0; k < n; k++) {
    kiln_literal_destroy(es->douts[k]);
    es->douts[k] = NULL;
  }
  return rc;
}

/* Stores `buf` (ownership passes, even on failure) holding an array of
 * `shape` as a new handle of the caller, described in o. */
static int keep_buffer(kilnd_call *c, exec_state *es, kiln_buffer *buf, const kiln_shape *shape,
                       uint32_t device, Kiln__V1__Output *o, kiln_status *st) {
  kiln_stored *b = NULL;
  int rc = kiln_buffer_store_add(c->srv->buffers, c->client, buf, shape, (int32_t)device,
                                 "execute output", false, &b, st);
  if (rc) return rc;
  kilnd_call_note_created(c, b->handle);
  o->value_case = KILN__V1__OUTPUT__VALUE_BUFFER;
  o->buffer = kilnd_buffer_info(es->arena, b);
  /* The info points into b, which the table keeps alive: only this caller
   * may release it, and it learns the handle from this very reply. */
  kiln_buffer_store_unref(c->srv->buffers, b);
  return o->buffer ? 0 : kiln_status_set(st, KILN_ENOMEM, "Execute", "out of memory");
}

/* The literal path's kept output: its bytes written into device memory. */
static int keep_literal(kilnd_call *c, exec_state *es, const kiln_literal *lit, uint32_t device,
                        Kiln__V1__Output *o, kiln_status *st) {
  if (!kiln_shape_is_array(&lit->shape) || lit->dynamic_sizes)
    return kiln_status_set(st, KILN_EINVAL, "keep_on_server",
                           "only array outputs can be kept on the server");
  kiln_buffer *buf = NULL;
  int rc = kiln_buffer_alloc(kilnd_buffer_home(c->srv, (int32_t)device), lit->nbytes, &buf, st);
  if (rc == 0) rc = kiln_buffer_write(buf, 0, lit->data, lit->nbytes, st);
  if (rc) {
    kiln_buffer_free(buf);
    return rc;
  }
  kiln_shape shape = lit->shape;
  if (!kiln_shape_is_row_major(&shape)) shape.layout = NULL; /* literals are row-major */
  return keep_buffer(c, es, buf, &shape, device, o, st);
}

/* The device path's inline output i: the result buffer seen as a literal
 * (its host memory when row-major, else a row-major copy in the arena). */
static int device_literal(exec_state *es, uint32_t i, const kiln_literal **out, kiln_status *st) {
  const kiln_executable *e = es->e->exe;
  const kiln_shape *rs = &e->result_shape, *bs = &e->results[i].shape;
  kiln_literal *lit = kiln_arena_alloc(es->arena, sizeof *lit);
  if (lit == NULL) return kiln_status_set(st, KILN_ENOMEM, "Execute", "out of memory");
  memset(lit, 0, sizeof *lit);
  lit->shape = kiln_shape_is_tuple(rs) ? rs->tuple[i] : *rs;
  lit->nbytes = kiln_buffer_size(es->dres[i]);
  lit->data = kiln_shape_is_row_major(bs) ? kiln_buffer_host(es->dres[i], false) : NULL;
  if (lit->data == NULL) {
    lit->data = kiln_arena_alloc(es->arena, lit->nbytes ? lit->nbytes : 1);
    if (lit->data == NULL) return kiln_status_set(st, KILN_ENOMEM, "Execute", "out of memory");
    int rc = kiln_array_read_row_major(es->dres[i], bs, lit->data, st);
    if (rc) return rc;
  }
  *out = lit;
  return 0;
}

/* A per-device program's outputs, grouped by device, or a global
 * program's on several replicas, grouped by replica (ExecuteResponse). */
static int device_outputs(kilnd_call *c, exec_state *es, const Kiln__V1__ExecuteRequest *r,
                          Kiln__V1__ExecuteResponse *resp, kiln_status *st) {
  uint32_t per = output_count(es->e->module), n = es->ndouts * per;
  resp->outputs = kiln_arena_calloc(es->arena, n ? n : 1, sizeof *resp->outputs);
  if (resp->outputs == NULL) return kiln_status_set(st, KILN_ENOMEM, "Execute", "out of memory");
  for (uint32_t k = 0; k < es->ndouts; k++) {
    const kiln_literal *out = es->douts[k];
    bool tuple = kiln_shape_is_tuple(&out->shape);
    if (out == NULL || (tuple ? out->shape.rank : 1) != per)
      return kiln_status_set(st, KILN_EINTERNAL, "Execute", "device %u returned %u outputs, not %u",
                             k, tuple ? out->shape.rank : 1, per);
    for (uint32_t j = 0; j < per; j++) {
      uint32_t i = k * per + j;
      Kiln__V1__Output *o = kiln_arena_alloc(es->arena, sizeof *o);
      if (o == NULL) return kiln_status_set(st, KILN_ENOMEM, "Execute", "out of memory");
      kiln__v1__output__init(o);
      const kiln_literal *lit = tuple ? out->elems[j] : out;
      int rc = 0;
      if (i < r->n_keep_on_server && r->keep_on_server[i]) {
        /* a replica's global output lives on the replica's first device */
        uint32_t home = es->e->per_device ? es->order[k] : es->order[k * es->e->partitions];
        rc = keep_literal(c, es, lit, home, o, st);
      } else {
        o->value_case = KILN__V1__OUTPUT__VALUE_LITERAL;
        o->literal = kilnd_literal_to_proto(es->arena, lit);
        if (o->literal == NULL) rc = kiln_status_set(st, KILN_ENOMEM, "Execute", "out of memory");
      }
      if (rc) return rc;
      resp->outputs[resp->n_outputs++] = o;
    }
  }
  return 0;
}

static int outputs(kilnd_call *c, exec_state *es, const Kiln__V1__ExecuteRequest *r,
                   uint32_t device, Kiln__V1__ExecuteResponse *resp, kiln_status *st) {
  if ((es->e->per_device || es->e->replicas > 1) && es->e->ndevices > 1)
    return device_outputs(c, es, r, resp, st);
  bool tuple = es->on_device ? kiln_shape_is_tuple(&es->e->exe->result_shape)
                             : kiln_shape_is_tuple(&es->out->shape);
  uint32_t n = es->on_device ? es->ndres : tuple ? es->out->shape.rank : 1;
  resp->outputs = kiln_arena_calloc(es->arena, n ? n : 1, sizeof *resp->outputs);
  if (resp->outputs == NULL) return kiln_status_set(st, KILN_ENOMEM, "Execute", "out of memory");
  for (uint32_t i = 0; i < n; i++) {
    Kiln__V1__Output *o = kiln_arena_alloc(es->arena, sizeof *o);
    if (o == NULL) return kiln_status_set(st, KILN_ENOMEM, "Execute", "out of memory");
    kiln__v1__output__init(o);
    bool keep = i < r->n_keep_on_server && r->keep_on_server[i];
    const kiln_literal *lit = NULL;
    int rc = 0;
    if (es->on_device && keep) {
      kiln_buffer *buf = es->dres[i];
      es->dres[i] = NULL; /* the store's now */
      rc = keep_buffer(c, es, buf, &es->e->exe->results[i].shape, device, o, st);
    } else if (es->on_device) {
      rc = device_literal(es, i, &lit, st);
    } else {
      lit = tuple ? es->out->elems[i] : es->out;
      if (keep) rc = keep_literal(c, es, lit, device, o, st);
    }
    if (rc == 0 && !keep) {
      o->value_case = KILN__V1__OUTPUT__VALUE_LITERAL;
      o->literal = kilnd_literal_to_proto(es->arena, lit);
      if (o->literal == NULL) rc = kiln_status_set(st, KILN_ENOMEM, "Execute", "out of memory");
    }
    if (rc) return rc;
    resp->outputs[resp->n_outputs++] = o;
  }
  return 0;
}

/* A time limit hit, or a run stopped by its cancel flag, because the call's
 * deadline came is the deadline's doing; a run stopped otherwise was
 * cancelled by its caller (gRPC cancels the call at its deadline too, so the
 * deadline is asked first). */
static int blame_deadline(kilnd_call *c, int rc, kiln_status *st) {
  if (rc != KILN_ELIMIT && rc != KILN_ECANCELED) return rc;
  /* gRPC's clock and ours may disagree by a little at the deadline */
  const int64_t slack_ns = 20000000;
  int why = 0;
  if (c->deadline_ns && kiln_sched_now_ns() >= c->deadline_ns - slack_ns)
    why = KILN_EDEADLINE;
  else if (atomic_load(&c->cancelled))
    why = KILN_ECANCELED;
  if (why == 0 || (rc == KILN_ELIMIT && why != KILN_EDEADLINE)) return rc;
  kiln_status fresh;
  kiln_status_clear(&fresh);
  if (why == KILN_EDEADLINE)
    kiln_status_set(&fresh, KILN_EDEADLINE, "Execute",
                    "the call's deadline passed while the program ran (%s)", st->msg);
  else
    kiln_status_set(&fresh, KILN_ECANCELED, "Execute",
                    "the caller went away while the program ran (%s)", st->msg);
  *st = fresh;
  return why;
}

/* Follows a rise at once and a fall slowly: one long run is enough to keep
 * an executable off the cq threads for a while. */
static void note_run_time(kilnd_exe *e, int64_t ns) {
  int64_t old = atomic_load_explicit(&e->run_ns, memory_order_relaxed);
  int64_t est = old == 0 || ns > old ? ns : old - old / 8 + ns / 8;
  atomic_store_explicit(&e->run_ns, est > 0 ? est : 1, memory_order_relaxed);
}

/* The device's part: the run alone. The reply is built in exec_done, after
 * the device was handed back. */
static void exec_run(void *arg, const uint32_t *devices, uint32_t ndev) {
  kilnd_call *c = arg;
  exec_state *es = c->state;
  kiln_status_clear(&es->st);
  es->t0 = kiln_sched_now_ns();
  es->rc = es->e->ndevices > 1 ? run_mesh_program(c, es, devices, ndev, &es->st)
                               : run_program(c, es, devices[0], &es->st);
  es->t1 = kiln_sched_now_ns();
  if (es->counted_inline) {
    atomic_fetch_sub(&inline_runs, 1);
    es->counted_inline = false;
  }
  note_run_time(es->e, es->t1 - es->t0);
}

static void exec_done(void *arg, const uint32_t *devices, uint32_t ndev) {
  kilnd_call *c = arg;
  exec_state *es = c->state;
  const Kiln__V1__ExecuteRequest *r = (const void *)c->req;
  int64_t t0 = es->t0, t1 = es->t1;
  kilnd_metrics_execute(c->srv, t1 - t0, t0 - es->queued_at);
  Kiln__V1__ExecuteResponse resp = KILN__V1__EXECUTE_RESPONSE__INIT;
  Kiln__V1__ExecuteTiming timing = KILN__V1__EXECUTE_TIMING__INIT;
  int32_t ids[KILN_SCHED_MAX_DEVICES > 64 ? 64 : KILN_SCHED_MAX_DEVICES];
  int rc = es->rc;
  if (rc) rc = blame_deadline(c, rc, &es->st);
  bool mesh = es->e->ndevices > 1;
  if (rc == 0) rc = outputs(c, es, r, mesh ? es->order[0] : devices[0], &resp, &es->st);
  if (rc) {
    kilnd_call_finish(c, NULL, rc, &es->st);
    return;
  }
  uint32_t nids = mesh ? es->e->ndevices : ndev;
  for (uint32_t i = 0; i < nids && i < 64; i++)
    ids[i] = (int32_t)(mesh ? es->order[i] : devices[i]);
  resp.device_ids = ids;
  resp.n_device_ids = nids < 64 ? nids : 64;
  resp.request_id = r->request_id;
  timing.queue_ns = t0 - es->queued_at;
  timing.run_ns = t1 - t0;
  timing.transfer_out_ns = kiln_sched_now_ns() - t1;
  timing.total_ns = kiln_sched_now_ns() - c->start_ns;
  resp.timing = &timing;
  kilnd_call_finish(c, &resp.base, 0, NULL);
}

static void exec_drop(void *arg, int code) {
  kilnd_call *c = arg;
  kilnd_call_fail(c, code, "%s",
                  code == KILN_EDEADLINE ? "the call's deadline passed while it waited for a device"
                  : code == KILN_ECANCELED ? "the caller went away"
                                           : "the server is shutting down");
}

/* True when the job ran on this (cq) thread; see the top of the file. The
 * count covers the run itself (exec_run ends it), not the reply. */
static bool run_here(kilnd *srv, exec_state *es, const kiln_sched_job *job) {
  int64_t est = atomic_load_explicit(&es->e->run_ns, memory_order_relaxed);
  if (es->e->ndevices > 1) return false; /* a gang has no business on a cq thread */
  if (est == 0 || est > INLINE_RUN_NS || srv->cfg.cq_threads < 2) return false;
  if (atomic_fetch_add(&inline_runs, 1) >= (int)srv->cfg.cq_threads - 1) {
    atomic_fetch_sub(&inline_runs, 1);
    return false;
  }
  es->counted_inline = true;
  if (kiln_sched_run_now(srv->sched, job)) return true;
  es->counted_inline = false;
  atomic_fetch_sub(&inline_runs, 1);
  return false;
}

void kilnd_handle_execute(kilnd_call *c, ProtobufCMessage *req) {
  const Kiln__V1__ExecuteRequest *r = (const void *)req;
  kiln_status st;
  kiln_status_clear(&st);
  exec_state *es = exec_new();
  if (es == NULL) {
    kilnd_call_fail(c, KILN_ENOMEM, "out of memory");
    return;
  }
  c->state = es;
  c->state_free = exec_free;
  if (r->executable_id) snprintf(c->log_key, sizeof c->log_key, "%s", r->executable_id);
  for (size_t i = 0; i < r->n_release_handles; i++)
    kiln_buffer_store_release(c->srv->buffers, c->client, r->release_handles[i], NULL);
  int rc = 0;
  if (r->n_arguments > MAX_ARGS)
    rc = kiln_status_set(&st, KILN_EINVAL, "arguments", "more than %d arguments", MAX_ARGS);
  if (rc == 0) rc = resolve(c, es, r, &st);
  if (rc == 0) rc = take_donated(c, r, &st);
  if (rc == 0) {
    es->queued_at = kiln_sched_now_ns();
    kiln_sched_job job = {.client = c->client,
                          .dev_class = (uint32_t)es->e->dev_class,
                          .ndevices = sched_devices(c->srv, es->e, r),
                          .deadline_ns = c->deadline_ns,
                          .cancelled = &c->cancelled,
                          .run = exec_run,
                          .done = exec_done,
                          .drop = exec_drop,
                          .arg = c};
    kilnd_call_watch_close(c);              /* learn if the caller leaves, wherever it runs */
    if (run_here(c->srv, es, &job)) return; /* c may be gone */
    rc = kiln_sched_submit(c->srv->sched, &job, &st);
  }
  if (rc) kilnd_call_finish(c, NULL, rc, &st);
}
