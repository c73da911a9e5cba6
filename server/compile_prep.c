/* Compile options -> plan, transforms, and the program signature.
 *
 * The proto's transforms map onto the compiler's (compiler/transforms):
 * grad, vjp, jvp, vmap and checkpoint. The compiler's grad returns the
 * value with the gradients, as jax.value_and_grad; a GradTransform without
 * with_value is that program with the value taken out of its result, done
 * right after that transform so that later transforms see the right
 * signature.
 */
#include "server/compile_prep.h"

#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/ir.h"
#include "compiler/ir/verify.h"
#include "compiler/target.h"
#include "server/convert.h"

#if defined(__has_include)
#if __has_include("compiler/transforms/transform.h")
#include "compiler/transforms/transform.h"
#define KILND_HAVE_TRANSFORMS 1
#endif
#endif

/* ---- backend, target, levels --------------------------------------------------------- */

static int plan_backend(kilnd *srv, const Kiln__V1__CompileOptions *o, kilnd_compile_plan *p,
                        kiln_status *st) {
  const char *b = o && o->backend && o->backend[0] ? o->backend : NULL;
  p->explicit_backend = b != NULL;
  if (b == NULL) b = srv->cfg.default_backend;
  if (strcmp(b, "cpu") == 0) p->backend = "cpu";
  else if (strcmp(b, "interp") == 0) p->backend = "interp";
  else if (strcmp(b, "cuda") == 0)
    return kiln_status_set(st, KILN_EUNIMPL, "options.backend",
                           "this server has no cuda backend (available: cpu, interp)");
  else
    return kiln_status_set(st, KILN_EINVAL, "options.backend",
                           "unknown backend '%.64s' (available: cpu, interp)", b);
  const char *t = o && o->target ? o->target : "";
  if (strcmp(p->backend, "interp") == 0) {
    /* Naming the default (the host's CPU) asks for nothing: no warning. */
    const kiln_target *any;
    if (kiln_target_resolve(NULL, t, &any, NULL) != 0 || any != kiln_target_default())
      p->warnings[p->nwarnings++] = "options.target is ignored by the interp backend";
    return 0;
  }
  kiln_status rs;
  kiln_status_clear(&rs);
  if (kiln_target_resolve(p->backend, t, &p->target, &rs))
    return kiln_status_set(st, rs.code, "options.target", "%s", rs.msg);
  return 0;
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
  if (o->device_count > 1)
    return kiln_status_set(st, KILN_EUNIMPL, "options.device_count",
                           "%d devices: multi-device (SPMD) programs are not supported yet",
                           o->device_count);
  int64_t prod = 1;
  for (size_t i = 0; i < o->n_mesh_shape; i++) {
    if (o->mesh_shape[i] <= 0 || o->mesh_shape[i] > 4096)
      return kiln_status_set(st, KILN_EINVAL, "options.mesh_shape", "entry %zu is %lld", i,
                             (long long)o->mesh_shape[i]);
    prod *= o->mesh_shape[i];
    if (prod > 4096) break;
  }
  if (o->n_mesh_shape && prod != (o->device_count ? o->device_count : 1))
    return kiln_status_set(st, KILN_EINVAL, "options.mesh_shape",
                           "the mesh has %lld devices but device_count is %d", (long long)prod,
                           o->device_count);
  if (o->memory_budget_bytes < 0)
    return kiln_status_set(st, KILN_EINVAL, "options.memory_budget_bytes", "is negative");
  if ((unsigned)o->cache_policy > KILN__V1__CACHE_POLICY__CACHE_POLICY_BYPASS)
    return kiln_status_set(st, KILN_EINVAL, "options.cache_policy", "%d is not a CachePolicy",
                           (int)o->cache_policy);
  if (o->n_dump_after_passes && p->nwarnings < KILND_MAX_PLAN_WARNINGS)
    p->warnings[p->nwarnings++] = "options.dump_after_passes is not supported by this server";
  if (o->argument_layouts && p->nwarnings < KILND_MAX_PLAN_WARNINGS)
    p->warnings[p->nwarnings++] = "options.argument_layouts is ignored: arguments and results "
                                  "travel in row-major order";
  if (o->memory_budget_bytes && p->nwarnings < KILND_MAX_PLAN_WARNINGS)
    p->warnings[p->nwarnings++] = "options.memory_budget_bytes is ignored (no rematerialization "
                                  "yet)";
  return 0;
}

