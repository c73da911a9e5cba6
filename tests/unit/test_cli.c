/* Tests for the kiln command, run as a user runs it: each test writes its
 * inputs to a fresh temporary directory, spawns KILN_BINARY_DIR/kiln and
 * checks the exit code, the exact standard output and standard error, and
 * any .npy files it wrote (read back with the command's own .npy reader,
 * compiled in here). Covers every exit code, the diagnostics of check,
 * print's canonical text, run with literal and .npy arguments, --out,
 * tuple flattening, bf16 rounding, argument mismatches, random arguments,
 * and garbage inputs that must fail cleanly rather than crash. */
#include <check.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "clients/cli/fileio.c"
#include "clients/cli/npy.c"

#define KILN KILN_BINARY_DIR "/kiln"

/* The verifier's message for adding f32[2] and f32[3]. */
#define VERIFY_ADD_MESSAGE \
  "add: operand 1 (%q) has shape f32[3] but operand 0 (%p) has shape f32[2]"

typedef struct result {
  int code;  /* exit status; -signal when killed by one */
  char *out; /* standard output */
  char *err; /* standard error */
} result;

static char tmpdir[64];

static void setup(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/kiln_cli_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", tmpdir);
}

/* A path inside the test's directory (static buffers, rotated: a test keeps
 * at most 64 alive). */
static const char *tpath(const char *name) {
  static char bufs[64][512];
  static int k;
  char *b = bufs[k++ % 64];
  snprintf(b, 512, "%s/%s", tmpdir, name);
  return b;
}

static const char *write_file(const char *name, const char *text) {
  const char *p = tpath(name);
  FILE *f = fopen(p, "wb");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
  return p;
}

static char *slurp(const char *path) {
  uint8_t *buf;
  size_t len;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln__file_read(path, &buf, &len, &st), 0);
  return (char *)buf;
}

/* Runs kiln with the NULL-terminated arguments; stdout/stderr captured. */
static result run(const char *arg0, ...) {
  const char *argv[64];
  int n = 0;
  argv[n++] = KILN;
  va_list ap;
  va_start(ap, arg0);
  for (const char *a = arg0; a; a = va_arg(ap, const char *)) argv[n++] = a;
  va_end(ap);
  argv[n] = NULL;
  const char *out_path = tpath(".stdout"), *err_path = tpath(".stderr");
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0) _exit(127);
    execv(KILN, (char *const *)argv);
    _exit(127);
  }
  int status;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  return r;
}

static void result_free(result *r) {
  kiln_free(r->out);
  kiln_free(r->err);
}

#define EXPECT(r, code_, out_, err_) \
  do { \
    ck_assert_str_eq((r).err, (err_)); \
    ck_assert_str_eq((r).out, (out_)); \
    ck_assert_int_eq((r).code, (code_)); \
  } while (0)

static const char add_module[] = "HloModule add\n"
                                 "\n"
                                 "ENTRY main {\n"
                                 "  x = f32[2] parameter(0)\n"
                                 "  y = f32[2] parameter(1)\n"
                                 "  ROOT r = f32[2] add(x, y)\n"
                                 "}\n";

/* ---- help and usage ----------------------------------------------------- */

/* A per-device program on R x P devices: shared --arg values, a device of
 * its own by --device-args, per-device output lines and files. */
START_TEST(test_run_mesh) {
  const char *f = write_file(
      "mesh.hlo", "HloModule m\n"
                  "add {\n x = s32[] parameter(0)\n y = s32[] parameter(1)\n"
                  " ROOT s = s32[] add(x, y)\n}\n"
                  "ENTRY e {\n p = s32[2] parameter(0)\n id = u32[] partition-id()\n"
                  " i = s32[] convert(id)\n b = s32[2] broadcast(i), dimensions={}\n"
                  " x = s32[2] add(p, b)\n"
                  " ROOT r = s32[2] all-reduce(x), channel_id=1, replica_groups={{0,1},{2,3}}, "
                  "use_global_device_ids=true, to_apply=add\n}\n");
  const char *dir = tpath("mesh_out");
  result r = run("run", f, "--replicas", "2", "--partitions", "2", "--arg", "s32[2] {1, 2}",
                 "--device-args", "3", "s32[2] {10, 20}", "--out", dir, NULL);
  ck_assert_msg(r.code == 0, "%s", r.err);
  ck_assert_str_eq(r.out, "device 0:\ns32[2] {3, 5}\ndevice 1:\ns32[2] {3, 5}\n"
                          "device 2:\ns32[2] {12, 23}\ndevice 3:\ns32[2] {12, 23}\n");
  char p3[600];
  snprintf(p3, sizeof p3, "%s/device3/0.npy", dir);
  ck_assert_int_eq(access(p3, R_OK), 0);
  result_free(&r);
  r = run("run", f, "--partitions", "4", "--device-args", "4", "s32[2] {1, 2}", NULL);
  ck_assert_int_eq(r.code, 2);
  ck_assert_ptr_nonnull(strstr(r.err, "device number below 4"));
  result_free(&r);
  r = run("run", f, "--partitions", "2", "--device-args", "1", "s32[2] {1, 2},s32[2] {1, 2}",
          "--arg", "s32[2] {0, 0}", NULL);
  ck_assert_int_eq(r.code, 1);
  ck_assert_ptr_nonnull(strstr(r.err, "gives 2 arguments, the ENTRY takes 1"));
  result_free(&r);
  /* The cpu backend runs the same per-device program, compiled once. */
  r = run("run", f, "--replicas", "2", "--partitions", "2", "--backend", "cpu", "--arg",
          "s32[2] {1, 2}", "--device-args", "3", "s32[2] {10, 20}", NULL);
  ck_assert_msg(r.code == 0, "%s", r.err);
  ck_assert_str_eq(r.out, "device 0:\ns32[2] {3, 5}\ndevice 1:\ns32[2] {3, 5}\n"
                          "device 2:\ns32[2] {12, 23}\ndevice 3:\ns32[2] {12, 23}\n");
  result_free(&r);
  r = run("run", f, "--partitions", "0", "--arg", "s32[2] {0, 0}", NULL);
  ck_assert_int_eq(r.code, 2);
  result_free(&r);
}
END_TEST

/* A global data-parallel step (the batch split over the partitions, the
 * weight's gradient all-reduced) compiled and benched on 2 replicas x 2
 * partitions: each device runs one all-reduce of the f32[4,3] gradient
 * (48 bytes) within its replica, the mesh of 4 devices 4 of them; the
 * bench times the gang of all 4 (interp and cpu). */
static const char dp_module[] =
    "HloModule dp\n"
    "ENTRY e {\n x = f32[8,4] parameter(0), sharding={devices=[2,1]0,1}\n"
    " w = f32[4,3] parameter(1), sharding={replicated}\n"
    " y = f32[8,3] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
    " t = f32[8,3] tanh(y)\n"
    " ROOT g = f32[4,3] dot(x, t), lhs_contracting_dims={0}, rhs_contracting_dims={0}, "
    "sharding={replicated}\n}\n";

START_TEST(test_compile_bench_mesh) {
  const char *f = write_file("dp.hlo", dp_module);
  result r =
      run("compile", f, "--replicas", "2", "--partitions", "2", "-o", tpath("dp.kexe"), NULL);
  ck_assert_msg(r.code == 0, "%s", r.err);
  char want[1024];
  snprintf(want, sizeof want,
           "%s: partitioned over 2 replicas x 2 partitions (4 devices): 1 collective per device "
           "per run\n  all-reduce: 1, 48 bytes\n"
           "the mesh of 4 devices: 4 collectives, 192 bytes per run, each replica's within its 2 "
           "partitions\n  all-reduce: 4, 192 bytes\n",
           f);
  ck_assert_msg(strncmp(r.out, want, strlen(want)) == 0, "%s", r.out);
  result_free(&r);
  /* one replica: as before */
  r = run("compile", f, "--partitions", "2", NULL);
  ck_assert_msg(r.code == 0, "%s", r.err);
  snprintf(want, sizeof want,
           "%s: partitioned over 2 devices: 1 collective per device per run\n"
           "  all-reduce: 1, 48 bytes\n%s: compiled",
           f, f);
  ck_assert_msg(strncmp(r.out, want, strlen(want)) == 0, "%s", r.out);
  result_free(&r);
  const char *backends[2] = {"interp", "cpu"};
  for (int i = 0; i < 2; i++) {
    r = run("bench", f, "--replicas", "2", "--partitions", "2", "--backend", backends[i], "--iters",
            "2", NULL);
    ck_assert_msg(r.code == 0, "%s", r.err);
    ck_assert_msg(strstr(r.out, "\"mode\": \"mesh-literals\", \"partitions\": 2, \"collectives\": "
                                "{\"all-reduce\": {\"count\": 1, \"bytes\": 48}}, \"replicas\": "
                                "2, \"devices\": 4, \"mesh_collectives\": {\"all-reduce\": "
                                "{\"count\": 4, \"bytes\": 192}}") != NULL,
                  "%s", r.out);
    result_free(&r);
  }
  /* refusals */
  r = run("compile", f, "--replicas", "2", NULL);
  EXPECT(r, 2, "", "kiln compile: --replicas R goes with --partitions P (a global program)\n");
  result_free(&r);
  r = run("compile", f, "--replicas", "0", "--partitions", "2", NULL);
  EXPECT(r, 2, "", "kiln compile: --replicas needs an integer from 1 to 4096, not '0'\n");
  result_free(&r);
  r = run("compile", f, "--replicas", "64", "--partitions", "128", NULL);
  EXPECT(r, 2, "", "kiln compile: a mesh of 64 x 128 devices is too large (at most 4096)\n");
  result_free(&r);
  r = run("bench", f, "--replicas", "2", NULL);
  EXPECT(r, 2, "", "kiln bench: --replicas R goes with --partitions P (a global program)\n");
  result_free(&r);
  r = run("compile", write_file("add.hlo", add_module), "--replicas", "2", "--partitions", "2",
          NULL);
  ck_assert_int_eq(r.code, 1);
  ck_assert_ptr_nonnull(strstr(r.err, "--partitions needs a module whose ENTRY carries shardings"));
  result_free(&r);
}
END_TEST

