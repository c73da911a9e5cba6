/* Compile options -> plan, transforms, and the program signature.
 *
 * Every option is honoured or refused: a field this server cannot do is
 * KILN_EUNIMPL (UNIMPLEMENTED) naming it, never a warning. The proto's
 * transforms map onto the compiler's through
 * compiler/transforms/transform_proto.c, the mapping the clients encode
 * with: a GradTransform without with_value is jax.grad, the compiler's
 * value_and_grad with the value dropped right after that transform so
 * that later transforms see the right signature.
 */
#include "server/compile_prep.h"

#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/ir.h"
#include "compiler/ir/verify.h"
#include "compiler/target.h"
#include "executor/backend.h"
#include "server/convert.h"

#include "compiler/transforms/transform.h"
#include "compiler/transforms/transform_proto.h"

/* ---- backend, target, levels --------------------------------------------------------- */

static int plan_backend(kilnd *srv, const Kiln__V1__CompileOptions *o, kilnd_compile_plan *p,
                        kiln_status *st) {
  const char *b = o && o->backend && o->backend[0] ? o->backend : NULL;
  p->explicit_backend = b != NULL;
  if (b == NULL) b = srv->cfg.default_backend;
  uint32_t nnames;
  const char *const *names = kiln_backend_names(&nnames);
  p->backend = NULL;
  for (uint32_t i = 0; i < nnames; i++)
    if (strcmp(b, names[i]) == 0) p->backend = names[i]; /* static, as the plan needs */
#if __has_include("compiler/compile.h")
  /* Compile as a service: cuda code is built by NVRTC here whether or not
   * this server has a GPU (Execute needs one: handlers_execute.c). */
  if (p->backend == NULL && strcmp(b, "cuda") == 0) {
    p->backend = "cuda";
    kiln_status rs;
    kiln_status_clear(&rs);
    if (kiln_target_resolve("cuda", o && o->target ? o->target : "", &p->target, &rs))
      return kiln_status_set(st, rs.code, "options.target", "%s", rs.msg);
    return 0;
  }
#endif
  if (p->backend == NULL) {
    char known[256];
    kiln_backend_names_join(0, ", ", known, sizeof known);
    if (strcmp(b, "cuda") == 0)
      return kiln_status_set(st, KILN_EUNIMPL, "options.backend",
                             "this server has no cuda backend (available: %s)", known);
    return kiln_status_set(st, KILN_EINVAL, "options.backend",
                           "unknown backend '%.64s' (available: %s)", b, known);
  }
  const char *t = o && o->target ? o->target : "";
  /* A backend that interprets modules has no code targets: a target named
   * for it is refused by plan_refuse_interp_target. */
  if (!(kiln_backend_caps(p->backend) & KILN_BACKEND_LOADS)) return 0;
  kiln_status rs;
  kiln_status_clear(&rs);
  if (kiln_target_resolve(p->backend, t, &p->target, &rs))
    return kiln_status_set(st, rs.code, "options.target", "%s", rs.msg);
  return 0;
}

/* Fields of CompileOptions this server cannot honour yet: refused, naming
 * the field, rather than accepted and ignored (a client that asked for a
 * layout must not get a program without one). */
static int plan_refuse_unhonoured(const Kiln__V1__CompileOptions *o, kilnd_compile_plan *p,
                                  kiln_status *st) {
  /* One dump is honoured: the module right after the transforms, which a
   * client inlines to apply a transform inside a larger program. */
  for (size_t i = 0; i < o->n_dump_after_passes; i++) {
    if (strcmp(o->dump_after_passes[i], "transforms") != 0)
      return kiln_status_set(st, KILN_EUNIMPL, "options.dump_after_passes",
                             "dumps after '%.64s' are not supported (only 'transforms')",
                             o->dump_after_passes[i]);
    p->dump_transforms = true;
  }
  if (o->argument_layouts)
    return kiln_status_set(st, KILN_EUNIMPL, "options.argument_layouts",
                           "caller-chosen layouts are not supported yet (arguments and results "
                           "travel in row-major order)");
  return 0;
}

/* What the interpreter has nothing to honour with: a code target ("native"
 * and empty mean "whatever runs here" and are fine) and a serialized
 * executable. plan_backend resolved the backend. */
