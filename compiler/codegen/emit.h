/* The kernel emitter: source for "the value of instruction X at element
 * index I", shared by every code target (target_iface.h): the C target
 * wraps it in loops over an index range, a CUDA target in grid-stride
 * loops.
 *
 * An index is a vector of C expressions, one per logical dim (variables or
 * integer literals the emitter made up), plus optionally the name of the
 * physical linear offset it denotes in buffers of one layout, so that
 * elementwise chains over equal layouts read b[i] directly and vectorize.
 * A value is a list of C variables (one per leaf; tuples have several),
 * memoized per (instruction, index) within the scope that computed it.
 * Values that come from outside the kernel (fusion parameters, operands of
 * a lone instruction, constants) are inputs: a buffer argument with its
 * physical shape, or a C variable (the parameters of a scalar function).
 *
 * Arithmetic follows XLA and the reference interpreter: f16/bf16 are
 * held in f32, and every op's f32 result is rounded to nearest even back to
 * the narrow type (no excess precision is carried from one op to the next:
 * for + - * / sqrt that is the correctly rounded result, f32 having more
 * than twice the bits plus two; exp, log, log1p, expm1, tanh, logistic,
 * erf, sin, cos, tan and rsqrt come within 1 unit of the narrow type of the
 * interpreter's, tests/support/tolerance.h; the rest are computed in double
 * and rounded once, bit-equal to the interpreter); f32 exp,
 * log, log1p, expm1, tanh, logistic and erf are computed in f32 by the
 * prelude's vectorizable helpers, within the ULP bounds listed below (as
 * XLA's CPU backend does; the other f32 transcendentals are computed in
 * double and rounded once, like the interpreter); integers wrap,
 * and division, remainder, shifts, conversions, min/max and comparisons use
 * XLA's edge semantics (the prelude's helpers: the contract below).
 *
 * Identifiers in the generated code are the emitter's own (v12, x3, b0,
 * kf2); no name or string from the module ever reaches the source.
 */
#ifndef KILN_COMPILER_CODEGEN_EMIT_H
#define KILN_COMPILER_CODEGEN_EMIT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/sbuf.h"
#include "compiler/codegen/target_iface.h"
#include "compiler/ir/ir.h"

#define KILN__EMIT_MAXR 32 /* largest rank code generation handles */
#define KILN__IX_LEN 48    /* longest index component expression */
#define KILN__NO_INPUT UINT32_MAX

/* Module-wide state: helper functions written so far (reducers,
 * comparators, map functions), shared by every kernel of the module. */
typedef struct kiln__emit_mod {
  const kiln_module *m;
  const kiln__cg_target *target; /* the dialect everything is written in */
  kiln_sbuf funcs;               /* file-scope helper functions */
  int32_t *comp_fn;              /* per computation: its helper function's number, or -1 */
  uint8_t *fn_tuple;             /* per helper function: returns through pointers (tuple root) */
  uint32_t nfns;
  size_t fncap;
  kiln_status *st;
} kiln__emit_mod;

typedef struct kiln__emit_input {
  uint32_t arg;            /* buffer argument number, or KILN__NO_INPUT */
  const kiln_shape *shape; /* the buffer's array shape (layout) */
  char var[16];            /* or a C variable holding the (scalar) value */
} kiln__emit_input;

typedef struct kiln__ix {
  uint32_t id; /* memo key; 0 for every rank-0 index */
  uint32_t rank;
  char (*c)[KILN__IX_LEN]; /* per logical dim */
  const char *lin;         /* physical offset in lin_shape's layout, or NULL */
  const kiln_shape *lin_shape;
  bool root; /* the kernel's own output index */
  /* The function it was made for (kiln__ix_new): where a component too long
   * to hold inline is spilled into an index variable. */
  struct kiln__emit_fn *f;
} kiln__ix;

typedef struct kiln__memo {
  kiln_id id;
  uint32_t ix;
  uint32_t n;
  uint32_t *vars;
} kiln__memo;

