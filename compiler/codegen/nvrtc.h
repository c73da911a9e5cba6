/* NVRTC, the CUDA runtime compiler, for the CUDA target: the generated CUDA
 * C of a module into one cubin for a real GPU architecture (nvrtc.c's
 * header says how). Needs libnvrtc only, found at first use; no GPU and no
 * driver. */
#ifndef KILN_COMPILER_CODEGEN_NVRTC_H
#define KILN_COMPILER_CODEGEN_NVRTC_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* The file name NVRTC reports lines of the source in ("kiln_kernels.cu"). */
#define KILN__NVRTC_SOURCE_NAME "kiln_kernels.cu"

typedef struct kiln__nvrtc_options {
  const char *arch; /* a real architecture: "sm_80", "sm_90", "sm_100" */
  double timeout_s; /* wall-clock limit; <= 0: 120 s */
} kiln__nvrtc_options;

/* Loads libnvrtc once per process (env KILN_NVRTC_LIB names the file to
 * open, else the sonames of CUDA 13 and 12 are tried, then the toolkit's
 * folders) and gives its version; major and minor may be NULL. A library
 * that cannot be found or lacks an entry point is KILN_EUNAVAIL saying
 * which. */
int kiln__nvrtc_version(int *major, int *minor, kiln_status *st);

/* The options every compile passes besides --gpu-architecture, as one
 * text (they enter cache keys). */
const char *kiln__nvrtc_flags(void);

/* Whether arch names a real architecture NVRTC can emit a cubin for:
 * "sm_" and two or three digits. A virtual one ("compute_90") or anything
 * else is KILN_EINVAL naming what is accepted. */
int kiln__nvrtc_check_arch(const char *arch, kiln_status *st);

/* Compiles src (len bytes) into a cubin for o->arch, returned in *cubin
 * (kiln_malloc'd, *n bytes). NVRTC runs in a child process of its own that
 * is killed at the deadline (KILN_ELIMIT), so a runaway compile never
 * holds the caller. A compile error is KILN_EINTERNAL located at the first
 * error of NVRTC's log ("kiln_kernels.cu:LINE", the kernel it lies in and
 * the message); no library KILN_EUNAVAIL. */
int kiln__nvrtc_compile(const kiln__nvrtc_options *o, const char *src, size_t len, uint8_t **cubin,
                        size_t *n, kiln_status *st);

#endif /* KILN_COMPILER_CODEGEN_NVRTC_H */
