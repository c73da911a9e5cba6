/* User kernels: the signature parser, the registry that compiles and keeps
 * the kernels' objects by source digest, the cache-key text, and the
 * lowering of a call into a kernel step (user_kernel.h has the ABI).
 *
 * A call lowers to a generated kernel of one line that calls the user's
 * function by its digest-derived symbol,
 *
 *   void kiln_kernel_N(void *const *bufs, int64_t begin, int64_t end) {
 *     extern void kiln_user_<hex>(void *const *, int64_t, int64_t); ... }
 *
 * and a KILN_STEP_KERNEL over the signature's range whose arguments are the
 * operands' slots and then the results': the cpu runtime runs it as any
 * other kernel (split across threads), and the link puts the user's object
 * beside the units. The registry is a list under a mutex: entries are
 * never changed or freed before the registry, so a pointer handed out
 * stays valid while a compile uses it.
 */
#include "compiler/codegen/user_kernel.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/sbuf.h"
#include "compiler/codegen/cc.h"
#include "compiler/codegen/lower_internal.h"
#include "compiler/codegen/nvrtc.h"
#include "compiler/codegen/sha256.h"
#include "compiler/codegen/user_kernel_lower.h"

/* ---- signatures ---------------------------------------------------------- */

typedef struct sig_parser {
  const char *s, *p;
  kiln_status *st;
} sig_parser;

static int sig_fail(sig_parser *sp, const char *fmt, const char *what) {
  char where[48];
  snprintf(where, sizeof where, "signature:1:%d", (int)(sp->p - sp->s) + 1);
  return kiln_status_set(sp->st, KILN_EINVAL, where, fmt, what);
}

static void skip_ws(sig_parser *sp) {
  while (*sp->p == ' ' || *sp->p == '\t') sp->p++;
}

static int parse_arg(sig_parser *sp, kiln_user_kernel_arg *a) {
  skip_ws(sp);
  const char *t = sp->p;
  while ((*sp->p >= 'a' && *sp->p <= 'z') || (*sp->p >= '0' && *sp->p <= '9')) sp->p++;
  kiln_dtype dt;
  if (sp->p == t || !kiln_dtype_from_name(t, (size_t)(sp->p - t), &dt) ||
      !kiln_dtype_is_array(dt)) {
    sp->p = t;
    return sig_fail(sp, "expected an element type (f32, s32, ...)%s", "");
  }
  a->dtype = dt;
  a->rank = 0;
  if (*sp->p != '[') return sig_fail(sp, "expected '[' after the element type%s", "");
  sp->p++;
  skip_ws(sp);
  if (*sp->p == ']') {
    sp->p++;
    return 0;
  }
  int64_t elems = 1;
  for (;;) {
    skip_ws(sp);
    if (*sp->p < '0' || *sp->p > '9') return sig_fail(sp, "expected a dimension size%s", "");
    const char *at = sp->p;
    int64_t d = 0;
    while (*sp->p >= '0' && *sp->p <= '9') {
      if (d > (INT64_C(1) << 40)) return sig_fail(sp, "dimension too large%s", "");
      d = d * 10 + (*sp->p++ - '0');
    }
    if (a->rank == KILN_USER_KERNEL_MAX_RANK) {
      sp->p = at;
      return sig_fail(sp, "more than 8 dimensions%s", "");
    }
    a->dims[a->rank++] = d;
    if (d > 0 && elems > (INT64_C(1) << 40) / d)
      return sig_fail(sp, "more than 2^40 elements%s", "");
    elems *= d;
    skip_ws(sp);
    if (*sp->p == ']') {
      sp->p++;
      return 0;
    }
    if (*sp->p != ',') return sig_fail(sp, "expected ',' or ']'%s", "");
    sp->p++;
  }
}

static int parse_list(sig_parser *sp, kiln_user_kernel_arg *args, uint32_t *n, uint32_t room,
                      const char *stop) {
  *n = 0;
  skip_ws(sp);
  if (strncmp(sp->p, stop, strlen(stop)) == 0 || *sp->p == '\0') return 0;
  for (;;) {
    if (*n == room) return sig_fail(sp, "more than %s operands and results in all", "16");
    int rc = parse_arg(sp, &args[*n]);
    if (rc) return rc;
    (*n)++;
    skip_ws(sp);
    if (*sp->p != ',') return 0;
    sp->p++;
  }
}

static int64_t arg_elements(const kiln_user_kernel_arg *a) {
  int64_t e = 1;
  for (uint32_t d = 0; d < a->rank; d++) e *= a->dims[d];
  return e;
}

