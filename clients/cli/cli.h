/* Internals shared by the kiln command's files.
 *
 * main.c holds the command table and the one validation point: it parses
 * every command line against the command's option table into a kiln__args
 * before any handler runs, so handlers only see well-formed requests and
 * usage errors look the same everywhere. Handlers return the process exit
 * code (KILN_EXIT_*).
 */
#ifndef KILN_CLIENTS_CLI_CLI_H
#define KILN_CLIENTS_CLI_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/status.h"
#include "compiler/ir/ir.h"

/* Exit codes; `kiln --help` documents them. */
enum {
  KILN_EXIT_OK = 0,
  KILN_EXIT_INVALID =
      1,               /* the input was rejected: parse, verify, arguments, files, unsupported op */
  KILN_EXIT_USAGE = 2, /* the command line is wrong */
  KILN_EXIT_INTERNAL = 3, /* out of memory or a bug in kiln */
};

#define KILN_CLI_MAX_OPTS 24

typedef struct kiln__opt {
  const char *name;    /* long name without "--" */
  char shortname;      /* 0 when none */
  const char *metavar; /* value placeholder; NULL for a flag; with a space
                        * ("K FILES") the option takes two values, stored
                        * one after the other in its value list */
  bool repeat;         /* may be given several times (values kept in order) */
  const char *help;
} kiln__opt;

struct kiln__args;

typedef struct kiln__cmd {
  const char *name;
  const char *synopsis;  /* "check FILE..." */
  const char *summary;   /* one line for `kiln --help` */
  const char *help;      /* the rest of `kiln help CMD` */
  const kiln__opt *opts; /* terminated by a zero entry */
  int min_pos, max_pos;  /* positional argument count; max -1: unlimited */
  int (*run)(const struct kiln__args *a);
  /* With --server HOST:PORT: the handler that asks the server instead
   * (remote.c); NULL when the command has no remote mode. */
  int (*remote)(const struct kiln__args *a);
} kiln__cmd;

/* A validated command line. Option values point into argv. */
typedef struct kiln__args {
  const kiln__cmd *cmd;
  const char **pos;
  int npos;
  const char **vals[KILN_CLI_MAX_OPTS]; /* per option of cmd->opts, in given order */
  int nvals[KILN_CLI_MAX_OPTS];
} kiln__args;

/* The last value of option `name` (or "" for a given flag); NULL if absent. */
const char *kiln__args_get(const kiln__args *a, const char *name);
/* All values of a repeatable option, in order. */
const char **kiln__args_all(const kiln__args *a, const char *name, int *n);

int kiln__cmd_check(const kiln__args *a);
int kiln__cmd_print(const kiln__args *a);
int kiln__cmd_run(const kiln__args *a);
int kiln__cmd_compile(const kiln__args *a);
int kiln__cmd_stats(const kiln__args *a);
int kiln__cmd_top(const kiln__args *a); /* cmd_top.c */
int kiln__cmd_dot(const kiln__args *a);
int kiln__cmd_explain(const kiln__args *a);
int kiln__cmd_bench(const kiln__args *a);
int kiln__cmd_cache(const kiln__args *a);
int kiln__cmd_kernel(const kiln__args *a); /* cmd_kernel.c */
/* --user-kernel NAME=FILE.c:SIGNATURE (repeatable): the kernels compiled
 * and registered in this process, *out NULL when none is given (the
 * registry lives until exit). An exit code; errors printed. */
struct kiln_user_kernels;
int kiln__user_kernels_parse(const kiln__args *a, const struct kiln_user_kernels **out);

/* Remote modes (remote.c, through libkiln): the same contract as the local
 * handlers (output, diagnostics, exit codes). */
int kiln__remote_check(const kiln__args *a);
int kiln__remote_compile(const kiln__args *a);
int kiln__remote_run(const kiln__args *a);
int kiln__remote_bench(const kiln__args *a);

/* For other remote commands (cmd_cache.c): connects to --server (an exit
 * code; usage errors printed), and prints a failed call as "WHAT: error:
 * MESSAGE [CODE]" returning its exit code. */
typedef struct kiln_client kiln_client;
int kiln__remote_connect(const kiln__args *a, kiln_client **out);
int kiln__remote_report(const char *what, const kiln_status *st);

/* Exit code for a KILN_E* code: out of memory and internal errors are 3,
 * everything else a rejected input (1). */
int kiln__exit_code(int err);

/* Prints a status on stderr as "FILE:LINE:COL: error: MESSAGE". The where of
 * a parse error already is "FILE:LINE:COL"; a verifier or interpreter where
 * ("computation/instruction") is turned into the instruction's position by
 * looking it up in `m` (may be NULL), falling back to "FILE: error: ...". */
void kiln__report(const char *file, const kiln_module *m, const kiln_status *st);

/* Reads and decodes a module (.pb/.binpb: binary kiln.v1.Module, otherwise
 * HLO text), then verifies it when `verify` is set. Diagnostics go to
 * stderr; returns an exit code, and *out (owned by the caller) on success. */
int kiln__module_load(const char *path, bool verify, kiln_module **out);

/* The deepest nesting of called computations a loaded module may have:
 * KILN_MAX_NESTING from the environment (as kilnd's --max-nesting), else
 * the verifier's default. Modules built by a transform are checked against
 * KILN_VERIFY_MAX_NESTING instead: the transform adds a few levels. */
uint32_t kiln__max_nesting(void);

/* ---- compiler options (copts.c) ------------------------------------------ */

