/* The kiln command: a table of subcommands and the one place that validates
 * command lines.
 *
 * Each subcommand is one row of `commands` (name, synopsis, help, option
 * table, positional count, handler), as in Redis's command table. main()
 * finds the row, answers --help itself, parses the options against the row
 * into a kiln__args (unknown options, missing values, wrong positional
 * counts are usage errors, exit 2) and only then calls the handler. Adding
 * a subcommand is adding a row and a handler file.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/cli/cli.h"
#include "common/alloc.h"
#include "executor/cpu/cpu_blas.h"

/* How to reach a secured kilnd: every command with --server takes these. */
#define KILN_SERVER_SECURITY_OPTS \
  {"tls-ca", 0, "FILE", false, \
   "connect with TLS, trusting the PEM CA certificates in FILE (KILN_TLS_CA)"}, \
      {"tls-cert", 0, "FILE", false, \
       "mutual TLS: this client's PEM certificate (with --tls-key; KILN_TLS_CERT)"}, \
      {"tls-key", 0, "FILE", false, "mutual TLS: this client's PEM private key (KILN_TLS_KEY)"}, { \
    "token", 0, "TOKEN", false, \
        "bearer token for a server with --tokens (default: the environment variable " \
        "KILN_TOKEN; flags show in ps, the environment does not)" \
  }

/* Auto-sharding before partitioning: run, compile and bench take these. */
/* The partitioner's windowed einsum: compile and bench take these. */
#define KILN_WINDOWED_OPTS \
  {"windowed-einsum", 0, "MODE", false, \
   "with --partitions: dots whose operand would be all-gathered along a dim they do not " \
   "contract loop over its blocks around the ring instead: auto (when the gathered copy " \
   "would hold at least --windowed-einsum-bytes, default 1M), on or off"}, \
  { \
    "windowed-einsum-bytes", 0, "BYTES", false, \
        "auto's threshold for --windowed-einsum (K, M, G suffixes)" \
  }

/* Auto-sharding before partitioning: run, compile and bench take these. */
#define KILN_AUTO_SHARD_OPTS \
  {"auto-shard", 0, NULL, false, \
   "with --partitions P: choose shardings for the module (its own annotations stay) by an " \
   "integer program over the modelled per-device cost, and print that cost"}, \
  { \
    "mesh", 0, "AxB", false, \
        "with --auto-shard: the device mesh the shardings split along (default: one axis of " \
        "P); --memory-budget also bounds the bytes per device of its plan" \
  }

static const kiln__opt check_opts[] = {
    {"server", 0, "HOST:PORT", false,
     "ask the kilnd at HOST:PORT to verify the modules (it compiles them for its interpreter "
     "at optimization level 0, without its cache)"},
    KILN_SERVER_SECURITY_OPTS,
    {0},
};

static const kiln__opt print_opts[] = {
    {"proto", 0, NULL, false, "write the binary kiln.v1.Module instead of text"},
    {"output", 'o', "OUT", false, "write to OUT instead of standard output"},
    {0},
};

static const kiln__opt run_opts[] = {
    {"server", 0, "HOST:PORT", false,
     "compile and run on the kilnd at HOST:PORT; arguments are matched against the signature "
     "it returns"},
    KILN_SERVER_SECURITY_OPTS,
    {"backend", 0, "NAME", false,
     "where to run: interp (the reference interpreter, default) or cpu (compiled to native "
     "code)"},
    {"arg", 0, "ARG", true,
     "the next parameter's value: an .npy file (a path ending in .npy) or HLO literal text "
     "such as 'f32[2] {1, 2}'"},
    {"random-args", 0, "SEED", false,
     "fill the parameters not given by --arg with deterministic pseudo-random values: floats "
     "in [-1,1), signed ints in [-8,8), unsigned ints in [0,16), random preds"},
    {"out", 0, "DIR", false,
     "also write the outputs as DIR/0.npy, DIR/1.npy, ... (DIR is created when missing)"},
    {"timeout", 0, "SECONDS", false,
     "stop the run after SECONDS of wall-clock time (exit 1); default: no limit"},
    {"max-iterations", 0, "N", false,
     "stop any while loop that runs more than N iterations (exit 1); default: 1000000000"},
    {"transform", 0, "SPEC", true,
     "run the transformed program, transforms innermost first: grad, grad:wrt=0,1, "
     "grad:wrt=0,output=1, vjp, jvp:wrt=0, vmap:in_axes=0,none (batch size from the "
     "arguments, or size=N), checkpoint, autocast:bf16 or autocast:f16 (mixed precision); "
     "--arg values then follow its parameters"},
    {"target", 0, "NAME", false,
     "cpu code target: native (this machine, default) or an ISA level such as x86-64-v3, "
     "with or without cpu- (an unknown name lists them all)"},
    {"opt-level", 'O', "N", false, "cpu: optimization level 0-3 (default 2)"},
    {"disable-pass", 0, "NAME", true, "cpu: switch compiler pass NAME off"},
    {"dump-dir", 0, "DIR", false,
     "cpu: write the module after each pass (NN-pass.hlo, .dot) and the generated C into DIR"},
    {"memory-budget", 0, "BYTES", false,
     "cpu: hold at most BYTES of temporaries live at once (K, M, G suffixes: KiB, MiB, GiB), "
     "recomputing values instead of keeping them; unreachable: exit 1 naming the smallest peak"},
    {"replicas", 0, "R", false,
     "run a per-device program on R x P devices (default: the module's replica_count, else 1)"},
    {"partitions", 0, "P", false,
     "run a per-device program on R x P devices (default: the module's num_partitions, else 1)"},
    {"device-args", 0, "K FILES", true,
     "device K's arguments, comma-separated (as --arg values); other devices get the --arg "
     "values"},
    {"user-kernel", 0, "NAME=FILE.c:SIG", true,
     "cpu: compile the C kernel in FILE.c with signature SIG for the module's custom calls of "
     "kiln.user.NAME (its code runs in this process; docs/toolbox.md)"},
    KILN_AUTO_SHARD_OPTS,
    {0},
};

