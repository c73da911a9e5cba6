/* kiln run FILE [--backend interp] [--arg ARG]... [--random-args SEED]
 * [--out DIR] [--timeout SECONDS] [--max-iterations N]: run the ENTRY
 * computation and print its outputs.
 *
 * The order is: check the command line (backend, seed), load and verify the
 * module, build one literal per parameter (from --arg, then --random-args),
 * run, then print every output leaf as HLO literal text, one per line, and
 * write DIR/i.npy when asked. Nothing runs until every argument matched. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/cli/cli.h"
#include "clients/cli/fileio.h"
#include "common/alloc.h"
#include "common/sbuf.h"
#include "compiler/ir/text.h"
#include "executor/interp/interp.h"

static const char *const backends[] = {"interp"};

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

/* Builds args[0..n) from --arg values then random fill; 0 or an exit code. */
static int build_args(const char *file, const kiln_module *m, const kiln__args *a,
                      kiln_literal **args, uint32_t n) {
  int ngiven;
  const char **given = kiln__args_all(a, "arg", &ngiven);
  const char *seed_text = kiln__args_get(a, "random-args");
  const kiln_computation *entry = kiln_module_entry(m);
  if ((uint32_t)ngiven > n || ((uint32_t)ngiven < n && seed_text == NULL)) {
    fprintf(stderr,
            "%s: error: ENTRY computation %s takes %u parameter%s, %d argument%s given%s\n",
            file, entry->name, n, n == 1 ? "" : "s", ngiven, ngiven == 1 ? "" : "s",
            (uint32_t)ngiven < n ? " (--random-args SEED fills the rest)" : "");
    return KILN_EXIT_INVALID;
  }
  uint64_t state = 0;
  if (seed_text) parse_seed(seed_text, &state); /* validated by the caller */
  kiln_status st;
  kiln_status_clear(&st);
  for (uint32_t i = 0; i < n; i++) {
    const kiln_instr *p = kiln_computation_param(m, entry, i);
    if (p == NULL) {
      kiln_status_set(&st, KILN_EINTERNAL, NULL, "parameter %u missing after verification", i);
    } else if (i < (uint32_t)ngiven) {
      kiln__arg_load(given[i], &p->shape, i, &args[i], &st);
    } else {
      kiln__arg_random(&p->shape, &state, &args[i], &st);
    }
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
    kiln_literal_print(&b, leaves[i], true);
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

int kiln__cmd_run(const kiln__args *a) {
  const char *file = a->pos[0];
  const char *backend = kiln__args_get(a, "backend");
  if (backend == NULL) backend = "interp";
  bool known = false;
  for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++)
    known |= strcmp(backend, backends[i]) == 0;
  if (!known) {
    fprintf(stderr, "kiln run: unknown backend '%s' (available: interp)\n", backend);
    return KILN_EXIT_USAGE;
  }
  const char *seed_text = kiln__args_get(a, "random-args");
  uint64_t seed;
  if (seed_text && parse_seed(seed_text, &seed)) {
    fprintf(stderr, "kiln run: --random-args needs a non-negative integer seed, not '%s'\n",
            seed_text);
    return KILN_EXIT_USAGE;
  }

  kiln_interp_options opts = {0};
  const char *timeout_text = kiln__args_get(a, "timeout");
  if (timeout_text) {
    char *end;
    errno = 0;
    opts.timeout_seconds = strtod(timeout_text, &end);
    if (errno || *end || end == timeout_text || !(opts.timeout_seconds > 0) ||
        opts.timeout_seconds > 1e9) {
      fprintf(stderr, "kiln run: --timeout needs a positive number of seconds, not '%s'\n",
              timeout_text);
      return KILN_EXIT_USAGE;
    }
  }
  const char *iter_text = kiln__args_get(a, "max-iterations");
  if (iter_text && (parse_seed(iter_text, &opts.max_while_iterations) ||
                    opts.max_while_iterations == 0)) {
    fprintf(stderr, "kiln run: --max-iterations needs a positive integer, not '%s'\n", iter_text);
    return KILN_EXIT_USAGE;
  }

  kiln_module *m;
  int rc = kiln__module_load(file, true, &m);
  if (rc) return rc;
  const kiln_computation *entry = kiln_module_entry(m);
  uint32_t n = entry ? kiln_computation_nparams(m, entry) : 0;
  kiln_literal **args = kiln_calloc(n ? n : 1, sizeof *args);
  kiln_literal *result = NULL;
  if (args == NULL) {
    fprintf(stderr, "kiln run: error: out of memory\n");
    rc = KILN_EXIT_INTERNAL;
    goto out_free_module;
  }
  if (entry == NULL) {
    fprintf(stderr, "%s: error: module has no ENTRY computation\n", file);
    rc = KILN_EXIT_INVALID;
    goto out_free_args;
  }
  rc = build_args(file, m, a, args, n);
  if (rc) goto out_free_args;

  kiln_status st;
  kiln_status_clear(&st);
  int err = kiln_interp_run(m, (const kiln_literal *const *)args, n, &opts, &result, &st);
  if (err == 0 && result == NULL) err = kiln_status_set(&st, KILN_EINTERNAL, NULL, "no result");
  if (err) {
    kiln__report(file, m, &st);
    rc = kiln__exit_code(err);
    goto out_free_args;
  }
  rc = emit_outputs(result, kiln__args_get(a, "out"));
  kiln_literal_destroy(result);
out_free_args:
  for (uint32_t i = 0; i < n; i++) kiln_literal_destroy(args[i]);
  kiln_free(args);
out_free_module:
  kiln_module_destroy(m);
  return rc;
}
