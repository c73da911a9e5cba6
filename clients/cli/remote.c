/* The kiln command against a server: check, compile and run with
 * --server HOST:PORT, and stats, all through libkiln (clients/c/kiln.h).
 *
 * Remote mode keeps local mode's contract: the same output (outputs as HLO
 * literal text, one per line, tuples flattened; --out writes .npy files),
 * the same diagnostics ("FILE: error: MESSAGE") and the same exit codes: a
 * request the server refuses as invalid is 1 like a local verifier error,
 * and so is a server that cannot be reached (an input that cannot be read);
 * a bad command line is 2; a server that reports an internal error, or a
 * reply that does not decode, is 3. Arguments are matched against the
 * calling convention the server returns from Compile, so transforms that
 * change the parameters work the same as they would locally. Transform
 * specs are checked here as the local command checks them, a vmap without
 * size=N gets its size from the --arg shapes before the request goes out
 * (libkiln encodes it through compiler/transforms/transform_proto.c, the
 * mapping kilnd decodes with), and a program the server refuses
 * (INVALID_ARGUMENT, UNIMPLEMENTED) is reported with the file's line, on
 * the module transformed as the request asked, as a local run reports it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clients/cli/cli.h"

#ifdef KILN_HAVE_CLIENT

#include "clients/c/kiln.h"
#include "clients/cli/fileio.h"
#include "common/alloc.h"
#include "common/sbuf.h"
#include "compiler/ir/proto_codec.h"
#include "compiler/ir/text.h"
#include "compiler/ir/verify.h"
#include "compiler/transforms/transform.h"
#include "executor/backend.h"

/* "HOST:PORT" with a numeric port in 1..65535 ("[v6]:PORT" too); the rest
 * is gRPC's to resolve. */
static bool server_ok(const char *s) {
  const char *colon = strrchr(s, ':');
  if (colon == NULL || colon == s) return strncmp(s, "unix:", 5) == 0 && s[5];
  char *end;
  errno = 0;
  long port = strtol(colon + 1, &end, 10);
  return colon[1] && !*end && !errno && port >= 1 && port <= 65535;
}

/* Prints a failed call as "WHAT: error: MESSAGE"; codes other than
 * INVALID_ARGUMENT (whose message is all a user needs) are named too. */