int kiln_user_kernel_sig_parse(const char *text, kiln_user_kernel_sig *out, kiln_status *st) {
  memset(out, 0, sizeof *out);
  if (text == NULL) text = "";
  sig_parser sp = {text, text, st};
  if (strlen(text) > KILN_USER_KERNEL_SIG_MAX)
    return kiln_status_set(st, KILN_EINVAL, "signature", "longer than %d bytes",
                           KILN_USER_KERNEL_SIG_MAX);
  int rc = parse_list(&sp, out->in, &out->nin, KILN_USER_KERNEL_MAX_ARGS, "->");
  if (rc) return rc;
  skip_ws(&sp);
  if (strncmp(sp.p, "->", 2) != 0)
    return sig_fail(&sp, "expected '->' between the operands and the results%s", "");
  sp.p += 2;
  if ((rc = parse_list(&sp, out->out, &out->nout, KILN_USER_KERNEL_MAX_ARGS - out->nin, ";")))
    return rc;
  if (out->nout == 0) return sig_fail(&sp, "expected at least one result%s", "");
  skip_ws(&sp);
  if (*sp.p == ';') {
    sp.p++;
    skip_ws(&sp);
    if (strncmp(sp.p, "elementwise", 11) == 0) {
      sp.p += 11;
    } else if (strncmp(sp.p, "grid=", 5) == 0) {
      sp.p += 5;
      uint64_t g = 0;
      const char *d = sp.p;
      while (*sp.p >= '0' && *sp.p <= '9' && g <= (UINT64_C(1) << 31))
        g = g * 10 + (uint64_t)(*sp.p++ - '0');
      if (sp.p == d || g == 0 || g > (UINT64_C(1) << 31)) {
        sp.p = d;
        return sig_fail(&sp, "grid= takes a block count from 1 to 2^31%s", "");
      }
      out->grid = g;
    } else {
      return sig_fail(&sp, "expected 'elementwise' or 'grid=N' after ';'%s", "");
    }
    skip_ws(&sp);
  }
  if (*sp.p != '\0') return sig_fail(&sp, "unexpected text after the signature%s", "");
  if (out->grid == 0) {
    int64_t n = arg_elements(&out->out[0]);
    for (uint32_t i = 0; i < out->nin + out->nout; i++) {
      const kiln_user_kernel_arg *a = i < out->nin ? &out->in[i] : &out->out[i - out->nin];
      if (arg_elements(a) != n)
        return kiln_status_set(st, KILN_EINVAL, "signature",
                               "an element-wise kernel needs every operand and result of one "
                               "element count: %s %u has %lld elements, result 0 has %lld "
                               "(block-indexed: add '; grid=N')",
                               i < out->nin ? "operand" : "result", i < out->nin ? i : i - out->nin,
                               (long long)arg_elements(a), (long long)n);
    }
  }
  return 0;
}

uint64_t kiln_user_kernel_sig_range(const kiln_user_kernel_sig *s) {
  return s->grid ? s->grid : (uint64_t)arg_elements(&s->out[0]);
}

/* ---- the registry -------------------------------------------------------- */

typedef struct object {
  uint8_t digest[KILN__SHA256_LEN];
  uint8_t *bytes;
  size_t n;
  struct object *next;
} object;

typedef struct entry {
  kiln_user_kernel k;
  struct entry *next; /* older entries */
} entry;

struct kiln_user_kernels {
  pthread_mutex_t mu;
  entry *entries; /* newest first */
  uint32_t nentries;
  object *objects;
  uint64_t compiles;
};

kiln_user_kernels *kiln_user_kernels_create(void) {
  kiln_user_kernels *r = kiln_calloc(1, sizeof *r);
  if (r && pthread_mutex_init(&r->mu, NULL) != 0) {
    kiln_free(r);
    return NULL;
  }
  return r;
}

void kiln_user_kernels_destroy(kiln_user_kernels *r) {
  if (r == NULL) return;
  for (entry *e = r->entries, *n; e; e = n) {
    n = e->next;
    kiln_free(e);
  }
  for (object *o = r->objects, *n; o; o = n) {
    n = o->next;
    kiln_free(o->bytes);
    kiln_free(o);
  }
  pthread_mutex_destroy(&r->mu);
  kiln_free(r);
}

static object *find_object(kiln_user_kernels *r, const uint8_t *digest) {
  for (object *o = r->objects; o; o = o->next)
    if (memcmp(o->digest, digest, KILN__SHA256_LEN) == 0) return o;
  return NULL;
}

