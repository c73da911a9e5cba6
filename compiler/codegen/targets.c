/* Code generators by backend: which kiln__cg_target writes the code of a
 * backend's targets. A new target (CUDA C through NVRTC) is one row here
 * and one implementation of target_iface.h beside c_target.c (the CUDA
 * target, cuda_target.c, is the second); nothing else in the compiler asks
 * a backend's name. */
#include <string.h>

#include "compiler/codegen/c_target.h"
#include "compiler/codegen/cuda_target.h"
#include "compiler/codegen/target_iface.h"

static const struct {
  const char *backend;
  const kiln__cg_target *target;
} generators[] = {
    {"cpu", &kiln__c_target},
    {"cuda", &kiln__cuda_target},
};

const kiln__cg_target *kiln__cg_target_for(const char *backend) {
  if (backend == NULL) return NULL;
  for (size_t i = 0; i < sizeof generators / sizeof generators[0]; i++)
    if (strcmp(generators[i].backend, backend) == 0) return generators[i].target;
  return NULL;
}