static int report(const char *what, const kiln_status *st) {
  kiln_rpc_code code = kiln_rpc_status_code(st);
  const char *msg = st->msg[0] ? st->msg : kiln_strerror(st->code);
  if (code == KILN_RPC_INVALID_ARGUMENT || code == KILN_RPC_UNKNOWN)
    fprintf(stderr, "%s: error: %s\n", what, msg);
  else
    fprintf(stderr, "%s: error: %s [%s]\n", what, msg, kiln_rpc_code_name(code));
  return kiln__exit_code(st->code);
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

static bool is_proto_path(const char *path) {
  return ends_with(path, ".pb") || ends_with(path, ".binpb");
}

/* "NAME:LINE:COL" (a parse error's position in the request): the offset
 * of ":LINE:COL", or -1. */
static int position_suffix(const char *where) {
  const char *c2 = strrchr(where, ':');
  if (c2 == NULL || c2 == where || !c2[1] || strspn(c2 + 1, "0123456789") != strlen(c2 + 1))
    return -1;
  const char *c1 = c2 - 1;
  while (c1 > where && *c1 != ':') c1--;
  if (*c1 != ':' || c1 + 1 == c2 || (size_t)(c2 - c1 - 1) != strspn(c1 + 1, "0123456789"))
    return -1;
  return strchr(where, '/') && strchr(where, '/') < c1 ? -1 : (int)(c1 - where);
}

/* A program the server refused, reported as `kiln check` would locally:
 * the server's "WHERE: error: MESSAGE" is split, a parse position in its
 * copy of the text becomes one in FILE, and a verifier's
 * "computation/instruction" is looked up in the file for its line. */
/* m transformed as the request asked (a local command reports on the
 * transformed module, whose new instructions keep the source lines), for
 * finding positions only: failures leave m as far as it got. */
static void transform_for_positions(kiln_module *m, const kiln_remote_compile_options *o) {
  kiln_transform *ts = kiln_calloc(o->ntransforms, sizeof *ts);
  kiln_status ignore;
  kiln_status_clear(&ignore);
  bool ok = ts != NULL && kiln_module_verify(m, NULL, &ignore) == 0;
  bool need = false;
  for (uint32_t i = 0; ok && i < o->ntransforms; i++) {
    ok = kiln_transform_parse(o->transforms[i], &ts[i], &ignore) == 0;
    need |= ok && ts[i].kind == KILN_TRANSFORM_VMAP && ts[i].axis_size <= 0;
  }
  if (ok && need && o->arg_shapes)
    ok = kiln_transforms_infer_sizes(ts, o->ntransforms, o->arg_shapes, o->narg_shapes, &ignore) ==
         0;
  if (ok) kiln_transforms_apply(m, ts, o->ntransforms, &ignore);
  kiln_free(ts);
}

static int report_program(const char *path, const kiln_status *st,
                          const kiln_remote_compile_options *o) {
  /* Refusals of the program (a local run reports them with no code) */
  kiln_rpc_code code = kiln_rpc_status_code(st);
  if (code != KILN_RPC_INVALID_ARGUMENT && code != KILN_RPC_UNIMPLEMENTED) return report(path, st);
  if (strncmp(st->msg, "error: ", 7) == 0) {
    kiln_status local = *st; /* the server's status had no where: FILE stands for it */
    snprintf(local.msg, sizeof local.msg, "%s", st->msg + 7);
    local.where[0] = '\0';
    kiln__report(path, NULL, &local);
    return kiln__exit_code(local.code);
  }
  const char *sep = strstr(st->msg, ": error: ");
  if (sep == NULL || (size_t)(sep - st->msg) >= KILN_STATUS_WHERE_MAX) {
    kiln_status local = *st; /* the text as it came, without the code's name */
    local.where[0] = '\0';
    kiln__report(path, NULL, &local);
    return kiln__exit_code(local.code);
  }
  kiln_status local;
  kiln_status_clear(&local);
  local.code = st->code;
  char where[KILN_STATUS_WHERE_MAX];
  snprintf(where, sizeof where, "%.*s", (int)(sep - st->msg), st->msg);
  snprintf(local.msg, sizeof local.msg, "%s", sep + 9);
  int pos = position_suffix(where);
  if (pos >= 0)
    snprintf(local.where, sizeof local.where, "%s%s", path, where + pos);
  else
    snprintf(local.where, sizeof local.where, "%s", where);
  kiln_module *m = NULL;
  if (pos < 0 && !is_proto_path(path)) {
    uint8_t *buf;
    size_t len;
    kiln_status ignore;
    kiln_status_clear(&ignore);
    if (kiln__file_read(path, &buf, &len, &ignore) == 0) {
      kiln_module_parse_text((const char *)buf, len, path, NULL, &m, &ignore);
      kiln_free(buf);
    }
    if (m && o && o->ntransforms) transform_for_positions(m, o);
  }
  kiln__report(path, m, &local);
  kiln_module_destroy(m);
  return kiln__exit_code(local.code);
}

static int connect_to(const kiln__args *a, kiln_client **out) {
  const char *server = kiln__args_get(a, "server");
  char what[64];
  snprintf(what, sizeof what, "kiln %s", a->cmd->name);
  if (server == NULL || !server_ok(server)) {
    fprintf(stderr, "%s: --server needs HOST:PORT, not '%s'\n", what, server ? server : "");
    return KILN_EXIT_USAGE;
  }
  kiln_client_options o = {.connect_timeout_ms = 5000};
  /* A flag, else the environment ("" there counts as unset). */
  static const struct {
    const char *opt, *env;
  } sec[] = {{"tls-ca", "KILN_TLS_CA"},
             {"tls-cert", "KILN_TLS_CERT"},
             {"tls-key", "KILN_TLS_KEY"},
             {"token", "KILN_TOKEN"}};
  const char *v[4];
  for (int i = 0; i < 4; i++) {
    v[i] = kiln__args_get(a, sec[i].opt);
    if (v[i] == NULL && getenv(sec[i].env) && getenv(sec[i].env)[0]) v[i] = getenv(sec[i].env);
  }
  o.tls_ca_file = v[0];
  o.tls_cert_file = v[1];
  o.tls_key_file = v[2];
  o.token = v[3];
  o.tls = v[0] || v[1];
  if ((v[1] == NULL) != (v[2] == NULL)) {
    fprintf(stderr, "%s: --tls-cert and --tls-key go together\n", what);
    return KILN_EXIT_USAGE;
  }
  kiln_status st;
  kiln_status_clear(&st);
  if (kiln_client_connect(server, &o, out, &st)) return report(what, &st);
  return KILN_EXIT_OK;
}

int kiln__remote_connect(const kiln__args *a, kiln_client **out) { return connect_to(a, out); }
int kiln__remote_report(const char *what, const kiln_status *st) { return report(what, st); }

/* Reads FILE and compiles it on the server. */
static int compile_file(kiln_client *c, const char *path, const kiln_remote_compile_options *o,
                        kiln_remote_executable **exe) {
  kiln_status st;
  kiln_status_clear(&st);
  uint8_t *buf;
  size_t len;
  int rc = kiln__file_read(path, &buf, &len, &st);
  if (rc) {
    kiln__report(path, NULL, &st);
    return kiln__exit_code(rc);
  }
  if (is_proto_path(path)) {
    /* Bytes that are no Module would reach the server as a CompileRequest
     * that does not decode: told apart here, as a local load reports them. */
    kiln_module *m = NULL;
    if (kiln_module_from_proto(buf, len, &m, &st)) {
      kiln_free(buf);
      kiln__report(path, NULL, &st);
      return kiln__exit_code(st.code);
    }
    kiln_module_destroy(m);
    rc = kiln_client_compile_proto(c, buf, len, o, exe, &st);
  } else
    rc = kiln_client_compile_text(c, (const char *)buf, len, o, exe, &st);
  kiln_free(buf);
  return rc ? report_program(path, &st, o) : KILN_EXIT_OK;
}

/* --backend for remote commands: any backend a server may have, checked
 * and worded as the local command checks it (an unknown name is the same
 * mistake with or without --server). */
static int backend_ok(const kiln__args *a, const char **out) {
  const char *b = kiln__args_get(a, "backend");
  *out = b;
  if (b == NULL) return KILN_EXIT_OK;
  unsigned caps = strcmp(a->cmd->name, "compile") == 0 ? KILN_BACKEND_LOADS : 0;
  return kiln__backend_check(a->cmd->name, b, caps, true);
}

/* ---- check -------------------------------------------------------------------------------- */

int kiln__remote_check(const kiln__args *a) {
  kiln_client *c;
  int rc = connect_to(a, &c);
  if (rc) return rc;
  /* kiln.v1 has no verify-only request: the interpreter backend at
   * optimization level 0, without the cache, is the least work that still
   * makes the server verify (no native code is generated). */
  kiln_remote_compile_options o = {.backend = "interp",
                                   .has_optimization_level = true,
                                   .optimization_level = 0,
                                   .cache_policy = KILN_REMOTE_CACHE_BYPASS};
  int worst = KILN_EXIT_OK;
  for (int i = 0; i < a->npos; i++) {
    kiln_remote_executable *exe = NULL;
    rc = compile_file(c, a->pos[i], &o, &exe);
    kiln_remote_executable_free(exe);
    if (rc > worst) worst = rc;
  }
  kiln_client_close(c);
  return worst;
}

/* ---- compile ------------------------------------------------------------------------------ */

static void print_signature(const kiln_remote_executable *e) {
  kiln_sbuf b = KILN_SBUF_INIT;
  kiln_sbuf_putc(&b, '(');
  for (uint32_t i = 0; i < e->nparams; i++) {
    if (i) kiln_sbuf_puts(&b, ", ");
    kiln_shape_print(&b, &e->params[i]);
  }
  kiln_sbuf_puts(&b, ") -> ");
  if (e->result.dtype != KILN_INVALID)
    kiln_shape_print(&b, &e->result);
  else
    kiln_sbuf_puts(&b, "?");
  if (!kiln_sbuf_failed(&b)) printf("signature %s\n", kiln_sbuf_str(&b));
  kiln_sbuf_free(&b);
}

/* Fills compile options from --backend, --target, -O, --memory-budget and
 * --transform. */
static int remote_compile_options(const kiln__args *a, kiln_remote_compile_options *o) {
  memset(o, 0, sizeof *o);
  int rc = backend_ok(a, &o->backend);
  if (rc) return rc;
  o->target = kiln__args_get(a, "target");
  const char *level = kiln__args_get(a, "opt-level");
  if (level) {
    if (strlen(level) != 1 || level[0] < '0' || level[0] > '3') {
      fprintf(stderr, "kiln %s: -O needs a level from 0 to 3, not '%s'\n", a->cmd->name, level);
      return KILN_EXIT_USAGE;
    }
    o->has_optimization_level = true;
    o->optimization_level = level[0] - '0';
  }
  const char *budget = kiln__args_get(a, "memory-budget");
  if (budget && kiln__memory_budget_parse(a->cmd->name, budget, &o->memory_budget_bytes))
    return KILN_EXIT_USAGE;
  int n;
  const char **specs = kiln__args_all(a, "transform", &n);
  o->transforms = specs;
  o->ntransforms = (uint32_t)n;
  return KILN_EXIT_OK;
}

/* The --transform specs checked as the local command checks them, with
 * its messages and exit codes; *need_size: a vmap gives no size=N. */
static int remote_transforms_check(const kiln__args *a, bool *need_size) {
  int n;
  const char **specs = kiln__args_all(a, "transform", &n);
  *need_size = false;
  for (int i = 0; i < n; i++) {
    kiln_transform t;
    kiln_status st;
    kiln_status_clear(&st);
    if (kiln_transform_parse(specs[i], &t, &st)) {
      fprintf(stderr, "kiln %s: --transform '%s': %s\n", a->cmd->name, specs[i], st.msg);
      return KILN_EXIT_USAGE;
    }
    if (t.kind == KILN_TRANSFORM_VMAP && t.axis_size <= 0) {
      if (strcmp(a->cmd->name, "bench") == 0) {
        fprintf(stderr,
                "kiln bench: --transform '%s': the arguments are random, so vmap needs its "
                "batch size (size=N)\n",
                specs[i]);
        return KILN_EXIT_USAGE;
      }
      *need_size = true;
    }
  }
  return KILN_EXIT_OK;
}

/* The shapes of the --arg values, for a vmap that takes its batch size from
 * them (the request then carries it, as the local run infers it); they
 * live in `ar`. The shapes' own errors read as a local run reports them. */
static int arg_shapes(const char *file, const kiln__args *a, kiln_arena *ar,
                      kiln_remote_compile_options *o) {
  kiln_status st;
  kiln_status_clear(&st);
  const kiln_shape **shapes;
  if (kiln__arg_shapes(a, ar, &shapes, &o->narg_shapes, &st)) {
    kiln__report(file, NULL, &st);
    return kiln__exit_code(st.code);
  }
  o->arg_shapes = shapes;
  return KILN_EXIT_OK;
}

/* "ENTRY computation NAME" when FILE parses here (as a local run names
 * it), else "the executable". */
static void entry_what(const char *path, char *what, size_t size) {
  snprintf(what, size, "the executable");
  uint8_t *buf;
  size_t len;
  kiln_status ignore;
  kiln_status_clear(&ignore);
  if (kiln__file_read(path, &buf, &len, &ignore)) return;
  kiln_module *m = NULL;
  if (is_proto_path(path))
    kiln_module_from_proto(buf, len, &m, &ignore);
  else
    kiln_module_parse_text((const char *)buf, len, path, NULL, &m, &ignore);
  kiln_free(buf);
  const kiln_computation *e = m ? kiln_module_entry(m) : NULL;
  if (e) snprintf(what, size, "ENTRY computation %s", e->name);
  kiln_module_destroy(m);
}

/* The server's phases of the compile on stderr: on a terminal one line
 * rewritten in place and erased at the end, elsewhere (with --progress) a
 * plain line per phase. */
typedef struct progress_view {
  bool tty;
  const char *file;
  size_t shown; /* characters of the line on the terminal */
} progress_view;

static void show_phase(void *arg, const kiln_remote_progress *p) {
  progress_view *v = arg;
  char line[256];
  int n = snprintf(line, sizeof line, "%s: %s%s%s%s (%.1f s)", v->file,
                   kiln_remote_phase_name(p->phase), p->detail[0] ? " for " : "", p->detail,
                   p->phase == KILN_REMOTE_PHASE_DONE ? "" : "...", (double)p->elapsed_ns / 1e9);
  if (n < 0) return;
  if (!v->tty) {
    fprintf(stderr, "%s\n", line);
    return;
  }
  if (p->phase == KILN_REMOTE_PHASE_DONE) { /* the summary on stdout says the rest */
    fprintf(stderr, "\r%*s\r", (int)v->shown, "");
    v->shown = 0;
  } else {
    fprintf(stderr, "\r%s\033[K", line);
    v->shown = (size_t)n;
  }
  fflush(stderr);
}

/* --deadline SECONDS into o->deadline_ms. */
static int compile_deadline(const kiln__args *a, kiln_remote_compile_options *o) {
  const char *text = kiln__args_get(a, "deadline");
  if (text == NULL) return KILN_EXIT_OK;
  char *end;
  errno = 0;
  double sec = strtod(text, &end);
  if (errno || *end || end == text || !(sec > 0) || sec > 1e7) {
    fprintf(stderr, "kiln compile: --deadline needs a positive number of seconds, not '%s'\n",
            text);
    return KILN_EXIT_USAGE;
  }
  o->deadline_ms = (int64_t)(sec * 1000 + 0.5);
  if (o->deadline_ms == 0) o->deadline_ms = 1;
  return KILN_EXIT_OK;
}

/* ---- ahead of time: one program, several signatures ------------------------------------ */

/* "f32[8,3];s32[]" into shapes in ar; false with a message on stderr. */
static bool parse_signature(const char *spec, kiln_arena *ar, const kiln_shape ***out,
                            uint32_t *n) {
  uint32_t cap = 1;
  for (const char *p = spec; *p; p++) cap += *p == ';';
  kiln_shape *store = kiln_arena_calloc(ar, cap, sizeof *store);
  const kiln_shape **shapes = kiln_arena_calloc(ar, cap, sizeof *shapes);
  int64_t *dims = kiln_arena_calloc(ar, 64, sizeof *dims);
  if (store == NULL || shapes == NULL || dims == NULL) return false;
  *n = 0;
  for (const char *p = spec; *p;) {
    const char *end = strchr(p, ';'), *lb = strchr(p, '[');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    kiln_dtype t;
    uint32_t rank = 0;
    const char *q = lb ? lb + 1 : NULL;
    bool ok =
        lb && lb < p + len && kiln_dtype_from_name(p, (size_t)(lb - p), &t) && p[len - 1] == ']';
    while (ok && q < p + len - 1) {
      char *e;
      errno = 0;
      long long v = strtoll(q, &e, 10);
      ok = errno == 0 && e != q && v >= 0 && v <= ((long long)1 << 40) && rank < 64 &&
           (*e == ',' || e == p + len - 1);
      dims[rank++] = v;
      q = *e == ',' ? e + 1 : e;
    }
    if (!ok || kiln_shape_make_array(ar, &store[*n], t, dims, rank)) {
      fprintf(stderr, "kiln compile: --shapes '%s': '%.*s' is not an array shape like f32[8,3]\n",
              spec, (int)len, p);
      return false;
    }
    shapes[*n] = &store[*n];
    (*n)++;
    p = end ? end + 1 : p + len;
  }
  *out = shapes;
  return true;
}

/* The module of `path` with its ENTRY parameters given `shapes` and every
 * ENTRY instruction's shape inferred again: a program written for any
 * size (elementwise ops, reductions, dots) takes the new signature; one
 * whose attributes fix sizes fails here, naming the instruction. */
static int specialize(const char *path, const kiln_shape *const *shapes, uint32_t n, char **text,
                      size_t *len) {
  kiln_module *m;
  int rc = kiln__module_load(path, true, &m);
  if (rc) return rc;
  kiln_status st;
  kiln_status_clear(&st);
  kiln_computation *e = kiln_module_entry(m);
  if (e == NULL || kiln_computation_nparams(m, e) != n) {
    fprintf(stderr, "%s: error: --shapes gives %u shapes, the ENTRY takes %u parameters\n", path, n,
            e ? kiln_computation_nparams(m, e) : 0);
    kiln_module_destroy(m);
    return KILN_EXIT_USAGE;
  }
  for (uint32_t i = 0; i < e->ninstrs && rc == 0; i++) {
    kiln_instr *x = m->instrs[e->instrs[i]];
    kiln_shape s;
    if (x->op == KILN_OP_PARAMETER)
      rc = kiln_instr_set_shape(m, x, shapes[x->param_number]);
    else if ((rc = kiln_infer_shape(m, x, m->arena, &s, &st)) == 0)
      rc = kiln_instr_set_shape(m, x, &s);
  }
  m->entry_layout = NULL;
  if (rc == 0) rc = kiln_module_verify(m, NULL, &st);
  if (rc) {
    kiln__report(path, m, &st);
    kiln_module_destroy(m);
    return kiln__exit_code(rc);
  }
  *text = kiln_module_print(m, len);
  kiln_module_destroy(m);
  return *text ? KILN_EXIT_OK : KILN_EXIT_INTERNAL;
}

/* kiln compile FILE --server ADDR --shapes SPEC...: each signature compiled
 * into the server's cache tiers (a vmap without size=N takes its batch
 * from the shapes; otherwise the ENTRY is specialized to them), one line
 * each; the exit status is the first failure's. */
static int compile_signatures(kiln_client *c, const kiln__args *a, kiln_remote_compile_options o,
                              bool need_size) {
  int n, first = KILN_EXIT_OK;
  const char **specs = kiln__args_all(a, "shapes", &n);
  const char *path = a->pos[0];
  for (int i = 0; i < n; i++) {
    kiln_arena *ar = kiln_arena_create();
    const kiln_shape **shapes;
    uint32_t ns;
    int rc = KILN_EXIT_USAGE;
    kiln_remote_executable *e = NULL;
    if (ar && parse_signature(specs[i], ar, &shapes, &ns)) {
      if (need_size) {
        o.arg_shapes = shapes;
        o.narg_shapes = ns;
        rc = compile_file(c, path, &o, &e);
      } else {
        char *text = NULL;
        size_t len = 0;
        rc = specialize(path, shapes, ns, &text, &len);
        kiln_status st;
        kiln_status_clear(&st);
        if (rc == KILN_EXIT_OK && kiln_client_compile_text(c, text, len, &o, &e, &st))
          rc = report_program(path, &st, &o);
        kiln_free(text);
      }
    }
    if (rc == KILN_EXIT_OK)
      printf("%s: executable %s, cache %s\n", specs[i], e->id,
             kiln_remote_source_name(e->cache_source));
    else if (first == KILN_EXIT_OK)
      first = rc;
    kiln_remote_executable_free(e);
    kiln_arena_destroy(ar);
  }
  return first;
}

static int remote_mesh(const kiln__args *a, kiln_remote_compile_options *o, int64_t mesh[2]);

int kiln__remote_compile(const kiln__args *a) {
  kiln_remote_compile_options o;
  bool need_size;
  int64_t mesh[2];
  int rc = remote_compile_options(a, &o);
  if (rc == 0) rc = remote_mesh(a, &o, mesh);
  if (rc == 0) rc = remote_transforms_check(a, &need_size);
  if (rc == 0) rc = compile_deadline(a, &o);
  if (rc) return rc;
  const char *out = kiln__args_get(a, "output");
  o.return_executable = out != NULL;
  progress_view view = {.tty = isatty(STDERR_FILENO) == 1, .file = a->pos[0]};
  if (view.tty || kiln__args_get(a, "progress")) {
    o.progress.fn = show_phase;
    o.progress.arg = &view;
  }
  kiln_client *c;
  if ((rc = connect_to(a, &c))) return rc;
  if (kiln__args_get(a, "shapes")) {
    if (out) {
      fprintf(stderr, "kiln compile: -o writes one executable; --shapes compiles several\n");
      rc = KILN_EXIT_USAGE;
    } else {
      rc = compile_signatures(c, a, o, need_size);
    }
    kiln_client_close(c);
    return rc;
  }
  kiln_remote_executable *e = NULL;
  rc = compile_file(c, a->pos[0], &o, &e);
  if (view.shown) fprintf(stderr, "\r%*s\r", (int)view.shown, ""); /* a failure's line */
  if (rc == KILN_EXIT_OK) {
    printf("executable %s\n", e->id);
    printf("cache %s%s%s\n", kiln_remote_source_name(e->cache_source), e->cache_key[0] ? " " : "",
           e->cache_key);
    print_signature(e);
    printf("devices %d, peak %lld bytes, %.3f ms on the server\n", e->device_count,
           (long long)e->peak_bytes, (double)e->compile_wall_ns / 1e6);
    for (uint32_t i = 0; i < e->nwarnings; i++)
      fprintf(stderr, "%s: warning: %s\n", a->pos[0], e->warnings[i]);
    kiln_status st;
    kiln_status_clear(&st);
    if (out && e->serialized == NULL) {
      fprintf(stderr, "%s: error: the server returned no serialized executable\n", a->pos[0]);
      rc = KILN_EXIT_INVALID;
    } else if (out && kiln__file_write(out, e->serialized, e->serialized_len, &st)) {
      kiln__report(out, NULL, &st);
      rc = kiln__exit_code(st.code);
    }
  }
  kiln_remote_executable_free(e);
  kiln_client_close(c);
  return rc;
}

/* ---- run ---------------------------------------------------------------------------------- */

static int parse_count(const char *s, uint64_t *out) {
  if (s[0] < '0' || s[0] > '9') return -1;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end) return -1;
  *out = v;
  return 0;
}