static void hex_of(const uint8_t *d, size_t n, char *out) {
  static const char hx[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = hx[d[i] >> 4];
    out[2 * i + 1] = hx[d[i] & 15];
  }
  out[2 * n] = '\0';
}

/* The kernel of one line that calls symbol, as codegen writes it. */
static void put_caller(kiln_sbuf *b, const char *qual, uint32_t index, const char *symbol,
                       uint64_t range) {
  kiln_sbuf_printf(b, "%svoid kiln_kernel_%u(void *const *bufs, int64_t begin, int64_t end) {\n",
                   qual, index);
  kiln_sbuf_printf(b, "  extern void %s(void *const *, int64_t, int64_t);\n", symbol);
  kiln_sbuf_printf(b, "  if (end > %lldLL) end = %lldLL;\n", (long long)range, (long long)range);
  kiln_sbuf_printf(b, "  if (begin < end) %s(bufs, begin, end);\n", symbol);
  kiln_sbuf_puts(b, "}\n\n");
}

/* Links obj into a shared object through a caller, as an executable will:
 * the symbol must be defined (the link fails naming it otherwise). */
static int check_link(const kiln__cc_options *co, const char *symbol, const uint8_t *obj,
                      size_t nobj, kiln_status *st) {
  kiln_sbuf k = KILN_SBUF_INIT;
  put_caller(&k, "", 0, symbol, 1);
  /* The caller needs only int64_t from a prelude. */
  static const char prelude[] = "#include <stdint.h>\n";
  const uint8_t *objs[1] = {obj};
  size_t lens[1] = {nobj};
  kiln__cc_program p = {.prelude = prelude,
                        .funcs = "",
                        .kernels = kiln_sbuf_str(&k),
                        .nkernels = 1,
                        .objs = objs,
                        .objs_len = lens,
                        .nobjs = 1};
  kiln__cc_options o = *co;
  o.no_cache = true;
  /* A shared object may leave symbols to the loader; this one may not
   * (the driver's own link, with libc, is tried when the lean one fails). */
  o.link_flag = "-Wl,--no-undefined";
  uint8_t *so = NULL;
  size_t nso = 0;
  int rc = kiln_sbuf_failed(&k) ? kiln_status_set(st, KILN_ENOMEM, "user kernel", "out of memory")
                                : kiln__cc_build(&o, &p, &so, &nso, NULL, st);
  kiln_free(so);
  kiln_sbuf_free(&k);
  return rc;
}

/* The compiler's message in the client's terms: its own function name
 * for the renamed symbol, "kernel.c" for the compiler's "<stdin>". */
static void client_terms(kiln_status *st, const char *symbol) {
  const char *from[2] = {symbol, "<stdin>"}, *to[2] = {"kiln_user_kernel", "kernel.c"};
  for (int k = 0; k < 2; k++) {
    size_t nf = strlen(from[k]), nt = strlen(to[k]);
    for (char *p = st->msg; (p = strstr(p, from[k])) != NULL;) {
      size_t tail = strlen(p + nf) + 1;
      if (nt > nf && (size_t)(p - st->msg) + nt + tail > sizeof st->msg) break;
      memmove(p + nt, p + nf, tail);
      memcpy(p, to[k], nt);
      p += nt;
    }
  }
}

/* Compiles src into a new object (the mutex is not held meanwhile). */
static int compile_source(const kiln_user_kernel_options *uo, const char *symbol, const char *src,
                          size_t n, uint8_t **obj, size_t *nobj, kiln_status *st) {
  const char *cc = uo && uo->cc ? uo->cc : getenv("KILN_CC");
  kiln__cc_options co = {.cc = cc, .timeout_s = uo && uo->timeout_s > 0 ? uo->timeout_s : 30};
  char define[64];
  snprintf(define, sizeof define, "-Dkiln_user_kernel=%s", symbol);
  int rc = kiln__cc_object(&co, src, n, define, obj, nobj, st);
  if (rc) {
    /* the compiler's message: the source is the client's to fix */
    snprintf(st->where, sizeof st->where, "kernel source");
    if (rc == KILN_EINTERNAL) st->code = rc = KILN_EINVAL;
    client_terms(st, symbol);
    return rc;
  }
  size_t max = uo && uo->max_object ? uo->max_object : KILN_USER_KERNEL_OBJECT_MAX;
  if (*nobj > max) {
    rc = kiln_status_set(st, KILN_ELIMIT, "kernel source",
                         "the compiled object has %zu bytes, over the limit of %zu", *nobj, max);
  } else if (uo && uo->check_link) {
    rc = check_link(&co, symbol, *obj, *nobj, st);
    if (rc) snprintf(st->where, sizeof st->where, "kernel source");
    if (rc) client_terms(st, symbol);
    if (rc == KILN_EINTERNAL) st->code = rc = KILN_EINVAL;
  }
  if (rc) {
    kiln_free(*obj);
    *obj = NULL;
  }
  return rc;
}

