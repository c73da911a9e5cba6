/* kiln_transform <-> kiln.v1.Transform, and grad's value dropped for the
 * wire's jax.grad form. See transform_proto.h for the mapping; the one
 * rule kept here is that every field of the message is either carried into
 * kiln_transform or refused, naming the field. */
#include "compiler/transforms/transform_proto.h"

#include <stdio.h>
#include <string.h>

#include "common/alloc.h"

/* Bounds on what a request may say, well past any real program: they keep
 * a hostile number from becoming an allocation. */
#define MAX_PARAM 1000000
#define MAX_AXIS 64
#define MAX_AXIS_SIZE ((int64_t)1 << 31)

/* ---- encoding -------------------------------------------------------------------------- */

static int64_t *copy_list(kiln_arena *a, const int64_t *v, uint32_t n) {
  if (n == 0) return NULL;
  int64_t *out = kiln_arena_calloc(a, n, sizeof *out);
  if (out) memcpy(out, v, n * sizeof *out);
  return out;
}

static int put_axes(kiln_arena *a, const int64_t *axes, uint32_t n, Kiln__V1__VmapAxis ***out,
                    size_t *nout) {
  *nout = 0;
  if (n == 0) return 0;
  *out = kiln_arena_calloc(a, n, sizeof **out);
  if (*out == NULL) return KILN_ENOMEM;
  for (uint32_t i = 0; i < n; i++) {
    Kiln__V1__VmapAxis *ax = kiln_arena_alloc(a, sizeof *ax);
    if (ax == NULL) return KILN_ENOMEM;
    kiln__v1__vmap_axis__init(ax);
    ax->not_mapped = axes[i] == KILN_AXIS_NONE;
    ax->axis = ax->not_mapped ? 0 : axes[i];
    (*out)[i] = ax;
  }
  *nout = n;
  return 0;
}

/* Allocates and initializes one sub-message; false on out-of-memory. */
#define NEW_MSG(a, T, init_fn, out) \
  (((out) = kiln_arena_alloc((a), sizeof(T))) ? (init_fn(out), 1) : 0)

static int encode(kiln_arena *a, const kiln_transform *t, Kiln__V1__Transform *pt) {
  switch (t->kind) {
  case KILN_TRANSFORM_GRAD:
    if (!NEW_MSG(a, Kiln__V1__GradTransform, kiln__v1__grad_transform__init, pt->grad))
      return KILN_ENOMEM;
    pt->kind_case = KILN__V1__TRANSFORM__KIND_GRAD;
    pt->grad->with_value = true; /* a spec's grad is value_and_grad */
    pt->grad->n_wrt = t->nwrt;
    if (t->nwrt && (pt->grad->wrt = copy_list(a, t->wrt, t->nwrt)) == NULL) return KILN_ENOMEM;
    pt->grad->has_output = t->output >= 0;
    pt->grad->output = t->output >= 0 ? t->output : 0;
    return 0;
  case KILN_TRANSFORM_VJP:
    if (!NEW_MSG(a, Kiln__V1__VjpTransform, kiln__v1__vjp_transform__init, pt->vjp))
      return KILN_ENOMEM;
    pt->kind_case = KILN__V1__TRANSFORM__KIND_VJP;
    pt->vjp->n_wrt = t->nwrt;
    if (t->nwrt && (pt->vjp->wrt = copy_list(a, t->wrt, t->nwrt)) == NULL) return KILN_ENOMEM;
    pt->vjp->has_output = t->output >= 0;
    pt->vjp->output = t->output >= 0 ? t->output : 0;
    return 0;
  case KILN_TRANSFORM_JVP:
    if (!NEW_MSG(a, Kiln__V1__JvpTransform, kiln__v1__jvp_transform__init, pt->jvp))
      return KILN_ENOMEM;
    pt->kind_case = KILN__V1__TRANSFORM__KIND_JVP;
    pt->jvp->n_wrt = t->nwrt;
    if (t->nwrt && (pt->jvp->wrt = copy_list(a, t->wrt, t->nwrt)) == NULL) return KILN_ENOMEM;
    return 0;
  case KILN_TRANSFORM_VMAP:
    if (!NEW_MSG(a, Kiln__V1__VmapTransform, kiln__v1__vmap_transform__init, pt->vmap))
      return KILN_ENOMEM;
    pt->kind_case = KILN__V1__TRANSFORM__KIND_VMAP;
    pt->vmap->axis_size = t->axis_size > 0 ? t->axis_size : 0;
    if (put_axes(a, t->in_axes, t->nin_axes, &pt->vmap->in_axes, &pt->vmap->n_in_axes) ||
        put_axes(a, t->out_axes, t->nout_axes, &pt->vmap->out_axes, &pt->vmap->n_out_axes))
      return KILN_ENOMEM;
    return 0;
  case KILN_TRANSFORM_CHECKPOINT:
    if (!NEW_MSG(a, Kiln__V1__CheckpointTransform, kiln__v1__checkpoint_transform__init,
                 pt->checkpoint))
      return KILN_ENOMEM;
    pt->kind_case = KILN__V1__TRANSFORM__KIND_CHECKPOINT;
    return 0;
  case KILN_TRANSFORM_AUTOCAST:
    if (!NEW_MSG(a, Kiln__V1__AutocastTransform, kiln__v1__autocast_transform__init, pt->autocast))
      return KILN_ENOMEM;
    pt->kind_case = KILN__V1__TRANSFORM__KIND_AUTOCAST;
    /* strings of the static tables: the message is only packed */
    pt->autocast->dtype = (char *)kiln_dtype_name(t->cast_to);
    pt->autocast->loss_scale = (char *)(t->loss_scale ? "dynamic" : "none");
    pt->autocast->growth_interval = t->growth_interval;
    return 0;
  }
  return KILN_EINVAL;
}

