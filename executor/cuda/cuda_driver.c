/* The CUDA driver, loaded lazily (cuda.h).
 *
 * A binary linked against libcuda.so.1 does not start where the driver is
 * absent, so nothing links it: the first question about devices opens it
 * with dlopen, takes cuGetProcAddress_v2 with dlsym (dlsym of a versioned
 * name such as cuMemAlloc gives its legacy ABI; cuGetProcAddress gives the
 * one of the CUDA version asked for) and fetches the rest through it. The
 * outcome, devices or the reason there are none, is kept for the process.
 */
#include "executor/cuda/cuda.h"

#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);

static struct {
  void *lib;
  uint32_t ndevices;
  char why[512];
  CUresult (*init)(unsigned);
  CUresult (*device_get_count)(int *);
  CUresult (*device_get)(CUdevice *, int);
  CUresult (*device_get_name)(char *, int, CUdevice);
  CUresult (*device_total_mem)(size_t *, CUdevice);
  CUresult (*device_get_attribute)(int *, CUdevice_attribute, CUdevice);
} drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static void *entry(get_proc_fn get, const char *name) {
  void *p = NULL;
  CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (get(name, &p, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &q) != CUDA_SUCCESS ||
      q != CU_GET_PROC_ADDRESS_SUCCESS)
    p = NULL;
  if (p == NULL && drv.why[0] == '\0')
    snprintf(drv.why, sizeof drv.why, "the CUDA driver has no %s", name);
  return p;
}

static void load(void) {
  const char *env = getenv("KILN_CUDA_DRIVER");
  const char *file = env && env[0] ? env : "libcuda.so.1";
  drv.lib = dlopen(file, RTLD_NOW | RTLD_LOCAL);
  if (drv.lib == NULL) {
    const char *e = dlerror();
    snprintf(drv.why, sizeof drv.why, "no NVIDIA driver (%.400s)", e ? e : file);
    return;
  }
  get_proc_fn get = (get_proc_fn)dlsym(drv.lib, "cuGetProcAddress_v2");
  if (get == NULL) {
    snprintf(drv.why, sizeof drv.why,
             "%.200s has no cuGetProcAddress_v2 (a driver older than "
             "CUDA 12)",
             file);
    return;
  }
  drv.init = (CUresult(*)(unsigned))entry(get, "cuInit");
  drv.device_get_count = (CUresult(*)(int *))entry(get, "cuDeviceGetCount");
  drv.device_get = (CUresult(*)(CUdevice *, int))entry(get, "cuDeviceGet");
  drv.device_get_name = (CUresult(*)(char *, int, CUdevice))entry(get, "cuDeviceGetName");
  drv.device_total_mem = (CUresult(*)(size_t *, CUdevice))entry(get, "cuDeviceTotalMem");
  drv.device_get_attribute =
      (CUresult(*)(int *, CUdevice_attribute, CUdevice))entry(get, "cuDeviceGetAttribute");
  if (drv.why[0]) return;
  CUresult r = drv.init(0);
  if (r != CUDA_SUCCESS) {
    snprintf(drv.why, sizeof drv.why, "cuInit failed (CUresult %d): no usable GPU", (int)r);
    return;
  }
  int n = 0;
  if (drv.device_get_count(&n) != CUDA_SUCCESS || n <= 0) {
    snprintf(drv.why, sizeof drv.why, "the CUDA driver sees no GPU");
    return;
  }
  drv.ndevices = n > KILN_CUDA_MAX_DEVICES ? KILN_CUDA_MAX_DEVICES : (uint32_t)n;
}

uint32_t kiln_cuda_device_count(kiln_status *st) {
  pthread_once(&drv_once, load);
  if (drv.ndevices == 0) kiln_status_set(st, KILN_EUNAVAIL, "cuda", "%s", drv.why);
  return drv.ndevices;
}

int kiln_cuda_device_info_get(uint32_t index, kiln_cuda_device_info *out, kiln_status *st) {
  memset(out, 0, sizeof *out);
  if (index >= kiln_cuda_device_count(st))
    return kiln_status_set(st, KILN_ERANGE, "cuda", "no CUDA device %u (%u devices)", index,
                           drv.ndevices);
  CUdevice d;
  size_t mem = 0;
  if (drv.device_get(&d, (int)index) != CUDA_SUCCESS ||
      drv.device_get_name(out->name, (int)sizeof out->name, d) != CUDA_SUCCESS ||
      drv.device_total_mem(&mem, d) != CUDA_SUCCESS ||
      drv.device_get_attribute(&out->cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d) !=
          CUDA_SUCCESS ||
      drv.device_get_attribute(&out->cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d) !=
          CUDA_SUCCESS)
    return kiln_status_set(st, KILN_EUNAVAIL, "cuda", "querying CUDA device %u failed", index);
  out->total_memory = mem;
  return 0;
}
