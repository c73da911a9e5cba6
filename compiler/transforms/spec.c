/* Transform spec strings: "grad:wrt=0,1", "vmap:in_axes=0,none,1", ...
 *
 * The same text travels through the CLI (--transform) and the compile
 * options of the RPC, so it is parsed in one place. A spec is a kind, then
 * optionally ':' and a comma-separated list of key=value items; an item
 * without '=' continues the list of the key before it, which is how
 * "wrt=0,1" reads as two entries. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/transforms/transform.h"

static const char *const kind_names[] = {
    [KILN_TRANSFORM_GRAD] = "grad",
    [KILN_TRANSFORM_VJP] = "vjp",
    [KILN_TRANSFORM_JVP] = "jvp",
    [KILN_TRANSFORM_VMAP] = "vmap",
    [KILN_TRANSFORM_CHECKPOINT] = "checkpoint",
    [KILN_TRANSFORM_AUTOCAST] = "autocast",
};

const char *kiln_transform_kind_name(kiln_transform_kind k) {
  return (unsigned)k < sizeof kind_names / sizeof kind_names[0] ? kind_names[k] : "?";
}

typedef enum key { KEY_NONE, KEY_WRT, KEY_OUTPUT, KEY_IN_AXES, KEY_OUT_AXES, KEY_SIZE } key;

static const char *const key_names[] = {"", "wrt", "output", "in_axes", "out_axes", "size"};

/* Which keys each kind takes, and how it lists them in messages. */
static bool takes(kiln_transform_kind k, key y) {
  switch (k) {
  case KILN_TRANSFORM_GRAD:
  case KILN_TRANSFORM_VJP: return y == KEY_WRT || y == KEY_OUTPUT;
  case KILN_TRANSFORM_JVP: return y == KEY_WRT;
  case KILN_TRANSFORM_VMAP: return y == KEY_IN_AXES || y == KEY_OUT_AXES || y == KEY_SIZE;
  case KILN_TRANSFORM_CHECKPOINT:
  case KILN_TRANSFORM_AUTOCAST: return false;
  }
  return false;
}

static const char *takes_text(kiln_transform_kind k) {
  switch (k) {
  case KILN_TRANSFORM_GRAD:
  case KILN_TRANSFORM_VJP: return "wrt and output";
  case KILN_TRANSFORM_JVP: return "wrt";
  case KILN_TRANSFORM_VMAP: return "in_axes, out_axes and size";
  case KILN_TRANSFORM_CHECKPOINT: return "no options";
  case KILN_TRANSFORM_AUTOCAST: return "a type (bf16 or f16), loss_scale and growth_interval";
  }
  return "";
}

/* A decimal integer filling all of [s, s+n); false otherwise. */
static bool parse_int(const char *s, size_t n, int64_t *out) {
  char buf[32];
  if (n == 0 || n >= sizeof buf) return false;
  memcpy(buf, s, n);
  buf[n] = 0;
  const char *p = buf;
  if (*p == '-' || *p == '+') p++;
  if (*p < '0' || *p > '9') return false;
  errno = 0;
  char *end;
  long long v = strtoll(buf, &end, 10);
  if (errno || *end) return false;
  *out = v;
  return true;
}