/* Reads --timeout into milliseconds (0 when absent); an exit code. */
static int timeout_ms(const kiln__args *a, int64_t *ms) {
  *ms = 0;
  const char *t = kiln__args_get(a, "timeout");
  if (t == NULL) return KILN_EXIT_OK;
  char *end;
  errno = 0;
  double s = strtod(t, &end);
  if (errno || *end || end == t || !(s > 0) || s > 1e9) {
    fprintf(stderr, "kiln run: --timeout needs a positive number of seconds, not '%s'\n", t);
    return KILN_EXIT_USAGE;
  }
  *ms = (int64_t)(s * 1000.0 + 0.5);
  if (*ms == 0) *ms = 1;
  return KILN_EXIT_OK;
}

/* One literal per parameter of the executable, from --arg then
 * --random-args, exactly as local runs build them. */
static int build_args(const char *file, const kiln_remote_executable *e, const kiln__args *a,
                      kiln_literal **args) {
  char what[300];
  int ngiven;
  const char **given = kiln__args_all(a, "arg", &ngiven);
  const char *seed_text = kiln__args_get(a, "random-args");
  uint32_t n = e->nparams;
  if ((uint32_t)ngiven > n || ((uint32_t)ngiven < n && seed_text == NULL)) {
    entry_what(file, what, sizeof what);
    fprintf(stderr, "%s: error: %s takes %u parameter%s, %d argument%s given%s\n", file, what, n,
            n == 1 ? "" : "s", ngiven, ngiven == 1 ? "" : "s",
            (uint32_t)ngiven < n ? " (--random-args SEED fills the rest)" : "");
    return KILN_EXIT_INVALID;
  }
  uint64_t state = 0;
  if (seed_text) parse_count(seed_text, &state);
  kiln_status st;
  kiln_status_clear(&st);
  for (uint32_t i = 0; i < n && st.code == 0; i++) {
    if (i < (uint32_t)ngiven)
      kiln__arg_load(given[i], &e->params[i], i, &args[i], &st);
    else
      kiln__arg_random(&e->params[i], &state, &args[i], &st);
  }
  if (st.code) {
    kiln__report(file, NULL, &st);
    return kiln__exit_code(st.code);
  }
  return KILN_EXIT_OK;
}

