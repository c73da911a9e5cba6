/* The executable: what the compiler produces, the cache stores and the
 * executor runs.
 *
 * A self-describing, versioned blob: a header (magic, format version,
 * compiler version, target, cache key), a buffer table (from buffer
 * assignment), parameter and result bindings, constants, a step program per
 * computation that runs on the host (kernel launches, library calls, copies,
 * nested programs for while/conditional/call), and the code object (an ELF
 * shared object for CPU targets, a cubin for CUDA). Kernels are named by
 * index only: the generated code exports kiln_kernel_<index>, so no string
 * from a client ever reaches generated source or the symbol table.
 *
 * Memory model at run time: every array value lives in a buffer slot. A slot
 * is a byte range of the device's temporary arena, a parameter, a constant
 * or an output. Tuples are not materialized: a tuple-shaped value is a list
 * of slots (its leaves, flattened depth-first).
 */
#ifndef KILN_COMPILER_CODEGEN_EXECUTABLE_H
#define KILN_COMPILER_CODEGEN_EXECUTABLE_H

#include <stddef.h>
#include <stdint.h>

#include "compiler/ir/ir.h"
#include "compiler/ir/lapack.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_EXE_MAGIC "KILNEXE1" /* 8 bytes */
/* 2: the convolution step; 3: the collective step; 4: the fft step; 5: the
 * code kind (a shared object or a cubin); 6: the debug-print step; 7: the
 * bounded-dynamic signature */
#define KILN_EXE_FORMAT_VERSION 7u
#define KILN_COMPILER_VERSION "0.1.0"

/* What the code object is. */
typedef enum kiln_code_kind {
  KILN_CODE_SO = 0,    /* an ELF shared object for the target's CPU (cpu backend) */
  KILN_CODE_CUBIN = 1, /* a cubin (ELF, machine EM_CUDA) for the target's sm (cuda backend):
                        * its functions are kiln_kernel_<N>, each launched over a grid */
} kiln_code_kind;

typedef enum kiln_slot_kind {
  KILN_SLOT_TEMP,     /* offset/size within the temporary arena */
  KILN_SLOT_PARAM,    /* leaf `leaf` of entry parameter `index` (caller's memory) */
  KILN_SLOT_CONSTANT, /* offset/size within the constants blob */
  KILN_SLOT_OUTPUT,   /* leaf `index` of the flattened result (allocated per run) */
} kiln_slot_kind;

typedef struct kiln_slot {
  kiln_slot_kind kind;
  uint32_t index;  /* PARAM: parameter number; OUTPUT: flattened result index */
  uint32_t leaf;   /* PARAM: leaf of a tuple-shaped parameter (0 for arrays) */
  uint64_t offset; /* TEMP / CONSTANT */
  uint64_t size;   /* bytes */
} kiln_slot;