/* One function being written (a kernel body or a scalar helper). */
typedef struct kiln__emit_fn {
  kiln__emit_mod *mod;
  kiln_sbuf *out;
  int indent;
  uint32_t nvars, nix;
  uint32_t *in_first; /* per instruction id: first input leaf, or KILN__NO_INPUT */
  kiln__emit_input *in;
  uint32_t nin;
  size_t incap;
  kiln__memo *memo;
  uint32_t nmemo;
  size_t memocap;
  bool used_root; /* a component of the root index was read */
  /* Row kernels (kernel_loop.c): per instruction id, the row temporary
   * b<N> that a value computed here is also stored into, at component
   * row_dim of its index, or KILN__NO_INPUT; NULL when none is. */
  const uint32_t *row_store;
  uint32_t row_dim;
  /* Row kernels: per instruction id, nonzero for a value bound once per
   * row (a row reduce or its broadcast); NULL when none is. An f32 divide
   * by one multiplies by its reciprocal (emit_elementwise.c). */
  const uint8_t *row_invariant;
  kiln_arena *arena; /* index vectors, value lists; freed with the function */
  int rc;
} kiln__emit_fn;

/* ---- setup (emit.c) ----------------------------------------------------- */

int kiln__emit_mod_init(kiln__emit_mod *mod, const kiln_module *m, const kiln__cg_target *target,
                        kiln_status *st);
void kiln__emit_mod_free(kiln__emit_mod *mod);
int kiln__emit_fn_init(kiln__emit_fn *f, kiln__emit_mod *mod, kiln_sbuf *out, int indent);
void kiln__emit_fn_free(kiln__emit_fn *f);
/* Reads instruction id's leaves from buffers (args[k] for leaf k) or from C
 * variables (vars[k]); one of the two is NULL. */
int kiln__emit_bind(kiln__emit_fn *f, kiln_id id, const uint32_t *args,
                    const kiln_shape *const *shapes, const char *const *vars, uint32_t nleaves);

/* ---- values ------------------------------------------------------------- */

/* The value of instruction id at index x: *vars receives its leaves' C
 * variable numbers (v<N>), *n their count. */
int kiln__emit_value(kiln__emit_fn *f, kiln_id id, const kiln__ix *x, const uint32_t **vars,
                     uint32_t *n);
/* Single-leaf convenience: the variable number of an array value. */
int kiln__emit_value1(kiln__emit_fn *f, kiln_id id, const kiln__ix *x, uint32_t *var);

/* ---- indices ------------------------------------------------------------ */

int kiln__ix_new(kiln__emit_fn *f, uint32_t rank, kiln__ix *x);
/* Component d (marks the root index used). */
const char *kiln__ix_get(kiln__emit_fn *f, const kiln__ix *x, uint32_t d);
/* Sets component d; an expression longer than KILN__IX_LEN - 1 becomes an
 * index variable x<N> (declared at this point of the function). */
