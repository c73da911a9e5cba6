/* Loading modules and reporting errors the way compilers do.
 *
 * Every diagnostic the kiln command prints about an input goes through
 * kiln__report, so that parse errors, verifier errors and interpreter
 * errors all read "FILE:LINE:COL: error: ..." and editors can jump to them.
 * The verifier knows instructions by name ("computation/instruction"); the
 * position comes from the instruction the parser recorded it on. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/cli/cli.h"
#include "clients/cli/fileio.h"
#include "common/alloc.h"
#include "compiler/ir/proto_codec.h"
#include "compiler/ir/text.h"
#include "compiler/ir/verify.h"

int kiln__exit_code(int err) {
  if (err == 0) return KILN_EXIT_OK;
  if (err == KILN_ENOMEM || err == KILN_EINTERNAL) return KILN_EXIT_INTERNAL;
  return KILN_EXIT_INVALID;
}

/* Finds "computation/instruction" (or a computation name) in m. Comparing
 * against kiln_instr_where's own spelling keeps this right even for names
 * that contain '/'. */
static bool find_position(const kiln_module *m, const char *where, uint32_t *line, uint32_t *col) {
  if (*where == '%') where++;
  char buf[KILN_STATUS_WHERE_MAX];
  for (uint32_t i = 0; i < m->ninstrs; i++) {
    const kiln_instr *ins = m->instrs[i];
    if (ins == NULL || ins->line == 0) continue;
    kiln_instr_where(m, ins, buf, sizeof buf);
    if (strcmp(buf, where) == 0) {
      *line = ins->line;
      *col = ins->col;
      return true;
    }
  }
  for (uint32_t i = 0; i < m->ncomps; i++) {
    const kiln_computation *c = m->comps[i];
    if (c && c->line && c->name && strcmp(c->name, where) == 0) {
      *line = c->line;
      *col = c->col;
      return true;
    }
  }
  return false;
}

void kiln__report(const char *file, const kiln_module *m, const kiln_status *st) {
  const char *msg = st->msg[0] ? st->msg : kiln_strerror(st->code);
  size_t flen = strlen(file);
  uint32_t line, col;
  if (st->where[0] == '\0')
    fprintf(stderr, "%s: error: %s\n", file, msg);
  else if (strncmp(st->where, file, flen) == 0 &&
           (st->where[flen] == ':' || st->where[flen] == '\0'))
    fprintf(stderr, "%s: error: %s\n", st->where, msg); /* already FILE[:LINE:COL] */
  else if (m && find_position(m, st->where, &line, &col))
    fprintf(stderr, "%s:%u:%u: error: %s: %s\n", file, line, col, st->where, msg);
  else
    fprintf(stderr, "%s: error: %s: %s\n", file, st->where, msg);
}

static bool is_proto_path(const char *path) {
  size_t n = strlen(path);
  return (n >= 3 && strcmp(path + n - 3, ".pb") == 0) ||
         (n >= 6 && strcmp(path + n - 6, ".binpb") == 0);
}

uint32_t kiln__max_nesting(void) {
  const char *v = getenv("KILN_MAX_NESTING");
  char *end;
  unsigned long n = v && *v ? strtoul(v, &end, 10) : 0;
  if (n == 0 || *end != '\0' || n > KILN_VERIFY_MAX_NESTING) {
    if (v && *v)
      fprintf(stderr, "kiln: KILN_MAX_NESTING='%s' is not a depth from 1 to %u; using %u\n", v,
              (unsigned)KILN_VERIFY_MAX_NESTING, (unsigned)KILN_VERIFY_DEFAULT_MAX_NESTING);
    return KILN_VERIFY_DEFAULT_MAX_NESTING;
  }
  return (uint32_t)n;
}

int kiln__module_load(const char *path, bool verify, kiln_module **out) {
  *out = NULL;
  kiln_status st;
  kiln_status_clear(&st);
  uint8_t *buf;
  size_t len;
  int rc = kiln__file_read(path, &buf, &len, &st);
  if (rc) {
    kiln__report(path, NULL, &st);
    return kiln__exit_code(rc);
  }
  kiln_module *m = NULL;
  if (is_proto_path(path))
    rc = kiln_module_from_proto(buf, len, &m, &st);
  else
    rc = kiln_module_parse_text((const char *)buf, len, path, NULL, &m, &st);
  kiln_free(buf);
  if (rc == 0 && m == NULL) rc = kiln_status_set(&st, KILN_EINTERNAL, NULL, "no module decoded");
  if (rc) {
    kiln__report(path, NULL, &st);
    return kiln__exit_code(rc);
  }
  if (verify) {
    kiln_verify_options vo = {.max_nesting = kiln__max_nesting()};
    rc = kiln_module_verify(m, &vo, &st);
    if (rc) {
      kiln__report(path, m, &st);
      kiln_module_destroy(m);
      return kiln__exit_code(rc);
    }
  }
  *out = m;
  return KILN_EXIT_OK;
}
