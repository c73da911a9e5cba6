/* Built into the host emulation of a cubin's CUDA C (test_cuda_fake): the
 * generated source's own head (its typedefs and limits, written for NVRTC)
 * is replaced by this one, which gives host C++ the same vocabulary and
 * runs one block of a launch at a time (kemu_block, called by the fake
 * driver for every block of the grid, the last first).
 *
 * A block's threads run as user-level fibers (their own stacks; switched
 * by a few instructions on x86-64, by ucontext elsewhere), one at a time,
 * each switched out only where the kernel waits for others:
 * __syncthreads() (every live thread of the block must arrive, at the same
 * line, before any goes on) and the warp shuffles (__shfl_down_sync,
 * __shfl_xor_sync with a full mask: the warp's 32 threads put their values
 * in a per-warp slot array, wait for each other and read).
 * A thread that returns while others wait at a barrier, threads waiting at
 * different barriers (divergence), a shuffle in a partial warp or with a
 * partial mask, and too much shared memory are errors: the launch fails
 * with the message (kemu_block's err). Shared memory (KSHARED, KDYNSHARED:
 * the CUDA prelude spells them __shared__ arrays) is a per-block arena,
 * filled with 0xff bytes (a NaN in every float) before each block, so that
 * a read before a write shows. Atomics are plain read-modify-writes: only
 * one thread runs at a time and none is switched out inside one.
 *
 * Most kernels are grid-stride loops that never wait: a block's last
 * thread runs first in a fiber, and when it returns without waiting the
 * others run as plain calls (the fast path); a plain call that reaches a
 * barrier is the error above (its thread waits for one that returned).
 */
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

struct kemu_dim3 {
  unsigned x, y, z;
};
/* threadIdx is the running fiber's (set before each switch to it). */
static kemu_dim3 blockIdx, threadIdx, blockDim, gridDim;
#define warpSize 32
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define KI static inline __attribute__((unused))
#define KCLZ64(x) __builtin_clzll((unsigned long long)(x))
static inline float __int_as_float(int i) {
  float f;
  memcpy(&f, &i, 4);
  return f;
}
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }

/* ---- the block's threads ------------------------------------------------- */

typedef void (*kemu_kernel)(void *const *bufs, int64_t begin, int64_t end);

/* Switching fibers: on x86-64 a few instructions of our own (callee-saved
 * registers, the stack pointer, MXCSR and the x87 control word, as the
 * SysV ABI asks a call to keep); elsewhere ucontext, whose swapcontext
 * also saves the signal mask (two system calls a switch, a hundred times
 * slower). */
#if defined(__x86_64__) && !defined(KEMU_UCONTEXT)
#define KEMU_ASM_SWITCH 1
/* kemu_sw(&save, to): saves this context's stack pointer in *save and
 * resumes the one whose stack pointer is `to`. */
extern "C" void kemu_sw(void **save, void *to);
__asm__(".text\n"
        ".p2align 4\n"
        ".type kemu_sw, @function\n"
        "kemu_sw:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size kemu_sw, .-kemu_sw\n");
#else
#define KEMU_ASM_SWITCH 0
#endif

enum { KEMU_MAXT = 1024, KEMU_STACK = 256 << 10, KEMU_STATIC_SHARED = 48 << 10 };
enum kemu_state { KEMU_RUN, KEMU_BAR, KEMU_WARP, KEMU_DONE };

static struct {
#if KEMU_ASM_SWITCH
  void *sched_sp;
  void *sp[KEMU_MAXT]; /* a switched-out fiber's stack pointer */
#else
  ucontext_t sched;
  ucontext_t ctx[KEMU_MAXT];
#endif
  char *stack[KEMU_MAXT]; /* mmap'd on first use, kept for later launches */
  unsigned char state[KEMU_MAXT];
  int line[KEMU_MAXT];           /* where a waiting thread waits */
  size_t soff[KEMU_MAXT];        /* the thread's next KSHARED offset */
  uint64_t slot[2][KEMU_MAXT];   /* shuffle slots, by thread, used in turn */
  unsigned char turn[KEMU_MAXT]; /* the slots the thread's next shuffle uses */
  unsigned cur;                  /* the thread running */
  bool fibers;                   /* cur runs in a fiber */
  kemu_kernel k;
  void *const *bufs;
  int64_t begin, end;
  unsigned char *shared; /* KEMU_STATIC_SHARED + the launch's dynamic bytes */
  size_t shared_cap, dyn;
  char *err;
  size_t nerr;
  bool failed;
  jmp_buf plain; /* a plain call that must not go on */
} kemu;

