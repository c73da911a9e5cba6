/* Parse + verify throughput on a large generated HLO module.
 *
 * The generator writes a module of the shape real JAX exports have: many
 * called computations (one per "layer": dot, bias broadcast, relu, a softmax
 * with two reductions, compare/select, a bf16 round trip), each instruction
 * with XLA-style names, layouts, typed operands on some instructions and
 * op_name/source metadata, and an ENTRY that calls every layer in turn.
 *
 * The figure reported is parse+verify MB/s (median of the runs) as a ratio
 * against a baseline measured in the same process on the same bytes: a plain
 * tokenizing scan (one pass, a 256-entry byte-class table, words, strings and
 * punctuation counted). That scan is the least work any HLO parser must do
 * (touch every byte and find the token boundaries), so the ratio says how
 * much the real work (building the IR, interning names, checking shapes)
 * costs on top of lexing, and it stays comparable across machines. A memchr
 * newline count would measure memory bandwidth instead and make the ratio
 * mostly a property of the machine.
 *
 * Usage: bench_parse [MB] [runs]   (defaults: 100 MB, 5 runs)
 *        bench_parse --dump [MB]   (writes the generated module to stdout)
 * Output: one JSON line on stdout; progress on stderr.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/sbuf.h"
#include "common/status.h"
#include "compiler/ir/text.h"
#include "compiler/ir/verify.h"

#define MAX_RUNS 21

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the generated module ---------------------------------------------- */

typedef struct gen {
  kiln_sbuf *b;
  unsigned next_id; /* XLA numbers instructions module-wide: %add.123 */
  unsigned line;    /* fake source line for metadata */
} gen;

/* Ids a layer may use; layer k's numbering starts at layer_first_id(k). */
#define LAYER_IDS 40u
#define FIRST_LAYER_ID 9u
static unsigned layer_first_id(int k) { return FIRST_LAYER_ID + LAYER_IDS * (unsigned)k; }

static void meta(gen *g, int layer, const char *op_type, const char *op_name) {
  kiln_sbuf_printf(
      g->b,
      ", metadata={op_type=\"%s\" op_name=\"jit(train_step)/jit(main)/mlp/layer_%d/%s\""
      " source_file=\"/srv/models/transformer/mlp.py\" source_line=%u}",
      op_type, layer, op_name, 100 + g->line++ % 900);
}

static void reducers(gen *g) {
  kiln_sbuf_puts(g->b, "%region_add.1 (Arg_0.2: f32[], Arg_1.3: f32[]) -> f32[] {\n"
                       "  %Arg_0.2 = f32[] parameter(0)\n"
                       "  %Arg_1.3 = f32[] parameter(1)\n"
                       "  ROOT %add.4 = f32[] add(f32[] %Arg_0.2, f32[] %Arg_1.3)\n"
                       "}\n\n"
                       "%region_max.5 (Arg_0.6: f32[], Arg_1.7: f32[]) -> f32[] {\n"
                       "  %Arg_0.6 = f32[] parameter(0)\n"
                       "  %Arg_1.7 = f32[] parameter(1)\n"
                       "  ROOT %maximum.8 = f32[] maximum(f32[] %Arg_0.6, f32[] %Arg_1.7)\n"
                       "}\n\n");
  g->next_id = FIRST_LAYER_ID;
}

#define A "f32[64,256]{1,0}"
#define W "f32[256,256]{1,0}"
#define V "f32[256]{0}"
#define R "f32[64]{0}"

/* The rest of layer k after relu: square, tanh, exp, a softmax with two
 * reductions, a mask, a round trip through bf16, and the tuple root. */