static int print_outputs(const kiln_remote_result *r, const char *out_dir) {
  kiln_status st;
  kiln_status_clear(&st);
  kiln_sbuf b = KILN_SBUF_INIT;
  uint32_t index = 0;
  if (out_dir && kiln__dir_make(out_dir, &st)) goto out_report;
  for (uint32_t i = 0; i < r->noutputs && st.code == 0; i++) {
    const kiln_literal **leaves;
    uint32_t n;
    if (r->outputs[i].literal == NULL) continue;
    if (kiln__literal_leaves(r->outputs[i].literal, &leaves, &n)) {
      kiln_status_set(&st, KILN_ENOMEM, NULL, "out of memory");
      break;
    }
    for (uint32_t k = 0; k < n && st.code == 0; k++, index++) {
      /* Printed as a local run prints it: the data is row-major whatever
       * layout the executable reported, so the layout says nothing here. */
      ((kiln_literal *)leaves[k])->shape.layout = NULL;
      kiln_sbuf_reset(&b);
      if (!kiln_literal_print_bounded(&b, leaves[k], true))
        fprintf(stderr, "kiln run: output %u holds too many empty arrays to print as text%s\n",
                index, out_dir ? "; its .npy file has it" : "; --out DIR writes it as .npy");
      kiln_sbuf_putc(&b, '\n');
      if (kiln_sbuf_failed(&b)) {
        kiln_status_set(&st, KILN_ENOMEM, NULL, "out of memory printing output %u", index);
        break;
      }
      fwrite(b.data, 1, b.len, stdout);
      if (out_dir && kiln_shape_is_array(&leaves[k]->shape)) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%u.npy", out_dir, index);
        kiln__literal_write_npy(leaves[k], path, &st);
      }
    }
    kiln_free(leaves);
  }