/* Adds one value of list `y` to t. */
static int add_value(kiln_transform *t, key y, const char *v, size_t n, kiln_status *st) {
  const char *kn = kiln_transform_kind_name(t->kind);
  int64_t x = 0;
  if (n == 0)
    return kiln_status_set(st, KILN_EINVAL, NULL, "%s: %s needs a value", kn, key_names[y]);
  bool none = n == 4 && memcmp(v, "none", 4) == 0;
  switch (y) {
  case KEY_WRT:
    if (!parse_int(v, n, &x) || x < 0)
      return kiln_status_set(st, KILN_EINVAL, NULL,
                             "%s: wrt entry '%.*s' is not a parameter number (a non-negative "
                             "integer)",
                             kn, (int)n, v);
    for (uint32_t i = 0; i < t->nwrt; i++)
      if (t->wrt[i] == x)
        return kiln_status_set(st, KILN_EINVAL, NULL,
                               "%s: parameter %" PRId64 " is listed twice in wrt", kn, x);
    if (t->nwrt == KILN_TRANSFORM_MAX_ARGS) goto too_many;
    t->wrt[t->nwrt++] = x;
    return 0;
  case KEY_OUTPUT:
    if (t->output >= 0)
      return kiln_status_set(st, KILN_EINVAL, NULL, "%s: output takes one output number", kn);
    if (!parse_int(v, n, &x) || x < 0)
      return kiln_status_set(st, KILN_EINVAL, NULL,
                             "%s: output '%.*s' is not an output number (a non-negative "
                             "integer)",
                             kn, (int)n, v);
    t->output = x;
    return 0;
  case KEY_IN_AXES:
  case KEY_OUT_AXES: {
    if (!none && !parse_int(v, n, &x))
      return kiln_status_set(st, KILN_EINVAL, NULL, "%s: %s entry '%.*s' is not an integer or none",
                             kn, key_names[y], (int)n, v);
    uint32_t *cnt = y == KEY_IN_AXES ? &t->nin_axes : &t->nout_axes;
    int64_t *arr = y == KEY_IN_AXES ? t->in_axes : t->out_axes;
    if (*cnt == KILN_TRANSFORM_MAX_ARGS) goto too_many;
    arr[(*cnt)++] = none ? KILN_AXIS_NONE : x;
    return 0;
  }
  case KEY_SIZE:
    if (t->axis_size > 0)
      return kiln_status_set(st, KILN_EINVAL, NULL, "%s: size takes one batch size", kn);
    if (!parse_int(v, n, &x) || x <= 0)
      return kiln_status_set(st, KILN_EINVAL, NULL,
                             "%s: size '%.*s' is not a batch size (a positive integer)", kn, (int)n,
                             v);
    t->axis_size = x;
    return 0;
  case KEY_NONE: break;
  }
  return kiln_status_set(st, KILN_EINTERNAL, NULL, "%s: bad option key", kn);
too_many:
  return kiln_status_set(st, KILN_EINVAL, NULL, "%s: %s lists more than %d entries", kn,
                         key_names[y], KILN_TRANSFORM_MAX_ARGS);
}

static bool item_is(const char *p, size_t n, const char *word) {
  return strlen(word) == n && memcmp(p, word, n) == 0;
}

/* autocast:TYPE[,loss_scale=dynamic|none][,growth_interval=N]: its own
 * small grammar, since the type comes first without a key. */
static int parse_autocast(const char *opts, kiln_transform *t, kiln_status *st) {
  if (opts == NULL || *opts == 0)
    return kiln_status_set(st, KILN_EINVAL, NULL,
                           "autocast: give the narrow type (autocast:bf16 or autocast:f16)");
  bool have_ls = false;
  for (const char *p = opts; p;) {
    const char *end = strchr(p, ',');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    int64_t x;
    if (p == opts) {
      if (item_is(p, n, "bf16"))
        t->cast_to = KILN_BF16;
      else if (item_is(p, n, "f16"))
        t->cast_to = KILN_F16;
      else
        return kiln_status_set(st, KILN_EINVAL, NULL,
                               "autocast: type '%.*s' is not bf16 or f16 (write autocast:bf16)",
                               (int)n, p);
    } else if (n > 11 && memcmp(p, "loss_scale=", 11) == 0) {
      if (have_ls)
        return kiln_status_set(st, KILN_EINVAL, NULL, "autocast: loss_scale is given twice");
      have_ls = true;
      if (item_is(p + 11, n - 11, "dynamic"))
        t->loss_scale = true;
      else if (item_is(p + 11, n - 11, "none"))
        t->loss_scale = false;
      else
        return kiln_status_set(st, KILN_EINVAL, NULL,
                               "autocast: loss_scale '%.*s' is not dynamic or none", (int)(n - 11),
                               p + 11);
    } else if (n > 16 && memcmp(p, "growth_interval=", 16) == 0) {
      if (t->growth_interval > 0)
        return kiln_status_set(st, KILN_EINVAL, NULL, "autocast: growth_interval is given twice");
      if (!parse_int(p + 16, n - 16, &x) || x <= 0 || x > INT32_MAX)
        return kiln_status_set(st, KILN_EINVAL, NULL,
                               "autocast: growth_interval '%.*s' is not a positive step count",
                               (int)(n - 16), p + 16);
      t->growth_interval = x;
    } else {
      return kiln_status_set(st, KILN_EINVAL, NULL,
                             "autocast: unknown option '%.*s' (autocast takes %s)", (int)n, p,
                             takes_text(KILN_TRANSFORM_AUTOCAST));
    }
    p = end ? end + 1 : NULL;
  }
  if (!have_ls) t->loss_scale = t->cast_to == KILN_F16;
  return 0;
}