static void layer_tail(gen *g, int k, unsigned id, unsigned relu, unsigned zb) {
  kiln_sbuf *b = g->b;
  unsigned sq = id++, th = id++, ex = id++, sub = id++, ninf = id++, mx = id++, mxb = id++,
           sh = id++, e2 = id++, z2 = id++, sum = id++, sumb = id++, div = id++, cmp = id++,
           sel = id++, lo = id++, hi = id++, tup = id++;
  kiln_sbuf_printf(b, "\n  %%multiply.%u = " A " multiply(%%maximum.%u, %%maximum.%u)", sq, relu,
                   relu);
  meta(g, k, "mul", "square/mul");
  kiln_sbuf_printf(b, "\n  %%tanh.%u = " A " tanh(%%multiply.%u)", th, sq);
  meta(g, k, "tanh", "tanh");
  kiln_sbuf_printf(b, "\n  %%exponential.%u = " A " exponential(%%tanh.%u)", ex, th);
  meta(g, k, "exp", "exp");
  kiln_sbuf_printf(b, "\n  %%subtract.%u = " A " subtract(%%exponential.%u, %%maximum.%u)", sub, ex,
                   relu);
  meta(g, k, "sub", "sub");
  kiln_sbuf_printf(b, "\n  %%constant.%u = f32[] constant(-inf)", ninf);
  kiln_sbuf_printf(b,
                   "\n  %%reduce.%u = " R " reduce(" A " %%subtract.%u, f32[] %%constant.%u), "
                   "dimensions={1}, to_apply=%%region_max.5",
                   mx, sub, ninf);
  meta(g, k, "reduce_max", "softmax/reduce_max");
  kiln_sbuf_printf(b, "\n  %%broadcast.%u = " A " broadcast(" R " %%reduce.%u), dimensions={0}",
                   mxb, mx);
  kiln_sbuf_printf(b, "\n  %%subtract.%u = " A " subtract(%%subtract.%u, %%broadcast.%u)", sh, sub,
                   mxb);
  meta(g, k, "sub", "softmax/sub");
  kiln_sbuf_printf(b, "\n  %%exponential.%u = " A " exponential(%%subtract.%u)", e2, sh);
  meta(g, k, "exp", "softmax/exp");
  kiln_sbuf_printf(b, "\n  %%constant.%u = f32[] constant(0)", z2);
  kiln_sbuf_printf(b,
                   "\n  %%reduce.%u = " R " reduce(" A " %%exponential.%u, f32[] %%constant.%u), "
                   "dimensions={1}, to_apply=%%region_add.1",
                   sum, e2, z2);
  meta(g, k, "reduce_sum", "softmax/reduce_sum");
  kiln_sbuf_printf(b, "\n  %%broadcast.%u = " A " broadcast(" R " %%reduce.%u), dimensions={0}",
                   sumb, sum);
  kiln_sbuf_printf(b, "\n  %%divide.%u = " A " divide(%%exponential.%u, %%broadcast.%u)", div, e2,
                   sumb);
  meta(g, k, "div", "softmax/div");
  kiln_sbuf_printf(b,
                   "\n  %%compare.%u = pred[64,256]{1,0} compare(%%divide.%u, %%broadcast.%u), "
                   "direction=GT",
                   cmp, div, zb);
  meta(g, k, "gt", "mask/gt");
  kiln_sbuf_printf(b, "\n  %%select.%u = " A " select(%%compare.%u, %%divide.%u, %%broadcast.%u)",
                   sel, cmp, div, zb);
  meta(g, k, "select_n", "mask/select_n");
  kiln_sbuf_printf(b, "\n  %%convert.%u = bf16[64,256]{1,0} convert(%%select.%u)", lo, sel);
  meta(g, k, "convert_element_type", "convert_element_type");
  kiln_sbuf_printf(b, "\n  %%convert.%u = " A " convert(bf16[64,256]{1,0} %%convert.%u)", hi, lo);
  meta(g, k, "convert_element_type", "convert_element_type");
  kiln_sbuf_printf(b,
                   "\n  ROOT %%tuple.%u = (" A ", " R ") tuple(%%convert.%u, %%reduce.%u)\n}\n\n",
                   tup, hi, sum);
}

/* One layer: x (64x256) -> softmax(relu(x.w + b)) rounded through bf16,
 * plus the softmax denominator, as a tuple. */