/* --windowed-einsum: a column-parallel matmul of row-split activations
 * takes the ring (3 permutes of a quarter each) instead of the all-gather
 * when forced on or when the gathered copy reaches the threshold. */
START_TEST(test_compile_windowed) {
  const char *f =
      write_file("ag.hlo", "HloModule ag\n"
                           "ENTRY e {\n x = f32[16,8] parameter(0), sharding={devices=[4,1]<=[4]}\n"
                           " w = f32[8,12] parameter(1), sharding={devices=[1,4]<=[4]}\n"
                           " ROOT y = f32[16,12] dot(x, w), lhs_contracting_dims={1}, "
                           "rhs_contracting_dims={0}, sharding={devices=[1,4]<=[4]}\n}\n");
  const char *ring = "collective-permute: 3, 384 bytes\n", *gather = "all-gather: 1, 512 bytes\n";
  struct {
    const char *mode, *bytes, *want;
  } cases[] = {{"on", NULL, ring},
               {"off", "0", gather},
               {"auto", NULL, gather}, /* 512 bytes: below the default 1M */
               {"auto", "512", ring},
               {NULL, "513", gather}};
  for (int i = 0; i < 5; i++) {
    const char *argv[8] = {"--partitions", "4"};
    int n = 2;
    if (cases[i].mode) argv[n++] = "--windowed-einsum", argv[n++] = cases[i].mode;
    if (cases[i].bytes) argv[n++] = "--windowed-einsum-bytes", argv[n++] = cases[i].bytes;
    argv[n] = NULL;
    result r = run("compile", f, argv[0], argv[1], argv[2], argv[3], argv[4], argv[5], NULL);
    ck_assert_msg(r.code == 0, "%s", r.err);
    ck_assert_msg(strstr(r.out, cases[i].want) != NULL, "case %d: %s", i, r.out);
    result_free(&r);
  }
  result r = run("compile", f, "--partitions", "4", "--windowed-einsum", "maybe", NULL);
  EXPECT(r, 2, "", "kiln compile: --windowed-einsum needs auto, on or off, not 'maybe'\n");
  result_free(&r);
  r = run("bench", f, "--partitions", "4", "--windowed-einsum-bytes", "1KB", NULL);
  EXPECT(r, 2, "",
         "kiln bench: --windowed-einsum-bytes needs a number of bytes (K, M, G: KiB, MiB, GiB), "
         "not '1KB'\n");
  result_free(&r);
  r = run("bench", f, "--partitions", "4", "--windowed-einsum", "on", "--backend", "interp",
          "--iters", "1", NULL);
  ck_assert_msg(r.code == 0, "%s", r.err);
  ck_assert_ptr_nonnull(
      strstr(r.out, "\"collectives\": {\"collective-permute\": {\"count\": 3, \"bytes\": 384}}"));
  result_free(&r);
}
END_TEST

START_TEST(test_help) {
  result r = run("--help", NULL);
  ck_assert_int_eq(r.code, 0);
  ck_assert_str_eq(r.err, "");
  ck_assert_ptr_nonnull(strstr(r.out, "  kiln run FILE [--backend interp|cpu] [--arg ARG]... "
                                      "[--random-args SEED] [--out DIR]\n"));
  ck_assert_ptr_nonnull(strstr(r.out, "Exit status:\n  0  success\n"));
  ck_assert_ptr_nonnull(strstr(r.out, "  3  internal error"));
  result_free(&r);

  result h1 = run("help", "run", NULL), h2 = run("run", "--help", NULL),
         h3 = run("run", "x", "-h", NULL);
  ck_assert_int_eq(h1.code, 0);
  ck_assert_str_eq(h1.out, h2.out);
  ck_assert_str_eq(h1.out, h3.out);
  ck_assert_ptr_nonnull(strstr(h1.out, "      --random-args SEED  fill the parameters not given"));
  ck_assert_ptr_nonnull(strstr(h1.out, "float32 array may feed a\nbf16 parameter"));
  result_free(&h1);
  result_free(&h2);
  result_free(&h3);

  r = run("help", "check", NULL);
  ck_assert_int_eq(r.code, 0);
  ck_assert_ptr_nonnull(strstr(r.out, "FILE:LINE:COL: error: COMPUTATION/INSTRUCTION: MESSAGE"));
  result_free(&r);
  r = run("print", "--help", NULL);
  ck_assert_int_eq(r.code, 0);
  ck_assert_ptr_nonnull(strstr(r.out, "  -o, --output OUT        write to OUT instead"));
  result_free(&r);
}
END_TEST

START_TEST(test_usage_errors) {
  result r = run(NULL);
  ck_assert_int_eq(r.code, 2);
  ck_assert_ptr_nonnull(strstr(r.err, "kiln: missing command\nusage: kiln COMMAND"));
  result_free(&r);
  r = run("frob", NULL);
  ck_assert_int_eq(r.code, 2);
  ck_assert_ptr_nonnull(strstr(r.err, "kiln: unknown command 'frob'\n"));
  result_free(&r);
  r = run("help", "frob", NULL);
  ck_assert_int_eq(r.code, 2);
  ck_assert_ptr_nonnull(strstr(r.err, "kiln: no such command 'frob'\n"));
  result_free(&r);
  const char *f = write_file("add.hlo", add_module);
  r = run("run", f, "--bogus", NULL);
  EXPECT(r, 2, "",
         "kiln run: unknown option '--bogus'\n"
         "usage: kiln run FILE [--backend interp|cpu] [--arg ARG]... [--random-args SEED] [--out "
         "DIR]\n"
         "         [--timeout SECONDS] [--max-iterations N] [--transform SPEC]...\n"
         "         [--target T] [-O N] [--disable-pass NAME]... [--dump-dir DIR]\n"
         "         [--memory-budget BYTES] [--replicas R] [--partitions P] [--device-args K "
         "FILES]...\n"
         "Run 'kiln help run' for details.\n");
  result_free(&r);
  r = run("check", NULL);
  ck_assert_int_eq(r.code, 2);
  ck_assert_ptr_nonnull(strstr(r.err, "kiln check: missing FILE operand\n"));
  result_free(&r);
  r = run("print", f, f, NULL);
  ck_assert_int_eq(r.code, 2);
  ck_assert_ptr_nonnull(strstr(r.err, "unexpected operand"));
  result_free(&r);
  r = run("run", f, "--arg", NULL);
  ck_assert_int_eq(r.code, 2);
  ck_assert_ptr_nonnull(strstr(r.err, "kiln run: option '--arg' needs a value\n"));
  result_free(&r);
  r = run("run", f, "--out", "a", "--out=b", NULL);
  ck_assert_int_eq(r.code, 2);
  ck_assert_ptr_nonnull(strstr(r.err, "kiln run: option '--out' given more than once\n"));
  result_free(&r);
  r = run("run", f, "--backend", "tpu", NULL);
  EXPECT(r, 2, "",
         "kiln run: unknown backend 'tpu' (available here: cpu, interp; a server may also have "
         "cuda)\n");
  result_free(&r);
  r = run("run", f, "--random-args", "-3", NULL);
  EXPECT(r, 2, "", "kiln run: --random-args needs a non-negative integer seed, not '-3'\n");
  result_free(&r);
  r = run("run", f, "--random-args=x1", NULL);
  ck_assert_int_eq(r.code, 2);
  result_free(&r);
  r = run("run", f, "--timeout", "0", NULL);
  EXPECT(r, 2, "", "kiln run: --timeout needs a positive number of seconds, not '0'\n");
  result_free(&r);
  r = run("run", f, "--max-iterations", "many", NULL);
  EXPECT(r, 2, "", "kiln run: --max-iterations needs a positive integer, not 'many'\n");
  result_free(&r);
}
END_TEST

/* ---- check -------------------------------------------------------------- */

START_TEST(test_check_ok) {
  const char *a = write_file("a.hlo", add_module);
  result r = run("check", a, NULL);
  EXPECT(r, 0, "", "");
  result_free(&r);
}
END_TEST

START_TEST(test_check_parse_error) {
  const char *f = write_file("bad.hlo", "HloModule m\n"
                                        "\n"
                                        "ENTRY e {\n"
                                        "  p = f32[2] parameter(0)\n"
                                        "  ROOT r = f32[2] add(p, q)\n"
                                        "}\n");
  result r = run("check", f, NULL);
  char want[1024];
  snprintf(want, sizeof want, "%s:5:26: error: unknown operand %%q in r\n", f);
  EXPECT(r, 1, "", want);
  result_free(&r);
}
END_TEST

START_TEST(test_check_verify_error) {
  const char *f = write_file("bad.hlo", "HloModule m\n"
                                        "\n"
                                        "ENTRY e {\n"
                                        "  p = f32[2] parameter(0)\n"
                                        "  q = f32[3] parameter(1)\n"
                                        "  ROOT r = f32[2] add(p, q)\n"
                                        "}\n");
  result r = run("check", f, NULL);
  char want[1024];
  snprintf(want, sizeof want, "%s:6:8: error: e/r: %s\n", f, VERIFY_ADD_MESSAGE);
  EXPECT(r, 1, "", want);
  result_free(&r);
}
END_TEST

START_TEST(test_check_several_files) {
  const char *good = write_file("good.hlo", add_module);
  const char *bad = write_file("bad.hlo", "HloModule m\nENTRY e {\n  p = f32[2] frob(0)\n}\n");
  result r = run("check", good, bad, good, NULL);
  char want[1024];
  snprintf(want, sizeof want, "%s:3:14: error: unknown opcode 'frob'\n", bad);
  EXPECT(r, 1, "", want);
  result_free(&r);
}
END_TEST