out_report:
  kiln_sbuf_free(&b);
  if (st.code == 0) return KILN_EXIT_OK;
  kiln__report("kiln run", NULL, &st);
  return kiln__exit_code(st.code);
}

/* --replicas R / --partitions P as the Compile's mesh (docs/spmd.md): P
 * alone is device_count P (a global program's partitions, or a per-device
 * program's); R (with P, or 1) names both as mesh_shape [R, P]. Neither:
 * the module's own counts. */
static int remote_mesh(const kiln__args *a, kiln_remote_compile_options *o, int64_t mesh[2]) {
  const char *names[2] = {"replicas", "partitions"};
  uint64_t v[2] = {1, 1};
  for (int i = 0; i < 2; i++) {
    const char *t = kiln__args_get(a, names[i]);
    if (t && (parse_count(t, &v[i]) || v[i] == 0 || v[i] > 4096)) {
      fprintf(stderr, "kiln run: --%s needs an integer from 1 to 4096, not '%s'\n", names[i], t);
      return KILN_EXIT_USAGE;
    }
  }
  if (v[0] * v[1] > 4096) {
    fprintf(stderr, "kiln run: a mesh of %llu x %llu devices is too large (at most 4096)\n",
            (unsigned long long)v[0], (unsigned long long)v[1]);
    return KILN_EXIT_USAGE;
  }
  bool r = kiln__args_get(a, "replicas") != NULL, p = kiln__args_get(a, "partitions") != NULL;
  if (!r && !p) return KILN_EXIT_OK;
  o->device_count = (int32_t)(v[0] * v[1]);
  if (r) {
    mesh[0] = (int64_t)v[0];
    mesh[1] = (int64_t)v[1];
    o->mesh_shape = mesh;
    o->nmesh_shape = 2;
  }
  return KILN_EXIT_OK;
}

/* A per-device program on the server's devices: every device gets the
 * --arg values unless --device-args K gives device K its own; the outputs
 * are printed per device after "device K:" (with --out DIR in
 * DIR/deviceK/), as a local mesh run prints them. */