typedef enum kiln_step_kind {
  /* Calls kernel `kernel` over the index range [0, range), split across
   * the device's worker threads in chunks; args are slot ids, passed to the
   * kernel as an array of base pointers in order. */
  KILN_STEP_KERNEL,
  /* C[b] = A[b] x B[b] for b in [0, batch): row-major views given by the
   * fields of kiln_gemm; args = {A, B, C}. Through BLAS on CPU. With more
   * args, an epilogue: kernel `kernel` (args[3..] its arguments) runs over
   * [0, range) as C's blocks are written, each block of rows right after
   * it, while it is in cache; iteration i covers elements [i*u, (i+1)*u)
   * of C, u = batch*m*n / range, which must divide n (C dense: ldc = n,
   * stride_c = m*n). */
  KILN_STEP_GEMM,
  /* memcpy of `bytes` from args[1] to args[0]. */
  KILN_STEP_COPY,
  /* Runs program `sub[0]` (condition: writes a pred into slot args[0]) and
   * while it is true program `sub[1]` (body). State lives in fixed slots. */
  KILN_STEP_WHILE,
  /* Reads the selector slot args[0] (pred: true -> sub[0], false ->
   * sub[1]; s32: index, out of range -> last) and runs that program. */
  KILN_STEP_CONDITIONAL,
  /* Runs program sub[0] (a call or an inlined computation). */
  KILN_STEP_CALL,
  /* out = convolution(lhs, rhs) as kiln_conv describes; args = {lhs, rhs,
   * out}. Through oneDNN on CPU (executor/cpu/cpu_conv.c). */
  KILN_STEP_CONV,
  /* A collective between the devices of a mesh, or this device's replica or
   * partition id, described by `coll` (kiln_coll below); args are the
   * nops operand slots, then the nops result slots (REPLICA_ID and
   * PARTITION_ID: one u32 result slot). The rank meets its group's members
   * at the gang launch's rendezvous (executor/comm.c). */
  KILN_STEP_COLLECTIVE,
  /* out = fft(in) as kiln_fft describes; args = {in, out}. Through FFTW on
   * CPU when it can be opened, else the direct DFT (executor/cpu/cpu_fft.c). */
  KILN_STEP_FFT,
  /* kiln.debug_print: args = {value, record}; the record, a constant slot,
   * holds the value's shape and the format (compiler/ir/debug_print.h);
   * the runtime renders it to the run's debug sink. */
  KILN_STEP_DEBUG_PRINT,
  /* A LAPACK factorization or solve over a batch of matrices as kiln_linalg
   * describes; args = the operands' slots, then the result leaves'. Through
   * OpenBLAS's LAPACK on CPU (executor/cpu/cpu_linalg.c). */
  KILN_STEP_LINALG,
} kiln_step_kind;

/* A collective step, with its replica groups resolved at compile time for
 * a mesh of replicas x partitions devices (device d = replica * partitions
 * + partition). Every operand i is outer[i] rows of equal bytes in its
 * physical layout (the rows of the split or gathered dimension: dims more
 * major than it; 1 for the others):
 * - ALL_REDUCE: result = `reduce` folded over the members, rank order;
 * - ALL_GATHER: result row = the members' rows one after another;
 * - REDUCE_SCATTER: result row = block `rank` of the reduced row;
 * - ALL_TO_ALL: outer[i] > 0: block j of the result row = block `rank` of
 *   member j's row; outer[i] == 0 (the tuple form, nops == gsize): result
 *   j = member j's operand `rank`;
 * - COLLECTIVE_PERMUTE: result = the operand of device source[d] (zeros
 *   when it is -1);
 * - COLLECTIVE_BROADCAST: result = member 0's operand. */
typedef struct kiln_coll {
  uint32_t op;     /* kiln_opcode (the synchronous form) */
  uint32_t reduce; /* kiln_opcode: ADD, MULTIPLY, MAXIMUM, MINIMUM, AND, OR */
  uint32_t dtype;  /* of the operands */
  uint32_t replicas, partitions;
  uint32_t nops;
  uint32_t gsize;    /* members per group */
  uint32_t *members; /* replicas * partitions rows of gsize: device d's group */
  int32_t *source;   /* COLLECTIVE_PERMUTE: per device, its source or -1 */
  uint64_t *outer;   /* nops */
} kiln_coll;

/* dtype F32 or F64: C = alpha A B + beta C in that type. S8 or U8: an
 * integer product, A of that type, B s8, C s32 (the exact sums, wrapping
 * as s32 does), alpha 1, beta 0, no epilogue; on CPU through oneDNN's int8
 * matmul (executor/cpu/cpu_igemm.c). */
typedef struct kiln_gemm {
  kiln_dtype dtype; /* F32, F64, S8 or U8 (C s32), BF16 (A and B bf16, C f32); others: a kernel */
  int64_t batch, m, n, k;
  int64_t lda, ldb, ldc;                /* leading dimensions, in elements */
  int64_t stride_a, stride_b, stride_c; /* between batches, in elements */
  uint8_t trans_a, trans_b;             /* 0/1 */
  double alpha, beta;
} kiln_gemm;