static const kiln__opt explain_opts[] = {
    {"target", 0, "NAME", false, "cpu code target whose cost model fusion uses (default cpu)"},
    {"opt-level", 'O', "N", false, "optimization level 0-3 (default 2)"},
    {"disable-pass", 0, "NAME", true, "switch compiler pass NAME off"},
    {"transform", 0, "SPEC", true, "apply a function transform first, innermost first"},
    {"memory-budget", 0, "BYTES", false,
     "hold at most BYTES of temporaries live at once (K, M, G suffixes: KiB, MiB, GiB), "
     "recomputing values instead of keeping them; unreachable: exit 1 naming the smallest peak"},
    {0},
};

static const kiln__opt dot_opts[] = {
    {"after", 0, "PASS", false,
     "draw the module after pass PASS of the pipeline ('input': before any pass; default: "
     "after the whole pipeline)"},
    {"output", 'o', "OUT", false, "write to OUT instead of standard output"},
    {"target", 0, "NAME", false, "cpu code target the pipeline plans for (default cpu)"},
    {"opt-level", 'O', "N", false, "optimization level 0-3 (default 2)"},
    {"disable-pass", 0, "NAME", true, "switch compiler pass NAME off"},
    {"memory-budget", 0, "BYTES", false,
     "draw the program as rematerialization leaves it under a budget of BYTES (K, M, G)"},
    {0},
};

static const kiln__opt bench_opts[] = {
    {"server", 0, "HOST:PORT", false,
     "compile on the kilnd at HOST:PORT, put the arguments there once and time Execute calls "
     "by handle (round trip and the server's run time)"},
    KILN_SERVER_SECURITY_OPTS,
    {"backend", 0, "NAME", false, "cpu (default) or interp"},
    {"iters", 0, "N", false, "timed runs (default 20)"},
    {"warmup", 0, "N", false, "untimed runs first (default 1)"},
    {"arg", 0, "ARG", true,
     "the next parameter's value (.npy file or HLO literal text), as for run; the "
     "parameters not given are pseudo-random"},
    {"random-args", 0, "SEED", false, "seed of the pseudo-random arguments (default 0)"},
    {"target", 0, "NAME", false, "cpu code target (default cpu)"},
    {"opt-level", 'O', "N", false, "optimization level 0-3 (default 2)"},
    {"disable-pass", 0, "NAME", true, "switch compiler pass NAME off"},
    {"transform", 0, "SPEC", true,
     "time the transformed program, transforms innermost first: grad, vjp, jvp, "
     "vmap:in_axes=0,size=N, checkpoint, autocast:bf16"},
    {"profile", 0, NULL, false,
     "time every fused kernel, GEMM and convolution step; print a table on stderr"},
    {"trace", 0, "FILE", false, "write the last timed run as Chrome trace JSON (Perfetto)"},
    {"memory-budget", 0, "BYTES", false,
     "cpu: hold at most BYTES of temporaries live at once (K, M, G suffixes: KiB, MiB, GiB), "
     "recomputing values instead of keeping them; unreachable: exit 1 naming the smallest peak"},
    {"partitions", 0, "P", false,
     "partition a module whose ENTRY carries shardings over P devices and time gang runs on "
     "them (the JSON gains \"partitions\" and \"collectives\")"},
    {"replicas", 0, "R", false,
     "with --partitions: time the gang of R replicas x P partitions (the JSON gains "
     "\"replicas\" and \"mesh_collectives\")"},
    KILN_WINDOWED_OPTS,
    {"user-kernel", 0, "NAME=FILE.c:SIG", true,
     "compile the C kernel in FILE.c for custom calls of kiln.user.NAME, as for run"},
    KILN_AUTO_SHARD_OPTS,
    {0},
};