int kiln_user_kernels_register(kiln_user_kernels *r, const char *name, const char *src, size_t n,
                               const char *signature, const kiln_user_kernel_options *o,
                               const kiln_user_kernel **out, bool *cached, kiln_status *st) {
  if (out) *out = NULL;
  if (cached) *cached = false;
  if (!kiln_user_kernel_name_ok(name))
    return kiln_status_set(st, KILN_EINVAL, "name",
                           "a kernel name is 1 to %d characters of letters, digits and '_', "
                           "starting with a letter",
                           KILN_USER_KERNEL_NAME_MAX);
  size_t max = o && o->max_source ? o->max_source : KILN_USER_KERNEL_SOURCE_MAX;
  if (src == NULL || n == 0)
    return kiln_status_set(st, KILN_EINVAL, "kernel source", "the source is empty");
  if (n > max)
    return kiln_status_set(st, KILN_ELIMIT, "kernel source",
                           "the source has %zu bytes, over the limit of %zu", n, max);
  if (memchr(src, '\0', n) != NULL)
    return kiln_status_set(st, KILN_EINVAL, "kernel source", "the source holds a NUL byte");
  entry *e = kiln_calloc(1, sizeof *e);
  if (e == NULL) return kiln_status_set(st, KILN_ENOMEM, "user kernel", "out of memory");
  int rc = kiln_user_kernel_sig_parse(signature, &e->k.sig, st);
  if (rc) goto out_free_entry;
  snprintf(e->k.name, sizeof e->k.name, "%s", name);
  uint8_t d[KILN__SHA256_LEN];
  kiln__sha256_of(src, n, d);
  hex_of(d, KILN__SHA256_LEN, e->k.digest);
  snprintf(e->k.symbol, sizeof e->k.symbol, "kiln_user_%.16s", e->k.digest);

  pthread_mutex_lock(&r->mu);
  bool full = r->nentries >= KILN_USER_KERNELS_MAX;
  object *ob = full ? NULL : find_object(r, d);
  pthread_mutex_unlock(&r->mu);
  if (full) {
    rc = kiln_status_set(st, KILN_ELIMIT, "user kernel",
                         "the server keeps at most %d registrations", KILN_USER_KERNELS_MAX);
    goto out_free_entry;
  }
  if (ob == NULL) {
    uint8_t *bytes = NULL;
    size_t nb = 0;
    if ((rc = compile_source(o, e->k.symbol, src, n, &bytes, &nb, st))) goto out_free_entry;
    pthread_mutex_lock(&r->mu);
    r->compiles++;
    ob = find_object(r, d); /* compiled meanwhile by another registration */
    if (ob == NULL && (ob = kiln_calloc(1, sizeof *ob)) != NULL) {
      memcpy(ob->digest, d, sizeof d);
      ob->bytes = bytes;
      ob->n = nb;
      ob->next = r->objects;
      r->objects = ob;
      bytes = NULL;
    }
    pthread_mutex_unlock(&r->mu);
    kiln_free(bytes);
    if (ob == NULL) {
      rc = kiln_status_set(st, KILN_ENOMEM, "user kernel", "out of memory");
      goto out_free_entry;
    }
  } else if (cached) {
    *cached = true;
  }
  e->k.obj = ob->bytes;
  e->k.nobj = ob->n;
  pthread_mutex_lock(&r->mu);
  e->next = r->entries;
  r->entries = e;
  r->nentries++;
  pthread_mutex_unlock(&r->mu);
  if (out) *out = &e->k;
  return 0;
out_free_entry:
  kiln_free(e);
  return rc;
}

