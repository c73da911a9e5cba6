/* The program representation: element types, shapes, literals, instructions,
 * computations and modules, following XLA HLO semantics.
 *
 * A module owns an arena; every instruction, computation, name, shape,
 * attribute and constant literal lives in it and dies with the module.
 * Instructions are numbered module-wide: an operand is a kiln_id, the index
 * of an instruction in kiln_module.instrs, never a pointer, so modules are
 * cheap to clone, serialize and hash canonically. A computation lists its
 * instructions in order (operands before users). Names are scoped per
 * computation, as in XLA text.
 *
 * The closed lists (element types, opcodes, attribute keys) are X-macro
 * tables: types.def, ops.def, attrs.def.
 */
#ifndef KILN_COMPILER_IR_IR_H
#define KILN_COMPILER_IR_IR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/arena.h"
#include "common/sbuf.h"
#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- element types ------------------------------------------------------ */

typedef enum kiln_dtype {
#define X(e, s, bits, bytes, kind) KILN_##e,
#include "compiler/ir/types.def"
#undef X
  KILN_DTYPE_COUNT
} kiln_dtype;

typedef enum kiln_dtype_kind {
  KILN_KIND_OTHER,
  KILN_KIND_PRED,
  KILN_KIND_SINT,
  KILN_KIND_UINT,
  KILN_KIND_FLOAT,
  KILN_KIND_COMPLEX,
  KILN_KIND_TOKEN,
  KILN_KIND_TUPLE,
} kiln_dtype_kind;

const char *kiln_dtype_name(kiln_dtype t); /* "f32" */
bool kiln_dtype_from_name(const char *s, size_t n, kiln_dtype *out);
int kiln_dtype_bits(kiln_dtype t);    /* logical width */
size_t kiln_dtype_size(kiln_dtype t); /* storage bytes per element */
kiln_dtype_kind kiln_dtype_kind_of(kiln_dtype t);
bool kiln_dtype_is_float(kiln_dtype t);    /* any real floating type */
bool kiln_dtype_is_integral(kiln_dtype t); /* signed or unsigned int */
bool kiln_dtype_is_signed_int(kiln_dtype t);
bool kiln_dtype_is_unsigned_int(kiln_dtype t);
bool kiln_dtype_is_complex(kiln_dtype t);
bool kiln_dtype_is_array(kiln_dtype t); /* has elements: not tuple/token/opaque */

/* ---- shapes ------------------------------------------------------------- */

typedef struct kiln_i64s {
  int64_t *v;
  uint32_t n;
} kiln_i64s;

typedef struct kiln_layout {
  int64_t *minor_to_major; /* rank entries; a permutation of 0..rank-1 */
  uint32_t rank;
  /* What followed ':' in the text (tiles "T(8,128)", element size "E(4)",
   * memory space "S(1)", ...), canonical (no spaces), NULL when absent.
   * Kept so that real dumps print back unchanged; not interpreted yet. */
  const char *tail;
  int64_t memory_space; /* from S(n) in tail; 0 when absent */
} kiln_layout;

typedef struct kiln_shape {
  kiln_dtype dtype;         /* element type, or KILN_TUPLE / KILN_TOKEN */
  uint32_t rank;            /* arrays: number of dims; tuples: number of elements */
  int64_t *dims;            /* arrays: rank sizes (for a dynamic dim: its bound) */
  uint8_t *dynamic;         /* NULL, or rank flags: dim i is bounded dynamic "<=N" */
  kiln_layout *layout;      /* NULL when none was given */
  struct kiln_shape *tuple; /* tuples: rank element shapes */
} kiln_shape;