static void layer(gen *g, int k) {
  kiln_sbuf *b = g->b;
  unsigned x = layer_first_id(k), w = x + 1, bias = x + 2, id = x + 3;
  g->next_id = x + LAYER_IDS;
  kiln_sbuf_printf(b,
                   "%%layer_%d.%u (Arg_0.%u: f32[64,256], Arg_1.%u: f32[256,256], "
                   "Arg_2.%u: f32[256]) -> (" A ", " R ") {\n",
                   k, id++, x, w, bias);
  kiln_sbuf_printf(b, "  %%Arg_0.%u = " A " parameter(0)", x);
  meta(g, k, "parameter", "x");
  kiln_sbuf_printf(b, "\n  %%Arg_1.%u = " W " parameter(1)", w);
  meta(g, k, "parameter", "w");
  kiln_sbuf_printf(b, "\n  %%Arg_2.%u = " V " parameter(2)", bias);
  meta(g, k, "parameter", "b");
  unsigned dot = id++, bb = id++, add = id++, zero = id++, zb = id++, relu = id++;
  kiln_sbuf_printf(b,
                   "\n  %%dot.%u = " A " dot(" A " %%Arg_0.%u, " W " %%Arg_1.%u), "
                   "lhs_contracting_dims={1}, rhs_contracting_dims={0}",
                   dot, x, w);
  meta(g, k, "dot_general", "dot_general");
  kiln_sbuf_printf(b, "\n  %%broadcast.%u = " A " broadcast(" V " %%Arg_2.%u), dimensions={1}", bb,
                   bias);
  meta(g, k, "broadcast_in_dim", "broadcast_in_dim");
  kiln_sbuf_printf(b, "\n  %%add.%u = " A " add(%%dot.%u, %%broadcast.%u)", add, dot, bb);
  meta(g, k, "add", "add");
  kiln_sbuf_printf(b, "\n  %%constant.%u = f32[] constant(0)", zero);
  kiln_sbuf_printf(b, "\n  %%broadcast.%u = " A " broadcast(f32[] %%constant.%u), dimensions={}",
                   zb, zero);
  kiln_sbuf_printf(b, "\n  %%maximum.%u = " A " maximum(%%add.%u, %%broadcast.%u)", relu, add, zb);
  meta(g, k, "max", "relu/max");
  layer_tail(g, k, id, relu, zb);
}

/* Writes the module; returns the number of layers (called computations). */
static int generate(kiln_sbuf *b, size_t target_bytes) {
  gen g = {b, 1, 0};
  kiln_sbuf_puts(b, "HloModule jit_train_step, entry_computation_layout={(" A ", " W ", " V ")->" A
                    "}\n\n");
  reducers(&g);
  /* Estimate the entry's share (two lines per layer) so the total lands
   * near the target. */
  int layers = 0;
  while (b->len + (size_t)layers * 170 < target_bytes && !b->failed) layer(&g, layers++);
  unsigned x = g.next_id++, w = g.next_id++, bias = g.next_id++;
  kiln_sbuf_printf(b,
                   "ENTRY %%main.%u (Arg_0.%u: f32[64,256], Arg_1.%u: f32[256,256], "
                   "Arg_2.%u: f32[256]) -> " A " {\n",
                   g.next_id++, x, w, bias);
  kiln_sbuf_printf(b, "  %%Arg_0.%u = " A " parameter(0)\n", x);
  kiln_sbuf_printf(b, "  %%Arg_1.%u = " W " parameter(1)\n", w);
  kiln_sbuf_printf(b, "  %%Arg_2.%u = " V " parameter(2)\n", bias);
  char prev[48];
  snprintf(prev, sizeof prev, "%%Arg_0.%u", x);
  for (int k = 0; k < layers; k++) {
    unsigned call = g.next_id++, gte = g.next_id++;
    kiln_sbuf_printf(b,
                     "  %%call.%u = (" A ", " R ") call(%s, %%Arg_1.%u, %%Arg_2.%u), "
                     "to_apply=%%layer_%d.%u\n",
                     call, prev, w, bias, k, layer_first_id(k) + 3);
    kiln_sbuf_printf(b,
                     "  %s%%get-tuple-element.%u = " A " get-tuple-element(%%call.%u), index=0\n",
                     k + 1 == layers ? "ROOT " : "", gte, call);
    snprintf(prev, sizeof prev, "%%get-tuple-element.%u", gte);
  }
  kiln_sbuf_puts(b, "}\n");
  return layers;
}

/* ---- the baseline: a plain tokenizing scan ------------------------------ */

enum { C_SPACE, C_WORD, C_PUNCT, C_QUOTE };