int kiln_transform_to_proto(kiln_arena *a, const kiln_transform *t, Kiln__V1__Transform **out,
                            kiln_status *st) {
  Kiln__V1__Transform *pt = kiln_arena_alloc(a, sizeof *pt);
  if (pt == NULL) return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
  kiln__v1__transform__init(pt);
  int rc = encode(a, t, pt);
  if (rc == KILN_ENOMEM) return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
  if (rc)
    return kiln_status_set(st, KILN_EINVAL, NULL, "transform kind %d has no kiln.v1 form",
                           (int)t->kind);
  *out = pt;
  return 0;
}

int kiln_transform_specs_to_proto(kiln_arena *a, const char *const *specs, uint32_t n,
                                  const kiln_shape *const *args, uint32_t nargs,
                                  Kiln__V1__Transform ***out, int *bad, kiln_status *st) {
  *bad = -1;
  *out = NULL;
  if (n == 0) return 0;
  kiln_transform *ts = kiln_calloc(n, sizeof *ts);
  Kiln__V1__Transform **pts = kiln_arena_calloc(a, n, sizeof *pts);
  if (ts == NULL || pts == NULL) {
    kiln_free(ts);
    return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
  }
  int rc = 0;
  bool need = false;
  for (uint32_t i = 0; i < n && rc == 0; i++) {
    if (specs[i] == NULL)
      rc = kiln_status_set(st, KILN_EINVAL, NULL, "transform %u: no spec given", i);
    else
      rc = kiln_transform_parse(specs[i], &ts[i], st);
    if (rc)
      *bad = (int)i;
    else
      need |= ts[i].kind == KILN_TRANSFORM_VMAP && ts[i].axis_size <= 0;
  }
  if (rc == 0 && need && args != NULL) rc = kiln_transforms_infer_sizes(ts, n, args, nargs, st);
  for (uint32_t i = 0; i < n && rc == 0; i++) rc = kiln_transform_to_proto(a, &ts[i], &pts[i], st);
  kiln_free(ts);
  if (rc == 0) *out = pts;
  return rc;
}

/* ---- decoding -------------------------------------------------------------------------- */