bool kiln_shape_is_array(const kiln_shape *s);
bool kiln_shape_is_tuple(const kiln_shape *s);
bool kiln_shape_is_token(const kiln_shape *s);
bool kiln_shape_is_scalar(const kiln_shape *s);
bool kiln_shape_is_dynamic(const kiln_shape *s); /* any dynamic dim, recursively */
/* Number of elements of an array shape; -1 on overflow past INT64_MAX. */
int64_t kiln_shape_elements(const kiln_shape *s);
/* Bytes of an array's dense storage; -1 on overflow. Tuples/tokens: 0. */
int64_t kiln_shape_bytes(const kiln_shape *s);
/* Leaves of an array literal's nested braces: its element count, or, when
 * a dimension is 0, the product of the dims before the first zero (each
 * one empty "{}": f32[3,0] prints {{}, {}, {}}, three leaves and no
 * element). It bounds the printed text where the element count cannot.
 * A scalar has one; tuples and tokens 0; -1 on overflow past INT64_MAX. */
int64_t kiln_shape_leaves(const kiln_shape *s);
/* Arrays, that is brace pairs, an array literal's text writes: one per
 * index of each level above the elements, or above and at the first
 * zero-sized dim (f32[2,3] has 3: {{..}, {..}}; f32[2,3,0] 9; f32[0] 1; a
 * scalar 0). With the elements, the size of the literal's text. Tuples and
 * tokens 0; -1 on overflow past INT64_MAX. */
int64_t kiln_shape_literal_arrays(const kiln_shape *s);
/* Structural equality: dtype, dims, dynamic flags, tuple structure; layouts
 * too when `layouts` is true (a missing layout equals the default one). */
bool kiln_shape_equal(const kiln_shape *a, const kiln_shape *b, bool layouts);
bool kiln_shape_same_dims(const kiln_shape *a, const kiln_shape *b);
/* Deep copy into arena `a`. Returns 0 or KILN_ENOMEM. */
int kiln_shape_copy(kiln_arena *a, kiln_shape *dst, const kiln_shape *src);
/* Builders (arena-owned). dims may be NULL when rank is 0. */
int kiln_shape_make_array(kiln_arena *a, kiln_shape *out, kiln_dtype t, const int64_t *dims,
                          uint32_t rank);
int kiln_shape_make_tuple(kiln_arena *a, kiln_shape *out, const kiln_shape *elems, uint32_t n);
/* The element shape at a tuple index path; NULL if the path is invalid. */
const kiln_shape *kiln_shape_subshape(const kiln_shape *s, const int64_t *index, uint32_t n);
/* Physical dimension order: minor_to_major of the layout, or the default
 * (rank-1 .. 0) when there is none. `out` has rank entries. */
void kiln_shape_minor_to_major(const kiln_shape *s, int64_t *out);
/* Whether that order is the default one (row-major): true without a
 * layout. Tiles and memory space in the layout's tail are not looked at. */
bool kiln_shape_is_row_major(const kiln_shape *s);
/* HLO text: "f32[2,<=3]{1,0}", "(f32[], token[])". */
void kiln_shape_print(kiln_sbuf *b, const kiln_shape *s);
/* Same without layouts: "f32[2,3]". */
void kiln_shape_print_short(kiln_sbuf *b, const kiln_shape *s);

/* ---- literals ----------------------------------------------------------- */

/* A literal value: an array stored densely in row-major (logical) order
 * whatever the shape's layout says, or a tuple of literals. Elements use
 * kiln_dtype_size() bytes each: pred as 0/1 bytes, s4/u4 one per byte
 * (sign- or zero-extended), f16/bf16 as their 16-bit patterns, f8 types as
 * their byte, c64 as two floats (re, im), c128 as two doubles. */
typedef struct kiln_literal {
  kiln_shape shape;
  void *data; /* arrays: nbytes of element data */
  size_t nbytes;
  struct kiln_literal **elems; /* tuples: shape.rank element literals */
  /* Arrays of a bounded-dynamic shape: NULL, or shape.rank runtime sizes
   * (each <= its bound). The data is always stored at the bound sizes
   * (padded), as XLA's dynamic padder lays it out. */
  int64_t *dynamic_sizes;
  /* A heap literal (created with arena NULL) owns a private arena holding
   * itself, its shape, data and tuple elements, freed by destroy; NULL when
   * the literal lives in someone else's arena (a module's constants). */
  kiln_arena *own;
} kiln_literal;

