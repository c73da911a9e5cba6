/* Bounded dynamic shapes for the code generators: the program made static
 * once, at compile time, with its runtime sizes as values (dyn_pad.c). */
#ifndef KILN_COMPILER_CODEGEN_DYN_PAD_H
#define KILN_COMPILER_CODEGEN_DYN_PAD_H

#include "compiler/codegen/executable.h"

/* Whether m has anything for kiln__dyn_pad to do: a "<=" dimension or a
 * get-dimension-size, set-dimension-size or dynamic-reshape anywhere. */
bool kiln__dyn_pad_needed(const kiln_module *m);

/* Before call inlining: a call in the entry that several instructions read
 * is read once, by a copy the others read, so that the inline pass copies
 * its body in (a runtime size then flows through it). */
int kiln__dyn_pad_split_calls(kiln_module *m, kiln_status *st);

/* Rewrites m (a compiler-owned clone) into a static program in which every
 * bounded-dynamic dimension is stored at its bound and its runtime size is
 * an s32[] value. When the entry's parameters or result have "<=" dims,
 * the entry gains one s32[] parameter per dynamic parameter dimension and
 * returns tuple(result, one s32[] per dynamic result dimension); *out then
 * describes that (allocated in `a`), else it is NULL. An op that cannot
 * take a dynamic dimension this way is KILN_EUNIMPL naming it. */
int kiln__dyn_pad(kiln_module *m, kiln_arena *a, kiln_exe_dynamic **out, kiln_status *st);

#endif /* KILN_COMPILER_CODEGEN_DYN_PAD_H */