static const kiln__opt compile_opts[] = {
    {"server", 0, "HOST:PORT", false, "compile on the kilnd at HOST:PORT"},
    {"shapes", 0, "SPEC", true,
     "with --server: compile for the argument shapes SPEC (f32[8,3];s32[]) into the server's "
     "cache; repeat for several signatures"},
    KILN_SERVER_SECURITY_OPTS,
    {"backend", 0, "NAME", false, "cpu (the default here); a server may also offer interp, cuda"},
    {"target", 0, "TARGET", false, "code target within the backend (a CPU ISA, sm_XX)"},
    {"opt-level", 'O', "N", false, "optimization level 0-3 (default 2)"},
    {"transform", 0, "SPEC", true,
     "apply a function transform, innermost first: grad, grad:wrt=0,1, vjp, jvp, vmap, "
     "vmap:in_axes=0,none, checkpoint"},
    {"output", 'o', "OUT", false, "write the serialized executable to OUT"},
    {"memory-budget", 0, "BYTES", false,
     "hold at most BYTES of temporaries live at once (K, M, G suffixes: KiB, MiB, GiB), "
     "recomputing values instead of keeping them; unreachable: exit 1 naming the smallest peak"},
    {"progress", 0, NULL, false,
     "--server: print the server's phases on stderr, one line each (on a terminal they are "
     "shown on one updating line without this flag)"},
    {"deadline", 0, "SECONDS", false,
     "--server: give up after SECONDS (DEADLINE_EXCEEDED); the server waits at most half of "
     "it for another server's build of the same program, then builds it itself"},
    {"partitions", 0, "P", false,
     "partition a module whose ENTRY carries shardings over P devices and report the "
     "collectives inserted"},
    {"replicas", 0, "R", false,
     "with --partitions: on R replicas of P partitions (device K = replica x P + partition); "
     "the collectives of the whole mesh too"},
    KILN_WINDOWED_OPTS,
    {"dump-dir", 0, "DIR", false,
     "with --partitions: write the module after propagation and after partitioning to DIR"},
    KILN_AUTO_SHARD_OPTS,
    {0},
};

static const kiln__opt cache_opts[] = {
    {"server", 0, "HOST:PORT", false, "the kilnd whose cache to ask"},
    KILN_SERVER_SECURITY_OPTS,
    {"all", 0, NULL, false, "evict: every entry"},
    {"shared", 0, NULL, false, "evict: from the shared Redis tier too"},
    {"limit", 0, "N", false, "list: at most N entries (default: the server's, 1000)"},
    {"components", 0, NULL, false, "list: also print each entry's key components"},
    {"backend", 0, "NAME", false, "explain: the backend the keys are for, cpu (default) or interp"},
    {"target", 0, "TARGET", false, "explain: the code target, as for compile (default native)"},
    {"opt-level", 'O', "N", false, "explain: optimization level 0-3 (default 2)"},
    {0},
};

static const kiln__opt kernel_opts[] = {
    {"server", 0, "HOST:PORT", false, "the kilnd to register the kernel with"},
    KILN_SERVER_SECURITY_OPTS,
    {"signature", 0, "SIG", false,
     "operands -> results, e.g. 'f32[1024], f32[1024] -> f32[1024]', '; grid=N' for a "
     "block-indexed kernel"},
    {"cuda", 0, "FILE.cu", false, "CUDA C of the same kernel, compile-checked with NVRTC"},
    {0},
};

static const kiln__opt top_opts[] = {
    {"server", 0, "HOST:PORT", false, "the kilnd to watch (required)"},
    KILN_SERVER_SECURITY_OPTS,
    {"once", 0, NULL, false, "print one screen and exit"},
    {0},
};

static const kiln__opt stats_opts[] = {
    {"server", 0, "HOST:PORT", false, "the kilnd to ask (required)"},
    KILN_SERVER_SECURITY_OPTS,
    {"counters", 0, NULL, false, "also list every counter, as NAME{LABELS} VALUE"},
    {0},
};

/* kiln__args keeps one value list per option: tables must fit in it. */
#define FITS(t) _Static_assert(sizeof t / sizeof t[0] <= KILN_CLI_MAX_OPTS + 1, #t " too long")
FITS(check_opts);
FITS(print_opts);
FITS(run_opts);
FITS(compile_opts);
FITS(stats_opts);
FITS(dot_opts);
FITS(explain_opts);
FITS(bench_opts);
FITS(cache_opts);
FITS(kernel_opts);