static int remote_run_devices(kiln_client *c, const char *file, const kiln_remote_executable *e,
                              const kiln__args *a, int64_t deadline,
                              const kiln_remote_compile_options *o) {
  uint32_t n = e->nparams, ndev = (uint32_t)e->device_count;
  size_t cells = (size_t)ndev * (n ? n : 1);
  kiln_literal **base = kiln_calloc(n ? n : 1, sizeof *base);
  kiln_literal **own = kiln_calloc(cells, sizeof *own);
  bool *has_own = kiln_calloc(ndev, sizeof *has_own);
  kiln_remote_arg *rargs = kiln_calloc(cells, sizeof *rargs);
  int rc = KILN_EXIT_OK;
  if (!base || !own || !has_own || !rargs) {
    fprintf(stderr, "kiln run: error: out of memory\n");
    rc = KILN_EXIT_INTERNAL;
    goto out_free;
  }
  rc = kiln__device_args_all(a, file, ndev, e->params, n, own, has_own);
  bool need_base = false, any_own = false;
  for (uint32_t k = 0; k < ndev; k++) {
    need_base = need_base || !has_own[k];
    any_own = any_own || has_own[k];
  }
  if (rc == 0 && need_base) rc = build_args(file, e, a, base);
  if (rc) goto out_free;
  /* Without --device-args the arguments travel once, for every device. */
  uint32_t nargs = any_own ? (uint32_t)cells : n;
  for (uint32_t k = 0; k < (any_own ? ndev : 1); k++)
    for (uint32_t i = 0; i < n; i++)
      rargs[k * n + i].literal = has_own[k] ? own[k * n + i] : base[i];
  kiln_remote_execute_options xo = {.deadline_ms = deadline};
  kiln_remote_result r;
  kiln_status st;
  kiln_status_clear(&st);
  int xrc = kiln_client_execute(c, e->id, rargs, n ? nargs : 0, &xo, &r, &st);
  fputs(kiln_client_last_debug(), stderr);
  if (xrc) {
    rc = report_program(file, &st, o);
    goto out_free;
  }
  const char *out_dir = kiln__args_get(a, "out");
  uint32_t per = ndev ? r.noutputs / ndev : 0;
  for (uint32_t k = 0; k < ndev && rc == 0; k++) {
    char dir[4096];
    if (out_dir) snprintf(dir, sizeof dir, "%s/device%u", out_dir, k);
    printf("device %u:\n", k);
    if (out_dir) {
      kiln_status_clear(&st);
      if (kiln__dir_make(out_dir, &st)) {
        kiln__report("kiln run", NULL, &st);
        rc = kiln__exit_code(st.code);
        break;
      }
    }
    kiln_remote_result part = {.noutputs = per, .outputs = r.outputs + (size_t)k * per};
    rc = print_outputs(&part, out_dir ? dir : NULL);
  }
  kiln_remote_result_free(&r);
out_free:
  for (uint32_t i = 0; base && i < n; i++) kiln_literal_destroy(base[i]);
  for (size_t i = 0; own && i < cells; i++) kiln_literal_destroy(own[i]);
  kiln_free(rargs);
  kiln_free(has_own);
  kiln_free(own);
  kiln_free(base);
  return rc;
}

/* Outputs of R replicas (grouped by replica) after "replica r:" lines,
 * with --out DIR in DIR/replicaR/. */
static int print_replicas(const kiln_remote_result *r, uint32_t R, const char *out_dir) {
  uint32_t per = r->noutputs / R;
  int rc = KILN_EXIT_OK;
  for (uint32_t q = 0; q < R && rc == 0; q++) {
    char dir[4096];
    if (out_dir) {
      snprintf(dir, sizeof dir, "%s/replica%u", out_dir, q);
      kiln_status st;
      kiln_status_clear(&st);
      if (kiln__dir_make(out_dir, &st)) {
        kiln__report("kiln run", NULL, &st);
        return kiln__exit_code(st.code);
      }
    }
    printf("replica %u:\n", q);
    kiln_remote_result part = {.noutputs = per, .outputs = r->outputs + (size_t)q * per};
    rc = print_outputs(&part, out_dir ? dir : NULL);
  }
  return rc;
}

int kiln__remote_run(const kiln__args *a) {
  const char *file = a->pos[0];
  if (kiln__args_get(a, "max-iterations")) {
    fprintf(stderr, "kiln run: --max-iterations applies to local runs; the server has its own "
                    "limits (use --timeout)\n");
    return KILN_EXIT_USAGE;
  }
  if (kiln__args_get(a, "user-kernel")) {
    fprintf(stderr, "kiln run: --user-kernel applies to local runs; register the kernel with the "
                    "server (kiln kernel register)\n");
    return KILN_EXIT_USAGE;
  }
  if (kiln__args_get(a, "disable-pass") || kiln__args_get(a, "dump-dir")) {
    fprintf(stderr, "kiln run: --disable-pass and --dump-dir apply to local runs\n");
    return KILN_EXIT_USAGE;
  }
  uint64_t seed;
  const char *seed_text = kiln__args_get(a, "random-args");
  if (seed_text && parse_count(seed_text, &seed)) {
    fprintf(stderr, "kiln run: --random-args needs a non-negative integer seed, not '%s'\n",
            seed_text);
    return KILN_EXIT_USAGE;
  }
  int64_t deadline;
  kiln_remote_compile_options o;
  bool need_size = false;
  int64_t mesh[2];
  int rc = timeout_ms(a, &deadline);
  if (rc == 0) rc = remote_compile_options(a, &o);
  if (rc == 0) rc = remote_mesh(a, &o, mesh);
  if (rc == 0) rc = remote_transforms_check(a, &need_size);
  if (rc) return rc;
  kiln_arena *shapes = kiln_arena_create();
  if (shapes == NULL) {
    fprintf(stderr, "kiln run: error: out of memory\n");
    return KILN_EXIT_INTERNAL;
  }
  if (need_size && (rc = arg_shapes(file, a, shapes, &o))) {
    kiln_arena_destroy(shapes);
    return rc;
  }
  kiln_client *c;
  if ((rc = connect_to(a, &c))) {
    kiln_arena_destroy(shapes);
    return rc;
  }
  kiln_remote_executable *e = NULL;
  kiln_literal **args = NULL;
  if ((rc = compile_file(c, file, &o, &e))) goto out_close;
  if (e->per_device && e->device_count > 1) {
    rc = remote_run_devices(c, file, e, a, deadline, &o);
    goto out_close;
  }
  if (kiln__args_get(a, "device-args")) {
    fprintf(stderr,
            "kiln run: --device-args needs a per-device program on several devices (%s "
            "is %s)\n",
            file, e->device_count > 1 ? "a global (sharded) program" : "a single-device program");
    rc = KILN_EXIT_USAGE;
    goto out_close;
  }
  args = kiln_calloc(e->nparams ? e->nparams : 1, sizeof *args);
  if (args == NULL) {
    fprintf(stderr, "kiln run: error: out of memory\n");
    rc = KILN_EXIT_INTERNAL;
    goto out_close;
  }
  if ((rc = build_args(file, e, a, args))) goto out_free_args;
  kiln_remote_arg *rargs = kiln_calloc(e->nparams ? e->nparams : 1, sizeof *rargs);
  if (rargs == NULL) {
    fprintf(stderr, "kiln run: error: out of memory\n");
    rc = KILN_EXIT_INTERNAL;
    goto out_free_args;
  }
  for (uint32_t i = 0; i < e->nparams; i++) rargs[i].literal = args[i];
  kiln_remote_execute_options xo = {.deadline_ms = deadline};
  kiln_remote_result r;
  kiln_status st;
  kiln_status_clear(&st);
  int xrc = kiln_client_execute(c, e->id, rargs, e->nparams, &xo, &r, &st);
  /* the server's kiln.debug_print output, as a local run prints it */
  fputs(kiln_client_last_debug(), stderr);
  if (xrc) {
    rc = report_program(file, &st, &o);
  } else if (e->replica_count > 1) {
    /* a global program on R replicas: each replica's result, as a local
     * run prints them */
    rc = print_replicas(&r, (uint32_t)e->replica_count, kiln__args_get(a, "out"));
    kiln_remote_result_free(&r);
  } else {
    rc = print_outputs(&r, kiln__args_get(a, "out"));
    kiln_remote_result_free(&r);
  }
  kiln_free(rargs);
out_free_args:
  for (uint32_t i = 0; i < e->nparams; i++) kiln_literal_destroy(args[i]);
  kiln_free(args);
out_close:
  kiln_remote_executable_free(e);
  kiln_client_close(c);
  kiln_arena_destroy(shapes); /* o.arg_shapes, read until here */
  return rc;
}

