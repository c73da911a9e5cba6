/* The CUDA device pool: the driver API opened lazily, so that a machine
 * without an NVIDIA driver has zero CUDA devices and everything else runs
 * as usual (cuda_driver.c). Built only where the toolkit's headers are
 * found (KILN_HAVE_CUDA); cuda.h provides the types, nothing is linked.
 */
#ifndef KILN_EXECUTOR_CUDA_CUDA_H
#define KILN_EXECUTOR_CUDA_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define KILN_CUDA_MAX_DEVICES 16

typedef struct kiln_cuda_device_info {
  char name[128];
  uint64_t total_memory;  /* bytes */
  int cc_major, cc_minor; /* compute capability: sm_<major><minor> */
  int multiprocessors;
} kiln_cuda_device_info;

/* The number of CUDA devices this process sees, after loading the driver
 * once (dlopen("libcuda.so.1"), then cuGetProcAddress_v2 for every other
 * entry point, so each is its current ABI version, and cuInit). No driver,
 * an entry point missing or cuInit failing is 0 devices with the reason in
 * st (KILN_EUNAVAIL); st may be NULL. Env KILN_CUDA_DRIVER names another
 * file to open (tests). */
uint32_t kiln_cuda_device_count(kiln_status *st);

/* What device `index` (< kiln_cuda_device_count) is. */
int kiln_cuda_device_info_get(uint32_t index, kiln_cuda_device_info *out, kiln_status *st);

/* The name of the cuda target row that device `index`'s architecture runs
 * ("cuda-sm_90" for compute capability 9.x; compiler/target.c's rows),
 * static. No such row is KILN_EUNIMPL naming the GPU's sm. */
int kiln_cuda_default_target(uint32_t index, const char **target, kiln_status *st);

typedef struct kiln_device kiln_device;

/* A cuda device's memory as its caching allocator sees it (bytes). */
typedef struct kiln_cuda_memory {
  uint64_t total;  /* the GPU's (cuDeviceTotalMem) */
  uint64_t budget; /* what the allocator may hold (KILN_CUDA_MEMORY_BYTES, else 90%) */
  uint64_t live;   /* in blocks handed out: buffers, arenas, constants */
  uint64_t cached; /* in freed blocks kept for reuse */
  uint64_t peak;   /* the most `live` has been */
} kiln_cuda_memory;

/* Fills out for dv, a device of the cuda backend; false (out zeroed) for
 * any other device. */
bool kiln_cuda_device_memory(const kiln_device *dv, kiln_cuda_memory *out);

#endif /* KILN_EXECUTOR_CUDA_CUDA_H */
