/* All-reduce throughput between cpu devices in shared memory against a
 * memcpy of the same bytes, in the same run.
 *
 * For N = 2 and 4 devices: an executable whose entry is one f32 add
 * all-reduce of `bytes` per device, loaded on a communicator of N cpu
 * devices and run as gang launches (kiln_mesh_execute; thread start,
 * result allocation and the rendezvous included). Each rank reads the N
 * members' operands and writes its own result, so the baseline is a memcpy
 * of the same payload (`bytes`) on one thread. The ratio is memcpy time /
 * all-reduce time, medians of `rounds` rounds; 1.0 would be an all-reduce
 * as fast as copying its payload once.
 *
 * usage: bench_allreduce [MiB per device (16)] [rounds (7)]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "compiler/codegen/executable.h"
#include "compiler/compile.h"
#include "compiler/ir/ir.h"
#include "compiler/ir/text.h"
#include "executor/backend.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void die(const char *what, const kiln_status *st) {
  fprintf(stderr, "bench_allreduce: %s: %s: %s\n", what, st->where, st->msg);
  exit(1);
}

int main(int argc, char **argv) {
  size_t mib = argc > 1 ? (size_t)atoi(argv[1]) : 16;
  int rounds = argc > 2 ? atoi(argv[2]) : 7;
  if (mib == 0 || rounds < 1 || rounds > 99) return 2;
  size_t bytes = mib << 20, n_el = bytes / 4;
  kiln_status st;
  kiln_status_clear(&st);
  printf("payload %zu MiB f32 per device, %d rounds\n", mib, rounds);
  for (uint32_t n = 2; n <= 4; n *= 2) {
    char text[1024];
    snprintf(
        text, sizeof text,
        "HloModule b, replica_count=%u\n"
        "add {\n x = f32[] parameter(0)\n y = f32[] parameter(1)\n ROOT s = f32[] add(x, y)\n}\n"
        "ENTRY e {\n p = f32[%zu] parameter(0)\n"
        " ROOT r = f32[%zu] all-reduce(p), replica_groups={}, to_apply=add\n}\n",
        n, n_el, n_el);
    kiln_module *m = NULL;
    kiln_executable *e = NULL;
    if (kiln_module_parse_text(text, strlen(text), "b.hlo", NULL, &m, &st)) die("parse", &st);
    if (kiln_compile(m, NULL, &e, NULL, &st)) die("compile", &st);
    kiln_backend *b = NULL;
    kiln_backend_options bo = {.ndevices = n, .threads_per_device = 1};
    if (kiln_backend_create("cpu", &bo, &b, &st)) die("backend", &st);
    kiln_device *devs[4];
    for (uint32_t k = 0; k < n; k++) devs[k] = kiln_backend_device(b, k);
    kiln_comm *comm = NULL;
    kiln_mesh *mesh = NULL;
    if (kiln_comm_create(b, devs, n, &comm, &st) || kiln_comm_load(comm, e, &mesh, &st))
      die("load", &st);
    kiln_buffer *in[4], *out[4] = {0};
    kiln_buffer *const *args[4];
    kiln_buffer **res[4];
    float *host = malloc(bytes);
    for (size_t i = 0; i < n_el; i++) host[i] = (float)(i % 1000);
    for (uint32_t k = 0; k < n; k++) {
      if (kiln_buffer_alloc(devs[k], bytes, &in[k], &st) ||
          kiln_buffer_write(in[k], 0, host, bytes, &st))
        die("buffers", &st);
      args[k] = &in[k];
      res[k] = &out[k];
    }
    char *src = malloc(bytes), *dst = malloc(bytes);
    memset(src, 1, bytes);
    memset(dst, 0, bytes);
    double tar[99], tcp[99];
    for (int r = 0; r < rounds; r++) {
      double t0 = now();
      if (kiln_mesh_execute(mesh, args, 1, NULL, res, 1, &st)) die("run", &st);
      tar[r] = now() - t0;
      for (uint32_t k = 0; k < n; k++) {
        kiln_buffer_free(out[k]);
        out[k] = NULL;
      }
      t0 = now();
      memcpy(dst, src, bytes);
      tcp[r] = now() - t0;
      src[r] ^= dst[bytes - 1 - (size_t)r]; /* keep the copy observable */
    }
    double ratio[99];
    for (int r = 0; r < rounds; r++) ratio[r] = tcp[r] / tar[r];
    qsort(tar, (size_t)rounds, sizeof *tar, cmp);
    qsort(tcp, (size_t)rounds, sizeof *tcp, cmp);
    qsort(ratio, (size_t)rounds, sizeof *ratio, cmp);
    double gb = (double)bytes / 1e9;
    printf("%u devices: all-reduce %.2f ms (%.2f GB/s per rank), memcpy %.2f ms (%.2f GB/s), "
           "ratio memcpy/all-reduce %.3f (min %.3f, max %.3f)\n",
           n, tar[rounds / 2] * 1e3, gb / tar[rounds / 2], tcp[rounds / 2] * 1e3,
           gb / tcp[rounds / 2], ratio[rounds / 2], ratio[0], ratio[rounds - 1]);
    free(host);
    free(src);
    free(dst);
    for (uint32_t k = 0; k < n; k++) kiln_buffer_free(in[k]);
    kiln_mesh_destroy(mesh);
    kiln_comm_destroy(comm);
    kiln_backend_destroy(b);
    kiln_executable_destroy(e);
    kiln_module_destroy(m);
  }
  return 0;
}