int kiln_user_kernel_cuda_check(const char *src, size_t n, const char *arch, double timeout_s,
                                char *out, size_t size, kiln_status *st) {
  if (size) out[0] = '\0';
  kiln_status vs;
  kiln_status_clear(&vs);
  if (kiln__nvrtc_version(NULL, NULL, &vs) != 0) {
    snprintf(out, size, "skipped: %s", vs.msg);
    return 0;
  }
  kiln__nvrtc_options no = {.arch = arch ? arch : "sm_90", .timeout_s = timeout_s};
  uint8_t *cubin = NULL;
  size_t nc = 0;
  int rc = kiln__nvrtc_compile(&no, src, n, &cubin, &nc, st);
  kiln_free(cubin);
  if (rc == 0) {
    snprintf(out, size, "ok");
    return 0;
  }
  snprintf(st->where, sizeof st->where, "cuda_source");
  if (rc == KILN_EINTERNAL) st->code = rc = KILN_EINVAL;
  return rc;
}

const kiln_user_kernel *kiln_user_kernels_find(const kiln_user_kernels *r, const char *name) {
  if (r == NULL || name == NULL) return NULL;
  kiln_user_kernels *w = (kiln_user_kernels *)r; /* the mutex only */
  const kiln_user_kernel *k = NULL;
  pthread_mutex_lock(&w->mu);
  for (entry *e = w->entries; e && k == NULL; e = e->next)
    if (strcmp(e->k.name, name) == 0) k = &e->k;
  pthread_mutex_unlock(&w->mu);
  return k;
}

uint64_t kiln_user_kernels_compiles(const kiln_user_kernels *r) {
  kiln_user_kernels *w = (kiln_user_kernels *)r;
  pthread_mutex_lock(&w->mu);
  uint64_t n = w->compiles;
  pthread_mutex_unlock(&w->mu);
  return n;
}

static int not_registered(kiln_status *st, const kiln_instr *ins, const char *name, bool allowed) {
  if (!kiln_user_kernel_name_ok(name))
    return kiln_status_set(st, KILN_EINVAL, ins->name,
                           "custom-call %s: \"" KILN_USER_KERNEL_PREFIX
                           "%.80s\" is not a valid user kernel name",
                           ins->name, name);
  if (!allowed)
    return kiln_status_set(st, KILN_EUNIMPL, ins->name,
                           "custom-call %s: user kernel \"%s\": user kernels are off here "
                           "(kilnd --allow-user-kernels, or kiln run --user-kernel)",
                           ins->name, name);
  return kiln_status_set(st, KILN_ENOTFOUND, ins->name,
                         "custom-call %s: user kernel \"%s\" is not registered", ins->name, name);
}

int kiln_user_kernels_key(const kiln_user_kernels *r, const kiln_module *m, char **out,
                          kiln_status *st) {
  *out = NULL;
  kiln_sbuf b = KILN_SBUF_INIT;
  for (uint32_t i = 0; i < m->ninstrs; i++) {
    const kiln_instr *ins = m->instrs[i];
    const char *name;
    if (ins == NULL || !kiln_user_kernel_call(ins, &name)) continue;
    const kiln_user_kernel *k = kiln_user_kernels_find(r, name);
    if (k == NULL || !kiln_user_kernel_name_ok(name)) {
      kiln_sbuf_free(&b);
      return not_registered(st, ins, name, r != NULL);
    }
    kiln_sbuf_printf(&b, "%s=%s;", k->name, k->digest);
  }
  size_t len;
  kiln_sbuf_putn(&b, "", 0);
  if (kiln_sbuf_failed(&b) || (*out = kiln_sbuf_detach(&b, &len)) == NULL) {
    kiln_sbuf_free(&b);
    return kiln_status_set(st, KILN_ENOMEM, "user kernel", "out of memory");
  }
  return 0;
}

/* ---- lowering ------------------------------------------------------------ */

/* (The layout pass makes every buffer of a call row-major: layout.c.) */
static bool arg_matches(const kiln_user_kernel_arg *a, const kiln_shape *s) {
  if (!kiln_shape_is_array(s) || s->dtype != a->dtype || s->rank != a->rank ||
      !kiln_shape_is_row_major(s))
    return false;
  for (uint32_t d = 0; d < a->rank; d++)
    if (s->dims[d] != a->dims[d]) return false;
  return !kiln_shape_is_dynamic(s);
}

static void arg_text(char *buf, size_t size, const kiln_user_kernel_arg *a) {
  int k = snprintf(buf, size, "%s[", kiln_dtype_name(a->dtype));
  for (uint32_t d = 0; d < a->rank && k > 0 && (size_t)k < size; d++)
    k += snprintf(buf + k, size - (size_t)k, "%s%lld", d ? "," : "", (long long)a->dims[d]);
  if (k > 0 && (size_t)k < size) snprintf(buf + k, size - (size_t)k, "]");
}