START_TEST(test_check_garbage) {
  /* Random bytes, an empty file, a directory, a missing file, a truncated
   * module, a binary proto that is not one: exit 1 with a message, never a
   * signal. */
  uint8_t noise[4096];
  uint64_t s = 99;
  for (size_t i = 0; i < sizeof noise; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    noise[i] = (uint8_t)(s >> 56);
  }
  kiln_status st;
  kiln_status_clear(&st);
  const char *rnd = tpath("random.hlo"), *rndpb = tpath("random.pb");
  ck_assert_int_eq(kiln__file_write(rnd, noise, sizeof noise, &st), 0);
  ck_assert_int_eq(kiln__file_write(rndpb, noise, sizeof noise, &st), 0);
  const char *empty = write_file("empty.hlo", "");
  const char *emptypb = write_file("empty.pb", "");
  const char *trunc = write_file("trunc.hlo", "HloModule m\nENTRY e {\n  p = f32[2");
  const char *files[] = {rnd, rndpb, empty, trunc, tmpdir, tpath("missing.hlo")};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    result r = run("check", files[i], NULL);
    ck_assert_msg(r.code == 1, "%s: exit %d, stderr %s", files[i], r.code, r.err);
    ck_assert_str_eq(r.out, "");
    ck_assert_msg(strncmp(r.err, files[i], strlen(files[i])) == 0, "%s", r.err);
    ck_assert_ptr_nonnull(strstr(r.err, ": error: "));
    result_free(&r);
    r = run("run", files[i], NULL);
    ck_assert_int_eq(r.code, 1);
    result_free(&r);
    r = run("print", files[i], NULL);
    ck_assert_int_eq(r.code, 1);
    result_free(&r);
  }
  result r = run("check", tmpdir, NULL);
  char want[256];
  snprintf(want, sizeof want, "%s: error: cannot read: is a directory\n", tmpdir);
  EXPECT(r, 1, "", want);
  result_free(&r);
  r = run("check", empty, NULL);
  snprintf(want, sizeof want, "%s:1:1: error: expected 'HloModule', found end of input\n", empty);
  EXPECT(r, 1, "", want);
  result_free(&r);
  (void)emptypb;
}
END_TEST

/* ---- print -------------------------------------------------------------- */

START_TEST(test_print) {
  const char *f = write_file("m.hlo", "HloModule add   // a comment\n"
                                      "ENTRY main {\n"
                                      "  x = f32[2] parameter(0)\n"
                                      "  y = f32[2]{0} parameter(1)\n"
                                      "  r = f32[2] add(x, y)\n"
                                      "}\n");
  result r = run("print", f, NULL);
  EXPECT(r, 0,
         "HloModule add\n"
         "\n"
         "ENTRY %main (x: f32[2], y: f32[2]{0}) -> f32[2] {\n"
         "  %x = f32[2] parameter(0)\n"
         "  %y = f32[2]{0} parameter(1)\n"
         "  ROOT %r = f32[2] add(%x, %y)\n"
         "}\n",
         "");
  /* The canonical text is a fixed point. */
  const char *g = write_file("canon.hlo", r.out);
  result r2 = run("print", g, NULL);
  EXPECT(r2, 0, r.out, "");
  result_free(&r2);

  /* Through the binary proto and back. */
  const char *pb = tpath("m.pb");
  r2 = run("print", "--proto", "-o", pb, f, NULL);
  EXPECT(r2, 0, "", "");
  result_free(&r2);
  r2 = run("print", pb, NULL);
  EXPECT(r2, 0, r.out, "");
  result_free(&r2);
  r2 = run("check", pb, NULL);
  EXPECT(r2, 0, "", "");
  result_free(&r2);
  result_free(&r);

  /* Unverified modules print; unparsable ones do not. */
  f = write_file("unverified.hlo",
                 "HloModule m\nENTRY e {\n  p = f32[2] parameter(0)\n  q = f32[3] parameter(1)\n"
                 "  ROOT r = f32[2] add(p, q)\n}\n");
  r = run("print", f, NULL);
  ck_assert_int_eq(r.code, 0);
  ck_assert_ptr_nonnull(strstr(r.out, "ROOT %r = f32[2] add(%p, %q)\n"));
  result_free(&r);
  f = write_file("bad.hlo", "HloModule m\nENTRY e {\n");
  r = run("print", "-o", tpath("never.txt"), f, NULL);
  ck_assert_int_eq(r.code, 1);
  ck_assert_str_eq(r.out, "");
  ck_assert_int_ne(access(tpath("never.txt"), F_OK), 0);
  result_free(&r);
}
END_TEST

/* ---- run ---------------------------------------------------------------- */

START_TEST(test_run_literal_args) {
  const char *f = write_file("add.hlo", add_module);
  result r = run("run", f, "--arg", "f32[2] {1, 2.5}", "--arg=f32[2] {3, -4}", NULL);
  EXPECT(r, 0, "f32[2] {4, -1.5}\n", "");
  result_free(&r);
  r = run("run", f, "--backend", "interp", "--arg", "f32[2]{0} {1, 2}", "--arg", "f32[2] {3, 4}",
          NULL);
  EXPECT(r, 0, "f32[2] {4, 6}\n", "");
  result_free(&r);
}
END_TEST

static void write_npy_f32(const char *name, const int64_t *dims, uint32_t rank, const float *v,
                          size_t n) {
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_npy_write(tpath(name), KILN_F32, dims, rank, v, n * sizeof *v, &st), 0);
}

static kiln_npy read_npy(const char *path) {
  kiln_npy a;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_msg(kiln_npy_read(path, &a, &st) == 0, "%s: %s", path, st.msg);
  return a;
}

START_TEST(test_run_npy_args_and_out) {
  const char *f = write_file("mm.hlo", "HloModule mm\n"
                                       "ENTRY main {\n"
                                       "  a = f32[2,3] parameter(0)\n"
                                       "  b = f32[3] parameter(1)\n"
                                       "  bb = f32[2,3] broadcast(b), dimensions={1}\n"
                                       "  ROOT p = f32[2,3] multiply(a, bb)\n"
                                       "}\n");
  int64_t da[2] = {2, 3}, db[1] = {3};
  float a[6] = {1, 2, 3, 4, 5, 6}, b[3] = {10, 0.5f, -1};
  write_npy_f32("a.npy", da, 2, a, 6);
  write_npy_f32("b.npy", db, 1, b, 3);
  const char *out = tpath("out/nested");
  result r = run("run", f, "--arg", tpath("a.npy"), "--arg", tpath("b.npy"), "--out", out, NULL);
  EXPECT(r, 0, "f32[2,3] {{10, 1, -3}, {40, 2.5, -6}}\n", "");
  result_free(&r);
  kiln_npy o = read_npy(tpath("out/nested/0.npy"));
  ck_assert_int_eq(o.dtype, KILN_F32);
  ck_assert_uint_eq(o.rank, 2);
  ck_assert_int_eq(o.dims[0], 2);
  ck_assert_int_eq(o.dims[1], 3);
  const float want[6] = {10, 1, -3, 40, 2.5f, -6};
  ck_assert_mem_eq(o.data, want, sizeof want);
  kiln_npy_free(&o);
  ck_assert_int_ne(access(tpath("out/nested/1.npy"), F_OK), 0);

  /* An .npy and a literal mixed. */
  r = run("run", f, "--arg", tpath("a.npy"), "--arg", "f32[3] {1, 1, 1}", NULL);
  EXPECT(r, 0, "f32[2,3] {{1, 2, 3}, {4, 5, 6}}\n", "");
  result_free(&r);
}
END_TEST

/* An output with no elements prints in full while its text is bounded
 * (f32[3,0]: three empty arrays), and by its shape alone when it would
 * write more empty arrays than any reader takes back: f32[10^8,0] would be
 * 400 MB of "{}, ". Its .npy file is written either way. */
START_TEST(test_run_empty_outputs) {
  const char *f =
      write_file("empty_out.hlo", "HloModule e\n"
                                  "ENTRY main {\n"
                                  "  p = f32[] parameter(0)\n"
                                  "  s = f32[3,0] broadcast(p), dimensions={}\n"
                                  "  b = f32[100000000,0] broadcast(p), dimensions={}\n"
                                  "  ROOT t = (f32[3,0], f32[100000000,0]) tuple(s, b)\n"
                                  "}\n");
  result r = run("run", f, "--arg", "f32[] 1", NULL);
  EXPECT(r, 0, "f32[3,0] {{}, {}, {}}\nf32[100000000,0] {...}\n",
         "kiln run: output 1 holds too many empty arrays to print as text; --out DIR writes "
         "it as .npy\n");
  result_free(&r);
  const char *out = tpath("empty_out");
  r = run("run", f, "--arg", "f32[] 1", "--out", out, NULL);
  ck_assert_int_eq(r.code, 0);
  ck_assert_ptr_nonnull(strstr(r.err, "its .npy file has it"));
  result_free(&r);
  kiln_npy o = read_npy(tpath("empty_out/1.npy"));
  ck_assert_uint_eq(o.rank, 2);
  ck_assert_int_eq(o.dims[0], 100000000);
  ck_assert_int_eq(o.dims[1], 0);
  kiln_npy_free(&o);
}
END_TEST

/* A bounded-dynamic parameter takes an .npy of fewer rows (padded to the
 * bound); the result prints and writes at its runtime size, the same on
 * interp and cpu; more rows than the bound name the dim and the bound. */