void kiln__ix_set(kiln__ix *x, uint32_t d, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A new index variable x<N> = expr; its name is written into dst. */
void kiln__ix_var(kiln__emit_fn *f, char dst[KILN__IX_LEN], const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The physical element offset of index x in a buffer of shape s. */
void kiln__ix_offset(kiln__emit_fn *f, const kiln__ix *x, const kiln_shape *s, char *dst,
                     size_t size);
/* A logical row-major linear index of x within dims (an expression). */
void kiln__ix_linear(kiln__emit_fn *f, const kiln__ix *x, const int64_t *dims, char *dst,
                     size_t size);
/* Splits a linear row-major index expression into components for dims. */
int kiln__ix_split(kiln__emit_fn *f, const char *linear, const int64_t *dims, uint32_t rank,
                   kiln__ix *out);

/* ---- writing ------------------------------------------------------------ */

void kiln__emit_line(kiln__emit_fn *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Opens/closes a C block; values and indices made inside die with it. */
uint32_t kiln__emit_open(kiln__emit_fn *f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void kiln__emit_close(kiln__emit_fn *f, uint32_t mark, const char *tail);
uint32_t kiln__emit_newvar(kiln__emit_fn *f);
int kiln__emit_fail(kiln__emit_fn *f, const kiln_instr *ins, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int kiln__emit_memo_put(kiln__emit_fn *f, kiln_id id, const kiln__ix *x, const uint32_t *vars,
                        uint32_t n);

/* ---- types -------------------------------------------------------------- */

/* Whether code generation computes on this element type. */
bool kiln__emit_dtype_ok(kiln_dtype t);
/* The target's spelling of t's compute type ("float", f16/bf16 too) and storage type ("uint16_t"
 * for f16/bf16); that of u8 for a type the emitter does not compute on. */
const char *kiln__ctype(const kiln__emit_mod *mod, kiln_dtype t);
const char *kiln__stype(const kiln__emit_mod *mod, kiln_dtype t);
/* Loads element `off` of buffer b<arg> as a compute value expression. */
void kiln__emit_load_expr(kiln_dtype t, uint32_t arg, const char *off, char *dst, size_t size);
/* Writes `v` (compute value expression) converted to storage form. */
void kiln__emit_store_expr(kiln_dtype t, const char *v, char *dst, size_t size);
/* A scalar literal of type t from the literal's element i. */
void kiln__emit_literal(const kiln__emit_mod *mod, kiln_dtype t, const kiln_literal *lit, int64_t i,
                        char *dst, size_t size);

/* ---- op families -------------------------------------------------------- */

/* emit_elementwise.c: expression of op on operand values a[] of types at[]
 * into result type rt (written as a C expression into dst). */
int kiln__emit_scalar_op(kiln__emit_fn *f, const kiln_instr *ins, kiln_opcode op,
                         const char *const *a, const kiln_dtype *at, uint32_t n, kiln_dtype rt,
                         char *dst, size_t size);
int kiln__emit_convert_expr(kiln__emit_fn *f, const kiln_instr *ins, const char *a, kiln_dtype from,
                            kiln_dtype to, char *dst, size_t size);
int kiln__emit_elementwise(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x,
                           uint32_t *var);
/* emit_shape.c: data movement ops. */
int kiln__emit_movement(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x, uint32_t *var);
/* For dynamic-update-slice `dus` written in place: the update's value at
 * update index u, and the output index it goes to (starts clamped). */
int kiln__emit_dus_target(kiln__emit_fn *f, const kiln_instr *dus, const kiln__ix *u, uint32_t *var,
                          kiln__ix *target);
/* emit_reduce.c: reduce (variadic), reduce-window, dot, convolution, map. */
int kiln__emit_reduction(kiln__emit_fn *f, const kiln_instr *ins, const kiln__ix *x,
                         const uint32_t **vars, uint32_t *n);
/* Writes (once per computation) a helper function computing scalar
 * computation comp: "<helper_qual> T kf<N>(T p0, ...)" returning the root,
 * or, for a tuple root, "<helper_qual> void kf<N>(T p0, ..., T *restrict
 * r0, ...)". */
int kiln__emit_comp_fn(kiln__emit_mod *mod, uint32_t comp, const kiln_instr *caller, uint32_t *fn);
/* Calls helper fn with argument variables args[0..nargs) and stores its
 * results into variables outs[0..nouts). */
void kiln__emit_call_fn(kiln__emit_fn *f, uint32_t fn, const uint32_t *args, uint32_t nargs,
                        const uint32_t *outs, uint32_t nouts);

/* ---- the prelude contract ------------------------------------------------
 *
 * Every target's prelude defines each helper below under this name, with
 * this signature (its own qualifiers; the types are the vocabulary's) and
 * exactly these semantics, so that a kernel computes the same bits on
 * every target. Shared code calls helpers only by these names; the C
 * prelude (c_target.c) is the reference implementation, and a test checks
 * that it defines every name listed with its signature and no other.
 *
 * Bits and values (exact):
 *   kbf32, kbf64      the float/double whose IEEE-754 bit pattern is u.
 *   kf32bits, kf64bits  the bit pattern of f (NaN payloads kept).
 * f16 and bf16 in double (conversions from and to double, reduce-precision):
 *   kh2d   binary16 bits -> its exact value; exponent 31 with a nonzero
 *          mantissa -> a quiet NaN, else +-infinity; subnormals exact; the
 *          sign bit applies to every result, NaN and zero included.
 *   kb2d   bfloat16 bits -> its exact value (the f32 whose upper half the
 *          bits are); a NaN pattern -> a quiet NaN of the same sign.
 *   kround(x, emin, mb, maxv, up, down)  x rounded to the nearest value
 *          (ties to even) of a binary format with mb explicit mantissa bits
 *          and smallest normal exponent emin: normal results by rounding
 *          x's mantissa at bit 52 - mb; below 2^emin at the format's
 *          subnormal quantum, as rint(x * up) * down under the default
 *          rounding mode (up = 1/quantum, down = quantum); a result whose
 *          magnitude exceeds maxv (the largest finite value) becomes an
 *          infinity; the sign is x's (-0 stays -0); NaN and infinities are
 *          returned as they are.
 *   krh    kround for f16: emin -14, 10 bits, maxv 65504, quantum 2^-24.
 *   krb    kround for bf16: emin -126, 7 bits, maxv 0x1.fep127, quantum
 *          2^-133.
 *   krbf   krb of an f32, in f32 and branch-free (so convert loops
 *          vectorize): the same value; a NaN stays a NaN of its sign.
 *   kd2h   an f16 value (a result of krh or kh2d) -> its binary16 bits; the
 *          mantissa is truncated, so x must already be representable; any
 *          NaN -> sign | 0x7e00; |x| >= 2^16 -> sign | infinity.
 *   kd2b   a bf16 value (a result of krb or kb2d) -> its bfloat16 bits: the
 *          upper half of (float)x's bits; any NaN -> 0xffc0 when its sign
 *          is set, else 0x7fc0.
 * f16 and bf16 held in f32 while computed (prelude_half.h; branch-free, so
 * the loops calling them vectorize):
 *   kh2f   binary16 bits -> its exact value as a float (kh2d's value); a
 *          NaN pattern -> the quiet NaN 0x7fc00000 with the sign bit.
 *   kb2f   bfloat16 bits -> its exact value (the f32 whose upper half the
 *          bits are); a NaN pattern -> the quiet NaN 0x7fc00000 with the
 *          sign bit.
 *   krhf   a float rounded to the nearest f16 value (ties to even), as a
 *          float: krh((double)x) for every x (subnormals at quantum 2^-24,
 *          |x| >= 65520 -> infinity); a NaN stays a NaN of its sign.
 *   kf2h   an f16 value held in a float (a result of krhf or kh2f) -> its
 *          binary16 bits, as kd2h: any NaN -> sign | 0x7e00.
 *   kf2b   a bf16 value held in a float (a result of krbf or kb2f) -> its
 *          bfloat16 bits, as kd2b: any NaN -> 0xffc0 when its sign is set,
 *          else 0x7fc0.
 * Float operations (a and b of the helper's type):
 *   ktot   total-order key of x: the bit pattern as int64_t, with the
 *          magnitude bits inverted when negative, so that signed integer
 *          comparison orders -NaN < -inf < ... < -0 < +0 < ... < inf < NaN.
 *   ksign, ksignf  NaN -> x; +-0 -> x (its sign kept); else +-1 with x's
 *          sign.
 *   klogistic  1 / (1 + exp(-x)), in double.
 *   krsqrt     1 / sqrt(x), in double.
 *   kpowd  a^b: 1 when a == 1 or b == 0 (even when the other is NaN), else
 *          the C library's pow(a, b).
 *   kmaxf, kmaxd, kminf, kmind  NaN-propagating max/min: a when a is NaN,
 *          else b when b is NaN, else the larger (smaller) value, a on ties
 *          (so max(-0, +0) and max(+0, -0) return their first operand).
 *   kclampf, kclampd(l, x, h)  the first NaN of l, x, h in that order; else
 *          y = x < l ? l : x, then y < h ? y : h (h wins when l > h).
 *   knanm, knanmd  all ones (32 or 64 bits) when x is NaN, else 0.
 *   kpickf, kpickd(m, a, b)  the bits of a where mask m is set, of b
 *          elsewhere (a select that stays straight-line code).
 * Integers (index arithmetic and XLA's edges):
 *   kclampi(v, hi)  v < 0 -> 0, v > hi -> hi, else v (hi >= 0).
 *   kf2s(x, w)  double -> signed w-bit integer (w = 8, 16, 32, 64),
 *          saturating: NaN -> 0; x >= 2^(w-1) -> the largest; x <= -2^(w-1)
 *          -> the smallest; else truncated toward zero.
 *   kf2sf(x, w)  kf2s of a float into w = 8, 16 or 32 bits, computed in
 *          float and int32 lanes (the same value: 2^(w-1) is exact in
 *          float), so an f32 -> s8 quantization loop vectorizes.
 *   kf2u(x, w)  double -> unsigned w-bit integer, saturating: NaN or x <= 0
 *          -> 0; x >= 2^w -> 2^w - 1; else truncated toward zero.
 *   kdivs32, kdivs64  a / b truncated toward zero; b == 0 -> -1; MIN / -1
 *          -> MIN (no trap).
 *   krems32, krems64  a % b with the sign of a; b == 0 -> a; MIN % -1 -> 0.
 *   kdivu64  a / b; b == 0 -> all ones (the caller's wrap to the width
 *          gives that width's maximum).
 *   kremu64  a % b; b == 0 -> a.
 *   kipow(x, y, neg)  x^y modulo 2^64 by repeated squaring (the caller wraps
 *          to the width; signed operands come sign-extended): 1 when x == 1
 *          or y == 0, else 0 when neg (a negative signed exponent).
 *   kclz(x, w)  leading zero bits of x as a w-bit value (x < 2^w): w when x
 *          is 0.
 *   kshl<W>, kshrl<W>, kshra<W> (W = 8, 16, 32, 64; uint<W>_t operands, the
 *          shift amount y taken as unsigned, so a negative signed amount
 *          is out of range): y >= W -> 0 for shl and shrl, and for shra
 *          all ones when x is negative as int<W>_t, else 0; otherwise
 *          x << y (wrapped to W bits), logical x >> y, and arithmetic
 *          (sign-filling) x >> y.
 * f32 math in f32 (branch-free, no libm calls, so that gcc vectorizes the
 * loops that call them). Bounds are in ULPs of the f32 result against the
 * correctly rounded value (what the interpreter computes in double and
 * rounds once), measured on a dense sweep of every f32 range by
 * test_codegen.c (f32_math_ulp_bounds) and written in
 * tests/support/tolerance.h; NaN in -> NaN out, and the edges as C99:
 *   kldexpf(p, n)  p * 2^n rounded once, for integral n in [-150, 128] and
 *          p in [0.5, 2] (two normal power-of-two factors).
 *   kexpf      e^x, <= 2 ULP; +inf above 88.73, +0 below -103.98.
 *   klog1pm(f) log(1 + f) for f in [sqrt(1/2) - 1, sqrt(2) - 1] (klogf's
 *          kernel), <= 2 ULP.
 *   klogf      log x, <= 2 ULP; -inf at +-0, NaN below 0, +inf at +inf.
 *   klog1pf    log(1 + x), <= 2 ULP; -inf at -1, NaN below -1.
 *   kexpm1f    e^x - 1, <= 2 ULP; -1 below -30, as kexpf above 20.
 *   ktanhf     tanh x, <= 3 ULP; +-1 beyond +-10, the sign of zero kept.
 *   klogisticf 1 / (1 + e^-x), <= 3 ULP (e^x / (1 + e^x) below 0, so that
 *          it stays accurate down to the subnormals).
 *   kerff      erf x, <= 3 ULP; +-1 beyond +-4, the sign of zero kept.
 * Exact rounding, selection and classification, branch-free and without
 * libm calls (floorf, ceilf and roundf are not vector instructions under
 * -ftrapping-math) so that loops holding them vectorize; each equals its
 * C99 counterpart bit for bit, NaN in -> NaN out:
 *   kfloorf, kfloord  floor x, from rint x (round to nearest, which GCC
 *          vectorizes) minus 1 where that lies above x.
 *   kceilf, kceild    ceil x, as -floor(-x) (so ceil(-0.5) is -0).
 *   kroundf, kroundd  round x (halfway cases away from zero).
 *   kself(c, a, b), kseld  c ? a : b (c a pred value) on the bits, so GCC
 *          cannot turn it into a branch that stops if-conversion.
 *   kfinitef, kfinited  1 when x is neither infinite nor NaN, else 0.
 *   ktotf(x)   the total-order key of an f32 as ktot((double)x) orders it
 *          (a NaN's quiet bit set, as the conversion to double sets it).
 *   kdivs32v, krems32v, kdivu32v, kremu32v  kdivs32, krems32 and the
 *          32-bit kdivu64, kremu64 (a 0 divisor giving all ones, x),
 *          vectorizable: an unknown divisor's quotient through double.
 *   katan2f(y, x)  atan2 of f32 values, computed in double without libm
 *          (the octant reduced to |u| <= tan(pi/8), atan's Taylor series
 *          to u^23, truncation error under 1e-11) and rounded once:
 *          <= 1 ULP (KILN_TOL_ULP_ATAN2); C99's values at zeros of both
 *          signs and infinities, NaN in -> NaN out.
 * reduce-precision (eb exponent bits, mb mantissa bits, as the attribute
 * gives them):
 *   krpbits(bits, se, sm, eb, mb)  on the bits of a non-NaN value of a
 *          format with se exponent and sm mantissa bits: unchanged when
 *          eb < 1 or mb < 0; else the mantissa rounded to mb bits (ties to
 *          even, carrying into the exponent) when mb < sm, then, when
 *          eb < se, exponents above the eb-bit range -> +-infinity and
 *          those at or below its bottom (subnormals included) -> +-0.
 *   krpf, krpd (float, double), krph, krpb (f16, bf16 values in double)
 *          krpbits on the value's bits (through kd2h/kd2b and back for
 *          f16/bf16); a NaN stays NaN unless mb == 0 and eb >= 1, when it
 *          becomes an infinity of its sign.
 *
 * Vocabulary the emitter spells directly, which every prelude must make
 * available (the C prelude declares them as <math.h>, <stdint.h>, <string.h> do): the
 * exact-width integer types int8_t ... uint64_t and INT64_MAX; float and
 * double with C99 arithmetic, casts (float to integer truncating, integer
 * to float rounding to nearest) and comparisons; and the functions of
 * KILN__EMIT_STD_FUNCS with their C99 meaning (correctly rounded where C99
 * says so, the others as the platform's libm computes them, which is what
 * the reference interpreter uses too). Besides these, generated code calls
 * only the target's popcount64 and names the emitter makes up: kf<N>
 * (scalar computations), kless<N> and LESS (sort comparators),
 * kiln_kernel_<N> (kernels); a test checks this on generated programs. */

/* X(name, signature) for each prelude helper. */
#define KILN__PRELUDE_HELPERS(X) \
  X(kbf32, "float kbf32(uint32_t u)") \
  X(kbf64, "double kbf64(uint64_t u)") \
  X(kf32bits, "uint32_t kf32bits(float f)") \
  X(kf64bits, "uint64_t kf64bits(double f)") \
  X(kh2d, "double kh2d(uint16_t h)") \
  X(kb2d, "double kb2d(uint16_t h)") \
  X(kround, "double kround(double x, int emin, int mb, double maxv, double up, double down)") \
  X(krh, "double krh(double x)") \
  X(krb, "double krb(double x)") \
  X(krbf, "float krbf(float x)") \
  X(kd2h, "uint16_t kd2h(double x)") \
  X(kd2b, "uint16_t kd2b(double x)") \
  X(kh2f, "float kh2f(uint16_t h)") \
  X(kb2f, "float kb2f(uint16_t h)") \
  X(krhf, "float krhf(float x)") \
  X(kf2h, "uint16_t kf2h(float x)") \
  X(kf2b, "uint16_t kf2b(float x)") \
  X(ktot, "int64_t ktot(double x)") \
  X(ksign, "double ksign(double x)") \
  X(ksignf, "float ksignf(float x)") \
  X(klogistic, "double klogistic(double x)") \
  X(krsqrt, "double krsqrt(double x)") \
  X(kpowd, "double kpowd(double a, double b)") \
  X(knanm, "uint32_t knanm(float a)") \
  X(knanmd, "uint64_t knanmd(double a)") \
  X(kpickf, "float kpickf(uint32_t m, float a, float b)") \
  X(kpickd, "double kpickd(uint64_t m, double a, double b)") \
  X(kmaxf, "float kmaxf(float a, float b)") \
  X(kminf, "float kminf(float a, float b)") \
  X(kmaxd, "double kmaxd(double a, double b)") \
  X(kmind, "double kmind(double a, double b)") \
  X(kclampf, "float kclampf(float l, float x, float h)") \
  X(kclampd, "double kclampd(double l, double x, double h)") \
  X(kclampi, "int64_t kclampi(int64_t v, int64_t hi)") \
  X(kf2s, "int64_t kf2s(double x, int w)") \
  X(kf2sf, "int32_t kf2sf(float x, int w)") \
  X(kf2u, "uint64_t kf2u(double x, int w)") \
  X(kdivs32, "int32_t kdivs32(int32_t a, int32_t b)") \
  X(krems32, "int32_t krems32(int32_t a, int32_t b)") \
  X(kdivs64, "int64_t kdivs64(int64_t a, int64_t b)") \
  X(krems64, "int64_t krems64(int64_t a, int64_t b)") \
  X(kdivu64, "uint64_t kdivu64(uint64_t a, uint64_t b)") \
  X(kremu64, "uint64_t kremu64(uint64_t a, uint64_t b)") \
  X(kipow, "uint64_t kipow(uint64_t x, uint64_t y, int neg)") \
  X(kclz, "uint64_t kclz(uint64_t x, int w)") \
  X(kshl8, "uint8_t kshl8(uint8_t x, uint8_t y)") \
  X(kshrl8, "uint8_t kshrl8(uint8_t x, uint8_t y)") \
  X(kshra8, "uint8_t kshra8(uint8_t x, uint8_t y)") \
  X(kshl16, "uint16_t kshl16(uint16_t x, uint16_t y)") \
  X(kshrl16, "uint16_t kshrl16(uint16_t x, uint16_t y)") \
  X(kshra16, "uint16_t kshra16(uint16_t x, uint16_t y)") \
  X(kshl32, "uint32_t kshl32(uint32_t x, uint32_t y)") \
  X(kshrl32, "uint32_t kshrl32(uint32_t x, uint32_t y)") \
  X(kshra32, "uint32_t kshra32(uint32_t x, uint32_t y)") \
  X(kshl64, "uint64_t kshl64(uint64_t x, uint64_t y)") \
  X(kshrl64, "uint64_t kshrl64(uint64_t x, uint64_t y)") \
  X(kshra64, "uint64_t kshra64(uint64_t x, uint64_t y)") \
  X(krpbits, "uint64_t krpbits(uint64_t bits, int se, int sm, long long eb, long long mb)") \
  X(krpf, "float krpf(float x, long long eb, long long mb)") \
  X(krpd, "double krpd(double x, long long eb, long long mb)") \
  X(krph, "double krph(double x, long long eb, long long mb)") \
  X(krpb, "double krpb(double x, long long eb, long long mb)") \
  X(kldexpf, "float kldexpf(float p, int32_t n)") \
  X(kexpf, "float kexpf(float x)") \
  X(klog1pm, "float klog1pm(float f)") \
  X(klogf, "float klogf(float x)") \
  X(klog1pf, "float klog1pf(float x)") \
  X(kexpm1f, "float kexpm1f(float x)") \
  X(ktanhf, "float ktanhf(float x)") \
  X(klogisticf, "float klogisticf(float x)") \
  X(kerff, "float kerff(float x)") \
  X(kfloorf, "float kfloorf(float x)") \
  X(kfloord, "double kfloord(double x)") \
  X(kceilf, "float kceilf(float x)") \
  X(kceild, "double kceild(double x)") \
  X(kroundf, "float kroundf(float x)") \
  X(kroundd, "double kroundd(double x)") \
  X(kself, "float kself(uint8_t c, float a, float b)") \
  X(kseld, "double kseld(uint8_t c, double a, double b)") \
  X(kfinitef, "uint8_t kfinitef(float x)") \
  X(kfinited, "uint8_t kfinited(double x)") \
  X(ktotf, "int32_t ktotf(float x)") \
  X(kdivs32v, "int32_t kdivs32v(int32_t a, int32_t b)") \
  X(krems32v, "int32_t krems32v(int32_t a, int32_t b)") \
  X(kdivu32v, "uint32_t kdivu32v(uint32_t a, uint32_t b)") \
  X(kremu32v, "uint32_t kremu32v(uint32_t a, uint32_t b)") \
  X(katan2f, "float katan2f(float y, float x)") \
  /* complex: owed only by a target whose ctype has KILN_C64/KILN_C128 */ \
  X(kcx, "double _Complex kcx(double re, double im)") \
  X(kc64r, "double _Complex kc64r(double _Complex z)") \
  X(kcsel, "double _Complex kcsel(uint8_t c, double _Complex a, double _Complex b)") \
  X(kc64abs, "double kc64abs(double _Complex z)") \
  X(kc64mul, "double _Complex kc64mul(double _Complex z, double _Complex w)") \
  X(kc64div, "double _Complex kc64div(double _Complex z, double _Complex w)")

/* X(name) for each standard function the emitter calls by name. */
#define KILN__EMIT_STD_FUNCS(X) \
  X(fabs) \
  X(fabsf) \
  X(ceil) \
  X(ceilf) \
  X(floor) \
  X(floorf) \
  X(round) \
  X(roundf) \
  X(rint) \
  X(rintf) \
  X(sqrt) \
  X(sqrtf) \
  X(cbrt) \
  X(cos) \
  X(cosf) \
  X(sin) \
  X(sinf) \
  X(tan) \
  X(tanf) \
  X(tanh) \
  X(erf) \
  X(exp) \
  X(expm1) \
  X(log) \
  X(log1p) \
  X(atan2) \
  X(fmod) \
  X(fmodf) \
  X(isfinite) \
  X(cabs) \
  X(isinf) \
  X(creal) \
  X(cimag) \
  X(memcpy)

typedef struct kiln__prelude_helper {
  const char *name;
  const char *signature;
} kiln__prelude_helper;

/* The helpers of KILN__PRELUDE_HELPERS, in order, and the standard
 * functions of KILN__EMIT_STD_FUNCS; each list ends with a NULL name. */
extern const kiln__prelude_helper kiln__prelude_helpers[];
extern const char *const kiln__emit_std_funcs[];

#endif /* KILN_COMPILER_CODEGEN_EMIT_H */