static void kemu_fail(const char *fmt, int a, int b) {
  if (!kemu.failed && kemu.err) snprintf(kemu.err, kemu.nerr, fmt, a, b);
  kemu.failed = true;
}

/* The running fiber t gives way to the scheduler. */
static void kemu_to_sched(unsigned t) {
#if KEMU_ASM_SWITCH
  kemu_sw(&kemu.sp[t], kemu.sched_sp);
#else
  swapcontext(&kemu.ctx[t], &kemu.sched);
#endif
}

/* The running thread gives way until the barrier of kind `st` at `line`
 * lets it go on. */
static void kemu_wait(int st, int line) {
  if (!kemu.fibers) {
    kemu_fail(st == KEMU_BAR ? "thread %d reaches __syncthreads (line %d) after a thread of its "
                               "block returned without it"
                             : "thread %d reaches a warp shuffle (line %d) after a thread of its "
                               "block returned without it",
              (int)kemu.cur, line);
    longjmp(kemu.plain, 1);
  }
  unsigned t = kemu.cur;
  kemu.state[t] = (unsigned char)st;
  kemu.line[t] = line;
  kemu_to_sched(t);
}

#define __syncthreads() kemu_wait(KEMU_BAR, __LINE__)

/* A fiber's first frame: its thread runs the kernel, then it is done and
 * never resumed. */
static void kemu_start(void) {
  unsigned t = kemu.cur;
  kemu.k(kemu.bufs, kemu.begin, kemu.end);
  kemu.state[t] = KEMU_DONE;
  for (;;) kemu_to_sched(t);
}