START_TEST(test_run_dynamic_rows) {
  const char *f = write_file("dyn.hlo", "HloModule dyn\n"
                                        "add {\n  a = f32[] parameter(0)\n"
                                        "  b = f32[] parameter(1)\n  ROOT c = f32[] add(a, b)\n}\n"
                                        "ENTRY main {\n"
                                        "  x = f32[<=4,2] parameter(0)\n"
                                        "  y = f32[<=4,2] multiply(x, x)\n"
                                        "  z = f32[] constant(0)\n"
                                        "  s = f32[2] reduce(y, z), dimensions={0}, to_apply=add\n"
                                        "  ROOT t = (f32[<=4,2], f32[2]) tuple(y, s)\n"
                                        "}\n");
  int64_t d3[2] = {3, 2}, d5[2] = {5, 2};
  float a[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  write_npy_f32("x3.npy", d3, 2, a, 6);
  write_npy_f32("x5.npy", d5, 2, a, 10);
  static const char *backends[] = {"interp", "cpu"};
  for (int i = 0; i < 2; i++) {
    const char *out = tpath(i ? "dyn_cpu" : "dyn_interp");
    result r =
        run("run", f, "--backend", backends[i], "--arg", tpath("x3.npy"), "--out", out, NULL);
    EXPECT(r, 0, "f32[<=4,2] {{1, 4}, {9, 16}, {25, 36}}\nf32[2] {35, 56}\n", "");
    result_free(&r);
    char path[512];
    snprintf(path, sizeof path, "%s/0.npy", out);
    kiln_npy o = read_npy(path);
    ck_assert_int_eq(o.dims[0], 3); /* the runtime size, not the bound */
    ck_assert_int_eq(o.dims[1], 2);
    kiln_npy_free(&o);
    r = run("run", f, "--backend", backends[i], "--arg", tpath("x5.npy"), NULL);
    ck_assert_int_eq(r.code, 1);
    ck_assert_msg(strstr(r.err, "parameter 0") && strstr(r.err, "over its bound 4"), "%s", r.err);
    result_free(&r);
  }
}
END_TEST

START_TEST(test_run_tuple_flattening) {
  const char *f = write_file(
      "t.hlo", "HloModule t\n"
               "ENTRY main {\n"
               "  x = s32[2] parameter(0)\n"
               "  p = pred[] parameter(1)\n"
               "  n = s32[2] negate(x)\n"
               "  c = f64[] constant(0.25)\n"
               "  pc = (pred[], f64[]) tuple(p, c)\n"
               "  inner = (s32[2], (pred[], f64[])) tuple(n, pc)\n"
               "  k = s8[] constant(-7)\n"
               "  ROOT t = (s32[2], (s32[2], (pred[], f64[])), s8[]) tuple(x, inner, k)\n"
               "}\n");
  const char *out = tpath("o");
  result r = run("run", f, "--arg", "s32[2] {5, -6}", "--arg", "pred[] true", "--out", out, NULL);
  EXPECT(r, 0,
         "s32[2] {5, -6}\n"
         "s32[2] {-5, 6}\n"
         "pred[] true\n"
         "f64[] 0.25\n"
         "s8[] -7\n",
         "");
  result_free(&r);
  static const struct {
    kiln_dtype t;
    uint32_t rank;
    const char *bytes;
    size_t n;
  } want[] = {
      {KILN_S32, 1, "\x05\x00\x00\x00\xfa\xff\xff\xff", 8},
      {KILN_S32, 1, "\xfb\xff\xff\xff\x06\x00\x00\x00", 8},
      {KILN_PRED, 0, "\x01", 1},
      {KILN_F64, 0, "\x00\x00\x00\x00\x00\x00\xd0\x3f", 8},
      {KILN_S8, 0, "\xf9", 1},
  };
  for (int i = 0; i < 5; i++) {
    char name[64];
    snprintf(name, sizeof name, "o/%d.npy", i);
    kiln_npy o = read_npy(tpath(name));
    ck_assert_int_eq(o.dtype, want[i].t);
    ck_assert_uint_eq(o.rank, want[i].rank);
    ck_assert_uint_eq(o.nbytes, want[i].n);
    ck_assert_mem_eq(o.data, want[i].bytes, want[i].n);
    kiln_npy_free(&o);
  }
  ck_assert_int_ne(access(tpath("o/5.npy"), F_OK), 0);
}
END_TEST

START_TEST(test_run_bf16_from_f32_npy) {
  const char *f = write_file("b.hlo", "HloModule b\n"
                                      "ENTRY main {\n"
                                      "  x = bf16[4] parameter(0)\n"
                                      "  ROOT y = bf16[4] add(x, x)\n"
                                      "}\n");
  /* 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even is 1. 1 + 3*2^-8 ties
   * between 1 + 2^-7 and 1 + 2^-6: even is 1 + 2^-6. 1 + 2^-8 + 2^-20 is
   * above the tie: 1 + 2^-7. 3 is exact. */
  int64_t d[1] = {4};
  float v[4] = {1.00390625f, 1.01171875f, 1.0f + 0x1p-8f + 0x1p-20f, 3.0f};
  write_npy_f32("x.npy", d, 1, v, 4);
  result r = run("run", f, "--arg", tpath("x.npy"), "--out", tpath("o"), NULL);
  /* Printed with the fewest digits that read back to the same bf16. */
  EXPECT(r, 0, "bf16[4] {2, 2.03, 2.02, 6}\n", "");
  result_free(&r);
  kiln_npy o = read_npy(tpath("o/0.npy"));
  ck_assert_int_eq(o.dtype, KILN_F32); /* bf16 results are written as float32, exactly */
  const float want[4] = {2.0f, 2.03125f, 2.015625f, 6.0f};
  ck_assert_mem_eq(o.data, want, sizeof want);
  kiln_npy_free(&o);

  /* f16 is a NumPy dtype of its own: written natively. */
  f = write_file(
      "h.hlo",
      "HloModule h\nENTRY main {\n  x = f16[2] parameter(0)\n  ROOT y = f16[2] negate(x)\n}\n");
  r = run("run", f, "--arg", "f16[2] {0.5, 65504}", "--out", tpath("h"), NULL);
  EXPECT(r, 0, "f16[2] {-0.5, -65500}\n", ""); /* 65500 reads back as f16 65504 */
  result_free(&r);
  o = read_npy(tpath("h/0.npy"));
  ck_assert_int_eq(o.dtype, KILN_F16);
  ck_assert_mem_eq(o.data, "\x00\xb8\xff\xfb", 4);
  kiln_npy_free(&o);
}
END_TEST

START_TEST(test_run_argument_mismatch) {
  const char *f = write_file("add.hlo", add_module);
  char want[1024];
  result r = run("run", f, "--arg", "f32[2] {1, 2}", NULL);
  snprintf(want, sizeof want,
           "%s: error: ENTRY computation main takes 2 parameters, 1 argument given "
           "(--random-args SEED fills the rest)\n",
           f);
  EXPECT(r, 1, "", want);
  result_free(&r);
  r = run("run", f, "--arg", "f32[2] {1, 2}", "--arg", "f32[2] {1, 2}", "--arg", "f32[2] {1, 2}",
          NULL);
  snprintf(want, sizeof want,
           "%s: error: ENTRY computation main takes 2 parameters, 3 arguments given\n", f);
  EXPECT(r, 1, "", want);
  result_free(&r);
  r = run("run", f, "--arg", "f32[2] {1, 2}", "--arg", "f32[3] {1, 2, 3}", NULL);
  snprintf(want, sizeof want, "%s: error: parameter 1: expected f32[2], found f32[3]\n", f);
  EXPECT(r, 1, "", want);
  result_free(&r);
  r = run("run", f, "--arg", "s32[2] {1, 2}", "--arg", "f32[2] {1, 2}", NULL);
  snprintf(want, sizeof want, "%s: error: parameter 0: expected f32[2], found s32[2]\n", f);
  EXPECT(r, 1, "", want);
  result_free(&r);

  int64_t d3[1] = {3}, d2[2] = {1, 2};
  float v[3] = {1, 2, 3};
  write_npy_f32("three.npy", d3, 1, v, 3);
  write_npy_f32("onebytwo.npy", d2, 2, v, 2);
  r = run("run", f, "--arg", tpath("onebytwo.npy"), "--arg", tpath("three.npy"), NULL);
  snprintf(want, sizeof want, "%s: error: parameter 0: expected f32[2], found f32[1,2] in %s\n", f,
           tpath("onebytwo.npy"));
  EXPECT(r, 1, "", want);
  result_free(&r);

  int32_t iv[2] = {1, 2};
  int64_t d1[1] = {2};
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_npy_write(tpath("ints.npy"), KILN_S32, d1, 1, iv, sizeof iv, &st), 0);
  r = run("run", f, "--arg", "f32[2] {0, 0}", "--arg", tpath("ints.npy"), NULL);
  snprintf(want, sizeof want, "%s: error: parameter 1: expected f32[2], found s32[2] in %s\n", f,
           tpath("ints.npy"));
  EXPECT(r, 1, "", want);
  result_free(&r);

  /* A bf16 parameter takes float32 only (and says so), not float64. */
  const char *g =
      write_file("b.hlo", "HloModule b\nENTRY main {\n  ROOT x = bf16[2] parameter(0)\n}\n");
  double dv[2] = {1, 2};
  ck_assert_int_eq(kiln_npy_write(tpath("f64.npy"), KILN_F64, d1, 1, dv, sizeof dv, &st), 0);
  r = run("run", g, "--arg", tpath("f64.npy"), NULL);
  snprintf(want, sizeof want,
           "%s: error: parameter 0: expected bf16[2], found f64[2] in %s (a bf16 parameter "
           "takes a bf16 literal or a float32 .npy)\n",
           g, tpath("f64.npy"));
  EXPECT(r, 1, "", want);
  result_free(&r);

  /* Unreadable and malformed arguments. */
  r = run("run", f, "--arg", tpath("missing.npy"), "--arg", "f32[2] {0, 0}", NULL);
  snprintf(want, sizeof want,
           "%s: error: parameter 0: %s: cannot open: No such file or directory\n", f,
           tpath("missing.npy"));
  EXPECT(r, 1, "", want);
  result_free(&r);
  const char *junk = tpath("junk.npy");
  static const char junk_bytes[] = "\x93NUMPY\x01\x00\x10\x00{'descr': 1}   \n";
  ck_assert_int_eq(kiln__file_write(junk, junk_bytes, sizeof junk_bytes - 1, &st), 0);
  r = run("run", f, "--arg", junk, "--arg", "f32[2] {0, 0}", NULL);
  snprintf(want, sizeof want,
           "%s: error: parameter 0: %s: malformed .npy header: expected a string at header "
           "offset 10\n",
           f, junk);
  EXPECT(r, 1, "", want);
  result_free(&r);
  r = run("run", f, "--arg", "f32[2] {1, 2", "--arg", "f32[2] {0, 0}", NULL);
  ck_assert_int_eq(r.code, 1);
  ck_assert_str_eq(r.out, "");
  snprintf(want, sizeof want,
           "%s: error: parameter 0: cannot parse 'f32[2] {1, 2' as a literal: ", f);
  ck_assert_msg(strncmp(r.err, want, strlen(want)) == 0, "%s", r.err);
  result_free(&r);
}
END_TEST

