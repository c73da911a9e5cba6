/* Running the system C compiler on generated source. */
#ifndef KILN_COMPILER_CODEGEN_CC_H
#define KILN_COMPILER_CODEGEN_CC_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct kiln__cc_options {
  const char *cc;    /* program (PATH is searched); NULL: "cc" */
  const char *march; /* -march= value; NULL or "": none */
  double timeout_s;  /* wall-clock limit; <= 0: 120 s */
  const char *opt;   /* optimization flag; NULL: "-O3" */
  const char *tune;  /* one more flag after it (a -f option); NULL: none */
} kiln__cc_options;

/* Compiles C source `src` (len bytes, fed on stdin) into a shared object
 * and returns its bytes in *so (kiln_malloc'd). The compiler runs in its
 * own process group with a private temporary directory that is removed
 * before returning. Failure is KILN_EINTERNAL carrying the compiler's
 * (truncated) output, a timeout KILN_ELIMIT, a compiler that cannot be
 * started KILN_ENOTFOUND. */
int kiln__cc_compile(const kiln__cc_options *o, const char *src, size_t len, uint8_t **so,
                     size_t *so_len, kiln_status *st);

#endif /* KILN_COMPILER_CODEGEN_CC_H */