static const kiln__cmd commands[] = {
    {"check", "check [--server HOST:PORT] FILE...", "parse and verify modules",
     "Parses and verifies each FILE (HLO text; binary kiln.v1.Module when the name ends in\n"
     ".pb or .binpb). Prints nothing and exits 0 when all are valid; otherwise prints one\n"
     "diagnostic per invalid file on stderr, as\n"
     "  FILE:LINE:COL: error: MESSAGE                           (parse errors)\n"
     "  FILE:LINE:COL: error: COMPUTATION/INSTRUCTION: MESSAGE  (verifier errors)\n"
     "and exits 1. With --server the server verifies them and its message is printed as\n"
     "  FILE: error: MESSAGE\n",
     check_opts, 1, -1, kiln__cmd_check, kiln__remote_check},
    {"print", "print [--proto] [-o OUT] FILE", "print a module in canonical form",
     "Parses FILE and prints it as canonical HLO text (or, with --proto, as a binary\n"
     "kiln.v1.Module, which needs -o or a redirected standard output). The module is not\n"
     "verified, so invalid modules can be inspected; a parse error exits 1.\n",
     print_opts, 1, 1, kiln__cmd_print, NULL},
    {"run",
     "run FILE [--backend interp|cpu] [--arg ARG]... [--random-args SEED] [--out DIR]\n"
     "         [--timeout SECONDS] [--max-iterations N] [--transform SPEC]...\n"
     "         [--target T] [-O N] [--disable-pass NAME]... [--dump-dir DIR]\n"
     "         [--memory-budget BYTES] [--replicas R] [--partitions P] [--device-args K FILES]...",
     "run a module's ENTRY computation",
     "Verifies FILE and runs its ENTRY computation. Arguments are given in parameter order;\n"
     "their number and shapes must match the parameters (layouts are ignored). An .npy\n"
     "argument must have the parameter's dtype, except that a float32 array may feed a\n"
     "bf16 parameter (rounded to nearest even). Each output is printed on its own line as\n"
     "HLO literal text; a tuple result is flattened depth-first. With --out, output i is\n"
     "also written to DIR/i.npy: bf16 and f8 outputs as float32 (exact), s4/s2 as int8,\n"
     "u4/u2 as uint8; token outputs are printed but have no file. A program that does\n"
     "not finish (a while loop whose condition stays true) is stopped by --max-iterations\n"
     "or --timeout with exit status 1. With --transform the program is first transformed\n"
     "(grad, vjp, jvp, vmap, checkpoint; innermost first, so --transform grad --transform\n"
     "vmap runs vmap of grad) and the arguments and outputs are the transformed program's:\n"
     "grad prints the value then the gradients, jvp takes the tangents after the\n"
     "parameters.\n"
     "\n"
     "With --backend cpu the module is compiled to native code first (--target, -O,\n"
     "--disable-pass and --dump-dir steer the compiler) and runs on a cpu device; an\n"
     "operation the compiler does not support exits 1 naming the instruction. FILE may\n"
     "also be a serialized executable from 'kiln compile -o FILE.kexe' (recognized by its\n"
     "name or its contents), which runs on the cpu backend as compiled.\n"
     "\n"
     "With --replicas R and/or --partitions P the module is a per-device program (explicit\n"
     "collectives, replica-id, partition-id: XLA's collective tests, compile().as_text())\n"
     "run on R x P devices of the interp backend, device K = replica x P + partition.\n"
     "Every device gets the --arg values unless --device-args K FILE,FILE,... gives device\n"
     "K its own. Outputs are printed per device after a line 'device K:'; with --out DIR\n"
     "device K's outputs go to DIR/deviceK/i.npy.\n"
     "\n"
     "A module whose ENTRY carries shardings over global shapes (jax.jit with in_shardings,\n"
     "exported with as_text(dialect=\"hlo\")) is a global program: with --partitions P it is\n"
     "partitioned over P devices, the --arg values (global arrays) are split by the\n"
     "parameters' shardings, the P programs run as one gang (interp or cpu) and the global\n"
     "result is printed, as PJRT runs it; with --replicas R as well, each replica runs it\n"
     "on its own P devices (device K = replica x P + partition) and prints its result\n"
     "after a line 'replica r:' (--out DIR: DIR/replicaR/i.npy). --dump-dir (cpu) shows\n"
     "the module after\n"
     "propagation and after partitioning; 'kiln compile --partitions P' reports the\n"
     "collectives. --auto-shard chooses shardings first (any module: the annotations it\n"
     "carries stay) and prints the plan's modelled cost on stderr.\n",
     run_opts, 1, 1, kiln__cmd_run, kiln__remote_run},
    {"compile",
     "compile FILE [--server HOST:PORT] [--backend B] [--target T] [-O N]\n"
     "         [--transform SPEC]... [--memory-budget BYTES] [-o OUT]\n"
     "         [--partitions P [--replicas R] [--dump-dir DIR] [--windowed-einsum MODE]]\n"
     "         [--auto-shard [--mesh AxB]]",
     "compile a module to an executable",
     "Verifies FILE, applies the transforms (innermost first) and compiles it. Locally the\n"
     "native CPU compiler runs in process and a summary is printed (kernels, code size,\n"
     "timings); -o writes the serialized executable. With --server the server compiles it\n"
     "(or finds it in its cache) and the executable id, cache source and key, and the\n"
     "calling convention are printed. With --partitions P a module whose ENTRY carries\n"
     "shardings is partitioned first (one program per device, driven by partition-id) and\n"
     "the collectives inserted are reported: count and bytes per device per run, by kind;\n"
     "with --replicas R on R replicas of P partitions, and those of the whole mesh too.\n"
     "--windowed-einsum on|off|auto decides whether a dot whose operand would be gathered\n"
     "along a dim it does not contract loops over its blocks around the ring instead\n"
     "(auto: from --windowed-einsum-bytes of gathered copy, default 1M; the environment's\n"
     "KILN_SPMD_WINDOWED and KILN_SPMD_WINDOWED_BYTES otherwise).\n"
     "--auto-shard (and -O 3 with --partitions) first chooses the shardings the module\n"
     "does not carry (docs/spmd.md), within --memory-budget per device when given, and\n"
     "prints the plan's modelled cost.\n"
     "With --memory-budget BYTES the compiler recomputes values rather than keep them live\n"
     "until the peak of live temporaries fits (rematerialization) and prints the peak\n"
     "before and after and the flops added; a budget it cannot reach exits 1 naming the\n"
     "smallest peak it reached.\n",
     compile_opts, 1, 1, kiln__cmd_compile, NULL},
    {"dot", "dot FILE [--after PASS] [-o OUT] [-O N] [--target T] [--disable-pass NAME]...",
     "draw a module as a Graphviz graph",
     "Verifies FILE, runs the compiler's pass pipeline on it up to and including PASS (as\n"
     "'kiln run --backend cpu' would, verifying after every pass) and prints the module as\n"
     "Graphviz DOT, one cluster per computation. Render it with 'dot -Tsvg'.\n",
     dot_opts, 1, 1, kiln__cmd_dot, NULL},
    {"explain",
     "explain FILE [--target T] [-O N] [--disable-pass NAME]... [--transform SPEC]...\n"
     "         [--memory-budget BYTES]",
     "print the fusion decisions with the cost model's numbers",
     "Runs the compiler's pass pipeline on FILE as 'kiln compile' would and prints what\n"
     "fusion decided and why: per computation each group it starts, each producer it\n"
     "weighs (+ joins, - stays out) with the roofline cost fused against the cost apart,\n"
     "each sibling merge it weighs, and each fusion it writes with its members and cost.\n"
     "With --memory-budget, each value rematerialization recomputes or moves, at which\n"
     "peak, with the bytes it takes off the peak and its flops, then the peak before and\n"
     "after.\n",
     explain_opts, 1, 1, kiln__cmd_explain, NULL},
    {"bench",
     "bench FILE [--backend cpu|interp] [--iters N] [--warmup N] [--arg ARG]...\n"
     "         [--random-args SEED] [--target T] [-O N] [--disable-pass NAME]...\n"
     "         [--transform SPEC]... [--memory-budget BYTES]\n"
     "         [--partitions P [--replicas R] [--windowed-einsum MODE]\n"
     "         [--auto-shard [--mesh AxB]]]",
     "time compiling and running a module",
     "Compiles FILE once (cpu) and runs it on the --arg values, pseudo-random arguments for\n"
     "the parameters not given, then prints one JSON\n"
     "object: compile_ms (with passes_ms per pass, pipeline_ms, codegen_ms, cc_ms),\n"
     "run_us_median, run_us_p90 and run_us_min over the timed runs, and peak_bytes, the\n"
     "most memory a run holds at once (parameters, outputs and the peak of live\n"
     "temporaries), with its parts. On cpu a run is one execution on device buffers that\n"
     "already hold the arguments (\"mode\": \"buffers\"); on interp one interpreter run,\n"
     "whose memory is not accounted (peak_bytes null). With --memory-budget the object\n"
     "gains \"remat\": the budget, temp_peak_before and temp_peak_after, extra_flops,\n"
     "flops (the program's, after), recomputed and moved. With --partitions P a global\n"
     "program is partitioned and each run is one gang launch of its devices (\"mode\":\n"
     "\"mesh-literals\"; with --replicas R of all R x P) and the object gains \"partitions\"\n"
     "and \"collectives\" per device (and \"replicas\", \"devices\", \"mesh_collectives\").\n",
     bench_opts, 1, 1, kiln__cmd_bench, kiln__remote_bench},
    {"stats", "stats --server HOST:PORT [--counters]", "show a server's counters",
     "Prints the server's version and uptime, compiles and cache hits, executions, live\n"
     "buffers and per-device figures; --counters adds every counter the server keeps.\n",
     stats_opts, 0, 0, kiln__cmd_stats, NULL},
    {"top", "top --server HOST:PORT [--once]", "watch a server live",
     "Shows the server's compile pool (queued, running), cache hit rate and memory,\n"
     "executions and buffers, resident memory, each device with how busy it has been, and\n"
     "every compile queued or running with its phase (queued, loading, waiting, passes,\n"
     "cc, storing), refreshed every second until Ctrl-C. --once prints one screen (device\n"
     "figures since the server started) and exits. A server with --tokens answers only\n"
     "admin tokens (Stats covers every client's work).\n",
     top_opts, 0, 0, kiln__cmd_top, NULL},
    {"cache",
     "cache stats --server HOST:PORT\n"
     "       kiln cache list --server HOST:PORT [KEY...] [--limit N] [--components]\n"
     "       kiln cache evict --server HOST:PORT KEY... | --all [--shared]\n"
     "       kiln cache export --server HOST:PORT FILE [KEY...]\n"
     "       kiln cache import --server HOST:PORT FILE\n"
     "       kiln cache explain A B [--backend B] [--target T] [-O N] [--server HOST:PORT]",
     "inspect a server's executable cache; explain cache misses",
     "stats prints the server's cache hits, misses and compiles, then every kiln_cache_*\n"
     "counter as NAME{LABELS} VALUE. list prints one line per entry of the server's memory\n"
     "and disk tiers (only the KEYs given, if any):\n"
     "  KEY TIERS BYTES COMPILE_MS CREATED\n"
     "(TIERS as memory,disk; CREATED in UTC, ISO 8601), with --components followed by one\n"
     "'  NAME DIGEST' line per key component. evict removes the KEYs (or --all) from the\n"
     "memory and disk tiers and the server's loaded executables, and with --shared from\n"
     "Redis too, then prints 'evicted N' (removals summed over tiers).\n"
     "export writes the KEYs (every local entry without KEYs) to FILE as one file signed\n"
     "with the server's cache secret; import stores such a file's entries on a server\n"
     "with the same secret, which refuses a file changed in any way.\n"
     "\n"
     "explain compares two cache keys: A and B are both module files, whose keys are\n"
     "computed here as the server would for 'kiln compile --server' with the same\n"
     "--backend, --target and -O, or both keys (64 hex digits), whose components are\n"
     "fetched from --server. It prints 'KEY  ARG' for each, then 'differs: COMPONENT' for\n"
     "each of module, signature, options, target, version that differs, or 'same key'.\n"
     "Exit status of explain: 0 same key, 1 the keys differ, 2 trouble (usage, an input\n"
     "that cannot be read or verified, a key the server does not hold), 3 internal error.\n",
     cache_opts, 1, -1, kiln__cmd_cache, NULL},
    {"kernel", "kernel register --server HOST:PORT NAME FILE.c --signature SIG [--cuda FILE.cu]",
     "register a C kernel with a server for custom calls of kiln.user.NAME",
     "Sends FILE.c to the server, which compiles it (its own translation unit, under a time\n"
     "and size limit) and keeps it as NAME for programs' custom calls of target\n"
     "\"kiln.user.NAME\". FILE.c defines\n"
     "  void kiln_user_kernel(void *const *bufs, int64_t begin, int64_t end)\n"
     "over iterations [begin, end): the elements (element-wise), or the blocks of\n"
     "'; grid=N'. bufs holds the operands, then the results, dense and row-major.\n"
     "Prints 'registered NAME DIGEST'. The server must run with --allow-user-kernels\n"
     "(the kernel runs on it); with tokens on, an admin token. A compile error is printed\n"
     "with the compiler's message (exit 1). Locally, 'kiln run --backend cpu\n"
     "--user-kernel NAME=FILE.c:SIG' does the same in process.\n",
     kernel_opts, 1, 3, kiln__cmd_kernel, NULL},
};