START_TEST(test_run_random_args) {
  const char *f = write_file(
      "r.hlo", "HloModule r\n"
               "ENTRY main {\n"
               "  a = f32[64] parameter(0)\n"
               "  b = s32[64] parameter(1)\n"
               "  c = pred[64] parameter(2)\n"
               "  d = bf16[64] parameter(3)\n"
               "  e = u8[64] parameter(4)\n"
               "  ROOT t = (f32[64], s32[64], pred[64], bf16[64], u8[64]) tuple(a, b, c, d, e)\n"
               "}\n");
  result r1 = run("run", f, "--random-args", "7", "--out", tpath("o"), NULL);
  result r2 = run("run", f, "--random-args", "7", NULL);
  result r3 = run("run", f, "--random-args", "8", NULL);
  ck_assert_int_eq(r1.code, 0);
  ck_assert_str_eq(r1.err, "");
  ck_assert_str_eq(r1.out, r2.out); /* deterministic */
  ck_assert_str_ne(r1.out, r3.out);
  kiln_npy a = read_npy(tpath("o/0.npy")), b = read_npy(tpath("o/1.npy")),
           c = read_npy(tpath("o/2.npy")), d = read_npy(tpath("o/3.npy")),
           e = read_npy(tpath("o/4.npy"));
  int trues = 0, negs = 0;
  for (int i = 0; i < 64; i++) {
    float av = ((float *)a.data)[i], dv = ((float *)d.data)[i];
    int32_t bv = ((int32_t *)b.data)[i];
    ck_assert(av >= -1.0f && av < 1.0f);
    ck_assert(dv >= -1.0f && dv < 1.0f);
    ck_assert(bv >= -8 && bv < 8);
    ck_assert_uint_lt(((uint8_t *)e.data)[i], 16);
    trues += ((uint8_t *)c.data)[i];
    negs += av < 0;
  }
  ck_assert(trues > 10 && trues < 54); /* fair coins, not constant */
  ck_assert(negs > 10 && negs < 54);
  kiln_npy_free(&a);
  kiln_npy_free(&b);
  kiln_npy_free(&c);
  kiln_npy_free(&d);
  kiln_npy_free(&e);
  result_free(&r1);
  result_free(&r2);
  result_free(&r3);

  /* --arg first, random for the rest. */
  const char *g = write_file("add.hlo", add_module);
  r1 = run("run", g, "--arg", "f32[2] {100, 200}", "--random-args", "0", NULL);
  ck_assert_int_eq(r1.code, 0);
  float x, y;
  ck_assert_int_eq(sscanf(r1.out, "f32[2] {%f, %f}", &x, &y), 2);
  ck_assert(x > 99 && x < 101 && y > 199 && y < 201);
  result_free(&r1);
}
END_TEST

START_TEST(test_run_runtime_errors) {
  /* A module that fails verification: exit 1 before running. */
  const char *f = write_file(
      "v.hlo", "HloModule m\nENTRY e {\n  p = f32[2] parameter(0)\n  q = f32[3] parameter(1)\n"
               "  ROOT r = f32[2] add(p, q)\n}\n");
  result r = run("run", f, "--random-args", "0", NULL);
  ck_assert_int_eq(r.code, 1);
  ck_assert_str_eq(r.out, "");
  result_free(&r);
  /* An op the interpreter does not run: exit 1, message at the instruction. */
  f = write_file("cc.hlo",
                 "HloModule m\nENTRY e {\n  p = f32[2] parameter(0)\n"
                 "  ROOT r = f32[2] custom-call(p), custom_call_target=\"no_such_target\"\n}\n");
  r = run("run", f, "--random-args", "0", NULL);
  ck_assert_int_eq(r.code, 1);
  ck_assert_str_eq(r.out, "");
  char want[512];
  snprintf(want, sizeof want, "%s:4:8: error: e/r: ", f);
  ck_assert_msg(strncmp(r.err, want, strlen(want)) == 0, "%s", r.err);
  result_free(&r);
  /* A loop that never ends is stopped by either limit. */
  f = write_file("forever.hlo",
                 "HloModule m\n"
                 "c {\n  s = s32[] parameter(0)\n  ROOT t = pred[] constant(true)\n}\n"
                 "b {\n  s = s32[] parameter(0)\n  one = s32[] constant(1)\n"
                 "  ROOT n = s32[] add(s, one)\n}\n"
                 "ENTRY e {\n  z = s32[] constant(0)\n"
                 "  ROOT w = s32[] while(z), condition=c, body=b\n}\n");
  r = run("run", f, "--max-iterations", "100", NULL);
  ck_assert_int_eq(r.code, 1);
  snprintf(want, sizeof want, "%s:13:8: error: e/w: ", f);
  ck_assert_msg(strncmp(r.err, want, strlen(want)) == 0, "%s", r.err);
  result_free(&r);
  r = run("run", f, "--timeout", "0.2", NULL);
  ck_assert_int_eq(r.code, 1);
  ck_assert_str_eq(r.out, "");
  ck_assert_ptr_nonnull(strstr(r.err, ": error: "));
  result_free(&r);
  /* --out where a file is in the way. */
  f = write_file("add.hlo", add_module);
  write_file("file", "x");
  r = run("run", f, "--random-args", "1", "--out", tpath("file"), NULL);
  ck_assert_int_eq(r.code, 1);
  snprintf(want, sizeof want, "kiln run: error: %s: not a directory\n", tpath("file"));
  ck_assert_ptr_nonnull(strstr(r.err, want));
  result_free(&r);
}
END_TEST

/* The shipped examples check, and the README's demo runs: two outputs, the
 * second a softmax whose rows sum to 1. */
/* ---- run --transform ---------------------------------------------------- */

static const char sine_loss[] =
    "HloModule f\n"
    "add { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }\n"
    "ENTRY main {\n"
    "  x = f32[3] parameter(0)\n"
    "  w = f32[] parameter(1)\n"
    "  wb = f32[3] broadcast(w), dimensions={}\n"
    "  s.1 = f32[3] sine(x)\n"
    "  m = f32[3] multiply(s.1, wb)\n"
    "  z = f32[] constant(0)\n"
    "  ROOT r = f32[] reduce(m, z), dimensions={0}, to_apply=add\n"
    "}\n";

START_TEST(test_run_transform) {
  const char *f = write_file("f.hlo", sine_loss);
  /* grad: the value, then the gradients */
  result r = run("run", f, "--transform", "grad:wrt=0,1", "--arg", "f32[3] {0, 1, 2}", "--arg",
                 "f32[] 2", NULL);
  EXPECT(r, 0, "f32[] 3.5015368\nf32[3] {2, 1.0806046, -0.8322937}\nf32[] 1.7507684\n", "");
  result_free(&r);
  /* jvp: tangents after the parameters; default wrt is parameter 0 for grad */
  r = run("run", f, "--transform", "jvp:wrt=1", "--arg", "f32[3] {0, 1, 2}", "--arg", "f32[] 2",
          "--arg", "f32[] 1", NULL);
  EXPECT(r, 0, "f32[] 3.5015368\nf32[] 1.7507684\n", "");
  result_free(&r);
  /* vmap of grad, the batch size taken from the .npy argument; --out */
  int64_t d[2] = {2, 3};
  float x[6] = {0, 1, 2, 3, 4, 5};
  write_npy_f32("x.npy", d, 2, x, 6);
  r = run("run", f, "--transform", "grad", "--transform", "vmap:in_axes=0,none", "--arg",
          tpath("x.npy"), "--arg", "f32[] 2", "--out", tpath("o"), NULL);
  EXPECT(r, 0,
         "f32[2] {3.5015368, -3.1492136}\n"
         "f32[2,3] {{2, 1.0806046, -0.8322937}, {-1.979985, -1.3072872, 0.5673244}}\n",
         "");
  result_free(&r);
  kiln_npy o = read_npy(tpath("o/1.npy"));
  ck_assert_uint_eq(o.rank, 2);
  ck_assert_int_eq(o.dims[0], 2);
  kiln_npy_free(&o);
  /* a batch axis elsewhere, and an explicit size */
  r = run("run", f, "--transform", "vmap:in_axes=1,none,size=2", "--arg",
          "f32[3,2] {{0, 3}, {1, 4}, {2, 5}}", "--arg", "f32[] 2", NULL);
  EXPECT(r, 0, "f32[2] {3.5015368, -3.1492136}\n", "");
  result_free(&r);
}
END_TEST