/* ---- bench -------------------------------------------------------------------------------- */

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int bench_count(const kiln__args *a, const char *name, long min, long dflt, long *out) {
  const char *t = kiln__args_get(a, name);
  uint64_t v;
  *out = dflt;
  if (t == NULL) return KILN_EXIT_OK;
  if (parse_count(t, &v) || v < (uint64_t)min || v > 1000000) {
    fprintf(stderr, "kiln bench: --%s needs an integer from %ld to 1000000, not '%s'\n", name, min,
            t);
    return KILN_EXIT_USAGE;
  }
  *out = (long)v;
  return KILN_EXIT_OK;
}

static void json_string(const char *s) {
  putchar('"');
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      printf("\\%c", c);
    else if (c < 0x20)
      printf("\\u%04x", c);
    else
      putchar(c);
  }
  putchar('"');
}

typedef struct rbench {
  const kiln_remote_compile_options *o; /* for the positions of errors */
  long iters, warmup;
  double *us, *server_us;
  kiln_remote_arg *args;
} rbench;

/* Puts the arguments on the server once, then times executions by handle:
 * the remote counterpart of a local run on device buffers. */
static int rbench_run(kiln_client *c, const kiln_remote_executable *e, kiln_literal **lits,
                      rbench *b, const char *file) {
  kiln_status st;
  kiln_status_clear(&st);
  kiln_remote_buffer *bufs = kiln_calloc(e->nparams + 1, sizeof *bufs);
  int rc = bufs ? KILN_EXIT_OK : KILN_EXIT_INTERNAL;
  uint32_t nput = 0;
  for (; rc == KILN_EXIT_OK && nput < e->nparams; nput++) {
    if (kiln_client_put_buffer(c, lits[nput], NULL, &bufs[nput], &st)) {
      rc = report(file, &st);
      break;
    }
    b->args[nput].handle = bufs[nput].handle;
  }
  for (long i = 0; rc == KILN_EXIT_OK && i < b->warmup + b->iters; i++) {
    kiln_remote_result r;
    double t0 = now_us();
    if (kiln_client_execute(c, e->id, b->args, e->nparams, NULL, &r, &st)) {
      rc = report_program(file, &st, b->o);
      break;
    }
    if (i >= b->warmup) {
      b->us[i - b->warmup] = now_us() - t0;
      b->server_us[i - b->warmup] = (double)r.run_ns / 1e3;
    }
    kiln_remote_result_free(&r);
  }
  for (uint32_t i = 0; i < nput && bufs; i++) {
    const char *h[1] = {bufs[i].handle};
    kiln_status ignore;
    kiln_status_clear(&ignore);
    if (h[0]) kiln_client_release_buffers(c, h, 1, NULL, NULL, &ignore);
    kiln_remote_buffer_clear(&bufs[i]);
  }
  kiln_free(bufs);
  return rc;
}

static void rbench_print(const kiln__args *a, const kiln_remote_compile_options *o,
                         const kiln_remote_executable *e, double compile_ms, rbench *b) {
  qsort(b->us, (size_t)b->iters, sizeof *b->us, cmp_double);
  qsort(b->server_us, (size_t)b->iters, sizeof *b->server_us, cmp_double);
  long n = b->iters, p90 = (long)((double)(n - 1) * 0.9);
  double median = n % 2 ? b->us[n / 2] : (b->us[n / 2 - 1] + b->us[n / 2]) / 2;
  double smedian =
      n % 2 ? b->server_us[n / 2] : (b->server_us[n / 2 - 1] + b->server_us[n / 2]) / 2;
  printf("{\"file\": ");
  json_string(a->pos[0]);
  printf(", \"backend\": "); /* null: the server's default */
  if (o->backend)
    json_string(o->backend);
  else
    printf("null");
  printf(", \"server\": ");
  json_string(kiln__args_get(a, "server"));
  printf(", \"iters\": %ld, \"warmup\": %ld, \"mode\": \"remote-buffers\"", b->iters, b->warmup);
  printf(", \"compile_ms\": %.3f, \"server_compile_ms\": %.3f, \"cache\": \"%s\"", compile_ms,
         (double)e->compile_wall_ns / 1e6, kiln_remote_source_name(e->cache_source));
  printf(", \"run_us_median\": %.3f, \"run_us_p90\": %.3f, \"run_us_min\": %.3f", median,
         b->us[p90], b->us[0]);
  printf(", \"server_run_us_median\": %.3f, \"peak_bytes\": %lld}\n", smedian,
         (long long)e->peak_bytes);
}

