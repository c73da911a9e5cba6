/* Compiler options from the command line, shared by run, dot, explain and
 * bench: --target NAME, --opt-level N, --disable-pass NAME (repeatable),
 * --dump-dir DIR and --memory-budget BYTES, each read only when the
 * command's option table has it.
 *
 * Every value is checked against the compiler's own tables (kiln_target_resolve,
 * kiln_pipeline_find) before anything is loaded, so a misspelt pass or
 * target is a usage error that lists the valid names rather than an option
 * the compiler would silently ignore.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/cli/cli.h"
#include "common/sbuf.h"
#include "compiler/compile.h"
#include "compiler/ir/verify.h"
#include "compiler/pass.h"
#include "compiler/target.h"
#include "executor/backend.h"

static void list_passes(kiln_sbuf *b) {
  uint32_t n;
  const kiln_pass *p = kiln_pipeline_passes(&n);
  for (uint32_t i = 0; i < n; i++) kiln_sbuf_printf(b, "%s%s", i ? ", " : "", p[i].name);
}

int kiln__opt_level_parse(const char *cmd, const char *text, int *out) {
  if (strlen(text) != 1 || text[0] < '0' || text[0] > '3') {
    fprintf(stderr, "kiln %s: --opt-level needs a level from 0 to 3, not '%s'\n", cmd, text);
    return KILN_EXIT_USAGE;
  }
  *out = text[0] - '0';
  return KILN_EXIT_OK;
}

int kiln__memory_budget_parse(const char *cmd, const char *text, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = text[0] >= '0' && text[0] <= '9' ? strtoull(text, &end, 10) : 0;
  unsigned shift = 0;
  if (v && errno == 0) {
    if (*end == 'K' || *end == 'k')
      shift = 10, end++;
    else if (*end == 'M' || *end == 'm')
      shift = 20, end++;
    else if (*end == 'G' || *end == 'g')
      shift = 30, end++;
  }
  if (v == 0 || errno || *end || v > (UINT64_C(1) << 62) >> shift) {
    fprintf(stderr,
            "kiln %s: --memory-budget needs a positive number of bytes (K, M or G for KiB, MiB, "
            "GiB), not '%s'\n",
            cmd, text);
    return KILN_EXIT_USAGE;
  }
  *out = (uint64_t)v << shift;
  return KILN_EXIT_OK;
}

int kiln__compile_options_parse(const kiln__args *a, kiln_compile_options *o, bool *given) {
  const char *cmd = a->cmd->name;
  kiln_compile_options_init(o);
  o->max_nesting = KILN_VERIFY_MAX_NESTING; /* the input's is checked at load */
  *given = false;
  kiln_sbuf names = KILN_SBUF_INIT;
  int rc = KILN_EXIT_OK;
  const char *target = kiln__args_get(a, "target");
  if (target) {
    *given = true;
    const kiln_target *t;
    kiln_status st;
    kiln_status_clear(&st);
    if (kiln_target_resolve("cpu", target, &t, &st)) { /* kiln_compile builds cpu code */
      fprintf(stderr, "kiln %s: %s\n", cmd, st.msg);
      rc = KILN_EXIT_USAGE;
      goto out;
    }
    o->target = t->name;
  }
  const char *level = kiln__args_get(a, "opt-level");
  if (level) {
    *given = true;
    if ((rc = kiln__opt_level_parse(cmd, level, &o->opt_level))) goto out;
  }
  int n;
  const char **off = kiln__args_all(a, "disable-pass", &n);
  for (int i = 0; i < n; i++) {
    *given = true;
    if (kiln_pipeline_find(off[i]) == NULL) {
      list_passes(&names);
      fprintf(stderr, "kiln %s: unknown pass '%s' (passes: %s)\n", cmd, off[i],
              kiln_sbuf_str(&names));
      rc = KILN_EXIT_USAGE;
      goto out;
    }
  }
  o->disabled = off;
  o->ndisabled = (uint32_t)n;
  o->dump_dir = kiln__args_get(a, "dump-dir");
  if (o->dump_dir) *given = true;
  const char *budget = kiln__args_get(a, "memory-budget");
  if (budget) {
    *given = true;
    if ((rc = kiln__memory_budget_parse(cmd, budget, &o->memory_budget))) goto out;
  }
  if (rc == 0) rc = kiln__user_kernels_parse(a, &o->user_kernels);
  if (rc == 0 && o->user_kernels) *given = true;
out:
  kiln_sbuf_free(&names);
  return rc;
}

bool kiln__is_executable_file(const char *path, const uint8_t *head, size_t len) {
  size_t n = strlen(path), k = strlen(KILN_EXECUTABLE_SUFFIX);
  if (n >= k && strcmp(path + n - k, KILN_EXECUTABLE_SUFFIX) == 0) return true;
  return head && len >= 8 && memcmp(head, KILN_EXE_MAGIC, 8) == 0;
}

/* Backends that the target table names but that are not registered here
 * (a server built with them may have them), joined by ", ". */
static void elsewhere_backends(char *buf, size_t size) {
  uint32_t n;
  const kiln_target *t = kiln_targets(&n);
  size_t used = 0;
  buf[0] = '\0';
  for (uint32_t i = 0; i < n; i++) {
    if (kiln_backend_caps(t[i].backend) != 0) continue;
    bool seen = false;
    for (uint32_t j = 0; j < i; j++) seen |= strcmp(t[j].backend, t[i].backend) == 0;
    if (seen) continue;
    int w = snprintf(buf + used, size - used, "%s%s", used ? ", " : "", t[i].backend);
    if (w < 0 || (size_t)w >= size - used) break;
    used += (size_t)w;
  }
}

int kiln__backend_check(const char *cmd, const char *name, unsigned caps, bool remote) {
  unsigned have = kiln_backend_caps(name);
  if (have != 0 && (have & caps) == caps) return KILN_EXIT_OK;
  if (remote && name) {
    if (have != 0) return KILN_EXIT_OK; /* registered: the server knows it too */
    uint32_t n;
    const kiln_target *t = kiln_targets(&n);
    for (uint32_t i = 0; i < n; i++)
      if (strcmp(t[i].backend, name) == 0) return KILN_EXIT_OK;
  }
  char here[256], other[256], absent[600];
  if (!remote && kiln_backend_why_absent(name, absent, sizeof absent)) {
    fprintf(stderr, "kiln %s: backend '%s': %s\n", cmd, name, absent);
    return KILN_EXIT_USAGE;
  }
  kiln_backend_names_join(caps, ", ", here, sizeof here);
  elsewhere_backends(other, sizeof other);
  if (other[0])
    fprintf(stderr,
            "kiln %s: unknown backend '%s' (available here: %s; a server may also have %s)\n", cmd,
            name ? name : "", here, other);
  else
    fprintf(stderr, "kiln %s: unknown backend '%s' (available: %s)\n", cmd, name ? name : "", here);
  return KILN_EXIT_USAGE;
}