START_TEST(test_run_transform_errors) {
  const char *f = write_file("f.hlo", sine_loss);
  result r = run("run", f, "--transform", "hess", "--random-args", "1", NULL);
  EXPECT(r, 2, "",
         "kiln run: --transform 'hess': unknown transform 'hess' (expected grad, vjp, jvp, vmap, "
         "checkpoint or autocast, optionally followed by ':' and options)\n");
  result_free(&r);
  r = run("run", f, "--transform", "grad:wrt=3", "--random-args", "1", NULL);
  char want[512];
  snprintf(want, sizeof want,
           "%s: error: grad: wrt parameter 3 does not exist (ENTRY main takes 2 parameters)\n", f);
  EXPECT(r, 1, "", want);
  result_free(&r);
  r = run("run", f, "--transform", "vmap:in_axes=0,none,size=2", "--transform", "grad",
          "--random-args", "1", NULL);
  snprintf(want, sizeof want,
           "%s: error: grad: output 0 is f32[2]; grad needs a floating-point scalar output (vjp "
           "takes a cotangent for any output)\n",
           f);
  EXPECT(r, 1, "", want);
  result_free(&r);
  /* the error names the instruction and its place in the file */
  const char *g = write_file("rng.hlo", "HloModule s\n"
                                        "ENTRY main {\n"
                                        "  x = f32[3] parameter(0)\n"
                                        "  lo = f32[] parameter(1)\n"
                                        "  hi = f32[] constant(1)\n"
                                        "  s.3 = f32[3] rng(lo, hi), distribution=rng_uniform\n"
                                        "  ROOT y = f32[3] add(x, s.3)\n"
                                        "}\n");
  r = run("run", g, "--transform", "jvp", "--random-args", "1", NULL);
  snprintf(want, sizeof want,
           "%s:6:3: error: main/s.3: jvp: op rng (main/s.3) is not differentiable: random values\n",
           g);
  EXPECT(r, 1, "", want);
  result_free(&r);
  r = run("run", f, "--transform", "vmap:in_axes=0,none", "--random-args", "1", NULL);
  snprintf(want, sizeof want,
           "%s: error: vmap: cannot infer the batch size from the arguments (give size=N)\n", f);
  EXPECT(r, 1, "", want);
  result_free(&r);
  r = run("run", f, "--transform", "vmap:in_axes=0,0", "--arg",
          "f32[4,3] {{0,0,0},{0,0,0},{0,0,0},{0,0,0}}", "--arg", "f32[5] {0, 0, 0, 0, 0}", NULL);
  snprintf(want, sizeof want, "%s: error: vmap: argument 1 has batch size 5 but argument 0 has 4\n",
           f);
  EXPECT(r, 1, "", want);
  result_free(&r);
}
END_TEST

START_TEST(test_examples) {
  result r = run("check", KILN_SOURCE_DIR "/examples/mlp.hlo", KILN_SOURCE_DIR "/examples/axpy.hlo",
                 KILN_SOURCE_DIR "/examples/count_loop.hlo", NULL);
  EXPECT(r, 0, "", "");
  result_free(&r);
  r = run("run", KILN_SOURCE_DIR "/examples/mlp.hlo", "--random-args", "0", "--out", tpath("o"),
          NULL);
  ck_assert_int_eq(r.code, 0);
  ck_assert_str_eq(r.err, "");
  ck_assert_int_eq(strncmp(r.out, "f32[2,3] {{", 11), 0);
  ck_assert_ptr_nonnull(strstr(r.out, "}}\nf32[2,3] {{"));
  result_free(&r);
  kiln_npy p = read_npy(tpath("o/1.npy"));
  const float *v = p.data;
  for (int row = 0; row < 2; row++) {
    float sum = v[3 * row] + v[3 * row + 1] + v[3 * row + 2];
    ck_assert_float_eq_tol(sum, 1.0f, 1e-6f);
  }
  kiln_npy_free(&p);
  r = run("run", KILN_SOURCE_DIR "/examples/count_loop.hlo", "--arg", "s32[] 10", NULL);
  EXPECT(r, 0, "s32[] 45\ns32[] 10\n", "");
  result_free(&r);
}
END_TEST

/* ---- the cpu backend, executables, dot, bench ----------------------------- */

static const char mixed_module[] =
    "HloModule mixed\n"
    "add { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }\n"
    "ENTRY main {\n"
    "  x = f32[2,3] parameter(0)\n"
    "  n = s32[] parameter(1)\n"
    "  e = f32[2,3] exponential(x)\n"
    "  z = f32[] constant(0)\n"
    "  r = f32[2] reduce(e, z), dimensions={1}, to_apply=add\n"
    "  c = s32[] constant(3)\n"
    "  m = s32[] multiply(n, c)\n"
    "  ROOT t = (f32[2], s32[], f32[2,3]) tuple(r, m, x)\n"
    "}\n";

/* Same arguments, same output lines and .npy files on both backends. */
START_TEST(test_run_cpu) {
  const char *f = write_file("add.hlo", add_module);
  result r = run("run", f, "--backend", "cpu", "--arg", "f32[2] {1, 2.5}", "--arg",
                 "f32[2] {3, -4}", NULL);
  EXPECT(r, 0, "f32[2] {4, -1.5}\n", "");
  result_free(&r);
  const char *g = write_file("mixed.hlo", mixed_module);
  result a = run("run", g, "--random-args", "3", "--out", tpath("oi"), NULL);
  result b = run("run", g, "--backend", "cpu", "--random-args", "3", "--out", tpath("oc"), NULL);
  ck_assert_int_eq(a.code, 0);
  ck_assert_int_eq(b.code, 0);
  ck_assert_str_eq(b.err, "");
  /* the integer and the passed-through outputs are exact; the sums of
   * exponentials are checked through the .npy files within a tolerance */
  const char *ai = strchr(a.out, '\n'), *bi = strchr(b.out, '\n');
  ck_assert_ptr_nonnull(ai);
  ck_assert_ptr_nonnull(bi);
  ck_assert_str_eq(ai, bi);
  kiln_npy x = read_npy(tpath("oi/0.npy")), y = read_npy(tpath("oc/0.npy"));
  for (int i = 0; i < 2; i++)
    ck_assert_float_eq_tol(((float *)x.data)[i], ((float *)y.data)[i], 1e-5f);
  kiln_npy_free(&x);
  kiln_npy_free(&y);
  result_free(&a);
  result_free(&b);
  /* compiler options reach the compiler: every combination runs alike */
  r = run("run", f, "--backend", "cpu", "--target", "cpu-x86-64", "-O", "0", "--disable-pass",
          "cse", "--disable-pass", "dce", "--arg", "f32[2] {1, 2}", "--arg", "f32[2] {3, 4}",
          "--dump-dir", tpath("dump"), NULL);
  EXPECT(r, 0, "f32[2] {4, 6}\n", "");
  result_free(&r);
  ck_assert_int_eq(access(tpath("dump/00-input.hlo"), F_OK), 0);
  ck_assert_int_eq(access(tpath("dump/00-input.dot"), F_OK), 0);
}
END_TEST

START_TEST(test_run_cpu_errors) {
  const char *f = write_file("add.hlo", add_module);
  result r = run("run", f, "--backend", "cpu", "--target", "z80", "--random-args", "1", NULL);
  EXPECT(r, 2, "",
         "kiln run: unknown cpu target 'z80' (known: cpu, cpu-x86-64, cpu-x86-64-v2, "
         "cpu-x86-64-v3, cpu-x86-64-v4; or by ISA: native, x86-64, x86-64-v2, x86-64-v3, "
         "x86-64-v4)\n");
  result_free(&r);
  r = run("run", f, "--backend", "cpu", "--disable-pass", "frob", "--random-args", "1", NULL);
  ck_assert_int_eq(r.code, 2);
  ck_assert_ptr_nonnull(
      strstr(r.err, "kiln run: unknown pass 'frob' (passes: unroll, inline, algsimp, "));
  result_free(&r);
  r = run("run", f, "--backend", "cpu", "-O", "7", "--random-args", "1", NULL);
  EXPECT(r, 2, "", "kiln run: --opt-level needs a level from 0 to 3, not '7'\n");
  result_free(&r);
  r = run("run", f, "--target", "cpu", "--random-args", "1", NULL);
  EXPECT(r, 2, "",
         "kiln run: --target, --opt-level, --disable-pass, --dump-dir, --memory-budget and "
         "--user-kernel need --backend cpu\n");
  result_free(&r);
  /* an op the cpu backend refuses: exit 1, naming the instruction */
  const char *g = write_file("chol.hlo", "HloModule f\n"
                                         "ENTRY main {\n"
                                         "  x = bf16[4,4] parameter(0)\n"
                                         "  ROOT y = bf16[4,4] cholesky(x), lower=true\n"
                                         "}\n");
  r = run("run", g, "--backend", "cpu", "--random-args", "1", NULL);
  ck_assert_int_eq(r.code, 1);
  ck_assert_str_eq(r.out, "");
  char want[512];
  snprintf(want, sizeof want,
           "%s:4:8: error: main/y: cholesky main/y: the cpu backend cannot compile this "
           "cholesky: cholesky of bf16 values is not supported yet",
           g);
  ck_assert_msg(strncmp(r.err, want, strlen(want)) == 0, "%s", r.err);
  result_free(&r);
  /* argument errors read as on interp */
  r = run("run", f, "--backend", "cpu", "--arg", "f32[3] {1, 2, 3}", "--arg", "f32[2] {1, 2}",
          NULL);
  ck_assert_int_eq(r.code, 1);
  ck_assert_ptr_nonnull(strstr(r.err, "parameter 0: expected f32[2], found f32[3]"));
  result_free(&r);
}
END_TEST

/* --target takes every spelling of kiln_target_resolve in run, compile and
 * cache explain, and an unknown one is refused listing the table. */