static int plan_refuse_interp_target(const Kiln__V1__CompileOptions *o, const kilnd_compile_plan *p,
                                     kiln_status *st) {
  if (p->backend == NULL || (kiln_backend_caps(p->backend) & KILN_BACKEND_LOADS) ||
      strcmp(p->backend, "cuda") == 0)
    return 0;
  if (o && o->return_executable)
    return kiln_status_set(st, KILN_EUNIMPL, "options.return_executable",
                           "the %s backend has no serialized executable", p->backend);
  if (o && o->memory_budget_bytes > 0)
    return kiln_status_set(st, KILN_EUNIMPL, "options.memory_budget_bytes",
                           "the %s backend places no buffers, so it has no peak to bring under a "
                           "budget (use the cpu or cuda backend)",
                           p->backend);
  const char *t = o && o->target ? o->target : "";
  /* Naming the default (the host's CPU, in any spelling) asks for nothing. */
  const kiln_target *any;
  if (kiln_target_resolve(NULL, t, &any, NULL) == 0 && any == kiln_target_default()) return 0;
  return kiln_status_set(st, KILN_EUNIMPL, "options.target",
                         "the %s backend has no code targets ('%.64s' given; leave it "
                         "empty or native)",
                         p->backend, t);
}

static int plan_levels(const Kiln__V1__CompileOptions *o, kilnd_compile_plan *p, kiln_status *st) {
  p->opt_level = 2;
  p->ndevices = 1;
  if (o == NULL) return 0;
  if (o->has_optimization_level) {
    if (o->optimization_level < 0 || o->optimization_level > 3)
      return kiln_status_set(st, KILN_EINVAL, "options.optimization_level",
                             "%d is not 0, 1, 2 or 3", o->optimization_level);
    p->opt_level = o->optimization_level;
  }
  if (o->device_count < 0)
    return kiln_status_set(st, KILN_EINVAL, "options.device_count", "%d is negative",
                           o->device_count);
  if (o->device_count > KILND_MAX_MESH)
    return kiln_status_set(st, KILN_EINVAL, "options.device_count",
                           "%d devices: a mesh has at most %d", o->device_count, KILND_MAX_MESH);
  if (o->device_count > 0) {
    p->ndevices = (uint32_t)o->device_count;
    p->devices_given = true;
  }
  if (o->n_mesh_shape > sizeof p->mesh / sizeof p->mesh[0])
    return kiln_status_set(st, KILN_EINVAL, "options.mesh_shape", "%zu dimensions (at most %zu)",
                           o->n_mesh_shape, sizeof p->mesh / sizeof p->mesh[0]);
  int64_t prod = 1;
  for (size_t i = 0; i < o->n_mesh_shape; i++) {
    if (o->mesh_shape[i] <= 0 || o->mesh_shape[i] > KILND_MAX_MESH)
      return kiln_status_set(st, KILN_EINVAL, "options.mesh_shape", "entry %zu is %lld", i,
                             (long long)o->mesh_shape[i]);
    prod *= o->mesh_shape[i];
    if (prod > KILND_MAX_MESH) break;
    p->mesh[i] = o->mesh_shape[i];
  }
  p->nmesh = (uint32_t)o->n_mesh_shape;
  if (o->n_mesh_shape && prod != (o->device_count ? o->device_count : 1))
    return kiln_status_set(st, KILN_EINVAL, "options.mesh_shape",
                           "the mesh has %lld devices but device_count is %d", (long long)prod,
                           o->device_count);
  if (o->memory_budget_bytes < 0)
    return kiln_status_set(st, KILN_EINVAL, "options.memory_budget_bytes", "is negative");
  p->memory_budget = (uint64_t)o->memory_budget_bytes;
  if ((unsigned)o->cache_policy > KILN__V1__CACHE_POLICY__CACHE_POLICY_BYPASS)
    return kiln_status_set(st, KILN_EINVAL, "options.cache_policy", "%d is not a CachePolicy",
                           (int)o->cache_policy);
  return plan_refuse_unhonoured(o, p, st);
}

/* ---- transforms ---------------------------------------------------------------------- */

static int plan_transforms(const Kiln__V1__CompileOptions *o, kilnd_compile_plan *p,
                           kiln_status *st) {
  if (o == NULL || o->n_transforms == 0) return 0;
  if (o->n_transforms > KILND_MAX_TRANSFORMS)
    return kiln_status_set(st, KILN_EINVAL, "options.transforms", "more than %d transforms",
                           KILND_MAX_TRANSFORMS);
  p->transforms = kiln_calloc(o->n_transforms, sizeof *p->transforms);
  p->drop_value = kiln_calloc(o->n_transforms, sizeof *p->drop_value);
  if (p->transforms == NULL || p->drop_value == NULL)
    return kiln_status_set(st, KILN_ENOMEM, "options.transforms", "out of memory");
  p->ntransforms = (uint32_t)o->n_transforms;
  for (size_t i = 0; i < o->n_transforms; i++) {
    char path[48];
    snprintf(path, sizeof path, "options.transforms[%zu]", i);
    int rc =
        kiln_transform_from_proto(o->transforms[i], path, &p->transforms[i], &p->drop_value[i], st);
    if (rc) return rc;
  }
  return 0;
}