int kiln_transform_parse(const char *spec, kiln_transform *out, kiln_status *st) {
  kiln_transform t;
  memset(&t, 0, sizeof t);
  t.output = -1;
  if (spec == NULL) spec = "";
  const char *colon = strchr(spec, ':');
  size_t klen = colon ? (size_t)(colon - spec) : strlen(spec);
  bool found = false;
  for (unsigned k = 0; k < sizeof kind_names / sizeof kind_names[0]; k++) {
    if (strlen(kind_names[k]) == klen && memcmp(kind_names[k], spec, klen) == 0) {
      t.kind = (kiln_transform_kind)k;
      found = true;
    }
  }
  if (!found)
    return kiln_status_set(st, KILN_EINVAL, NULL,
                           "unknown transform '%.*s' (expected grad, vjp, jvp, vmap, "
                           "checkpoint or autocast, optionally followed by ':' and options)",
                           (int)klen, spec);
  const char *kn = kind_names[t.kind];
  if (t.kind == KILN_TRANSFORM_AUTOCAST) {
    int rc = parse_autocast(colon ? colon + 1 : NULL, &t, st);
    if (rc == 0) *out = t;
    return rc;
  }
  if (colon) {
    const char *p = colon + 1;
    if (*p == 0)
      return kiln_status_set(st, KILN_EINVAL, NULL, "%s: nothing follows ':' (%s takes %s)", kn, kn,
                             takes_text(t.kind));
    key cur = KEY_NONE;
    for (;;) {
      const char *end = strchr(p, ',');
      size_t n = end ? (size_t)(end - p) : strlen(p);
      const char *eq = memchr(p, '=', n);
      const char *v = p;
      size_t vn = n;
      if (eq) {
        size_t kl = (size_t)(eq - p);
        cur = KEY_NONE;
        for (unsigned y = KEY_WRT; y <= KEY_SIZE; y++)
          if (strlen(key_names[y]) == kl && memcmp(key_names[y], p, kl) == 0) cur = (key)y;
        if (cur == KEY_NONE || !takes(t.kind, cur))
          return kiln_status_set(st, KILN_EINVAL, NULL, "%s: unknown option '%.*s' (%s takes %s)",
                                 kn, (int)kl, p, kn, takes_text(t.kind));
        v = eq + 1;
        vn = n - kl - 1;
      } else if (cur == KEY_NONE) {
        return kiln_status_set(st, KILN_EINVAL, NULL,
                               "%s: option '%.*s' has no key (write key=value; %s takes %s)", kn,
                               (int)n, p, kn, takes_text(t.kind));
      }
      int rc = add_value(&t, cur, v, vn, st);
      if (rc) return rc;
      if (end == NULL) break;
      p = end + 1;
    }
  }
  *out = t;
  return 0;
}

static void put_list(char **p, size_t *left, const char *name, const int64_t *v, uint32_t n,
                     bool *first) {
  if (n == 0) return;
  int w = snprintf(*p, *left, "%s%s=", *first ? ":" : ",", name);
  *first = false;
  for (uint32_t i = 0; w >= 0 && (size_t)w < *left && i < n; i++) {
    *p += w;
    *left -= (size_t)w;
    if (v[i] == KILN_AXIS_NONE)
      w = snprintf(*p, *left, "%snone", i ? "," : "");
    else
      w = snprintf(*p, *left, "%s%" PRId64, i ? "," : "", v[i]);
  }
  if (w < 0 || (size_t)w >= *left) {
    *p += *left ? *left - 1 : 0;
    *left = *left ? 1 : 0;
    return;
  }
  *p += w;
  *left -= (size_t)w;
}

void kiln_transform_format(const kiln_transform *t, char *buf, size_t size) {
  if (size == 0) return;
  if (t->kind == KILN_TRANSFORM_AUTOCAST) {
    bool dflt = t->loss_scale == (t->cast_to == KILN_F16);
    int w = snprintf(buf, size, "autocast:%s", kiln_dtype_name(t->cast_to));
    if (w >= 0 && (size_t)w < size && !dflt)
      w +=
          snprintf(buf + w, size - (size_t)w, ",loss_scale=%s", t->loss_scale ? "dynamic" : "none");
    if (w >= 0 && (size_t)w < size && t->growth_interval > 0)
      snprintf(buf + w, size - (size_t)w, ",growth_interval=%" PRId64, t->growth_interval);
    return;
  }
  int w = snprintf(buf, size, "%s", kiln_transform_kind_name(t->kind));
  if (w < 0 || (size_t)w >= size) return;
  char *p = buf + w;
  size_t left = size - (size_t)w;
  bool first = true;
  put_list(&p, &left, "wrt", t->wrt, t->nwrt, &first);
  if (t->output >= 0) put_list(&p, &left, "output", &t->output, 1, &first);
  put_list(&p, &left, "in_axes", t->in_axes, t->nin_axes, &first);
  put_list(&p, &left, "out_axes", t->out_axes, t->nout_axes, &first);
  if (t->axis_size > 0) put_list(&p, &left, "size", &t->axis_size, 1, &first);
}