int kiln__remote_bench(const kiln__args *a) {
  const char *file = a->pos[0];
  if (kiln__args_get(a, "user-kernel")) {
    fprintf(stderr, "kiln bench: --user-kernel applies to local runs; register the kernel with "
                    "the server (kiln kernel register)\n");
    return KILN_EXIT_USAGE;
  }
  if (kiln__args_get(a, "disable-pass") || kiln__args_get(a, "dump-dir")) {
    fprintf(stderr, "kiln bench: --disable-pass and --dump-dir apply to local runs\n");
    return KILN_EXIT_USAGE;
  }
  rbench b = {0};
  long seed;
  kiln_remote_compile_options o;
  int rc = bench_count(a, "iters", 1, 20, &b.iters);
  if (rc == 0) rc = bench_count(a, "warmup", 0, 1, &b.warmup);
  if (rc == 0) rc = bench_count(a, "random-args", 0, 0, &seed);
  if (rc == 0) rc = remote_compile_options(a, &o);
  int64_t mesh[2];
  if (rc == 0) rc = remote_mesh(a, &o, mesh);
  bool need_size;
  if (rc == 0) rc = remote_transforms_check(a, &need_size);
  if (rc) return rc;
  kiln_client *c;
  if ((rc = connect_to(a, &c))) return rc;
  kiln_remote_executable *e = NULL;
  kiln_literal **lits = NULL;
  double t0 = now_us();
  if ((rc = compile_file(c, file, &o, &e))) goto out_close;
  double compile_ms = (now_us() - t0) / 1e3;
  lits = kiln_calloc(e->nparams + 1, sizeof *lits);
  b.args = kiln_calloc(e->nparams + 1, sizeof *b.args);
  b.us = kiln_calloc((size_t)b.iters, sizeof *b.us);
  b.server_us = kiln_calloc((size_t)b.iters, sizeof *b.server_us);
  if (lits == NULL || b.args == NULL || b.us == NULL || b.server_us == NULL) {
    fprintf(stderr, "kiln bench: error: out of memory\n");
    rc = KILN_EXIT_INTERNAL;
    goto out_free;
  }
  kiln_status st;
  kiln_status_clear(&st);
  uint64_t state = (uint64_t)seed;
  int ngiven;
  const char **given = kiln__args_all(a, "arg", &ngiven);
  if ((uint32_t)ngiven > e->nparams)
    kiln_status_set(&st, KILN_EINVAL, NULL, "the executable takes %u parameter%s, %d --arg given",
                    e->nparams, e->nparams == 1 ? "" : "s", ngiven);
  for (uint32_t i = 0; i < e->nparams && st.code == 0; i++) {
    if (i < (uint32_t)ngiven)
      kiln__arg_load(given[i], &e->params[i], i, &lits[i], &st);
    else
      kiln__arg_random(&e->params[i], &state, &lits[i], &st);
  }
  if (st.code) {
    kiln__report(file, NULL, &st);
    rc = kiln__exit_code(st.code);
    goto out_free;
  }
  b.o = &o;
  if ((rc = rbench_run(c, e, lits, &b, file)) == KILN_EXIT_OK)
    rbench_print(a, &o, e, compile_ms, &b);
out_free:
  for (uint32_t i = 0; lits && i < e->nparams; i++) kiln_literal_destroy(lits[i]);
  kiln_free(lits);
  kiln_free(b.args);
  kiln_free(b.us);
  kiln_free(b.server_us);
out_close:
  kiln_remote_executable_free(e);
  kiln_client_close(c);
  return rc;
}

/* ---- stats -------------------------------------------------------------------------------- */

int kiln__cmd_stats(const kiln__args *a) {
  if (kiln__args_get(a, "server") == NULL) {
    fprintf(stderr, "kiln stats: --server HOST:PORT is required (stats are the server's)\n");
    return KILN_EXIT_USAGE;
  }
  kiln_client *c;
  int rc = connect_to(a, &c);
  if (rc) return rc;
  kiln_server_stats s;
  kiln_status st;
  kiln_status_clear(&st);
  if (kiln_client_stats(c, &s, &st)) {
    rc = report("kiln stats", &st);
    kiln_client_close(c);
    return rc;
  }
  printf("server %s, up %.1f s\n", s.server_version, (double)s.uptime_ns / 1e9);
  printf("compiles %lld, cache hits %lld, misses %lld\n", (long long)s.compiles,
         (long long)s.cache_hits, (long long)s.cache_misses);
  printf("executions %lld, queued %lld\n", (long long)s.executions, (long long)s.queued_requests);
  printf("buffers %lld live, %lld bytes\n", (long long)s.live_buffers,
         (long long)s.live_buffer_bytes);
  for (uint32_t i = 0; i < s.ndevices; i++) {
    const kiln_server_device *d = &s.devices[i];
    printf("device %d %s (%s): %lld executions, busy %.3f s, memory %lld/%lld bytes\n", d->device,
           d->description, d->backend, (long long)d->executions, (double)d->busy_ns / 1e9,
           (long long)d->memory_in_use_bytes, (long long)d->memory_limit_bytes);
  }
  if (kiln__args_get(a, "counters")) {
    for (uint32_t i = 0; i < s.ncounters; i++) {
      const kiln_server_counter *k = &s.counters[i];
      printf("%s%s%s%s %lld\n", k->name, k->labels[0] ? "{" : "", k->labels,
             k->labels[0] ? "}" : "", (long long)k->value);
    }
  }
  kiln_server_stats_clear(&s);
  kiln_client_close(c);
  return KILN_EXIT_OK;
}

#else /* !KILN_HAVE_CLIENT */

static int no_client(const kiln__args *a) {
  fprintf(stderr,
          "kiln %s: this kiln was built without libkiln (no gRPC core found); "
          "--server is not available\n",
          a->cmd->name);
  return KILN_EXIT_USAGE;
}

int kiln__remote_check(const kiln__args *a) { return no_client(a); }
int kiln__remote_compile(const kiln__args *a) { return no_client(a); }
int kiln__remote_run(const kiln__args *a) { return no_client(a); }
int kiln__remote_bench(const kiln__args *a) { return no_client(a); }
int kiln__cmd_stats(const kiln__args *a) { return no_client(a); }

#endif