typedef struct kiln_compile_options kiln_compile_options;

/* Serialized executables: `kiln compile -o` writes them, `kiln run` takes them. */
#define KILN_EXECUTABLE_SUFFIX ".kexe"

/* Fills `o` (after kiln_compile_options_init) from the command's --target,
 * --opt-level, --disable-pass and --dump-dir, checked against the known
 * targets and passes; *given says whether any was on the command line.
 * Returns an exit code (usage errors printed). Pointers refer to argv. */
int kiln__compile_options_parse(const kiln__args *a, kiln_compile_options *o, bool *given);
/* --backend NAME of command `cmd`. In process (remote false) NAME must be
 * a backend registered here with every KILN_BACKEND_* bit of `caps`;
 * through a server (remote true) any registered backend or one the target
 * table names (a server may have it) will do. An unknown name prints the
 * one message both paths share and is KILN_EXIT_USAGE. */
int kiln__backend_check(const char *cmd, const char *name, unsigned caps, bool remote);
/* "0".."3" into *out; a usage error naming `cmd` otherwise. */
/* --memory-budget BYTES (a positive integer, K/M/G for KiB/MiB/GiB);
 * prints the usage error itself. */
int kiln__memory_budget_parse(const char *cmd, const char *text, uint64_t *out);
int kiln__opt_level_parse(const char *cmd, const char *text, int *out);
/* A serialized executable: named *.kexe, or starting with the format's
 * magic (head may be NULL when the contents are not read yet). */
bool kiln__is_executable_file(const char *path, const uint8_t *head, size_t len);

/* ---- auto-sharding (autoshard.c) ------------------------------------------ */

/* --auto-shard was given. */
bool kiln__auto_shard_wanted(const kiln__args *a);
/* --mesh / --memory-budget only with --auto-shard, which needs
 * --partitions: an exit code (usage errors printed). */
int kiln__auto_shard_check(const kiln__args *a);
/* Auto-shards m in place over `partitions` devices with the command's
 * --mesh and --memory-budget and prints the plan's modelled cost to `out`
 * (and into *cost, when not NULL); an exit code (errors reported against
 * `file`). */
typedef struct kiln_spmd_cost kiln_spmd_cost;
int kiln__auto_shard(const kiln__args *a, const char *file, kiln_module *m, int64_t partitions,
                     FILE *out, kiln_spmd_cost *cost);
/* The partitioner's options: kiln_spmd_options_init's (the environment),
 * then --windowed-einsum auto|on|off and --windowed-einsum-bytes BYTES
 * where the command takes them; an exit code. */
typedef struct kiln_spmd_options kiln_spmd_options;
int kiln__spmd_options(const kiln__args *a, kiln_spmd_options *o);

/* ---- arguments and results (args.c) ------------------------------------- */

/* Builds the argument literal for a parameter of shape `want` from `spec`:
 * an .npy path (when it ends in ".npy") or HLO literal text. A float32 .npy
 * feeds a bf16 parameter (rounded to nearest even); any other dtype or shape
 * mismatch is an error naming parameter `pnum`, expected and found. */
int kiln__arg_load(const char *spec, const kiln_shape *want, int64_t pnum, kiln_literal **out,
                   kiln_status *st);

/* Device K's arguments from --device-args K "FILE,FILE,..." into
 * dev[0..n) (shapes[i] is parameter i's); 0 or an exit code, the problem
 * printed. Commas inside braces or brackets belong to an HLO literal. */
int kiln__device_args(const char *file, const char *k_text, const char *list,
                      const kiln_shape *shapes, uint32_t n, kiln_literal **dev);
/* Every --device-args K LIST of a, for a mesh of ndev devices: device K's
 * arguments into own[K * n ..), has_own[K] set; 0 or an exit code, the
 * problem (a device number out of range or given twice) printed. */
int kiln__device_args_all(const kiln__args *a, const char *file, uint32_t ndev,
                          const kiln_shape *shapes, uint32_t n, kiln_literal **own, bool *has_own);

/* The shape of an argument spec (an .npy file's array, or literal text),
 * allocated in `a`: what vmap batch sizes are inferred from. */
int kiln__arg_shape(const char *spec, kiln_arena *a, kiln_shape *out, kiln_status *st);
/* The shapes of every --arg of the command line, in order, allocated in
 * `ar` (*out is never NULL on success, also when none is given). */
int kiln__arg_shapes(const struct kiln__args *a, kiln_arena *ar, const kiln_shape ***out,
                     uint32_t *n, kiln_status *st);

/* A deterministic pseudo-random literal of `shape` (tuples recursively):
 * floats in [-1, 1) on a grid exact in the element type, signed ints in
 * [-8, 8), unsigned ints in [0, 16), pred fair coins. `state` advances. */
int kiln__arg_random(const kiln_shape *shape, uint64_t *state, kiln_literal **out, kiln_status *st);

/* The leaves of a (nested) tuple literal depth-first, or the literal itself.
 * *leaves is kiln_malloc'd. */
int kiln__literal_leaves(const kiln_literal *lit, const kiln_literal ***leaves, uint32_t *n);

/* Writes an array literal as .npy: bf16 and the f8 types as float32 (exact),
 * s2/s4 as int8, u2/u4 as uint8, everything else in its own dtype. */
int kiln__literal_write_npy(const kiln_literal *lit, const char *path, kiln_status *st);

#endif /* KILN_CLIENTS_CLI_CLI_H */
