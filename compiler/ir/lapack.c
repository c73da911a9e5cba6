/* LAPACK custom calls and the HLO linear-algebra ops as kiln_lapack values
 * (see lapack.h): the target table, the backend_config reader and the shape
 * checks.
 *
 * A target is "lapack_" + a type letter (s, d, c, z) + a routine + "_ffi";
 * the routine names the kind (orgqr/ungqr and syevd/heevd are the real and
 * complex spellings of one kind). Nothing of the target string is kept: the
 * description holds enums and sizes only.
 *
 * backend_config is the dictionary JAX writes, `{uplo = 76 : ui8, ...}`:
 * each value is the code of one LAPACK character. Keys the kind does not
 * take, values outside the characters LAPACK accepts and missing keys are
 * refused, so a backend never passes LAPACK a flag it would reject.
 */
#include "compiler/ir/lapack.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const kind_names[KILN_LAPACK_KIND_COUNT] = {
    "potrf", "trsm", "getrf", "geqrf", "orgqr", "syevd", "gesdd", "cholesky", "triangular-solve"};

const char *kiln_lapack_kind_name(uint32_t kind) {
  return kind < KILN_LAPACK_KIND_COUNT ? kind_names[kind] : "?";
}

/* Routine spellings: real, complex. */
static const struct {
  const char *real, *cplx;
  kiln_lapack_kind kind;
} routines[] = {
    {"potrf", "potrf", KILN_LAPACK_POTRF}, {"trsm", "trsm", KILN_LAPACK_TRSM},
    {"getrf", "getrf", KILN_LAPACK_GETRF}, {"geqrf", "geqrf", KILN_LAPACK_GEQRF},
    {"orgqr", "ungqr", KILN_LAPACK_ORGQR}, {"syevd", "heevd", KILN_LAPACK_SYEVD},
    {"gesdd", "gesdd", KILN_LAPACK_GESDD},
};

/* Parses target into kind and dtype; false when it is not in the table. */
static bool parse_target(const char *t, uint32_t *kind, uint32_t *dtype) {
  if (t == NULL || strncmp(t, "lapack_", 7) != 0) return false;
  char letter = t[7];
  kiln_dtype dt = letter == 's'   ? KILN_F32
                  : letter == 'd' ? KILN_F64
                  : letter == 'c' ? KILN_C64
                  : letter == 'z' ? KILN_C128
                                  : KILN_INVALID;
  if (dt == KILN_INVALID) return false;
  bool cplx = letter == 'c' || letter == 'z';
  const char *r = t + 8;
  for (size_t i = 0; i < sizeof routines / sizeof *routines; i++) {
    const char *name = cplx ? routines[i].cplx : routines[i].real;
    size_t n = strlen(name);
    if (strncmp(r, name, n) == 0 && strcmp(r + n, "_ffi") == 0) {
      *kind = routines[i].kind;
      *dtype = dt;
      return true;
    }
  }
  return false;
}

bool kiln_lapack_is_target(const char *target) {
  uint32_t k, d;
  return parse_target(target, &k, &d);
}

bool kiln_lapack_is(const kiln_instr *ins) {
  if (ins->op == KILN_OP_CHOLESKY || ins->op == KILN_OP_TRIANGULAR_SOLVE) return true;
  return ins->op == KILN_OP_CUSTOM_CALL &&
         kiln_lapack_is_target(kiln_instr_attr_str(ins, KILN_ATTR_CUSTOM_CALL_TARGET));
}