#define NCOMMANDS (sizeof commands / sizeof commands[0])

static const char exit_help[] =
    "Exit status:\n"
    "  0  success\n"
    "  1  invalid input: a parse or verifier error, arguments that do not match the\n"
    "     parameters, a file that cannot be read or written, or an operation or element\n"
    "     type the backend cannot run (the message names the instruction)\n"
    "  2  usage error: unknown command, option or backend, missing or extra operands\n"
    "  3  internal error: out of memory, or a bug in kiln\n"
    "\n"
    "Environment:\n"
    "  KILN_MAX_NESTING  deepest nesting of called computations (calls, whiles,\n"
    "                    conditionals, fusions) a module may have, 1 to 4096; default 256\n";

static const kiln__cmd *find_command(const char *name) {
  for (size_t i = 0; i < NCOMMANDS; i++)
    if (strcmp(commands[i].name, name) == 0) return &commands[i];
  return NULL;
}

static void print_usage(FILE *f) {
  fprintf(f, "usage: kiln COMMAND [OPTIONS] ...\n\nCommands:\n");
  for (size_t i = 0; i < NCOMMANDS; i++)
    fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].summary);
  fprintf(f, "  %-8s %s\n", "help", "show help for a command: kiln help COMMAND");
}

static void print_main_help(void) {
  print_usage(stdout);
  printf("\n");
  for (size_t i = 0; i < NCOMMANDS; i++) printf("  kiln %s\n", commands[i].synopsis);
  printf("\nRun 'kiln help COMMAND' or 'kiln COMMAND --help' for details.\n\n%s", exit_help);
}