static int take_wrt(const int64_t *v, size_t n, kiln_transform *t, const char *path,
                    kiln_status *st) {
  if (n > KILN_TRANSFORM_MAX_ARGS)
    return kiln_status_set(st, KILN_EINVAL, path, "more than %d entries", KILN_TRANSFORM_MAX_ARGS);
  for (size_t i = 0; i < n; i++) {
    if (v[i] < 0 || v[i] > MAX_PARAM)
      return kiln_status_set(st, KILN_EINVAL, path, "entry %zu is %lld, not a parameter number", i,
                             (long long)v[i]);
    for (size_t k = 0; k < i; k++)
      if (v[k] == v[i])
        return kiln_status_set(st, KILN_EINVAL, path, "parameter %lld is listed twice",
                               (long long)v[i]);
    t->wrt[i] = v[i];
  }
  t->nwrt = (uint32_t)n;
  return 0;
}

static int take_output(bool has, int64_t v, kiln_transform *t, const char *path, kiln_status *st) {
  if (!has) {
    if (v != 0)
      return kiln_status_set(st, KILN_EINVAL, path, "%lld given without has_output", (long long)v);
    return 0;
  }
  if (v < 0 || v > MAX_PARAM)
    return kiln_status_set(st, KILN_EINVAL, path, "%lld is not an output number", (long long)v);
  t->output = v;
  return 0;
}

static int take_axes(Kiln__V1__VmapAxis *const *v, size_t n, int64_t *out, uint32_t *nout,
                     const char *path, kiln_status *st) {
  if (n > KILN_TRANSFORM_MAX_ARGS)
    return kiln_status_set(st, KILN_EINVAL, path, "more than %d entries", KILN_TRANSFORM_MAX_ARGS);
  for (size_t i = 0; i < n; i++) {
    if (v[i] == NULL) return kiln_status_set(st, KILN_EINVAL, path, "entry %zu is missing", i);
    if (v[i]->not_mapped && v[i]->axis != 0)
      return kiln_status_set(st, KILN_EINVAL, path, "entry %zu: axis %lld given with not_mapped", i,
                             (long long)v[i]->axis);
    if (v[i]->axis < -MAX_AXIS || v[i]->axis > MAX_AXIS)
      return kiln_status_set(st, KILN_EINVAL, path, "entry %zu: axis %lld is out of range", i,
                             (long long)v[i]->axis);
    out[i] = v[i]->not_mapped ? KILN_AXIS_NONE : v[i]->axis;
  }
  *nout = (uint32_t)n;
  return 0;
}

/* path + "." + field, for messages. */
static const char *field(char *buf, size_t size, const char *path, const char *name) {
  snprintf(buf, size, "%s.%s", path, name);
  return buf;
}