/* A convolution with its operands' layouts resolved: each operand is
 * described by the sizes and element strides of its dimensions in a fixed
 * role order, so every dim_labels permutation and every layout is the same
 * step. lhs and out: [batch, feature, spatial...]; rhs: [output feature,
 * input feature, spatial...]. Semantics are XLA's (see compiler/eval):
 * output feature o belongs to feature group o / (O / feature_groups) and to
 * batch group o / (O / batch_groups); out batch b reads lhs batch
 * b + group * (lhs batch / batch_groups). No window reversal. */
#define KILN_CONV_MAX_SPATIAL 3
#define KILN_CONV_MAX_DIMS (KILN_CONV_MAX_SPATIAL + 2)
typedef struct kiln_conv {
  kiln_dtype dtype;  /* of all three operands (F32 or F64) */
  uint32_t nspatial; /* 0 .. KILN_CONV_MAX_SPATIAL */
  int64_t feature_groups, batch_groups;
  int64_t lhs_dims[KILN_CONV_MAX_DIMS], lhs_strides[KILN_CONV_MAX_DIMS];
  int64_t rhs_dims[KILN_CONV_MAX_DIMS], rhs_strides[KILN_CONV_MAX_DIMS];
  int64_t out_dims[KILN_CONV_MAX_DIMS], out_strides[KILN_CONV_MAX_DIMS];
  /* per spatial dimension */
  int64_t stride[KILN_CONV_MAX_SPATIAL];
  int64_t pad_lo[KILN_CONV_MAX_SPATIAL], pad_hi[KILN_CONV_MAX_SPATIAL]; /* may be negative */
  int64_t lhs_dilate[KILN_CONV_MAX_SPATIAL], rhs_dilate[KILN_CONV_MAX_SPATIAL];
} kiln_conv;

/* An fft with its operands' layouts resolved: per logical dimension of the
 * operand and result, the size and element stride (elements of the side's
 * own type: complex, or real for RFFT's input and IRFFT's result). The
 * innermost `nfft` dims are transformed with lengths len[rank - nfft ..];
 * the others are a batch (len = the common size). Semantics are XLA's (see
 * compiler/eval/interp_linalg.c): FFT/IFFT complex to complex, RFFT real to
 * the half spectrum (last dim len/2 + 1), IRFFT its inverse; the inverses
 * scale by 1/N. dtype is the complex side's (C64: f32 real side). */
#define KILN_FFT_MAX_RANK 8
#define KILN_FFT_MAX_NFFT 3
typedef enum kiln_fft_type {
  KILN_FFT_FORWARD,
  KILN_FFT_INVERSE,
  KILN_FFT_REAL_FORWARD,
  KILN_FFT_REAL_INVERSE
} kiln_fft_type;
typedef struct kiln_fft {
  uint32_t type;  /* kiln_fft_type */
  uint32_t dtype; /* C64 or C128 */
  uint32_t rank;  /* 1 .. KILN_FFT_MAX_RANK */
  uint32_t nfft;  /* 1 .. KILN_FFT_MAX_NFFT, <= rank */
  int64_t len[KILN_FFT_MAX_RANK];
  int64_t in_dims[KILN_FFT_MAX_RANK], in_strides[KILN_FFT_MAX_RANK];
  int64_t out_dims[KILN_FFT_MAX_RANK], out_strides[KILN_FFT_MAX_RANK];
} kiln_fft;

/* A LAPACK call with its arguments' layouts resolved: `l` (see
 * compiler/ir/lapack.h) gives each argument's logical shape
 * (kiln_lapack_arg_dims), strides[i] the element stride of each of its
 * dims, so any layout is the same step; the runtime gathers each matrix
 * into a column-major work array and scatters the results back. */