/* Prints `text` from column `indent` on, wrapped at 79 columns. */
static void print_wrapped(const char *text, int col, int indent) {
  const char *p = text;
  while (*p) {
    const char *sp = strchr(p, ' ');
    int w = sp ? (int)(sp - p) : (int)strlen(p);
    if (col > indent && col + 1 + w > 79) {
      printf("\n%*s", indent, "");
      col = indent;
    } else if (col > indent) {
      putchar(' ');
      col++;
    }
    printf("%.*s", w, p);
    col += w;
    p += w;
    while (*p == ' ') p++;
  }
  putchar('\n');
}

static void print_command_help(const kiln__cmd *c) {
  printf("usage: kiln %s\n\n%s", c->synopsis, c->help);
  printf("\nOptions:\n");
  for (const kiln__opt *o = c->opts; o->name; o++) {
    char head[64], text[512];
    if (o->shortname)
      snprintf(head, sizeof head, "-%c, --%s%s%s", o->shortname, o->name, o->metavar ? " " : "",
               o->metavar ? o->metavar : "");
    else
      snprintf(head, sizeof head, "    --%s%s%s", o->name, o->metavar ? " " : "",
               o->metavar ? o->metavar : "");
    snprintf(text, sizeof text, "%s%s", o->help, o->repeat ? " (repeatable)" : "");
    if (strlen(head) > 22)
      printf("  %s\n%26s", head, "");
    else
      printf("  %-24s", head);
    print_wrapped(text, 26, 26);
  }
  printf("  %-24s%s\n", "-h, --help", "show this help");
  printf("\n%s", exit_help);
}