int kiln_transform_from_proto(const Kiln__V1__Transform *pt, const char *path, kiln_transform *out,
                              bool *drop_value, kiln_status *st) {
  kiln_transform t;
  memset(&t, 0, sizeof t);
  t.output = -1;
  *drop_value = false;
  char f[160];
  int rc = 0;
  if (path == NULL) path = "transform";
  switch (pt ? pt->kind_case : KILN__V1__TRANSFORM__KIND__NOT_SET) {
  case KILN__V1__TRANSFORM__KIND_GRAD:
    if (pt->grad->has_aux)
      return kiln_status_set(st, KILN_EUNIMPL, field(f, sizeof f, path, "grad.has_aux"),
                             "grad with auxiliary outputs is not supported yet (differentiate "
                             "one output with has_output/output instead)");
    t.kind = KILN_TRANSFORM_GRAD;
    *drop_value = !pt->grad->with_value;
    rc = take_wrt(pt->grad->wrt, pt->grad->n_wrt, &t, field(f, sizeof f, path, "grad.wrt"), st);
    if (rc == 0)
      rc = take_output(pt->grad->has_output, pt->grad->output, &t,
                       field(f, sizeof f, path, "grad.output"), st);
    break;
  case KILN__V1__TRANSFORM__KIND_VJP:
    t.kind = KILN_TRANSFORM_VJP;
    rc = take_wrt(pt->vjp->wrt, pt->vjp->n_wrt, &t, field(f, sizeof f, path, "vjp.wrt"), st);
    if (rc == 0)
      rc = take_output(pt->vjp->has_output, pt->vjp->output, &t,
                       field(f, sizeof f, path, "vjp.output"), st);
    break;
  case KILN__V1__TRANSFORM__KIND_JVP:
    t.kind = KILN_TRANSFORM_JVP;
    rc = take_wrt(pt->jvp->wrt, pt->jvp->n_wrt, &t, field(f, sizeof f, path, "jvp.wrt"), st);
    break;
  case KILN__V1__TRANSFORM__KIND_VMAP:
    t.kind = KILN_TRANSFORM_VMAP;
    if (pt->vmap->axis_size < 0 || pt->vmap->axis_size > MAX_AXIS_SIZE)
      return kiln_status_set(st, KILN_EINVAL, field(f, sizeof f, path, "vmap.axis_size"),
                             "%lld is not a batch size", (long long)pt->vmap->axis_size);
    t.axis_size = pt->vmap->axis_size;
    rc = take_axes(pt->vmap->in_axes, pt->vmap->n_in_axes, t.in_axes, &t.nin_axes,
                   field(f, sizeof f, path, "vmap.in_axes"), st);
    if (rc == 0)
      rc = take_axes(pt->vmap->out_axes, pt->vmap->n_out_axes, t.out_axes, &t.nout_axes,
                     field(f, sizeof f, path, "vmap.out_axes"), st);
    break;
  case KILN__V1__TRANSFORM__KIND_CHECKPOINT: {
    const char *pol = pt->checkpoint->policy ? pt->checkpoint->policy : "";
    if (pol[0] && strcmp(pol, "nothing_saveable") != 0)
      return kiln_status_set(st, KILN_EUNIMPL, field(f, sizeof f, path, "checkpoint.policy"),
                             "'%.64s' is not supported yet (only nothing_saveable)", pol);
    t.kind = KILN_TRANSFORM_CHECKPOINT;
    break;
  }
  case KILN__V1__TRANSFORM__KIND_AUTOCAST: {
    const char *dt = pt->autocast->dtype ? pt->autocast->dtype : "";
    const char *ls = pt->autocast->loss_scale ? pt->autocast->loss_scale : "";
    t.kind = KILN_TRANSFORM_AUTOCAST;
    if (strcmp(dt, "bf16") == 0)
      t.cast_to = KILN_BF16;
    else if (strcmp(dt, "f16") == 0)
      t.cast_to = KILN_F16;
    else
      return kiln_status_set(st, KILN_EINVAL, field(f, sizeof f, path, "autocast.dtype"),
                             "'%.16s' is not bf16 or f16", dt);
    if (ls[0] == 0)
      t.loss_scale = t.cast_to == KILN_F16;
    else if (strcmp(ls, "dynamic") == 0 || strcmp(ls, "none") == 0)
      t.loss_scale = ls[0] == 'd';
    else
      return kiln_status_set(st, KILN_EINVAL, field(f, sizeof f, path, "autocast.loss_scale"),
                             "'%.16s' is not dynamic or none", ls);
    if (pt->autocast->growth_interval < 0 || pt->autocast->growth_interval > INT32_MAX)
      return kiln_status_set(st, KILN_EINVAL, field(f, sizeof f, path, "autocast.growth_interval"),
                             "%lld is not a step count", (long long)pt->autocast->growth_interval);
    t.growth_interval = pt->autocast->growth_interval;
    break;
  }
  default: return kiln_status_set(st, KILN_EINVAL, path, "no transform kind set");
  }
  if (rc == 0) *out = t;
  return rc;
}

/* ---- grad without its value ------------------------------------------------------------ */

int kiln_transform_drop_value(kiln_module *m, kiln_status *st) {
  kiln_computation *e = kiln_module_entry(m);
  kiln_instr *root = e ? kiln_computation_root(m, e) : NULL;
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