static int failf(char *why, size_t nwhy, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int failf(char *why, size_t nwhy, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (nwhy) vsnprintf(why, nwhy, fmt, ap);
  va_end(ap);
  return KILN_EINVAL;
}

/* ---- backend_config ------------------------------------------------------ */

/* The keys a kind takes and the characters each accepts. */
typedef struct flag_spec {
  const char *key;
  const char *allowed;
  size_t field; /* offsetof into kiln_lapack */
} flag_spec;

#define FIELD(f) offsetof(kiln_lapack, f)
static const flag_spec potrf_flags[] = {{"uplo", "LU", FIELD(uplo)}, {NULL, NULL, 0}};
static const flag_spec trsm_flags[] = {{"side", "LR", FIELD(side)},
                                       {"uplo", "LU", FIELD(uplo)},
                                       {"trans_x", "NTC", FIELD(trans)},
                                       {"diag", "NU", FIELD(diag)},
                                       {NULL, NULL, 0}};
static const flag_spec syevd_flags[] = {
    {"mode", "VN", FIELD(mode)}, {"uplo", "LU", FIELD(uplo)}, {NULL, NULL, 0}};
/* gesdd's 'O' (overwrite a with u) is not taken: JAX does not write it. */
static const flag_spec gesdd_flags[] = {{"mode", "ASN", FIELD(mode)}, {NULL, NULL, 0}};
static const flag_spec no_flags[] = {{NULL, NULL, 0}};

static const flag_spec *flags_of(uint32_t kind) {
  switch (kind) {
  case KILN_LAPACK_POTRF: return potrf_flags;
  case KILN_LAPACK_TRSM: return trsm_flags;
  case KILN_LAPACK_SYEVD: return syevd_flags;
  case KILN_LAPACK_GESDD: return gesdd_flags;
  default: return no_flags;
  }
}

static const char *skip(const char *p) {
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
  return p;
}

/* Reads `{key = N : ui8, ...}` (braces optional, "" and NULL are empty). */
static int read_config(const char *cfg, const char *tname, kiln_lapack *l, char *why, size_t nwhy) {
  const flag_spec *spec = flags_of(l->kind);
  const char *p = skip(cfg ? cfg : "");
  /* The string form backend_config="{...}" holds the same dictionary. */
  char unquoted[512];
  size_t plen = strlen(p);
  if (plen >= 2 && p[0] == '"' && p[plen - 1] == '"') {
    if (plen - 2 >= sizeof unquoted)
      return failf(why, nwhy, "%s: backend_config is longer than %zu characters", tname,
                   sizeof unquoted - 1);
    memcpy(unquoted, p + 1, plen - 2);
    unquoted[plen - 2] = 0;
    cfg = unquoted;
    p = skip(unquoted);
  }
  bool brace = *p == '{';
  if (brace) p = skip(p + 1);
  while (*p && *p != '}') {
    char key[32];
    size_t n = 0;
    while (isalnum((unsigned char)*p) || *p == '_') {
      if (n + 1 >= sizeof key)
        return failf(why, nwhy, "%s: backend_config has a key longer than %zu characters", tname,
                     sizeof key - 2);
      key[n++] = *p++;
    }
    key[n] = 0;
    if (n == 0)
      return failf(why, nwhy,
                   "%s: backend_config is not a dictionary {key = N : ui8, ...} (at "
                   "offset %td)",
                   tname, p - cfg);
    p = skip(p);
    if (*p != '=') return failf(why, nwhy, "%s: backend_config: %s has no '= value'", tname, key);
    p = skip(p + 1);
    long v = 0;
    int digits = 0;
    while (isdigit((unsigned char)*p) && digits < 6) v = v * 10 + (*p++ - '0'), digits++;
    if (digits == 0 || isdigit((unsigned char)*p))
      return failf(why, nwhy, "%s: backend_config: %s is not a small integer", tname, key);
    p = skip(p);
    if (*p == ':') {
      p = skip(p + 1);
      if (strncmp(p, "ui8", 3) != 0)
        return failf(why, nwhy, "%s: backend_config: %s is not of type ui8", tname, key);
      p = skip(p + 3);
    }
    const flag_spec *f = spec;
    while (f->key && strcmp(f->key, key) != 0) f++;
    if (f->key == NULL)
      return failf(why, nwhy, "%s: backend_config has key %s, which %s does not take", tname, key,
                   kind_names[l->kind]);
    uint8_t *dst = (uint8_t *)l + f->field;
    if (*dst) return failf(why, nwhy, "%s: backend_config gives %s twice", tname, key);
    if (v <= 0 || v > 127 || strchr(f->allowed, (int)v) == NULL) {
      char list[64] = "";
      for (const char *a = f->allowed; *a; a++) {
        size_t len = strlen(list);
        snprintf(list + len, sizeof list - len, "%s%d ('%c')", a == f->allowed ? "" : " or ", *a,
                 *a);
      }
      return failf(why, nwhy, "%s: %s is %ld, expected %s", tname, key, v, list);
    }
    *dst = (uint8_t)v;
    if (*p == ',')
      p = skip(p + 1);
    else if (*p && *p != '}')
      return failf(why, nwhy, "%s: backend_config: expected ',' or '}' after %s", tname, key);
  }
  if (brace && *p != '}') return failf(why, nwhy, "%s: backend_config has no closing '}'", tname);
  if (!brace && *p == '}') return failf(why, nwhy, "%s: backend_config has a stray '}'", tname);
  if (*p == '}' && *skip(p + 1))
    return failf(why, nwhy, "%s: backend_config has text after its closing '}'", tname);
  for (const flag_spec *f = spec; f->key; f++)
    if (*((uint8_t *)l + f->field) == 0)
      return failf(why, nwhy, "%s: backend_config has no %s (one of \"%s\" as a ui8)", tname,
                   f->key, f->allowed);
  return 0;
}

/* ---- argument shapes ------------------------------------------------------ */

static uint32_t real_of(uint32_t dt) {
  return dt == KILN_C64 ? KILN_F32 : dt == KILN_C128 ? KILN_F64 : dt;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* The minor dims of argument i (0, 1 or 2 of them) and its type. */
static bool minor_dims(const kiln_lapack *l, uint32_t i, uint32_t *dtype, uint32_t *r, int64_t *d) {
  uint32_t dt = l->dtype, s32 = KILN_S32;
  int64_t m = l->m, n = l->n, k = l->k, mn = min64(m, n);
#define MAT(a, b, t) (*dtype = (t), d[0] = (a), d[1] = (b), *r = 2, true)
#define VEC(a, t) (*dtype = (t), d[0] = (a), *r = 1, true)
#define SCALAR(t) (*dtype = (t), *r = 0, true)
  switch (l->kind) {
  case KILN_LAPACK_POTRF: return i < 2 ? MAT(n, n, dt) : i == 2 ? SCALAR(s32) : false;
  case KILN_LAPACK_CHOLESKY: return i < 2 ? MAT(n, n, dt) : false;
  case KILN_LAPACK_TRSM:
  case KILN_LAPACK_TRIANGULAR_SOLVE: return i == 0 ? MAT(k, k, dt) : i < 3 ? MAT(m, n, dt) : false;
  case KILN_LAPACK_GETRF:
    return i < 2 ? MAT(m, n, dt) : i == 2 ? VEC(mn, s32) : i == 3 ? SCALAR(s32) : false;
  case KILN_LAPACK_GEQRF: return i < 2 ? MAT(m, n, dt) : i == 2 ? VEC(mn, dt) : false;
  case KILN_LAPACK_ORGQR: return i == 0 || i == 2 ? MAT(m, n, dt) : i == 1 ? VEC(k, dt) : false;
  case KILN_LAPACK_SYEVD:
    return i < 2 ? MAT(n, n, dt) : i == 2 ? VEC(n, real_of(dt)) : i == 3 ? SCALAR(s32) : false;
  case KILN_LAPACK_GESDD: {
    bool reduced = l->mode == 'S';
    switch (i) {
    case 0:
    case 1: return MAT(m, n, dt);
    case 2: return VEC(mn, real_of(dt));
    case 3: return MAT(m, reduced ? mn : m, dt);
    case 4: return MAT(reduced ? mn : n, n, dt);
    case 5: return SCALAR(s32);
    default: return false;
    }
  }
  default: return false;
  }
#undef MAT
#undef VEC
#undef SCALAR
}

bool kiln_lapack_arg_dims(const kiln_lapack *l, uint32_t i, uint32_t *dtype, uint32_t *rank,
                          int64_t *dims) {
  if (i >= l->nargs || l->nbatch > KILN_LAPACK_MAX_BATCH) return false;
  uint32_t r;
  if (!minor_dims(l, i, dtype, &r, dims + l->nbatch)) return false;
  for (uint32_t b = 0; b < l->nbatch; b++) dims[b] = l->batch[b];
  *rank = l->nbatch + r;
  return true;
}

static uint32_t nargs_of(uint32_t kind) {
  static const uint8_t n[KILN_LAPACK_KIND_COUNT] = {3, 3, 4, 3, 3, 4, 6, 2, 3};
  return kind < KILN_LAPACK_KIND_COUNT ? n[kind] : 0;
}

uint32_t kiln_lapack_noperands(uint32_t kind) {
  return kind == KILN_LAPACK_TRSM || kind == KILN_LAPACK_TRIANGULAR_SOLVE ||
                 kind == KILN_LAPACK_ORGQR
             ? 2
             : 1;
}

static bool is_char(uint8_t c, const char *allowed) { return c && strchr(allowed, c) != NULL; }

bool kiln_lapack_check(const kiln_lapack *l, char *why, size_t nwhy) {
  if (l->kind >= KILN_LAPACK_KIND_COUNT) return failf(why, nwhy, "unknown kind %u", l->kind), false;
  if (l->dtype != KILN_F32 && l->dtype != KILN_F64 && l->dtype != KILN_C64 && l->dtype != KILN_C128)
    return failf(why, nwhy, "element type %u is not f32, f64, c64 or c128", l->dtype), false;
  if (l->nargs != nargs_of(l->kind))
    return failf(why, nwhy, "%s takes %u arguments, %u given", kind_names[l->kind],
                 nargs_of(l->kind), l->nargs),
           false;
  if (l->nbatch > KILN_LAPACK_MAX_BATCH)
    return failf(why, nwhy, "%u batch dims (at most %d)", l->nbatch, KILN_LAPACK_MAX_BATCH), false;
  const int64_t lim = (int64_t)1 << 31;
  for (uint32_t b = 0; b < l->nbatch; b++)
    if (l->batch[b] < 0 || l->batch[b] >= lim)
      return failf(why, nwhy, "batch dim %u is %lld", b, (long long)l->batch[b]), false;
  if (l->m < 0 || l->m >= lim || l->n < 0 || l->n >= lim || l->k < 0 || l->k >= lim)
    return failf(why, nwhy, "matrix sizes %lld, %lld, %lld out of range", (long long)l->m,
                 (long long)l->n, (long long)l->k),
           false;
  bool ok = true;
  switch (l->kind) {
  case KILN_LAPACK_POTRF:
  case KILN_LAPACK_CHOLESKY: ok = is_char(l->uplo, "LU") && l->m == l->n; break;
  case KILN_LAPACK_TRSM:
  case KILN_LAPACK_TRIANGULAR_SOLVE:
    ok = is_char(l->side, "LR") && is_char(l->uplo, "LU") && is_char(l->trans, "NTC") &&
         is_char(l->diag, "NU") && l->k == (l->side == 'L' ? l->m : l->n);
    break;
  case KILN_LAPACK_ORGQR: ok = l->m >= l->n && l->n >= l->k; break;
  case KILN_LAPACK_SYEVD:
    ok = is_char(l->uplo, "LU") && is_char(l->mode, "VN") && l->m == l->n;
    break;
  case KILN_LAPACK_GESDD: ok = is_char(l->mode, "ASN"); break;
  default: break;
  }
  if (!ok)
    return failf(why, nwhy, "%s: flags or sizes are inconsistent", kind_names[l->kind]), false;
  return true;
}

/* Writes "f32[2,3,3]" for an expected argument. */
static void expect_text(char *buf, size_t n, uint32_t dt, uint32_t rank, const int64_t *d) {
  int w = snprintf(buf, n, "%s[", kiln_dtype_name((kiln_dtype)dt));
  for (uint32_t i = 0; i < rank && w > 0 && (size_t)w < n; i++)
    w += snprintf(buf + w, n - (size_t)w, "%s%lld", i ? "," : "", (long long)d[i]);
  if (w > 0 && (size_t)w < n) snprintf(buf + w, n - (size_t)w, "]");
}

static int check_arg(const kiln_lapack *l, uint32_t i, const kiln_shape *s, const char *tname,
                     const char *role, char *why, size_t nwhy) {
  uint32_t dt, r;
  int64_t d[KILN_LAPACK_MAX_BATCH + 2];
  kiln_lapack_arg_dims(l, i, &dt, &r, d);
  bool ok =
      kiln_shape_is_array(s) && s->dtype == (kiln_dtype)dt && s->rank == r && s->dynamic == NULL;
  for (uint32_t j = 0; ok && j < r; j++) ok = s->dims[j] == d[j];
  if (ok) return 0;
  char want[96];
  expect_text(want, sizeof want, dt, r, d);
  return failf(why, nwhy, "%s: %s must be %s (static)", tname, role, want);
}

/* Sizes and batch from operand 0 (and operand 1 for the solves). */
static int sizes_from_operands(const kiln_module *mod, const kiln_instr *ins, kiln_lapack *l,
                               const char *tname, char *why, size_t nwhy) {
  uint32_t want_ops = kiln_lapack_noperands(l->kind);
  if (ins->noperands != want_ops)
    return failf(why, nwhy, "%s takes %u operand%s, %u given", tname, want_ops,
                 want_ops > 1 ? "s" : "", ins->noperands);
  const kiln_shape *a = &mod->instrs[ins->operands[0]]->shape;
  const kiln_shape *main =
      want_ops == 2 && l->kind != KILN_LAPACK_ORGQR ? &mod->instrs[ins->operands[1]]->shape : a;
  if (!kiln_shape_is_array(main) || main->rank < 2)
    return failf(why, nwhy, "%s: operand %u must be a (batch of) matrices, has rank %u", tname,
                 main == a ? 0u : 1u, kiln_shape_is_array(main) ? main->rank : 0u);
  if (main->rank - 2 > KILN_LAPACK_MAX_BATCH)
    return failf(why, nwhy, "%s: %u batch dimensions (at most %d)", tname, main->rank - 2,
                 KILN_LAPACK_MAX_BATCH);
  l->nbatch = main->rank - 2;
  for (uint32_t b = 0; b < l->nbatch; b++) l->batch[b] = main->dims[b];
  l->m = main->dims[l->nbatch];
  l->n = main->dims[l->nbatch + 1];
  if (l->kind == KILN_LAPACK_TRSM || l->kind == KILN_LAPACK_TRIANGULAR_SOLVE)
    l->k = l->side == 'L' ? l->m : l->n;
  if (l->kind == KILN_LAPACK_ORGQR) {
    const kiln_shape *tau = &mod->instrs[ins->operands[1]]->shape;
    if (!kiln_shape_is_array(tau) || tau->rank != l->nbatch + 1)
      return failf(why, nwhy, "%s: operand 1 (tau) must be a vector per matrix", tname);
    l->k = tau->dims[l->nbatch];
    if (!(l->m >= l->n && l->n >= l->k))
      return failf(why, nwhy,
                   "%s: needs rows >= columns >= reflectors, has %lld x %lld and %lld reflectors",
                   tname, (long long)l->m, (long long)l->n, (long long)l->k);
  }
  if ((l->kind == KILN_LAPACK_POTRF || l->kind == KILN_LAPACK_SYEVD ||
       l->kind == KILN_LAPACK_CHOLESKY) &&
      l->m != l->n)
    return failf(why, nwhy, "%s: operand 0 must be square, is %lld x %lld", tname, (long long)l->m,
                 (long long)l->n);
  const int64_t lim = (int64_t)1 << 31;
  if (l->m >= lim || l->n >= lim)
    return failf(why, nwhy, "%s: matrices of %lld x %lld are too large", tname, (long long)l->m,
                 (long long)l->n);
  return 0;
}

static int hlo_flags(const kiln_instr *ins, kiln_lapack *l, char *why, size_t nwhy) {
  l->uplo = kiln_instr_attr_int(ins, KILN_ATTR_LOWER, 0) ? 'L' : 'U';
  if (ins->op == KILN_OP_CHOLESKY) return 0;
  l->side = kiln_instr_attr_int(ins, KILN_ATTR_LEFT_SIDE, 0) ? 'L' : 'R';
  l->diag = kiln_instr_attr_int(ins, KILN_ATTR_UNIT_DIAGONAL, 0) ? 'U' : 'N';
  const char *t = kiln_instr_attr_str(ins, KILN_ATTR_TRANSPOSE_A);
  if (t == NULL || strcmp(t, "NO_TRANSPOSE") == 0)
    l->trans = 'N';
  else if (strcmp(t, "TRANSPOSE") == 0)
    l->trans = 'T';
  else if (strcmp(t, "ADJOINT") == 0)
    l->trans = 'C';
  else
    return failf(why, nwhy,
                 "triangular-solve: transpose_a is not one of NO_TRANSPOSE, "
                 "TRANSPOSE, ADJOINT");
  return 0;
}

int kiln_lapack_describe(const kiln_module *mod, const kiln_instr *ins, kiln_lapack *out, char *why,
                         size_t nwhy) {
  kiln_lapack l;
  memset(&l, 0, sizeof l);
  char tname[48];
  int rc;
  if (ins->op == KILN_OP_CHOLESKY || ins->op == KILN_OP_TRIANGULAR_SOLVE) {
    l.kind = ins->op == KILN_OP_CHOLESKY ? KILN_LAPACK_CHOLESKY : KILN_LAPACK_TRIANGULAR_SOLVE;
    snprintf(tname, sizeof tname, "%s", kind_names[l.kind]);
    if (ins->noperands == 0) return failf(why, nwhy, "%s has no operands", tname);
    const kiln_shape *a = &mod->instrs[ins->operands[0]]->shape;
    l.dtype = kiln_shape_is_array(a) ? a->dtype : KILN_INVALID;
    if ((rc = hlo_flags(ins, &l, why, nwhy))) return rc;
  } else {
    const char *t = kiln_instr_attr_str(ins, KILN_ATTR_CUSTOM_CALL_TARGET);
    if (ins->op != KILN_OP_CUSTOM_CALL || !parse_target(t, &l.kind, &l.dtype))
      return failf(why, nwhy, "not a LAPACK custom call");
    snprintf(tname, sizeof tname, "%s", t); /* from the table's alphabet, bounded */
    if ((rc =
             read_config(kiln_instr_attr_str(ins, KILN_ATTR_BACKEND_CONFIG), tname, &l, why, nwhy)))
      return rc;
  }
  l.nargs = nargs_of(l.kind);
  if ((rc = sizes_from_operands(mod, ins, &l, tname, why, nwhy))) return rc;
  uint32_t nops = ins->noperands;
  for (uint32_t i = 0; i < nops; i++) {
    char role[24];
    snprintf(role, sizeof role, "operand %u", i);
    if ((rc = check_arg(&l, i, &mod->instrs[ins->operands[i]]->shape, tname, role, why, nwhy)))
      return rc;
  }
  uint32_t nres = l.nargs - nops;
  const kiln_shape *rs = &ins->shape;
  bool tuple = l.kind != KILN_LAPACK_TRSM && l.kind != KILN_LAPACK_ORGQR &&
               l.kind != KILN_LAPACK_CHOLESKY && l.kind != KILN_LAPACK_TRIANGULAR_SOLVE;
  if (tuple) {
    if (rs->dtype != KILN_TUPLE || rs->rank != nres)
      return failf(why, nwhy, "%s: the result must be a tuple of %u arrays", tname, nres);
    for (uint32_t j = 0; j < nres; j++) {
      char role[24];
      snprintf(role, sizeof role, "result %u", j);
      if ((rc = check_arg(&l, nops + j, &rs->tuple[j], tname, role, why, nwhy))) return rc;
    }
  } else if ((rc = check_arg(&l, nops, rs, tname, "the result", why, nwhy))) {
    return rc;
  }
  if (!kiln_lapack_check(&l, why, nwhy)) return KILN_EINVAL;
  *out = l;
  return 0;
}