/* The call's operands and result against the signature. */
static int check_call(kiln__lctx *c, const kiln_instr *ins, const kiln_user_kernel *k) {
  const kiln_user_kernel_sig *g = &k->sig;
  char want[160];
  if (ins->noperands != g->nin)
    return kiln__lower_fail(c, ins, KILN_EINVAL,
                            "user kernel \"%s\" takes %u operands, the call passes %u", k->name,
                            g->nin, ins->noperands);
  for (uint32_t i = 0; i < g->nin; i++) {
    const kiln_shape *s = &c->m->instrs[ins->operands[i]]->shape;
    if (!arg_matches(&g->in[i], s)) {
      arg_text(want, sizeof want, &g->in[i]);
      return kiln__lower_fail(c, ins, KILN_EINVAL,
                              "user kernel \"%s\": operand %u must be %s (row-major) as registered",
                              k->name, i, want);
    }
  }
  bool tuple = kiln_shape_is_tuple(&ins->shape);
  uint32_t nres = tuple ? ins->shape.rank : 1;
  if (nres != g->nout)
    return kiln__lower_fail(c, ins, KILN_EINVAL,
                            "user kernel \"%s\" has %u results, the call declares %u", k->name,
                            g->nout, nres);
  for (uint32_t i = 0; i < nres; i++) {
    const kiln_shape *s = tuple ? &ins->shape.tuple[i] : &ins->shape;
    if (!arg_matches(&g->out[i], s)) {
      arg_text(want, sizeof want, &g->out[i]);
      return kiln__lower_fail(c, ins, KILN_EINVAL,
                              "user kernel \"%s\": result %u must be %s (row-major) as registered",
                              k->name, i, want);
    }
  }
  return 0;
}

int kiln__lower_user_kernel(kiln__lctx *c, uint32_t prog, const kiln_instr *ins) {
  const char *name = NULL;
  kiln_user_kernel_call(ins, &name);
  kiln__codegen *g = c->g;
  const kiln_user_kernel *k = kiln_user_kernels_find(g->user, name);
  if (k == NULL || !kiln_user_kernel_name_ok(name))
    return not_registered(c->st, ins, name, g->user != NULL);
  if (g->mod.target->code != KILN__CODE_SO)
    return kiln__lower_fail(c, ins, KILN_EUNIMPL,
                            "user kernel \"%s\": the %s backend does not run user kernels (C "
                            "user kernels run on cpu targets)",
                            k->name, g->mod.target->name);
  int rc = check_call(c, ins, k);
  if (rc) return rc;
  uint32_t args[2 * KILN_USER_KERNEL_MAX_ARGS], na = 0;
  for (uint32_t i = 0; i < ins->noperands; i++) {
    uint32_t n;
    const uint32_t *l = kiln_buffer_leaves(c->ba, ins->operands[i], &n);
    if (n != 1) return kiln__lower_fail(c, ins, KILN_EINTERNAL, "operand %u has %u buffers", i, n);
    args[na++] = l[0];
  }
  uint32_t n;
  const uint32_t *l = kiln_buffer_leaves(c->ba, ins->id, &n);
  if (n != k->sig.nout)
    return kiln__lower_fail(c, ins, KILN_EINTERNAL, "the result has %u buffers", n);
  for (uint32_t i = 0; i < n; i++) args[na++] = l[i];
  /* the object once per executable, whatever calls it */
  bool seen = false;
  for (uint32_t u = 0; u < g->nused && !seen; u++) seen = g->used[u]->obj == k->obj;
  if (!seen) {
    if (kiln_grow((void **)&g->used, &g->usedcap, g->nused + 1, sizeof *g->used))
      return kiln_status_set(c->st, KILN_ENOMEM, "codegen", "out of memory");
    g->used[g->nused++] = k;
  }
  uint64_t range = kiln_user_kernel_sig_range(&k->sig);
  kiln_step s = {.kind = KILN_STEP_KERNEL, .kernel = g->nkernels, .range = range, .nargs = na};
  put_caller(&g->kernels, g->mod.target->kernel_qual, g->nkernels, k->symbol, range);
  g->nkernels++;
  if ((s.args = kiln_arena_memdup(c->e->arena, args, na * sizeof *args)) == NULL)
    return kiln_status_set(c->st, KILN_ENOMEM, "codegen", "out of memory");
  return kiln__lower_step(c, prog, &s);
}