/* A zero-filled literal of `shape` (deep-copied). With arena NULL it is owned
 * by the caller and freed with kiln_literal_destroy; otherwise it lives in
 * the arena. Fails with KILN_ELIMIT when the size overflows or exceeds
 * `max_bytes` (0 = no limit), KILN_ENOMEM when allocation fails. */
int kiln_literal_create(kiln_arena *arena, const kiln_shape *shape, size_t max_bytes,
                        kiln_literal **out, kiln_status *st);
void kiln_literal_destroy(kiln_literal *lit); /* no-op for arena literals */
int kiln_literal_clone(kiln_arena *arena, const kiln_literal *src, kiln_literal **out,
                       kiln_status *st);
int64_t kiln_literal_elements(const kiln_literal *lit);
/* Element access by linear row-major index, converting through the widest
 * type of the family. Setters round to nearest even for floats (exactly, in
 * one step) and wrap integers to the element width (two's complement). */
double kiln_literal_get_f64(const kiln_literal *lit, int64_t i);
int64_t kiln_literal_get_s64(const kiln_literal *lit, int64_t i);
uint64_t kiln_literal_get_u64(const kiln_literal *lit, int64_t i);
bool kiln_literal_get_pred(const kiln_literal *lit, int64_t i);
void kiln_literal_get_c128(const kiln_literal *lit, int64_t i, double *re, double *im);
void kiln_literal_set_f64(kiln_literal *lit, int64_t i, double v);
void kiln_literal_set_s64(kiln_literal *lit, int64_t i, int64_t v);
void kiln_literal_set_u64(kiln_literal *lit, int64_t i, uint64_t v);
void kiln_literal_set_c128(kiln_literal *lit, int64_t i, double re, double im);
/* Exact equality of shape (without layout) and bytes; NaNs equal when their
 * bits are equal. */
bool kiln_literal_equal(const kiln_literal *a, const kiln_literal *b);
/* An argument for a parameter of bounded-dynamic array shape `want`: src
 * itself (*out = src) when its shape is want, else an array of want's type
 * and rank whose dims are at most the bounds where want has "<=" and equal
 * elsewhere (a static array with fewer rows, or a dynamic one of smaller
 * bounds), copied into storage at the bounds (zero padding) with its dims
 * as the runtime sizes; new in `arena` (NULL: the caller's, see
 * kiln_literal_create). KILN_EINVAL says which dim does not fit. */
int kiln_literal_fit_bounds(kiln_arena *arena, const kiln_literal *src, const kiln_shape *want,
                            const kiln_literal **out, kiln_status *st);

/* ---- opcodes and attributes --------------------------------------------- */

typedef enum kiln_opcode {
#define X(e, s, arity, family, flags) KILN_OP_##e,
#include "compiler/ir/ops.def"
#undef X
  KILN_OP_COUNT
} kiln_opcode;

/* What kind of computation an op is: the family column of ops.def. */
typedef enum kiln_op_family {
  KILN_FAM_NONE,       /* invalid */
  KILN_FAM_LEAF,       /* parameter, constant */
  KILN_FAM_TUPLE,      /* tuple, get-tuple-element */
  KILN_FAM_UNARY,      /* elementwise, one operand (and bitcast-convert) */
  KILN_FAM_BINARY,     /* elementwise, two operands, not compare */
  KILN_FAM_COMPARE,    /* compare */
  KILN_FAM_TERNARY,    /* elementwise, three operands: select, clamp */
  KILN_FAM_MOVEMENT,   /* shape manipulation and iota: elements moved, not computed */
  KILN_FAM_REDUCTION,  /* combines many operand elements per result element: dot,
                        * convolution, reduce, reduce-window, and map (a called
                        * computation per element) */
  KILN_FAM_COMPUTE,    /* the other array computations: sort, gather, scatter, fft, ... */
  KILN_FAM_CONTROL,    /* control flow, calls, async wrappers, barriers */
  KILN_FAM_RANDOM,     /* random number generation */
  KILN_FAM_TOKEN,      /* token plumbing: after-all, add-dependency */
  KILN_FAM_CHANNEL,    /* host and peer channels: infeed, outfeed, send, recv */
  KILN_FAM_COLLECTIVE, /* replica/partition ids and communication across them */
} kiln_op_family;