static bool kemu_fiber(unsigned t) {
  if (kemu.stack[t] == NULL) {
    void *p = mmap(NULL, KEMU_STACK, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return false;
    kemu.stack[t] = (char *)p;
  }
#if KEMU_ASM_SWITCH
  /* The first switch to it "returns" into kemu_start (entered as if
   * called: its stack pointer 8 past a 16-byte boundary) through a frame
   * of zero registers and the default MXCSR and x87 control word. */
  uint64_t *top = (uint64_t *)(kemu.stack[t] + KEMU_STACK);
  top[-1] = 0;
  top[-2] = (uint64_t)(uintptr_t)kemu_start;
  for (int i = 3; i <= 8; i++) top[-i] = 0;
  top[-9] = 0x1f80u | (uint64_t)0x037fu << 32;
  kemu.sp[t] = top - 9;
#else
  getcontext(&kemu.ctx[t]);
  kemu.ctx[t].uc_stack.ss_sp = kemu.stack[t];
  kemu.ctx[t].uc_stack.ss_size = KEMU_STACK;
  kemu.ctx[t].uc_link = NULL;
  makecontext(&kemu.ctx[t], kemu_start, 0);
#endif
  kemu.state[t] = KEMU_RUN;
  kemu.soff[t] = 0;
  kemu.turn[t] = 0;
  return true;
}

static void kemu_switch(unsigned t) {
  kemu.cur = t;
  threadIdx = {t, 0, 0};
#if KEMU_ASM_SWITCH
  kemu_sw(&kemu.sched_sp, kemu.sp[t]);
#else
  swapcontext(&kemu.sched, &kemu.ctx[t]);
#endif
}

/* Runs the block's fibers (some waiting already) until all return or the
 * barriers cannot let any go on. */
static void kemu_schedule(unsigned n) {
  for (;;) {
    for (unsigned t = n; t-- > 0 && !kemu.failed;)
      if (kemu.state[t] == KEMU_RUN) kemu_switch(t);
    if (kemu.failed) return;
    unsigned done = 0, bar = 0, first = n;
    for (unsigned t = 0; t < n; t++) {
      done += kemu.state[t] == KEMU_DONE;
      if (kemu.state[t] == KEMU_BAR) {
        if (bar++ == 0) first = t;
        if (kemu.line[t] != kemu.line[first])
          return kemu_fail("divergence: threads of a block wait at __syncthreads on lines %d and "
                           "%d",
                           kemu.line[first], kemu.line[t]);
      }
    }
    if (done == n) return;
    if (bar > 0 && bar + done == n) {
      if (done)
        return kemu_fail("%d threads of the block returned while the others wait at "
                         "__syncthreads (line %d)",
                         (int)done, kemu.line[first]);
      for (unsigned t = 0; t < n; t++) kemu.state[t] = KEMU_RUN;
      continue;
    }
    bool released = false;
    for (unsigned w = 0; w * 32 < n; w++) {
      unsigned lo = w * 32, hi = lo + 32 < n ? lo + 32 : n, at = 0, gone = 0;
      for (unsigned t = lo; t < hi; t++) {
        at += kemu.state[t] == KEMU_WARP;
        gone += kemu.state[t] == KEMU_DONE;
      }
      if (at == 0) continue;
      if (hi - lo < 32)
        return kemu_fail("a warp shuffle (line %d) in a partial warp of %d threads", kemu.line[lo],
                         (int)(hi - lo));
      if (gone)
        return kemu_fail("%d threads of a warp returned while the others wait in a shuffle (line "
                         "%d)",
                         (int)gone, kemu.line[lo]);
      if (at < 32) continue; /* the others still wait elsewhere: deadlock unless released */
      for (unsigned t = lo; t < hi; t++)
        if (kemu.line[t] != kemu.line[lo])
          return kemu_fail("divergence: a warp shuffles on lines %d and %d", kemu.line[lo],
                           kemu.line[t]);
      for (unsigned t = lo; t < hi; t++) kemu.state[t] = KEMU_RUN;
      released = true;
    }
    if (!released)
      return kemu_fail("divergence: no thread can go on (some wait at __syncthreads on line %d, "
                       "others in a warp shuffle, %d returned)",
                       bar ? kemu.line[first] : 0, (int)done);
  }
}

/* ---- shared memory ------------------------------------------------------- */

static void *kemu_shared(size_t bytes, size_t align) {
  size_t *off = &kemu.soff[kemu.cur];
  size_t at = (*off + align - 1) / align * align;
  if (at + bytes > KEMU_STATIC_SHARED) {
    kemu_fail("%d bytes of static shared memory: more than the %d a block has", (int)(at + bytes),
              KEMU_STATIC_SHARED);
    if (!kemu.fibers) longjmp(kemu.plain, 1);
    kemu.state[kemu.cur] = KEMU_DONE;
    kemu_to_sched(kemu.cur); /* never resumed */
  }
  *off = at + bytes;
  return kemu.shared + at;
}
#define KSHARED(T, name, n) T *name = (T *)kemu_shared(sizeof(T) * (n), alignof(T))
#define KDYNSHARED(T, name) T *name = (T *)(kemu.shared + KEMU_STATIC_SHARED)

/* ---- warp shuffles ------------------------------------------------------- */

template <typename T>
static T kemu_shfl(unsigned mask, T v, unsigned src, int line) {
  static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
  if (mask != 0xffffffffu) {
    kemu_fail("a warp shuffle (line %d) with mask %d: only full masks are emulated", line,
              (int)mask);
    if (!kemu.fibers) longjmp(kemu.plain, 1);
  }
  /* Slots in turn: a thread writes these slots again two shuffles later,
   * when its whole warp has passed the next one's barrier, so has read. */
  unsigned t = kemu.cur, lane = t & 31u, u = kemu.turn[t];
  kemu.turn[t] = (unsigned char)(u ^ 1u);
  memcpy(&kemu.slot[u][t], &v, sizeof v);
  kemu_wait(KEMU_WARP, line);
  T r = v;
  if (src < 32) memcpy(&r, &kemu.slot[u][t - lane + src], sizeof r);
  return r;
}
#define __shfl_down_sync(mask, v, delta) \
  kemu_shfl((mask), (v), (threadIdx.x & 31u) + (unsigned)(delta), __LINE__)
#define __shfl_xor_sync(mask, v, m) \
  kemu_shfl((mask), (v), (threadIdx.x & 31u) ^ (unsigned)(m), __LINE__)

/* ---- atomics ------------------------------------------------------------- */

template <typename T>
static T atomicAdd(T *p, T v) {
  T old = *p;
  *p = old + v;
  return old;
}
template <typename T>
static T atomicMin(T *p, T v) {
  T old = *p;
  *p = v < old ? v : old;
  return old;
}
template <typename T>
static T atomicMax(T *p, T v) {
  T old = *p;
  *p = v > old ? v : old;
  return old;
}
template <typename T>
static T atomicCAS(T *p, T cmp, T v) {
  T old = *p;
  if (old == cmp) *p = v;
  return old;
}

/* emu.so is closed after each program: what it holds goes with it. */
__attribute__((destructor)) static void kemu_release(void) {
  free(kemu.shared);
  kemu.shared = NULL;
  for (unsigned t = 0; t < KEMU_MAXT; t++)
    if (kemu.stack[t]) munmap(kemu.stack[t], KEMU_STACK);
}

/* ---- one block ----------------------------------------------------------- */

/* Runs block b of a launch of k (grid g blocks of bd threads, dyn bytes of
 * dynamic shared memory): 0, or -1 with the reason in err. */
extern "C" __attribute__((visibility("default"))) int
kemu_block(kemu_kernel k, void *const *bufs, int64_t begin, int64_t end, unsigned b, unsigned g,
           unsigned bd, unsigned dyn, char *err, size_t nerr) {
  kemu.err = err;
  kemu.nerr = nerr;
  kemu.failed = false;
  if (err && nerr) err[0] = '\0';
  if (bd == 0 || bd > KEMU_MAXT) {
    kemu_fail("a block of %d threads (at most %d)", (int)bd, KEMU_MAXT);
    return -1;
  }
  size_t need = KEMU_STATIC_SHARED + (size_t)dyn;
  if (need > kemu.shared_cap) {
    free(kemu.shared);
    kemu.shared = (unsigned char *)malloc(need);
    kemu.shared_cap = kemu.shared ? need : 0;
    if (kemu.shared == NULL) {
      kemu_fail("no memory for %d bytes of shared memory%.0d", (int)need, 0);
      return -1;
    }
  }
  memset(kemu.shared, 0xff, need);
  kemu.dyn = dyn;
  kemu.k = k;
  kemu.bufs = bufs;
  kemu.begin = begin;
  kemu.end = end;
  blockIdx = {b, 0, 0};
  gridDim = {g, 1, 1};
  blockDim = {bd, 1, 1};
  unsigned last = bd - 1;
  memset(kemu.state, KEMU_DONE, bd);
  if (!kemu_fiber(last)) {
    kemu_fail("no memory for a fiber's stack%.0d%.0d", 0, 0);
    return -1;
  }
  kemu.fibers = true;
  kemu_switch(last);
  if (kemu.failed) return -1;
  if (kemu.state[last] == KEMU_DONE) { /* it never waited: the others as plain calls */
    kemu.fibers = false;
    if (setjmp(kemu.plain) != 0) return -1;
    for (unsigned t = last; t-- > 0;) {
      kemu.cur = t;
      threadIdx = {t, 0, 0};
      kemu.soff[t] = 0;
      k(bufs, begin, end);
      if (kemu.failed) return -1;
    }
    return 0;
  }
  for (unsigned t = 0; t < last; t++)
    if (!kemu_fiber(t)) {
      kemu_fail("no memory for fiber %d's stack%.0d", (int)t, 0);
      return -1;
    }
  kemu_schedule(bd);
  kemu.fibers = false;
  return kemu.failed ? -1 : 0;
}