static int usage_error(const kiln__cmd *c, const char *fmt, const char *what) {
  fprintf(stderr, "kiln%s%s: ", c ? " " : "", c ? c->name : "");
  fprintf(stderr, fmt, what);
  fprintf(stderr, "\n");
  if (c)
    fprintf(stderr, "usage: kiln %s\nRun 'kiln help %s' for details.\n", c->synopsis, c->name);
  else
    print_usage(stderr);
  return KILN_EXIT_USAGE;
}

const char *kiln__args_get(const kiln__args *a, const char *name) {
  for (int i = 0; a->cmd->opts[i].name; i++)
    if (strcmp(a->cmd->opts[i].name, name) == 0)
      return a->nvals[i] ? a->vals[i][a->nvals[i] - 1] : NULL;
  return NULL;
}

const char **kiln__args_all(const kiln__args *a, const char *name, int *n) {
  for (int i = 0; a->cmd->opts[i].name; i++)
    if (strcmp(a->cmd->opts[i].name, name) == 0) {
      *n = a->nvals[i];
      return a->vals[i];
    }
  *n = 0;
  return NULL;
}

static int find_opt(const kiln__cmd *c, const char *arg, size_t n, bool is_long) {
  for (int i = 0; c->opts[i].name; i++) {
    const kiln__opt *o = &c->opts[i];
    if (is_long ? (strlen(o->name) == n && strncmp(o->name, arg, n) == 0)
                : (o->shortname && o->shortname == arg[0]))
      return i;
  }
  return -1;
}

/* The validation point: argv (after the command name) against c's table.
 * "--opt VALUE", "--opt=VALUE", "-o VALUE", "-oVALUE"; "--" ends options. */
