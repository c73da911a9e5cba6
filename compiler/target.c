/* The target table and its resolver (target.h).
 *
 * The rows are the only list of target names in Kiln: the resolver's
 * spellings are derived from each row's name, backend and ISA, and its
 * error message lists the rows, so adding a row (a CUDA architecture, a new
 * x86 level) is the whole change needed for every client to accept it.
 * Whether a backend can build or load a row is the backend's question, asked
 * of the row (kiln_compile refuses rows of other backends; the CPU loader
 * checks that this host runs the row's -march).
 */
#include "compiler/target.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* Per-target constants: rough figures for one device (a core group for
 * CPU), used by the cost model only in ratios. The first row of each
 * backend is that backend's default; the first row of all is the default. */
static const kiln_target targets[] = {
    {"cpu", "cpu", "native", "native", 1.0e11, 2.0e10, 2e-6},
    {"cpu-x86-64", "cpu", "x86-64", "x86-64", 5.0e10, 2.0e10, 2e-6},
    {"cpu-x86-64-v2", "cpu", "x86-64-v2", "x86-64-v2", 5.0e10, 2.0e10, 2e-6},
    {"cpu-x86-64-v3", "cpu", "x86-64-v3", "x86-64-v3", 1.0e11, 2.0e10, 2e-6},
    {"cpu-x86-64-v4", "cpu", "x86-64-v4", "x86-64-v4", 2.0e11, 2.0e10, 2e-6},
    {"interp", "interp", NULL, NULL, 1.0e8, 1.0e9, 0},
    {"cuda-sm_80", "cuda", "sm_80", NULL, 1.9e13, 2.0e12, 5e-6},
    {"cuda-sm_90", "cuda", "sm_90", NULL, 5.0e13, 4.0e12, 5e-6},
    {"cuda-sm_100", "cuda", "sm_100", NULL, 8.0e13, 8.0e12, 5e-6},
};

#define NTARGETS (sizeof targets / sizeof targets[0])

const kiln_target *kiln_targets(uint32_t *n) {
  *n = (uint32_t)NTARGETS;
  return targets;
}

const kiln_target *kiln_target_default(void) { return &targets[0]; }

/* name is BACKEND-ISA of t. */
static bool is_prefixed_isa(const kiln_target *t, const char *name) {
  size_t nb = strlen(t->backend);
  return t->isa && strncmp(name, t->backend, nb) == 0 && name[nb] == '-' &&
         strcmp(name + nb + 1, t->isa) == 0;
}

static bool spells(const kiln_target *t, const char *name) {
  return strcmp(name, t->name) == 0 || (t->isa && strcmp(name, t->isa) == 0) ||
         is_prefixed_isa(t, name);
}

static bool in_backend(const kiln_target *t, const char *backend) {
  return backend == NULL || strcmp(t->backend, backend) == 0;
}

/* Appends "a, b, c" to buf: the rows' names (isa false) or ISAs (true). */
static void list_rows(char *buf, size_t size, const char *backend, bool isa) {
  size_t len = strlen(buf);
  bool first = true;
  for (size_t i = 0; i < NTARGETS && len < size; i++) {
    const char *s = isa ? targets[i].isa : targets[i].name;
    if (s == NULL || !in_backend(&targets[i], backend)) continue;
    int k = snprintf(buf + len, size - len, "%s%s", first ? "" : ", ", s);
    if (k < 0) break;
    len += (size_t)k;
    first = false;
  }
}

/* "known: NAMES; or by ISA: ISAS" for the rows of backend (NULL: all). */
static void known(char *buf, size_t size, const char *backend) {
  snprintf(buf, size, "known: ");
  list_rows(buf, size, backend, false);
  size_t len = strlen(buf);
  if (len + 1 >= size) return;
  snprintf(buf + len, size - len, "; or by ISA: ");
  size_t mark = strlen(buf);
  list_rows(buf, size, backend, true);
  if (strlen(buf) == mark) buf[len] = '\0'; /* no row has an ISA */
}

int kiln_target_resolve(const char *backend, const char *name, const kiln_target **out,
                        kiln_status *st) {
  *out = NULL;
  const kiln_target *first = NULL, *other = NULL;
  for (size_t i = 0; i < NTARGETS; i++) {
    const kiln_target *t = &targets[i];
    bool mine = in_backend(t, backend);
    if (mine && first == NULL) first = t;
    if (name == NULL || name[0] == '\0') continue;
    if (spells(t, name)) {
      if (mine) {
        *out = t;
        return 0;
      }
      if (other == NULL) other = t;
    }
  }
  if (first == NULL) {
    char backends[256] = "";
    size_t len = 0;
    for (size_t i = 0; i < NTARGETS && len < sizeof backends; i++) {
      bool seen = false;
      for (size_t j = 0; j < i && !seen; j++)
        seen = strcmp(targets[j].backend, targets[i].backend) == 0;
      if (seen) continue;
      int k = snprintf(backends + len, sizeof backends - len, "%s%s", len ? ", " : "",
                       targets[i].backend);
      if (k < 0) break;
      len += (size_t)k;
    }
    return kiln_status_set(st, KILN_EINVAL, "target",
                           "unknown backend '%.64s' (backends with targets: %s)", backend,
                           backends);
  }
  if (name == NULL || name[0] == '\0') {
    *out = first;
    return 0;
  }
  char list[KILN_STATUS_MSG_MAX / 2];
  known(list, sizeof list, backend);
  if (other)
    return kiln_status_set(st, KILN_EINVAL, "target",
                           "target '%.64s' is for the %s backend, not %s (%s)", name,
                           other->backend, backend, list);
  return kiln_status_set(st, KILN_EINVAL, "target", "unknown %s%starget '%.64s' (%s)",
                         backend ? backend : "", backend ? " " : "", name, list);
}
