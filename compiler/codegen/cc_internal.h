/* Shared by cc.c (the parallel build), cc_split.c (translation units) and
 * cc_cache.c (compiled units kept for reuse); tests reach them too. */
#ifndef KILN_COMPILER_CODEGEN_CC_INTERNAL_H
#define KILN_COMPILER_CODEGEN_CC_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "compiler/codegen/cc.h"
#include "compiler/codegen/sha256.h"

/* "kk" and 16 hex digits of the kernel's canonical hash, and a NUL. */
#define KILN__CC_SYM_LEN 19

/* One translation unit: the prelude and whole kernels (with the helpers
 * they call, renamed after the kernel). */
typedef struct kiln__cc_unit {
  char *src; /* kiln_malloc'd, NUL-terminated */
  size_t len;
  uint8_t cls;                   /* kiln__cc_class: the flags it is compiled with */
  uint8_t classes;               /* 1 << class of each kernel in it */
  uint32_t nkernels;             /* distinct kernels in it */
  uint32_t first;                /* the lowest kernel index it defines (for messages) */
  uint8_t key[KILN__SHA256_LEN]; /* cache key, filled by cc.c */
} kiln__cc_unit;

typedef struct kiln__cc_split {
  kiln__cc_unit *units;
  uint32_t nunits;
  char (*sym)[KILN__CC_SYM_LEN]; /* per kernel index: the content symbol */
  uint32_t nkernels;
  uint32_t ndistinct; /* kernels left after merging identical ones */
  uint32_t nmixed;    /* units holding kernels of more than one class */
} kiln__cc_split;

/* Units of at most about unit_bytes of kernel text each (0: the default),
 * and at least min_units when there are that many distinct kernels. With
 * attrs NULL every unit holds kernels of one class. Otherwise attrs[c] is
 * C text that gives a function class c's flags (a GCC optimize
 * attribute), and a small module's tiny kernels, when they are few (with
 * min_units 1, all its kernels), share a unit with the others: such a unit is compiled with the
 * light class's flags and each kernel of another class is declared first
 * with its class's attribute. */
int kiln__cc_split_program(const kiln__cc_program *p, uint32_t min_units, size_t unit_bytes,
                           const char *const *attrs, kiln__cc_split *out, kiln_status *st);
void kiln__cc_split_free(kiln__cc_split *s);

/* ---- the kernel cache (cc_cache.c) ---------------------------------------- */

/* The compiled object of the unit with this key, from memory or from dir
 * (NULL: memory only); *obj is kiln_malloc'd. Returns true on a hit. */
bool kiln__cc_cache_get(const char *dir, const uint8_t key[KILN__SHA256_LEN], uint8_t **obj,
                        size_t *len);
/* Keeps a copy; failures (memory, disk) are ignored: a cache is optional. */
void kiln__cc_cache_put(const char *dir, const uint8_t key[KILN__SHA256_LEN], const uint8_t *obj,
                        size_t len);

/* Nothing in memory: a lookup there cannot hit. */
bool kiln__cc_cache_empty(void);

#endif /* KILN_COMPILER_CODEGEN_CC_INTERNAL_H */
