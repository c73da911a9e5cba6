/* OpenBLAS core selection (see cpu_blas.h).
 *
 * The CPU's features come from gcc's __builtin_cpu_supports, which also
 * checks that the OS saves the vector state (XGETBV), so a core chosen here
 * never executes instructions the machine cannot run. Cores are compared
 * by tier (AVX-512 > AVX2 > anything else): a core OpenBLAS did recognize
 * at the right tier (Cooperlake, SapphireRapids, Zen...) is left alone.
 */
#include "executor/cpu/cpu_blas.h"

#include <cblas.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "common/log.h"

enum { TIER_OTHER, TIER_AVX2, TIER_AVX512 };

static int core_tier(const char *name) {
  static const char *const avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
  static const char *const avx2[] = {"Haswell", "Zen"};
  for (size_t i = 0; i < sizeof avx512 / sizeof *avx512; i++)
    if (strcasecmp(name, avx512[i]) == 0) return TIER_AVX512;
  for (size_t i = 0; i < sizeof avx2 / sizeof *avx2; i++)
    if (strcasecmp(name, avx2[i]) == 0) return TIER_AVX2;
  return TIER_OTHER;
}

static int cpu_tier(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl"))
    return TIER_AVX512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return TIER_AVX2;
#endif
  return TIER_OTHER;
}

const char *kiln_cpu_blas_core(void) {
  const char *name = openblas_get_corename();
  return name ? name : "unknown";
}

const char *kiln_cpu_blas_better_core(void) {
  if (getenv("OPENBLAS_CORETYPE") != NULL) return NULL; /* the user's choice */
  int want = cpu_tier();
  if (want == TIER_OTHER || core_tier(kiln_cpu_blas_core()) >= want) return NULL;
  return want == TIER_AVX512 ? "SkylakeX" : "Haswell";
}

void kiln_cpu_blas_select_core(char **argv) {
  /* oneDNN's OpenMP threads (executor/cpu/cpu_conv.c) spin after each
   * convolution unless told to wait passively; set here, before any thread
   * of ours exists, so that nothing later has to change the environment
   * while other threads may read it. A user's own value stays. */
  setenv("OMP_WAIT_POLICY", "passive", 0);
  const char *core = kiln_cpu_blas_better_core();
  if (core == NULL || argv == NULL || argv[0] == NULL) return;
  /* OPENBLAS_CORETYPE now set, the new image takes the early return above
   * whatever core it gets: no loop. */
  if (setenv("OPENBLAS_CORETYPE", core, 1) != 0) return;
  /* The program's own path first: the kernel names a process after the
   * file it executes, and "exe" would stand in ps and logs instead of
   * kiln or kilnd. /proc/self/exe still works when that path is gone. */
  char path[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n > 0) {
    path[n] = '\0';
    execv(path, argv);
  }
  execv("/proc/self/exe", argv);
  /* Still here: this image keeps the generic core. Leaving the variable
   * set is harmless (OpenBLAS read it long ago), and says what was tried. */
  kiln_log(KILN_LOG_INFO, "kiln",
           "note: OpenBLAS runs its %s kernels; re-executing with "
           "OPENBLAS_CORETYPE=%s failed, continuing",
           kiln_cpu_blas_core(), core);
}