static size_t token_scan(const char *s, size_t n) {
  static unsigned char cls[256];
  static int ready;
  if (!ready) {
    for (int c = 0; c < 256; c++) {
      if (c == ' ' || c == '\n' || c == '\t' || c == '\r')
        cls[c] = C_SPACE;
      else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '_' || c == '.' || c == '-' || c == '%' || c >= 0x80)
        cls[c] = C_WORD;
      else if (c == '"')
        cls[c] = C_QUOTE;
      else
        cls[c] = C_PUNCT;
    }
    ready = 1;
  }
  size_t tokens = 0, i = 0;
  while (i < n) {
    unsigned char c = cls[(unsigned char)s[i]];
    if (c == C_SPACE) {
      i++;
    } else if (c == C_WORD) {
      while (i < n && cls[(unsigned char)s[i]] == C_WORD) i++;
      tokens++;
    } else if (c == C_QUOTE) {
      for (i++; i < n && s[i] != '"'; i++)
        if (s[i] == '\\') i++;
      i++;
      tokens++;
    } else {
      i++;
      tokens++;
    }
  }
  return tokens;
}

/* ---- measurement ---------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int fail(const char *what, const kiln_status *st) {
  char buf[KILN_STATUS_WHERE_MAX + KILN_STATUS_MSG_MAX + 16];
  kiln_status_format(st, buf, sizeof buf);
  fprintf(stderr, "bench_parse: %s: %s\n", what, buf);
  return 1;
}

static int dump(double mb) {
  kiln_sbuf text = KILN_SBUF_INIT;
  generate(&text, (size_t)(mb * 1e6));
  int bad = kiln_sbuf_failed(&text) || fwrite(text.data, 1, text.len, stdout) != text.len;
  kiln_sbuf_free(&text);
  return bad;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--dump") == 0) return dump(argc > 2 ? atof(argv[2]) : 1.0);
  double mb = argc > 1 ? atof(argv[1]) : 100.0;
  int runs = argc > 2 ? atoi(argv[2]) : 5;
  if (mb <= 0 || mb > 4096 || runs < 1 || runs > MAX_RUNS) {
    fprintf(stderr, "usage: bench_parse [MB (0-4096], default 100] [runs (1-%d), default 5]\n",
            MAX_RUNS);
    return 2;
  }
  kiln_sbuf text = KILN_SBUF_INIT;
  double t0 = now();
  int layers = generate(&text, (size_t)(mb * 1e6));
  if (kiln_sbuf_failed(&text)) {
    fprintf(stderr, "bench_parse: out of memory generating the module\n");
    return 1;
  }
  const char *s = text.data;
  size_t n = text.len;
  fprintf(stderr, "bench_parse: generated %.1f MB, %d layers, in %.2f s\n", (double)n / 1e6, layers,
          now() - t0);

  double t_scan[MAX_RUNS], t_parse[MAX_RUNS], t_verify[MAX_RUNS], t_both[MAX_RUNS];
  size_t tokens = 0, instrs = 0;
  for (int r = 0; r < runs; r++) {
    /* Alternate the two measurements so that drift affects both alike. */
    double a = now();
    tokens = token_scan(s, n);
    t_scan[r] = now() - a;

    kiln_status st;
    kiln_status_clear(&st);
    kiln_module *m = NULL;
    a = now();
    if (kiln_module_parse_text(s, n, "bench.hlo", NULL, &m, &st) != 0) return fail("parse", &st);
    double b = now();
    if (kiln_module_verify(m, NULL, &st) != 0) return fail("verify", &st);
    double c = now();
    t_parse[r] = b - a;
    t_verify[r] = c - b;
    t_both[r] = c - a;
    instrs = m->ninstrs;
    kiln_module_destroy(m);
    fprintf(stderr, "bench_parse: run %d: scan %.3f s, parse %.3f s, verify %.3f s\n", r + 1,
            t_scan[r], t_parse[r], t_verify[r]);
  }
  double mbytes = (double)n / 1e6;
  double scan = mbytes / median(t_scan, runs);
  double parse = mbytes / median(t_parse, runs);
  double verify = mbytes / median(t_verify, runs);
  double both = mbytes / median(t_both, runs);
  printf("{\"bench\":\"parse_verify\",\"bytes\":%zu,\"computations\":%d,\"instructions\":%zu,"
         "\"tokens\":%zu,\"runs\":%d,\"parse_verify_mb_s\":%.1f,\"parse_mb_s\":%.1f,"
         "\"verify_mb_s\":%.1f,\"baseline\":\"token_scan\",\"baseline_mb_s\":%.1f,"
         "\"ratio\":%.4f}\n",
         n, layers + 2, instrs, tokens, runs, both, parse, verify, scan, both / scan);
  kiln_sbuf_free(&text);
  return 0;
}
