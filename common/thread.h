/* Threads that run or compile programs, with a stack of a known size.
 *
 * The walks that follow a module's calls and the backends' run loops
 * recurse once per nesting level (a while in a while in a call ...), and
 * the verifier bounds that depth (KILN_NESTING_CAPACITY). What the deepest
 * module needs was measured in frames; whether a thread has it must not
 * depend on the RLIMIT_STACK of whoever started kilnd (glibc sizes default
 * thread stacks from it: 8 MiB usually, 2 MiB or less in some containers).
 * So every thread that compiles, verifies or runs a program is started
 * here, with KILN_THREAD_STACK_BYTES of stack (address space: pages are
 * touched only as deep as the recursion goes).
 */
#ifndef KILN_COMMON_THREAD_H
#define KILN_COMMON_THREAD_H

#include <pthread.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Deepest nesting of called computations any part of Kiln accepts: the
 * verifier's largest max-nesting, the cpu loader's and the interpreter's
 * call depth. A run level costs about 0.3 KiB of stack on the cpu backend
 * and 0.8 KiB in the interpreter, so 4096 levels fit in a few MiB. */
#define KILN_NESTING_CAPACITY 4096

#define KILN_THREAD_STACK_BYTES ((size_t)16 << 20)

/* pthread_create with a KILN_THREAD_STACK_BYTES stack; returns its error
 * number (0 on success). */
int kiln_thread_start(pthread_t *t, void *(*fn)(void *), void *arg);

#ifdef __cplusplus
}
#endif

#endif