START_TEST(test_target_spellings) {
  const char *f = write_file("add.hlo", add_module);
  const char *spell[][2] = {{"x86-64", "cpu-x86-64"},
                            {"cpu-x86-64", "cpu-x86-64"},
                            {"x86-64-v3", "cpu-x86-64-v3"},
                            {"cpu-x86-64-v3", "cpu-x86-64-v3"},
                            {"native", "cpu"},
                            {"cpu", "cpu"}};
  char want[1024];
  for (size_t i = 0; i < sizeof spell / sizeof spell[0]; i++) {
    result r = run("compile", f, "--target", spell[i][0], NULL);
    snprintf(want, sizeof want, "%s: compiled for %s: ", f, spell[i][1]);
    ck_assert_msg(r.code == 0 && strncmp(r.out, want, strlen(want)) == 0, "%s: %s%s", spell[i][0],
                  r.out, r.err);
    result_free(&r);
  }
  result r = run("run", f, "--backend", "cpu", "--target", "x86-64", "--arg", "f32[2] {1, 2}",
                 "--arg", "f32[2] {3, 4}", NULL);
  EXPECT(r, 0, "f32[2] {4, 6}\n", "");
  result_free(&r);
  r = run("run", f, "--backend", "cpu", "--target", "native", "--arg", "f32[2] {1, 2}", "--arg",
          "f32[2] {3, 4}", NULL);
  EXPECT(r, 0, "f32[2] {4, 6}\n", "");
  result_free(&r);
  /* in process, a bad name reads as kilnd's answer to --server */
  r = run("compile", f, "--target", "z80", NULL);
  snprintf(want, sizeof want,
           "%s: error: options.target: unknown cpu target 'z80' (known: cpu, cpu-x86-64, "
           "cpu-x86-64-v2, cpu-x86-64-v3, cpu-x86-64-v4; or by ISA: native, x86-64, x86-64-v2, "
           "x86-64-v3, x86-64-v4)\n",
           f);
  EXPECT(r, 1, "", want);
  result_free(&r);
  /* a cuda row compiles without --backend (NVRTC, no GPU needed) ... */
  r = run("compile", f, "--target", "cuda-sm_90", NULL);
  ck_assert_msg(r.code == 0 ? strstr(r.out, "compiled for cuda-sm_90") != NULL
                            : strstr(r.err, "libnvrtc") != NULL,
                "%d: %s%s", r.code, r.out, r.err);
  result_free(&r);
  /* ... and is not a cpu target */
  r = run("compile", f, "--backend", "cpu", "--target", "cuda-sm_90", NULL);
  ck_assert_int_eq(r.code, 1);
  ck_assert_msg(strstr(r.err, "target 'cuda-sm_90' is for the cuda backend, not cpu (known: "),
                "%s", r.err);
  result_free(&r);
  r = run("run", f, "--backend", "cpu", "--target", "cuda-sm_90", "--random-args", "1", NULL);
  ck_assert_int_eq(r.code, 2);
  ck_assert_msg(strstr(r.err, "kiln run: target 'cuda-sm_90' is for the cuda backend, not cpu"),
                "%s", r.err);
  result_free(&r);
  /* the cache key's target: one text per row, whatever the spelling */
  result a = run("cache", "explain", f, f, "--target", "x86-64-v3", NULL);
  result b = run("cache", "explain", f, f, "--target", "cpu-x86-64-v3", NULL);
  result c = run("cache", "explain", f, f, "--target", "cpu", NULL);
  result d = run("cache", "explain", f, f, NULL);
  ck_assert_int_eq(a.code, 0);
  ck_assert_str_eq(a.out, b.out);
  ck_assert_str_eq(c.out, d.out);
  ck_assert_str_ne(a.out, c.out);
  result_free(&a), result_free(&b), result_free(&c), result_free(&d);
  r = run("cache", "explain", f, f, "--target", "z80", NULL);
  ck_assert_int_eq(r.code, 2);
  const char *bad = "kiln cache explain: unknown cpu target 'z80' (known: cpu, ";
  ck_assert_msg(strncmp(r.err, bad, strlen(bad)) == 0, "%s", r.err);
  result_free(&r);
}
END_TEST

/* compile -o FILE.kexe, then run it: the outputs of running the module. */
START_TEST(test_compile_and_run_executable) {
  const char *g = write_file("mixed.hlo", mixed_module);
  const char *exe = tpath("mixed.kexe");
  result r = run("compile", g, "-o", exe, NULL);
  ck_assert_int_eq(r.code, 0);
  ck_assert_str_eq(r.err, "");
  result_free(&r);
  result a = run("run", g, "--backend", "cpu", "--random-args", "5", NULL);
  result b = run("run", exe, "--random-args", "5", NULL);
  EXPECT(b, 0, a.out, "");
  result_free(&b);
  /* recognized by its contents under another name; --backend cpu accepted */
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", exe, tpath("renamed.bin"));
  ck_assert_int_eq(system(cmd), 0);
  b = run("run", tpath("renamed.bin"), "--backend", "cpu", "--random-args", "5", NULL);
  EXPECT(b, 0, a.out, "");
  result_free(&b);
  result_free(&a);
  r = run("run", exe, "--arg", "f32[2,3] {{0, 0, 0}, {0, 0, 0}}", NULL);
  char want[512];
  snprintf(want, sizeof want,
           "%s: error: the executable takes 2 parameters, 1 argument given (--random-args SEED "
           "fills the rest)\n",
           exe);
  EXPECT(r, 1, "", want);
  result_free(&r);
  r = run("run", exe, "--arg", "f32[2,3] {{0, 0, 0}, {-0, 0, -0}}", "--arg", "s32[] 7", NULL);
  EXPECT(r, 0, "f32[2] {3, 3}\ns32[] 21\nf32[2,3] {{0, 0, 0}, {-0, 0, -0}}\n", "");
  result_free(&r);
  r = run("run", exe, "--backend", "interp", "--random-args", "1", NULL);
  snprintf(want, sizeof want, "kiln run: %s is a compiled executable; it runs on the cpu backend\n",
           exe);
  EXPECT(r, 2, "", want);
  result_free(&r);
  r = run("run", exe, "--backend", "cpu", "--disable-pass", "cse", "--random-args", "1", NULL);
  snprintf(want, sizeof want,
           "kiln run: %s is already compiled: compiler options and --transform need a module\n",
           exe);
  EXPECT(r, 2, "", want);
  result_free(&r);
}
END_TEST

/* A damaged executable is refused with a message, never run or crashed on. */
START_TEST(test_corrupt_executable) {
  const char *bad = write_file("bad.kexe", "this is not an executable\n");
  result r = run("run", bad, "--random-args", "1", NULL);
  char want[512];
  snprintf(want, sizeof want,
           "%s: error: executable blob: magic at offset 0: not a Kiln executable\n", bad);
  EXPECT(r, 1, "", want);
  result_free(&r);
  const char *g = write_file("add.hlo", add_module);
  const char *exe = tpath("add.kexe");
  r = run("compile", g, "-o", exe, NULL);
  ck_assert_int_eq(r.code, 0);
  result_free(&r);
  uint8_t *blob;
  size_t len;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln__file_read(exe, &blob, &len, &st), 0);
  ck_assert_uint_gt(len, 64);
  ck_assert_int_eq(memcmp(blob, "KILNEXE1", 8), 0);
  /* truncated: refused with a message */
  ck_assert_int_eq(kiln__file_write(tpath("cut.kexe"), blob, len / 2, &st), 0);
  r = run("run", tpath("cut.kexe"), "--random-args", "1", NULL);
  ck_assert_int_eq(r.code, 1);
  ck_assert_str_eq(r.out, "");
  ck_assert_ptr_nonnull(strstr(r.err, ": error: "));
  result_free(&r);
  /* another format version: refused, saying so */
  blob[8] ^= 0x7f;
  ck_assert_int_eq(kiln__file_write(tpath("ver.kexe"), blob, len, &st), 0);
  blob[8] ^= 0x7f;
  r = run("run", tpath("ver.kexe"), "--random-args", "1", NULL);
  ck_assert_int_eq(r.code, 1);
  ck_assert_ptr_nonnull(strstr(r.err, "version"));
  result_free(&r);
  kiln_free(blob);
}
END_TEST

/* Damage anywhere in the header and tables of an executable (everything
 * before the code object, which the loader checks field by field) must end
 * in a clean refusal or a correct run: never a signal or an internal error.
 * (A damaged code object is out of reach of field checks: only a checksum
 * over the blob could catch it.) */
START_TEST(test_damaged_executable_tables) {
  const char *g = write_file("add.hlo", add_module);
  const char *exe = tpath("add.kexe");
  result r = run("compile", g, "-o", exe, NULL);
  ck_assert_int_eq(r.code, 0);
  result_free(&r);
  uint8_t *blob;
  size_t len;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln__file_read(exe, &blob, &len, &st), 0);
  size_t code = 8;
  while (code + 4 <= len && memcmp(blob + code, "\177ELF", 4) != 0) code++;
  ck_assert_uint_lt(code, len);
  for (size_t off = 8; off < code; off += 3) {
    blob[off] ^= 0xa5;
    ck_assert_int_eq(kiln__file_write(tpath("flip.kexe"), blob, len, &st), 0);
    blob[off] ^= 0xa5;
    r = run("run", tpath("flip.kexe"), "--arg", "f32[2] {1, 2}", "--arg", "f32[2] {3, 4}",
            "--timeout", "10", NULL);
    ck_assert_msg(r.code == 0 || r.code == 1, "byte %zu flipped: exit %d: %s", off, r.code, r.err);
    result_free(&r);
  }
  kiln_free(blob);
}
END_TEST

/* kiln explain: fusion's decisions with the cost model's numbers. */
static const char *const softmax_module =
    "HloModule sm\n"
    "add_f {\n"
    "  a = f32[] parameter(0)\n"
    "  b = f32[] parameter(1)\n"
    "  ROOT s = f32[] add(a, b)\n"
    "}\n"
    "ENTRY main {\n"
    "  x = f32[64,128] parameter(0)\n"
    "  e = f32[64,128] exponential(x)\n"
    "  z = f32[] constant(0)\n"
    "  s = f32[64] reduce(e, z), dimensions={1}, to_apply=add_f\n"
    "  b = f32[64,128] broadcast(s), dimensions={0}\n"
    "  ROOT d = f32[64,128] divide(e, b)\n"
    "}\n";