/* ---- transforms ---------------------------------------------------------------------- */

#ifdef KILND_HAVE_TRANSFORMS
static int copy_wrt(const int64_t *v, size_t n, kiln_transform *t, const char *path,
                    kiln_status *st) {
  if (n > KILN_TRANSFORM_MAX_ARGS)
    return kiln_status_set(st, KILN_EINVAL, path, "more than %d entries", KILN_TRANSFORM_MAX_ARGS);
  for (size_t i = 0; i < n; i++) {
    if (v[i] < 0 || v[i] > 1000000)
      return kiln_status_set(st, KILN_EINVAL, path, "entry %zu is %lld", i, (long long)v[i]);
    t->wrt[i] = v[i];
  }
  t->nwrt = (uint32_t)n;
  return 0;
}

static int copy_axes(Kiln__V1__VmapAxis *const *v, size_t n, int64_t *out, uint32_t *nout,
                     const char *path, kiln_status *st) {
  if (n > KILN_TRANSFORM_MAX_ARGS)
    return kiln_status_set(st, KILN_EINVAL, path, "more than %d entries", KILN_TRANSFORM_MAX_ARGS);
  for (size_t i = 0; i < n; i++) {
    if (v[i]->axis < -64 || v[i]->axis > 64)
      return kiln_status_set(st, KILN_EINVAL, path, "entry %zu: axis %lld is out of range", i,
                             (long long)v[i]->axis);
    out[i] = v[i]->not_mapped ? KILN_AXIS_NONE : v[i]->axis;
  }
  *nout = (uint32_t)n;
  return 0;
}

static int one_transform(const Kiln__V1__Transform *pt, kiln_transform *t, bool *drop_value,
                         const char *path, kiln_status *st) {
  memset(t, 0, sizeof *t);
  t->output = -1;
  switch (pt->kind_case) {
  case KILN__V1__TRANSFORM__KIND_GRAD:
    if (pt->grad->has_aux)
      return kiln_status_set(st, KILN_EUNIMPL, path, "grad with has_aux is not supported yet");
    t->kind = KILN_TRANSFORM_GRAD;
    *drop_value = !pt->grad->with_value;
    return copy_wrt(pt->grad->wrt, pt->grad->n_wrt, t, path, st);
  case KILN__V1__TRANSFORM__KIND_VJP:
    t->kind = KILN_TRANSFORM_VJP;
    return copy_wrt(pt->vjp->wrt, pt->vjp->n_wrt, t, path, st);
  case KILN__V1__TRANSFORM__KIND_JVP:
    t->kind = KILN_TRANSFORM_JVP;
    return copy_wrt(pt->jvp->wrt, pt->jvp->n_wrt, t, path, st);
  case KILN__V1__TRANSFORM__KIND_VMAP:
    t->kind = KILN_TRANSFORM_VMAP;
    if (pt->vmap->axis_size != 0)
      return kiln_status_set(st, KILN_EUNIMPL, path, "vmap axis_size is not supported yet");
    return copy_axes(pt->vmap->in_axes, pt->vmap->n_in_axes, t->in_axes, &t->nin_axes, path, st)
               ? st->code
               : copy_axes(pt->vmap->out_axes, pt->vmap->n_out_axes, t->out_axes, &t->nout_axes,
                           path, st);
  case KILN__V1__TRANSFORM__KIND_CHECKPOINT: {
    const char *pol = pt->checkpoint->policy ? pt->checkpoint->policy : "";
    if (pol[0] && strcmp(pol, "nothing_saveable") != 0)
      return kiln_status_set(st, KILN_EUNIMPL, path, "checkpoint policy '%.64s' is not supported "
                             "yet (only nothing_saveable)", pol);
    t->kind = KILN_TRANSFORM_CHECKPOINT;
    return 0;
  }
  default: return kiln_status_set(st, KILN_EINVAL, path, "no transform kind set");
  }
}
#endif

