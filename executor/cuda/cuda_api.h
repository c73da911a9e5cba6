/* The driver entry points the CUDA backend calls, fetched once per process
 * through cuGetProcAddress_v2 (cuda_driver.c) so that each is the ABI
 * version of the CUDA the backend was built against (cuMemAlloc is
 * cuMemAlloc_v2, ...). Internal to executor/cuda/: it includes the
 * toolkit's cuda.h for the types; nothing links libcuda.
 *
 * Every call the backend makes is checked through kiln__cuda_check, which
 * names the call and the driver's own name and description of the error
 * (cuGetErrorName / cuGetErrorString from the same table).
 */
#ifndef KILN_EXECUTOR_CUDA_CUDA_API_H
#define KILN_EXECUTOR_CUDA_CUDA_API_H

#include <cuda.h>

#include "common/status.h"

/* X(field, the name cuGetProcAddress is asked for, the prototype in cuda.h) */
#define KILN__CUDA_API(X) \
  X(init, "cuInit", cuInit) \
  X(get_error_name, "cuGetErrorName", cuGetErrorName) \
  X(get_error_string, "cuGetErrorString", cuGetErrorString) \
  X(device_get_count, "cuDeviceGetCount", cuDeviceGetCount) \
  X(device_get, "cuDeviceGet", cuDeviceGet) \
  X(device_get_name, "cuDeviceGetName", cuDeviceGetName) \
  X(device_total_mem, "cuDeviceTotalMem", cuDeviceTotalMem) \
  X(device_get_attribute, "cuDeviceGetAttribute", cuDeviceGetAttribute) \
  X(primary_ctx_retain, "cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain) \
  X(primary_ctx_release, "cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease) \
  X(ctx_push, "cuCtxPushCurrent", cuCtxPushCurrent) \
  X(ctx_pop, "cuCtxPopCurrent", cuCtxPopCurrent) \
  X(stream_create, "cuStreamCreate", cuStreamCreate) \
  X(stream_destroy, "cuStreamDestroy", cuStreamDestroy) \
  X(stream_synchronize, "cuStreamSynchronize", cuStreamSynchronize) \
  X(stream_query, "cuStreamQuery", cuStreamQuery) \
  X(stream_wait_event, "cuStreamWaitEvent", cuStreamWaitEvent) \
  X(event_create, "cuEventCreate", cuEventCreate) \
  X(event_destroy, "cuEventDestroy", cuEventDestroy) \
  X(event_record, "cuEventRecord", cuEventRecord) \
  X(event_synchronize, "cuEventSynchronize", cuEventSynchronize) \
  X(mem_alloc, "cuMemAlloc", cuMemAlloc) \
  X(mem_free, "cuMemFree", cuMemFree) \
  X(mem_host_alloc, "cuMemHostAlloc", cuMemHostAlloc) \
  X(mem_free_host, "cuMemFreeHost", cuMemFreeHost) \
  X(memcpy_htod_async, "cuMemcpyHtoDAsync", cuMemcpyHtoDAsync) \
  X(memcpy_dtoh_async, "cuMemcpyDtoHAsync", cuMemcpyDtoHAsync) \
  X(memcpy_dtod_async, "cuMemcpyDtoDAsync", cuMemcpyDtoDAsync) \
  X(memset_d8_async, "cuMemsetD8Async", cuMemsetD8Async) \
  X(module_load_data, "cuModuleLoadData", cuModuleLoadData) \
  X(module_unload, "cuModuleUnload", cuModuleUnload) \
  X(module_get_function, "cuModuleGetFunction", cuModuleGetFunction) \
  X(func_get_attribute, "cuFuncGetAttribute", cuFuncGetAttribute) \
  X(launch_kernel, "cuLaunchKernel", cuLaunchKernel)

typedef struct kiln__cuda_api {
#define KILN__CUDA_FIELD(field, name, proto) __typeof__(proto) *field;
  KILN__CUDA_API(KILN__CUDA_FIELD)
#undef KILN__CUDA_FIELD
} kiln__cuda_api;

/* The table, once the driver has loaded with at least one device (the
 * same load as kiln_cuda_device_count); NULL otherwise, with the reason in
 * st (KILN_EUNAVAIL). */
const kiln__cuda_api *kiln__cuda_api_get(kiln_status *st);

/* 0 when r is CUDA_SUCCESS; else fills st with "CALL failed: NAME: TEXT"
 * at `where` and returns the KILN_E* code kiln__cuda_error_code gives. */
int kiln__cuda_check(const kiln__cuda_api *api, CUresult r, const char *call, const char *where,
                     kiln_status *st);

#endif /* KILN_EXECUTOR_CUDA_CUDA_API_H */
