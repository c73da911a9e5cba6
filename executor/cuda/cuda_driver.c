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

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/target.h"
#include "executor/cuda/cuda_alloc.h"
#include "executor/cuda/cuda_api.h"

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);

static struct {
  void *lib;
  uint32_t ndevices;
  char why[512];
  kiln__cuda_api api;
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
  /* Each entry point as its own type; a void * from the driver converts to
   * a function pointer as POSIX's dlsym does. */
#define KILN__CUDA_FETCH(field, name, proto) \
  do { \
    void *p_ = entry(get, name); \
    memcpy(&drv.api.field, &p_, sizeof p_); \
  } while (0);
  KILN__CUDA_API(KILN__CUDA_FETCH)
#undef KILN__CUDA_FETCH
  if (drv.why[0]) return;
  CUresult r = drv.api.init(0);
  if (r != CUDA_SUCCESS) {
    snprintf(drv.why, sizeof drv.why, "cuInit failed (CUresult %d): no usable GPU", (int)r);
    return;
  }
  int n = 0;
  if (drv.api.device_get_count(&n) != CUDA_SUCCESS || n <= 0) {
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

const kiln__cuda_api *kiln__cuda_api_get(kiln_status *st) {
  return kiln_cuda_device_count(st) ? &drv.api : NULL;
}

int kiln__cuda_check(const kiln__cuda_api *api, CUresult r, const char *call, const char *where,
                     kiln_status *st) {
  if (r == CUDA_SUCCESS) return 0;
  const char *name = NULL, *desc = NULL;
  if (api && api->get_error_name && api->get_error_name(r, &name) != CUDA_SUCCESS) name = NULL;
  if (api && api->get_error_string && api->get_error_string(r, &desc) != CUDA_SUCCESS) desc = NULL;
  return kiln__cuda_error((int)r, call, name, desc, where, st);
}

int kiln_cuda_device_info_get(uint32_t index, kiln_cuda_device_info *out, kiln_status *st) {
  memset(out, 0, sizeof *out);
  if (index >= kiln_cuda_device_count(st))
    return kiln_status_set(st, KILN_ERANGE, "cuda", "no CUDA device %u (%u devices)", index,
                           drv.ndevices);
  const kiln__cuda_api *a = &drv.api;
  CUdevice d;
  size_t mem = 0;
  int rc = kiln__cuda_check(a, a->device_get(&d, (int)index), "cuDeviceGet", "cuda", st);
  if (rc == 0)
    rc = kiln__cuda_check(a, a->device_get_name(out->name, (int)sizeof out->name, d),
                          "cuDeviceGetName", "cuda", st);
  if (rc == 0)
    rc = kiln__cuda_check(a, a->device_total_mem(&mem, d), "cuDeviceTotalMem", "cuda", st);
  if (rc == 0)
    rc = kiln__cuda_check(
        a, a->device_get_attribute(&out->cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d),
        "cuDeviceGetAttribute", "cuda", st);
  if (rc == 0)
    rc = kiln__cuda_check(
        a, a->device_get_attribute(&out->cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d),
        "cuDeviceGetAttribute", "cuda", st);
  if (rc == 0)
    rc = kiln__cuda_check(
        a,
        a->device_get_attribute(&out->multiprocessors, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d),
        "cuDeviceGetAttribute", "cuda", st);
  if (rc) return rc;
  out->total_memory = mem;
  return 0;
}

int kiln_cuda_default_target(uint32_t index, const char **target, kiln_status *st) {
  *target = NULL;
  kiln_cuda_device_info info;
  int rc = kiln_cuda_device_info_get(index, &info, st);
  if (rc) return rc;
  /* A cubin runs on its own major and later minors: the row of the same
   * major with the highest minor not above the device's. */
  uint32_t n;
  const kiln_target *rows = kiln_targets(&n);
  const kiln_target *best = NULL;
  int best_minor = -1;
  for (uint32_t i = 0; i < n; i++) {
    int major, minor;
    if (strcmp(rows[i].backend, "cuda") != 0 || !kiln__cuda_arch_parse(rows[i].isa, &major, &minor))
      continue;
    if (kiln__cuda_arch_runs(major, minor, info.cc_major, info.cc_minor) && minor > best_minor) {
      best = &rows[i];
      best_minor = minor;
    }
  }
  if (best == NULL)
    return kiln_status_set(st, KILN_EUNIMPL, "cuda",
                           "no cuda target runs on CUDA device %u (%s, sm_%d%d)", index, info.name,
                           info.cc_major, info.cc_minor);
  *target = best->name;
  return 0;
}