enum {
  KILN_OPF_ELEMENTWISE = 1u << 0, /* E: result element i depends on operand elements i */
  KILN_OPF_COMMUTATIVE = 1u << 1, /* C */
  KILN_OPF_CALLS = 1u << 2,       /* K: takes called computations */
  KILN_OPF_SIDE_EFFECT = 1u << 3, /* S: not removable even when unused */
  KILN_OPF_ASYNC = 1u << 4,       /* A: part of a start/update/done chain */
  KILN_OPF_COLLECTIVE = 1u << 5,  /* L: communicates across replicas/partitions */
  KILN_OPF_RANDOM = 1u << 6,      /* R: draws random numbers (two evaluations differ) */
  KILN_OPF_BARRIER = 1u << 7,     /* B: orders or fences other instructions; keep in place */
  /* I: each result element is an operand element found by index arithmetic,
   * or is computed from its index alone, on arrays of static size: no
   * arithmetic on element values (the kernel emitter's movement kernels). */
  KILN_OPF_INDEXING = 1u << 8,
  /* F: constant folding may evaluate it at compile time when its operands
   * are constants (the interpreter computes it exactly, layout-free). */
  KILN_OPF_FOLDABLE = 1u << 9,
};

const char *kiln_opcode_name(kiln_opcode op); /* text spelling */
bool kiln_opcode_from_name(const char *s, size_t n, kiln_opcode *out);
int kiln_opcode_arity(kiln_opcode op); /* -1: variadic */
unsigned kiln_opcode_flags(kiln_opcode op);
kiln_op_family kiln_opcode_family(kiln_opcode op); /* KILN_FAM_NONE when invalid */
/* UNARY, BINARY, COMPARE or TERNARY. */
bool kiln_opcode_is_elementwise_family(kiln_opcode op);
/* The op alone (not what it calls, not its shape) may be removed, merged,
 * moved or evaluated early: valid, and no side effect, async step,
 * communication, randomness or barrier. */
bool kiln_opcode_is_pure(kiln_opcode op);
bool kiln_opcode_has_side_effects(kiln_opcode op); /* S */
bool kiln_opcode_is_foldable(kiln_opcode op);      /* F */

typedef enum kiln_attr_key {
#define X(e, s, kind) KILN_ATTR_##e,
#include "compiler/ir/attrs.def"
#undef X
  KILN_ATTR_COUNT
} kiln_attr_key;

typedef enum kiln_attr_kind {
  KILN_AK_INT,            /* i */
  KILN_AK_BOOL,           /* i: 0/1; "true"/"false" */
  KILN_AK_FLOAT,          /* f */
  KILN_AK_INTS,           /* ints: {1,2,3} */
  KILN_AK_SLICE,          /* ints: triples (start, limit, stride): {[0:2], [1:5:2]} */
  KILN_AK_PADDING,        /* ints: triples (lo, hi, interior): 0_0x1_2_1 */
  KILN_AK_PAIRS,          /* ints: pairs (source, target): {{0,1},{1,0}} */
  KILN_AK_WINDOW,         /* window */
  KILN_AK_DIM_LABELS,     /* conv */
  KILN_AK_CMP_DIR,        /* i: kiln_cmp_dir */
  KILN_AK_REPLICA_GROUPS, /* groups */
  KILN_AK_SHARDING,       /* sharding */
  KILN_AK_IDENT,          /* s: a bare word (kLoop, rng_uniform, TOTALORDER) */
  KILN_AK_STRING,         /* s: the unescaped contents of a "quoted string" */
  KILN_AK_OPAQUE,         /* s: the value's text verbatim (braces and quotes included) */
} kiln_attr_kind;