int kilnd_compile_plan_make(kilnd *srv, const Kiln__V1__CompileOptions *o, kilnd_compile_plan *p,
                            kiln_status *st) {
  memset(p, 0, sizeof *p);
  int rc = plan_backend(srv, o, p, st);
  if (rc == 0) rc = plan_refuse_interp_target(o, p, st);
  if (rc == 0) rc = plan_levels(o, p, st);
  if (rc == 0) rc = plan_transforms(o, p, st);
  if (rc) kilnd_compile_plan_free(p);
  return rc;
}

void kilnd_compile_plan_free(kilnd_compile_plan *p) {
  kiln_free(p->transforms);
  kiln_free(p->drop_value);
  p->transforms = NULL;
  p->drop_value = NULL;
  p->ntransforms = 0;
}

/* ---- applying ------------------------------------------------------------------------ */

int kilnd_compile_plan_apply(const kilnd_compile_plan *p, kiln_module *m, kiln_status *st) {
  if (p->ntransforms == 0) return 0;
  for (uint32_t i = 0; i < p->ntransforms; i++) {
    int rc = kiln_transforms_apply(m, &p->transforms[i], 1, st);
    if (rc == 0 && p->drop_value[i]) rc = kiln_transform_drop_value(m, st);
    if (rc) return rc;
  }
  /* The input's nesting was checked against max-nesting; a transform adds
   * a bounded number of levels. */
  kiln_verify_options vo = {.max_nesting = KILN_VERIFY_MAX_NESTING};
  return kiln_module_verify(m, &vo, st);
}

/* ---- the signature ------------------------------------------------------------------- */

static Kiln__V1__InputOutputAlias *alias_to_proto(kiln_arena *a, const kiln_alias *al) {
  Kiln__V1__InputOutputAlias *p = kiln_arena_alloc(a, sizeof *p);
  if (p == NULL) return NULL;
  kiln__v1__input_output_alias__init(p);
  p->n_output_shape_index = al->output_index.n;
  p->output_shape_index = al->output_index.v;
  p->parameter_number = al->param_number;
  p->n_parameter_shape_index = al->param_index.n;
  p->parameter_shape_index = al->param_index.v;
  p->kind = (Kiln__V1__AliasKind)al->kind;
  return p;
}

Kiln__V1__ProgramSignature *kilnd_signature_to_proto(kiln_arena *a, const kiln_module *m) {
  const kiln_computation *e = kiln_module_entry(m);
  Kiln__V1__ProgramSignature *sig = kiln_arena_alloc(a, sizeof *sig);
  if (sig == NULL || e == NULL) return NULL;
  kiln__v1__program_signature__init(sig);
  uint32_t n = kiln_computation_nparams(m, e);
  bool layouts = m->entry_layout && m->entry_layout->nparams == n;
  sig->parameters = kiln_arena_calloc(a, n ? n : 1, sizeof *sig->parameters);
  if (sig->parameters == NULL) return NULL;
  for (uint32_t i = 0; i < n; i++) {
    const kiln_instr *p = kiln_computation_param(m, e, i);
    const kiln_shape *s = layouts ? &m->entry_layout->params[i] : p ? &p->shape : NULL;
    if (s == NULL || (sig->parameters[i] = kilnd_shape_to_proto(a, s)) == NULL) return NULL;
  }
  sig->n_parameters = n;
  const kiln_instr *root = kiln_computation_root(m, e);
  const kiln_shape *rs = layouts ? &m->entry_layout->result : root ? &root->shape : NULL;
  if (rs == NULL || (sig->result = kilnd_shape_to_proto(a, rs)) == NULL) return NULL;
  if (m->naliases) {
    sig->input_output_alias = kiln_arena_calloc(a, m->naliases, sizeof *sig->input_output_alias);
    if (sig->input_output_alias == NULL) return NULL;
    for (uint32_t i = 0; i < m->naliases; i++)
      if ((sig->input_output_alias[i] = alias_to_proto(a, &m->aliases[i])) == NULL) return NULL;
    sig->n_input_output_alias = m->naliases;
  }
  return sig;
}