START_TEST(test_explain) {
  const char *f = write_file("sm.hlo", softmax_module);
  result r = run("explain", f, NULL);
  ck_assert_msg(r.code == 0, "%s", r.err);
  const char *want[] = {"fusion on target cpu: a kernel costs max(flops / ",
                        "computation main",
                        "group 0 (kLoop) rooted at d: ",
                        "+ b joins group 0: fused ",
                        "+ e joins group 0: fused ",
                        " beats ",
                        "=> fusion (kLoop, ",
                        "members ",
                        "summary: ENTRY main has 1 fusions"};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    ck_assert_msg(strstr(r.out, want[i]) != NULL, "explain lacks \"%s\":\n%s", want[i], r.out);
  result_free(&r);
  /* -O 0 runs no fusion: said so */
  r = run("explain", f, "-O", "0", NULL);
  ck_assert_int_eq(r.code, 0);
  ck_assert_ptr_nonnull(strstr(r.out, "fusion did not run"));
  result_free(&r);
  r = run("explain", tpath("missing.hlo"), NULL);
  ck_assert_int_ne(r.code, 0);
  result_free(&r);
}
END_TEST

START_TEST(test_dot) {
  const char *f = write_file("add.hlo", add_module);
  result r = run("dot", f, NULL);
  ck_assert_int_eq(r.code, 0);
  ck_assert_str_eq(r.err, "");
  ck_assert_int_eq(strncmp(r.out, "digraph \"add\" {\n", 16), 0);
  ck_assert_ptr_nonnull(strstr(r.out, "ENTRY main"));
  ck_assert_str_eq(r.out + strlen(r.out) - 2, "}\n");
  result o = run("dot", f, "-o", tpath("g.dot"), NULL);
  EXPECT(o, 0, "", "");
  char *file = slurp(tpath("g.dot"));
  ck_assert_str_eq(file, r.out);
  kiln_free(file);
  result_free(&o);
  result_free(&r);
  /* the graph after a given pass, and of the input */
  r = run("dot", f, "--after", "input", NULL);
  ck_assert_int_eq(r.code, 0);
  ck_assert_ptr_nonnull(strstr(r.out, "parameter f32[2]"));
  result_free(&r);
  r = run("dot", f, "--after", "algsimp", "-O", "1", "--disable-pass", "cse", NULL);
  ck_assert_int_eq(r.code, 0);
  result_free(&r);
  r = run("dot", f, "--after", "frob", NULL);
  ck_assert_int_eq(r.code, 2);
  ck_assert_ptr_nonnull(
      strstr(r.err, "kiln dot: unknown pass 'frob' (input, unroll, inline, algsimp, "));
  result_free(&r);
  const char *bad = write_file("bad.hlo", "HloModule m\nENTRY e {\n");
  r = run("dot", bad, NULL);
  ck_assert_int_eq(r.code, 1);
  ck_assert_str_eq(r.out, "");
  result_free(&r);
}
END_TEST

/* One JSON object on one line, with the promised fields. */
/* --memory-budget: the remat line of kiln compile, the remat record of the
 * bench JSON, a budget no schedule meets (exit 1 naming the smallest peak)
 * and a malformed one (usage). */
START_TEST(test_memory_budget) {
  const char *f = write_file("mixed.hlo", mixed_module);
  result r = run("compile", f, "--memory-budget", "1G", NULL);
  ck_assert_int_eq(r.code, 0);
  ck_assert_msg(strstr(r.out, "remat: budget 1073741824 bytes: peak ") != NULL, "%s", r.out);
  ck_assert_ptr_nonnull(strstr(r.out, " 0 values recomputed (+0 flops), 0 moved\n"));
  result_free(&r);
  r = run("bench", f, "--iters", "1", "--memory-budget", "64K", NULL);
  ck_assert_int_eq(r.code, 0);
  ck_assert_msg(strstr(r.out, "\"remat\": {\"budget\": 65536, \"temp_peak_before\": ") != NULL,
                "%s", r.out);
  result_free(&r);
  const char *g = write_file("dots.hlo", "HloModule dots\n"
                                         "ENTRY main {\n"
                                         "  x = f32[4,4] parameter(0)\n"
                                         "  d = f32[4,4] dot(x, x), lhs_contracting_dims={1}, "
                                         "rhs_contracting_dims={0}\n"
                                         "  ROOT e = f32[4,4] dot(d, x), lhs_contracting_dims={1}, "
                                         "rhs_contracting_dims={0}\n"
                                         "}\n");
  r = run("compile", g, "--memory-budget", "1", NULL);
  ck_assert_int_eq(r.code, 1);
  ck_assert_msg(strstr(r.err, "error: memory_budget: a peak of ") != NULL, "%s", r.err);
  ck_assert_ptr_nonnull(strstr(r.err, "bytes at the least"));
  result_free(&r);
  r = run("compile", f, "--memory-budget", "12x", NULL);
  EXPECT(r, 2, "",
         "kiln compile: --memory-budget needs a positive number of bytes (K, M or G for KiB, MiB, "
         "GiB), not '12x'\n");
  result_free(&r);
}
END_TEST

START_TEST(test_bench) {
  const char *f = write_file("mixed.hlo", mixed_module);
  result r = run("bench", f, "--iters", "3", "--random-args", "2", NULL);
  ck_assert_int_eq(r.code, 0);
  ck_assert_str_eq(r.err, "");
  ck_assert_int_eq(r.out[0], '{');
  ck_assert_ptr_eq(strchr(r.out, '\n'), r.out + strlen(r.out) - 1);
  static const char *const fields[] = {
      "\"backend\": \"cpu\"", "\"iters\": 3,",    "\"compile_ms\": ",
      "\"passes_ms\": {",     "\"cc_ms\": ",      "\"run_us_median\": ",
      "\"run_us_p90\": ",     "\"peak_bytes\": ", "\"mode\": \"buffers\""};
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
    ck_assert_msg(strstr(r.out, fields[i]) != NULL, "no %s in %s", fields[i], r.out);
  /* peak = parameters (24 + 4) + outputs (8 + 4 + 24) + temporaries */
  unsigned long long peak, temp;
  const char *p = strstr(r.out, "\"peak_bytes\": "), *t = strstr(r.out, "\"temp_peak_bytes\": ");
  ck_assert(sscanf(p, "\"peak_bytes\": %llu", &peak) == 1);
  ck_assert(sscanf(t, "\"temp_peak_bytes\": %llu", &temp) == 1);
  ck_assert_uint_eq(peak, 28 + 36 + temp);
  result_free(&r);
  r = run("bench", f, "--backend", "interp", "--iters", "2", NULL);
  ck_assert_int_eq(r.code, 0);
  ck_assert_ptr_nonnull(strstr(r.out, "\"backend\": \"interp\""));
  ck_assert_ptr_nonnull(strstr(r.out, "\"peak_bytes\": null}\n"));
  result_free(&r);
  r = run("bench", f, "--iters", "0", NULL);
  EXPECT(r, 2, "", "kiln bench: --iters needs an integer from 1 to 1000000, not '0'\n");
  result_free(&r);
  r = run("bench", f, "--backend", "tpu", NULL);
  EXPECT(r, 2, "",
         "kiln bench: unknown backend 'tpu' (available here: cpu, interp; a server may also have "
         "cuda)\n");
  result_free(&r);
  r = run("bench", f, "--backend", "interp", "-O", "1", NULL);
  ck_assert_int_eq(r.code, 2);
  result_free(&r);
  /* --arg gives parameters their values (the rest stay pseudo-random). */
  r = run("bench", f, "--iters", "2", "--arg", "f32[2,3] {{1, 2, 3}, {4, 5, 6}}", NULL);
  ck_assert_msg(r.code == 0, "%s", r.err);
  ck_assert_ptr_nonnull(strstr(r.out, "\"run_us_median\": "));
  result_free(&r);
  r = run("bench", f, "--arg", "f32[3] {1, 2, 3}", NULL);
  ck_assert_int_eq(r.code, 1);
  ck_assert_msg(strstr(r.err, "parameter 0: expected f32[2,3]") != NULL, "%s", r.err);
  result_free(&r);
  r = run("bench", f, "--arg", "f32[2,3] {{1, 2, 3}, {4, 5, 6}}", "--arg", "s32[] 1", "--arg",
          "s32[] 2", NULL);
  ck_assert_int_eq(r.code, 1);
  ck_assert_msg(strstr(r.err, "takes 2 parameters, 3 --arg given") != NULL, "%s", r.err);
  result_free(&r);
}
END_TEST

static Suite *cli_suite(void) {
  Suite *s = suite_create("cli");
  TCase *tc = tcase_create("core");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_help);
  tcase_add_test(tc, test_run_mesh);
  tcase_add_test(tc, test_compile_bench_mesh);
  tcase_add_test(tc, test_compile_windowed);
  tcase_add_test(tc, test_usage_errors);
  tcase_add_test(tc, test_check_ok);
  tcase_add_test(tc, test_check_parse_error);
  tcase_add_test(tc, test_check_verify_error);
  tcase_add_test(tc, test_check_several_files);
  tcase_add_test(tc, test_check_garbage);
  tcase_add_test(tc, test_print);
  tcase_add_test(tc, test_run_literal_args);
  tcase_add_test(tc, test_run_npy_args_and_out);
  tcase_add_test(tc, test_run_empty_outputs);
  tcase_add_test(tc, test_run_dynamic_rows);
  tcase_add_test(tc, test_run_tuple_flattening);
  tcase_add_test(tc, test_run_bf16_from_f32_npy);
  tcase_add_test(tc, test_run_argument_mismatch);
  tcase_add_test(tc, test_run_random_args);
  tcase_add_test(tc, test_run_runtime_errors);
  tcase_add_test(tc, test_run_transform);
  tcase_add_test(tc, test_run_transform_errors);
  tcase_add_test(tc, test_examples);
  tcase_add_test(tc, test_run_cpu);
  tcase_add_test(tc, test_run_cpu_errors);
  tcase_add_test(tc, test_target_spellings);
  tcase_add_test(tc, test_compile_and_run_executable);
  tcase_add_test(tc, test_corrupt_executable);
  tcase_add_test(tc, test_damaged_executable_tables);
  tcase_add_test(tc, test_dot);
  tcase_add_test(tc, test_explain);
  tcase_add_test(tc, test_bench);
  tcase_add_test(tc, test_memory_budget);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(cli_suite());
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