const char *kiln_attr_key_name(kiln_attr_key k);
bool kiln_attr_key_from_name(const char *s, size_t n, kiln_attr_key *out);
kiln_attr_kind kiln_attr_key_kind(kiln_attr_key k);

typedef enum kiln_cmp_dir {
  KILN_CMP_EQ,
  KILN_CMP_NE,
  KILN_CMP_GE,
  KILN_CMP_GT,
  KILN_CMP_LE,
  KILN_CMP_LT,
} kiln_cmp_dir;
const char *kiln_cmp_dir_name(kiln_cmp_dir d); /* "EQ" */

typedef struct kiln_window_dim {
  int64_t size;
  int64_t stride; /* default 1 */
  int64_t pad_lo, pad_hi;
  int64_t lhs_dilate; /* base dilation, default 1 */
  int64_t rhs_dilate; /* window dilation, default 1 */
  bool reversal;
} kiln_window_dim;

typedef struct kiln_window {
  uint32_t rank;
  kiln_window_dim *dims;
} kiln_window;

/* Convolution dimension numbers, from dim_labels "b01f_01io->b01f". */
typedef struct kiln_conv_dims {
  int64_t in_batch, in_feature;
  int64_t kernel_in, kernel_out;
  int64_t out_batch, out_feature;
  uint32_t nspatial;
  int64_t *in_spatial, *kernel_spatial, *out_spatial; /* nspatial each */
} kiln_conv_dims;

/* replica_groups={{0,1},{2,3}} or the iota form [2,2]<=[4] / [2,2]<=[2,2]T(1,0). */
typedef struct kiln_replica_groups {
  bool iota;
  kiln_i64s iota_shape;   /* [ngroups, group_size] */
  kiln_i64s iota_reshape; /* <=[...] */
  kiln_i64s iota_perm;    /* T(...); n == 0 when absent */
  uint32_t ngroups;       /* list form */
  kiln_i64s *groups;
} kiln_replica_groups;

typedef enum kiln_sharding_kind {
  KILN_SHARD_REPLICATED,
  KILN_SHARD_MAXIMAL,
  KILN_SHARD_TILED,
  KILN_SHARD_MANUAL,
  KILN_SHARD_UNKNOWN,
  KILN_SHARD_TUPLE,
} kiln_sharding_kind;

typedef struct kiln_sharding {
  kiln_sharding_kind kind;
  int64_t device;         /* MAXIMAL: device=N */
  kiln_i64s tile_dims;    /* TILED: devices=[a,b,...] */
  kiln_i64s devices;      /* TILED, explicit list; n == 0 in the iota form */
  kiln_i64s iota_reshape; /* TILED, iota form <=[...] */
  kiln_i64s iota_perm;    /* T(...) of the iota form; n == 0 when absent */
  bool last_tile_dim_replicate;
  kiln_i64s last_tile_dims; /* last_tile_dims={manual, replicated}: kiln_sharding_kind each */
  uint32_t nelems;          /* TUPLE: {{...}, {...}} */
  struct kiln_sharding *elems;
  const char *extra; /* other fields verbatim (metadata={...}, shard_as ...), or NULL */
} kiln_sharding;

typedef struct kiln_attr {
  kiln_attr_key key;
  const char *name; /* KILN_ATTR_UNKNOWN: the spelling; else NULL */
  union {
    int64_t i;
    double f;
    kiln_i64s ints;
    const char *s;
    kiln_window *window;
    kiln_conv_dims *conv;
    kiln_replica_groups *groups;
    kiln_sharding *sharding;
  } v;
} kiln_attr;

/* ---- instructions, computations, modules -------------------------------- */

typedef uint32_t kiln_id;
#define KILN_NO_ID UINT32_MAX