#define KILN_LINALG_MAX_RANK (KILN_LAPACK_MAX_BATCH + 2)
typedef struct kiln_linalg {
  kiln_lapack l;
  int64_t strides[KILN_LAPACK_MAX_ARGS][KILN_LINALG_MAX_RANK];
} kiln_linalg;

typedef struct kiln_step {
  kiln_step_kind kind;
  uint32_t kernel; /* KERNEL */
  uint64_t range;  /* KERNEL: iterations; COPY: bytes */
  uint32_t *args;  /* slot ids */
  uint32_t nargs;
  uint32_t *sub; /* program ids (WHILE: 2, CONDITIONAL: n, CALL: 1) */
  uint32_t nsub;
  kiln_gemm gemm;      /* GEMM */
  kiln_conv *conv;     /* CONV (owned by the executable's arena); else NULL */
  kiln_fft *fft;       /* FFT (likewise); else NULL */
  kiln_linalg *linalg; /* LINALG (likewise); else NULL */
  kiln_coll coll;      /* COLLECTIVE */
} kiln_step;

typedef struct kiln_program {
  kiln_step *steps;
  uint32_t nsteps;
} kiln_program;

/* A flattened array value at the boundary (parameter leaf or result leaf). */
typedef struct kiln_binding {
  kiln_shape shape; /* array shape with layout */
  uint32_t slot;
} kiln_binding;

/* One runtime size at the boundary: dimension `dim` of the caller's
 * parameter number `leaf` (an array), or of result leaf `leaf`. */
typedef struct kiln_dyn_dim {
  uint32_t leaf;
  uint32_t dim;
} kiln_dyn_dim;

/* The caller's view of a program with bounded-dynamic shapes
 * (codegen/dyn_pad.c). The compiled program itself is static: every
 * dynamic dimension is stored at its bound (padded), its runtime size an
 * s32[] value. The entry takes the caller's nuser_params parameters at
 * their bounds, then nsize_params s32[] sizes (size_params[i] says whose);
 * its result is tuple(the caller's result, nsize_results s32[] sizes):
 * result leaves 0 .. nuser_results-1 are the caller's, then the sizes. */
typedef struct kiln_exe_dynamic {
  uint32_t nuser_params;
  kiln_shape *user_param_shapes; /* nuser_params, with their "<=" dims */
  kiln_shape user_result;        /* with its "<=" dims */
  uint32_t nuser_results;        /* array leaves of user_result */
  uint32_t nsize_params;
  kiln_dyn_dim *size_params; /* leaf = the caller's parameter number */
  uint32_t nsize_results;
  kiln_dyn_dim *size_results; /* leaf = the caller's result leaf */
} kiln_exe_dynamic;

typedef struct kiln_executable {
  /* header */
  uint32_t format_version;
  const char *compiler_version;
  const char *target; /* kiln_target name */
  uint8_t key[32];    /* cache key (zero when not computed) */
  /* entry signature */
  kiln_shape *param_shapes; /* nparams entry parameter shapes (may be tuples) */
  uint32_t nparams;
  kiln_shape result_shape; /* the entry's result (may be a tuple) */
  kiln_binding *params;    /* flattened parameter leaves, in order */
  uint32_t nparam_leaves;
  kiln_binding *results; /* flattened result leaves, in order */
  uint32_t nresults;
  /* memory */
  kiln_slot *slots;
  uint32_t nslots;
  uint64_t temp_bytes; /* size of the temporary arena */
  uint64_t peak_bytes; /* buffer assignment's peak live bytes */
  uint8_t *constants;  /* constants blob */
  uint64_t nconstants;
  /* code */
  kiln_program *programs; /* programs[0] is the entry */
  uint32_t nprograms;
  uint32_t nkernels;  /* kernels are kiln_kernel_0 .. kiln_kernel_{n-1} */
  uint32_t code_kind; /* kiln_code_kind */
  uint8_t *code;      /* ELF shared object (CPU) or cubin (CUDA) */
  uint64_t ncode;
  /* NULL for a static program; else the caller's signature (above). The
   * entry signature above is then the padded program's, sizes included. */
  kiln_exe_dynamic *dyn;
  kiln_arena *arena; /* owns everything above */
  /* In process only (not serialized; NULL after deserialize): for
   * programs[p].steps[i], the instruction it was lowered from, as
   * "name opcode" (a fusion: "name fusion(root opcode)"), and the op_name
   * of its metadata ("" when none), for profiles. In `arena`. */
  const char ***step_names;
  const char ***step_op_names;
} kiln_executable;