static int plan_transforms(const Kiln__V1__CompileOptions *o, kilnd_compile_plan *p,
                           kiln_status *st) {
  if (o == NULL || o->n_transforms == 0) return 0;
  if (o->n_transforms > KILND_MAX_TRANSFORMS)
    return kiln_status_set(st, KILN_EINVAL, "options.transforms", "more than %d transforms",
                           KILND_MAX_TRANSFORMS);
#ifdef KILND_HAVE_TRANSFORMS
  p->transforms = kiln_calloc(o->n_transforms, sizeof *p->transforms);
  p->drop_value = kiln_calloc(o->n_transforms, sizeof *p->drop_value);
  if (p->transforms == NULL || p->drop_value == NULL)
    return kiln_status_set(st, KILN_ENOMEM, "options.transforms", "out of memory");
  p->ntransforms = (uint32_t)o->n_transforms;
  for (size_t i = 0; i < o->n_transforms; i++) {
    char path[48];
    snprintf(path, sizeof path, "options.transforms[%zu]", i);
    int rc = one_transform(o->transforms[i], &p->transforms[i], &p->drop_value[i], path, st);
    if (rc) return rc;
  }
  return 0;
#else
  return kiln_status_set(st, KILN_EUNIMPL, "options.transforms",
                         "this server was built without transforms");
#endif
}

int kilnd_compile_plan_make(kilnd *srv, const Kiln__V1__CompileOptions *o,
                            kilnd_compile_plan *p, kiln_status *st) {
  memset(p, 0, sizeof *p);
  int rc = plan_backend(srv, o, p, st);
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

#ifdef KILND_HAVE_TRANSFORMS
/* grad without with_value: the root (value, g...) becomes g (one wrt) or
 * (g...). */
static int drop_grad_value(kiln_module *m, kiln_status *st) {
  kiln_computation *e = kiln_module_entry(m);
  kiln_instr *root = kiln_computation_root(m, e);
  if (root == NULL || root->op != KILN_OP_TUPLE || root->noperands < 2)
    return kiln_status_set(st, KILN_EINTERNAL, "grad", "unexpected result of the grad transform");
  if (root->noperands == 2) {
    e->root = root->operands[1];
    return 0;
  }
  kiln_instr *t = kiln_module_add_instr(m, e->id, KILN_OP_TUPLE, NULL);
  kiln_shape *elems = t ? kiln_arena_calloc(m->arena, root->noperands - 1, sizeof *elems) : NULL;
  if (elems == NULL) return kiln_status_set(st, KILN_ENOMEM, "grad", "out of memory");
  for (uint32_t i = 1; i < root->noperands; i++)
    elems[i - 1] = kiln_module_instr(m, root->operands[i])->shape;
  kiln_shape shape;
  int rc = kiln_instr_set_operands(m, t, root->operands + 1, root->noperands - 1);
  if (rc == 0) rc = kiln_shape_make_tuple(m->arena, &shape, elems, root->noperands - 1);
  if (rc == 0) rc = kiln_instr_set_shape(m, t, &shape);
  if (rc) return kiln_status_set(st, KILN_ENOMEM, "grad", "out of memory");
  e->root = t->id;
  return 0;
}
#endif

int kilnd_compile_plan_apply(const kilnd_compile_plan *p, kiln_module *m, kiln_status *st) {
  if (p->ntransforms == 0) return 0;
#ifdef KILND_HAVE_TRANSFORMS
  for (uint32_t i = 0; i < p->ntransforms; i++) {
    int rc = kiln_transforms_apply(m, &p->transforms[i], 1, st);
    if (rc == 0 && p->drop_value[i]) rc = drop_grad_value(m, st);
    if (rc) return rc;
  }
  return kiln_module_verify(m, NULL, st);
#else
  (void)m;
  return kiln_status_set(st, KILN_EUNIMPL, "options.transforms", "no transforms in this build");
#endif
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