typedef struct kiln_instr {
  kiln_id id;    /* index in kiln_module.instrs */
  uint32_t comp; /* owning computation; KILN_NO_ID once removed by a pass
                  * (it stays in kiln_module.instrs, unlisted) */
  kiln_opcode op;
  /* async-start/update/done written as "negate-start" sugar: the wrapped op;
   * KILN_OP_INVALID otherwise. */
  kiln_opcode async_op;
  const char *name; /* unique within its computation */
  kiln_shape shape; /* result shape; dtype KILN_INVALID until inferred */
  kiln_id *operands;
  uint32_t noperands;
  /* Called computations; their roles follow from op:
   * while: [condition, body]; conditional: branches in order ([true, false]
   * when the selector is pred); select-and-scatter: [select, scatter];
   * reduce, map, sort, scatter, reduce-window, all-reduce, reduce-scatter,
   * call: [to_apply]; fusion, async-*: [calls]; custom-call: called_computations. */
  uint32_t *called;
  uint32_t ncalled;
  kiln_id *control_preds; /* control-predecessors={...} */
  uint32_t ncontrol;
  kiln_attr *attrs; /* at most one per key, except KILN_ATTR_UNKNOWN */
  uint32_t nattrs, attrcap;
  kiln_literal *literal; /* constant: its value (arena-owned) */
  int64_t param_number;  /* parameter: its number */
  /* Source position of the definition in text input (1-based; 0 = unknown),
   * so that verifier errors can point into the file. */
  uint32_t line, col;
} kiln_instr;

typedef struct kiln_computation {
  uint32_t id; /* index in kiln_module.comps */
  const char *name;
  kiln_id *instrs; /* in order: operands before users */
  uint32_t ninstrs, cap;
  kiln_id root; /* KILN_NO_ID until set */
  bool is_entry;
  uint32_t line, col;
} kiln_computation;

typedef struct kiln_program_shape {
  kiln_shape *params;
  uint32_t nparams;
  kiln_shape result;
} kiln_program_shape;

typedef enum kiln_alias_kind { KILN_ALIAS_MAY, KILN_ALIAS_MUST } kiln_alias_kind;

/* input_output_alias={ {0}: (0, {}, must-alias) } */
typedef struct kiln_alias {
  kiln_i64s output_index;
  int64_t param_number;
  kiln_i64s param_index;
  kiln_alias_kind kind;
} kiln_alias;

/* A module-level attribute Kiln does not interpret, kept verbatim. */
typedef struct kiln_raw_attr {
  const char *name;
  const char *text;
} kiln_raw_attr;

typedef struct kiln_module {
  kiln_arena *arena;
  const char *name;
  kiln_instr **instrs; /* all instructions, by id */
  uint32_t ninstrs;
  size_t instr_cap;
  kiln_computation **comps; /* computations, in text order */
  uint32_t ncomps;
  size_t comp_cap;
  uint32_t entry; /* index of the ENTRY computation; KILN_NO_ID if none */
  /* header */
  kiln_program_shape *entry_layout; /* entry_computation_layout, or NULL */
  int is_scheduled;                 /* -1 absent, 0 false, 1 true */
  kiln_alias *aliases;              /* input_output_alias */
  uint32_t naliases;
  bool has_aliases;            /* written, even when empty */
  int64_t replica_count;       /* 0 when absent */
  int64_t num_partitions;      /* 0 when absent */
  kiln_raw_attr *header_extra; /* other header attributes, verbatim */
  uint32_t nheader_extra;
  /* Debug-info sections after the header (FileNames, FunctionNames,
   * FileLocations, StackFrames: what compile().as_text() writes), in order:
   * name is the section's, text its entries verbatim, one a line. They only
   * resolve metadata's stack_frame_id, so the cache key drops them. */
  kiln_raw_attr *sections;
  uint32_t nsections;
} kiln_module;