/* Kernel ABI (CPU): void kiln_kernel_N(void *const *bufs, int64_t begin,
 * int64_t end) computes iterations [begin, end). */
typedef void (*kiln_kernel_fn)(void *const *bufs, int64_t begin, int64_t end);

kiln_executable *kiln_executable_create(void);
void kiln_executable_destroy(kiln_executable *e);

/* Serializes to one contiguous blob (little-endian, versioned). Loading it
 * back gives a bit-identical blob when serialized again. */
int kiln_executable_serialize(const kiln_executable *e, uint8_t **buf, size_t *len,
                              kiln_status *st);
/* Parses a blob; every count, offset, slot id and program id is checked
 * (the input may be hostile or truncated). A blob of another format version
 * or magic is KILN_EINVAL with a message saying so. */
int kiln_executable_deserialize(const uint8_t *buf, size_t len, kiln_executable **out,
                                kiln_status *st);

/* Whether c is a well-formed convolution whose operands fit in lhs_bytes,
 * rhs_bytes and out_bytes; on false, why[] says what is wrong. */
bool kiln_conv_check(const kiln_conv *c, uint64_t lhs_bytes, uint64_t rhs_bytes, uint64_t out_bytes,
                     char *why, size_t nwhy);
/* The direct loop (accumulating in double): the reference for the step
 * and the fallback when no library takes it. c must pass kiln_conv_check. */
void kiln_conv_reference(const kiln_conv *c, const void *lhs, const void *rhs, void *out);
/* Whether f is a well-formed fft whose operand and result fit in in_bytes
 * and out_bytes; on false, why[] says what is wrong. */
bool kiln_fft_check(const kiln_fft *f, uint64_t in_bytes, uint64_t out_bytes, char *why,
                    size_t nwhy);
/* The direct DFT in double, axis by axis as the interpreter computes it:
 * the reference for the step and the fallback without FFTW. f must pass
 * kiln_fft_check; KILN_ENOMEM when its work array cannot be allocated. */
int kiln_fft_reference(const kiln_fft *f, const void *in, void *out);
/* Whether g is a well-formed LAPACK step over nargs slots of the given
 * sizes (bytes); on false, why[] says what is wrong. */
bool kiln_linalg_check(const kiln_linalg *g, uint32_t nargs, const uint64_t *slot_bytes, char *why,
                       size_t nwhy);
/* Whether GEMM step g's operands lie within their slots (args[0..2]: A, B,
 * C, already in range): transpose flags 0 or 1, each leading dimension at
 * least its row and within int32, each operand's batches within its slot
 * (elements of g's type; C of s32 for s8/u8 and of f32 for bf16), C's
 * batches apart. On false, why[] says what is wrong. */
bool kiln_gemm_check_extents(const kiln_gemm *g, const uint32_t *args, const kiln_slot *slots,
                             char *why, size_t nwhy);
/* Why collective step c (with nargs slot ids args into slots, already in
 * range) is malformed, or NULL when it is well formed: groups, sources,
 * reduction, element type and every slot's size. */
const char *kiln_coll_check(const kiln_coll *c, uint32_t nargs, const kiln_slot *slots,
                            const uint32_t *args);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMPILER_CODEGEN_EXECUTABLE_H */
