/* Compile options, checked and resolved into a plan: the backend and target
 * that will build the program, the optimization level, the device count and
 * the transforms in the compiler's own form. Made twice per request: on the
 * completion-queue thread to refuse bad options at once, and on the compile
 * pool to do the work (it is cheap and keeps no pointers into the request).
 */
#ifndef KILN_SERVER_COMPILE_PREP_H
#define KILN_SERVER_COMPILE_PREP_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln/v1/kiln.pb-c.h"
#include "server/server.h"

#define KILND_MAX_TRANSFORMS 16
#define KILND_MAX_TIMINGS 96
#define KILND_MAX_PLAN_WARNINGS 4
/* The most devices one SPMD run takes (kilnd --cpu-devices is at most 256). */
#define KILND_MAX_MESH 256
/* ... and on the interpreter, whose devices are threads of one slot. */
#define KILND_MAX_INTERP_MESH 64

typedef struct kiln_transform kiln_transform;
typedef struct kiln_target kiln_target;

typedef struct kilnd_compile_plan {
  const char *backend;       /* "cpu" or "interp" (static strings) */
  bool explicit_backend;     /* the request named it */
  const kiln_target *target; /* resolved (compiler/target.h); NULL: none (interp) */
  int opt_level;
  uint64_t memory_budget; /* bytes of temporaries live at once; 0: none (remat) */
  /* Devices one run takes: options.device_count (0: the module's replica
   * and partition counts decide, in handlers_compile.c). mesh[0..nmesh) is
   * options.mesh_shape, checked to multiply to ndevices when given. */
  uint32_t ndevices;
  bool devices_given;
  int64_t mesh[8];
  uint32_t nmesh;
  kiln_transform *transforms; /* kiln_malloc'd, ntransforms */
  bool *drop_value;           /* per transform: grad without with_value */
  uint32_t ntransforms;
  bool dump_transforms; /* dump_after_passes ["transforms"]: the transformed module's text */
  const char *warnings[KILND_MAX_PLAN_WARNINGS]; /* static strings */
  uint32_t nwarnings;
} kilnd_compile_plan;

/* Checks options (may be NULL) and fills plan. Errors name the field. */
int kilnd_compile_plan_make(kilnd *srv, const Kiln__V1__CompileOptions *o, kilnd_compile_plan *plan,
                            kiln_status *st);
void kilnd_compile_plan_free(kilnd_compile_plan *plan);

/* Applies the plan's transforms to a verified module, then verifies it
 * again. */
int kilnd_compile_plan_apply(const kilnd_compile_plan *plan, kiln_module *m, kiln_status *st);

/* ProgramSignature of a module's ENTRY. NULL on out-of-memory. */
Kiln__V1__ProgramSignature *kilnd_signature_to_proto(kiln_arena *a, const kiln_module *m);

#endif /* KILN_SERVER_COMPILE_PREP_H */