/* Creates an empty module named `name` (copied). NULL on out-of-memory. */
kiln_module *kiln_module_create(const char *name);
void kiln_module_destroy(kiln_module *m);

/* Appends a computation; *out is its id. */
int kiln_module_add_computation(kiln_module *m, const char *name, uint32_t *out);
kiln_computation *kiln_module_computation(const kiln_module *m, uint32_t id);
kiln_computation *kiln_module_find_computation(const kiln_module *m, const char *name);
kiln_computation *kiln_module_entry(const kiln_module *m);

/* Appends an instruction to computation `comp`. `name` is copied; NULL makes
 * one up ("add.7"). The result has no operands, no attributes and an invalid
 * shape. NULL on out-of-memory. */
kiln_instr *kiln_module_add_instr(kiln_module *m, uint32_t comp, kiln_opcode op, const char *name);
static inline kiln_instr *kiln_module_instr(const kiln_module *m, kiln_id id) {
  return m->instrs[id];
}
int kiln_instr_set_operands(kiln_module *m, kiln_instr *ins, const kiln_id *ids, uint32_t n);
int kiln_instr_set_called(kiln_module *m, kiln_instr *ins, const uint32_t *comps, uint32_t n);
int kiln_instr_set_control(kiln_module *m, kiln_instr *ins, const kiln_id *ids, uint32_t n);
int kiln_instr_set_shape(kiln_module *m, kiln_instr *ins, const kiln_shape *shape);

/* Adds attribute `key` (replacing an existing one of that key, except for
 * KILN_ATTR_UNKNOWN) and returns its slot, value zeroed, for the caller to
 * fill with arena memory. NULL on out-of-memory. */
kiln_attr *kiln_instr_add_attr(kiln_module *m, kiln_instr *ins, kiln_attr_key key);
const kiln_attr *kiln_instr_attr(const kiln_instr *ins, kiln_attr_key key);
bool kiln_instr_has_attr(const kiln_instr *ins, kiln_attr_key key);
int64_t kiln_instr_attr_int(const kiln_instr *ins, kiln_attr_key key, int64_t dflt);

/* Whether reduce-window rw is an inclusive prefix scan along one dimension
 * (what cumsum, cumprod, cummax and cummin lower to): one input and its
 * init, the window as long as that dimension with its length - 1 of low
 * padding, every other window dimension 1, strides and dilations 1, result
 * of the input's dims; *dim is that dimension. Code generation runs it as
 * a scan, and fusion leaves it a kernel of its own. */
bool kiln_reduce_window_is_scan(const kiln_module *m, const kiln_instr *rw, uint32_t *dim);
/* The list of an INTS/SLICE/PADDING/PAIRS attribute, or NULL when absent. */
const kiln_i64s *kiln_instr_attr_ints(const kiln_instr *ins, kiln_attr_key key);
const char *kiln_instr_attr_str(const kiln_instr *ins, kiln_attr_key key);
/* Convenience builders (values copied into the module arena). */
int kiln_instr_set_attr_int(kiln_module *m, kiln_instr *ins, kiln_attr_key key, int64_t v);
int kiln_instr_set_attr_ints(kiln_module *m, kiln_instr *ins, kiln_attr_key key, const int64_t *v,
                             uint32_t n);
int kiln_instr_set_attr_str(kiln_module *m, kiln_instr *ins, kiln_attr_key key, const char *s);

/* Parameter instruction number `n` of a computation, or NULL. */
kiln_instr *kiln_computation_param(const kiln_module *m, const kiln_computation *c, int64_t n);
/* Number of parameters (1 + the highest parameter number; holes allowed
 * until verification). */
uint32_t kiln_computation_nparams(const kiln_module *m, const kiln_computation *c);
kiln_instr *kiln_computation_root(const kiln_module *m, const kiln_computation *c);

/* "computation/instruction" for error messages. */
void kiln_instr_where(const kiln_module *m, const kiln_instr *ins, char *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMPILER_IR_IR_H */