static int parse_args(const kiln__cmd *c, int argc, char **argv, kiln__args *a) {
  memset(a, 0, sizeof *a);
  a->cmd = c;
  /* Everything is sized by argc, so no further bounds checks are needed. */
  a->pos = kiln_calloc((size_t)argc + 1, sizeof *a->pos);
  if (a->pos == NULL) return KILN_EXIT_INTERNAL;
  for (int i = 0; c->opts[i].name; i++) {
    a->vals[i] = kiln_calloc((size_t)argc + 1, sizeof *a->vals[i]);
    if (a->vals[i] == NULL) return KILN_EXIT_INTERNAL;
  }
  bool opts_done = false;
  for (int i = 0; i < argc; i++) {
    const char *s = argv[i];
    if (opts_done || s[0] != '-' || s[1] == '\0') {
      a->pos[a->npos++] = s;
      continue;
    }
    if (strcmp(s, "--") == 0) {
      opts_done = true;
      continue;
    }
    bool is_long = s[1] == '-';
    const char *name = s + (is_long ? 2 : 1);
    const char *eq = is_long ? strchr(name, '=') : NULL;
    size_t n = eq ? (size_t)(eq - name) : strlen(name);
    int k = find_opt(c, name, n, is_long);
    if (k < 0) return usage_error(c, "unknown option '%s'", s);
    const kiln__opt *o = &c->opts[k];
    const char *val = "";
    if (o->metavar) {
      if (eq)
        val = eq + 1;
      else if (!is_long && name[1])
        val = name + 1;
      else if (i + 1 < argc)
        val = argv[++i];
      else
        return usage_error(c, "option '%s' needs a value", s);
    } else if (eq || (!is_long && name[1])) {
      return usage_error(c, "option '%s' takes no value", s);
    }
    if (!o->repeat && a->nvals[k])
      return usage_error(c, "option '--%s' given more than once", o->name);
    a->vals[k][a->nvals[k]++] = val;
    if (o->metavar && strchr(o->metavar, ' ')) {
      if (eq || i + 1 >= argc) return usage_error(c, "option '%s' needs two values", s);
      a->vals[k][a->nvals[k]++] = argv[++i];
    }
  }
  if (a->npos < c->min_pos) return usage_error(c, "%s", "missing FILE operand");
  if (c->max_pos >= 0 && a->npos > c->max_pos)
    return usage_error(c, "unexpected operand '%s'", a->pos[c->max_pos]);
  return KILN_EXIT_OK;
}

static void free_args(kiln__args *a) {
  kiln_free(a->pos);
  for (int i = 0; i < KILN_CLI_MAX_OPTS; i++) kiln_free(a->vals[i]);
}

static bool wants_help(int argc, char **argv) {
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--") == 0) return false;
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return true;
  }
  return false;
}

int main(int argc, char **argv) {
  /* Before anything else: OpenBLAS may need its core chosen (cpu_blas.h). */
  kiln_cpu_blas_select_core(argv);
  /* A closed pipe on stdout must be a write error we report, not a signal. */
  signal(SIGPIPE, SIG_IGN);
  if (argc < 2) return usage_error(NULL, "%s", "missing command");
  const char *name = argv[1];
  if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 ||
      (strcmp(name, "help") == 0 && argc == 2)) {
    print_main_help();
    return KILN_EXIT_OK;
  }
  if (strcmp(name, "help") == 0) {
    if (argc > 3) return usage_error(NULL, "%s", "help takes one command name");
    const kiln__cmd *c = find_command(argv[2]);
    if (c == NULL) return usage_error(NULL, "no such command '%s'", argv[2]);
    print_command_help(c);
    return KILN_EXIT_OK;
  }
  const kiln__cmd *c = find_command(name);
  if (c == NULL) return usage_error(NULL, "unknown command '%s'", name);
  if (wants_help(argc - 2, argv + 2)) {
    print_command_help(c);
    return KILN_EXIT_OK;
  }
  kiln__args a;
  int rc = parse_args(c, argc - 2, argv + 2, &a);
  if (rc == KILN_EXIT_INTERNAL) fprintf(stderr, "kiln: error: out of memory\n");
  if (rc == KILN_EXIT_OK && kiln__args_get(&a, "server") && kiln__args_get(&a, "auto-shard"))
    rc = usage_error(c, "%s", "--auto-shard runs here: it does not go with --server");
  if (rc == KILN_EXIT_OK) rc = kiln__auto_shard_check(&a);
  if (rc == KILN_EXIT_OK)
    rc = c->remote && kiln__args_get(&a, "server") ? c->remote(&a) : c->run(&a);
  free_args(&a);
  /* Output that could not be written (full disk, closed pipe) is a failure. */
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "kiln: error: cannot write standard output\n");
    if (rc == KILN_EXIT_OK) rc = KILN_EXIT_INVALID;
  }
  return rc;
}
