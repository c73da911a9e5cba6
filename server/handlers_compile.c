/* Compile: program in, executable id out.
 *
 * On the completion-queue thread only what is cheap is checked (sizes, the
 * option values) and the compile-queue bound applied; the work itself runs
 * on the loop's compile pool: parse or decode, verify, apply the requested
 * transforms, compute the cache key (cache/key.h: module, signature,
 * options, target, version), then find or build the executable:
 *
 *   1. the loaded-executable table (executables.c), by key: MEMORY;
 *   2. cpu programs: the executable cache (cache/cache.h) by key, which
 *      answers from its memory, disk or Redis tier, waits for a concurrent
 *      build of the same key (here or on another server), or calls back to
 *      compile; the built executable is kept as it is, an entry read from a
 *      tier is deserialized;
 *   3. interpreter programs: the verified module is the executable; they
 *      live in the table only.
 *
 * The executable id is the key's hex. A request that names no backend gets
 * --default-backend; when that is cpu and the cpu compiler cannot take the
 * program (an op it has no code for, no C compiler), the program runs on
 * the interpreter instead, under the cpu key, and the response says so in
 * warnings. Redis being slow or down never fails a compile: the cache
 * counts the fault and serves from the local tiers or builds.
 */
#include <stdio.h>
#include <string.h>

#include "cache/cache.h"
#include "common/alloc.h"
#include "common/deadline.h"
#include "common/sbuf.h"
#include "compiler/ir/ir.h"
#include "compiler/ir/proto_codec.h"
#include "compiler/ir/text.h"
#include "compiler/ir/verify.h"
#include "compiler/spmd/spmd.h"
#include "compiler/target.h"
#include "executor/scheduler.h"
#include "kiln/v1/kiln.pb-c.h"
#include "server/compile_memo.h"
#include "server/compile_prep.h"
#include "server/convert.h"
#include "server/executables.h"
#include "server/progress.h"
#include "server/server.h"

#if defined(__has_include)
#if __has_include("compiler/compile.h")
#include "compiler/codegen/executable.h"
#include "compiler/codegen/user_kernel.h"
#include "compiler/compile.h"
#define KILND_HAVE_COMPILER 1
#endif
#endif

/* The log's name of a Kiln__V1__CacheSource (log.h). */
static const char *log_source(int source) {
  switch (source) {
  case KILN__V1__CACHE_SOURCE__CACHE_SOURCE_MEMORY: return "memory";
  case KILN__V1__CACHE_SOURCE__CACHE_SOURCE_DISK: return "disk";
  case KILN__V1__CACHE_SOURCE__CACHE_SOURCE_SHARED: return "redis";
  case KILN__V1__CACHE_SOURCE__CACHE_SOURCE_SINGLE_FLIGHT: return "single-flight";
  default: return "compiled";
  }
}

/* What the call's log line says it found; a build is also audited. */
static void note_answer(kilnd_call *c, const kiln_cache_key *key, int source, const char *backend,
                        int64_t ns) {
  c->log_cache = log_source(source);
  snprintf(c->log_key, sizeof c->log_key, "%s", key->hex);
  if (source != KILN__V1__CACHE_SOURCE__CACHE_SOURCE_COMPILED) return;
  kilnd_log_rec r;
  kilnd_log_audit(&r, c, "compile");
  kilnd_log_str(&r, "key", key->hex);
  kilnd_log_str(&r, "backend", backend);
  kilnd_log_ms(&r, "duration_ms", (double)ns / 1e6);
  kilnd_log_end(&r);
}

/* ---- the cheap checks ---------------------------------------------------------------- */

static int check_request(kilnd *srv, const Kiln__V1__CompileRequest *r, kiln_status *st) {
  uint64_t max = srv->cfg.max_module_bytes;
  if (r->program_case == KILN__V1__COMPILE_REQUEST__PROGRAM_HLO_TEXT) {
    size_t n = strlen(r->hlo_text);
    if (n > max)
      return kiln_status_set(st, KILN_ELIMIT, "hlo_text",
                             "program of %zu bytes exceeds the limit of %llu (max-module-bytes)", n,
                             (unsigned long long)max);
  } else if (r->program_case == KILN__V1__COMPILE_REQUEST__PROGRAM_MODULE) {
    size_t n = protobuf_c_message_get_packed_size(&r->module->base);
    if (n > max)
      return kiln_status_set(st, KILN_ELIMIT, "module",
                             "program of %zu bytes exceeds the limit of %llu (max-module-bytes)", n,
                             (unsigned long long)max);
  } else {
    return kiln_status_set(st, KILN_EINVAL, "program", "neither hlo_text nor module is set");
  }
  if (r->request_id && strlen(r->request_id) > 256)
    return kiln_status_set(st, KILN_EINVAL, "request_id", "longer than 256 bytes");
  kilnd_compile_plan plan;
  int rc = kilnd_compile_plan_make(srv, r->options, &plan, st);
  kilnd_compile_plan_free(&plan);
  return rc;
}

/* The state of a Compile call past its cheap checks (c->state): its
 * progress (progress.h, first, as kilnd_progress_of expects) and, when the
 * memo could not answer, the request's digest, which the compile pool
 * remembers the key under: the program is hashed once. */
typedef struct compile_state {
  kilnd_progress progress;
  bool has_digest;
  uint8_t digest[KILN_CACHE_DIGEST_LEN];
} compile_state;

static void compile_state_free(kilnd_call *c) {
  compile_state *cs = c->state;
  kilnd_progress_destroy(&cs->progress);
  kiln_free(cs);
  c->state = NULL;
}

static bool answer_from_memo(kilnd_call *c, const Kiln__V1__CompileRequest *r);

void kilnd_handle_compile(kilnd_call *c, ProtobufCMessage *req) {
  kilnd *srv = c->srv;
  kiln_status st;
  kiln_status_clear(&st);
  int rc = check_request(srv, (const Kiln__V1__CompileRequest *)req, &st);
  if (rc) {
    kilnd_call_finish(c, NULL, rc, &st);
    return;
  }
  compile_state *cs = kiln_calloc(1, sizeof *cs);
  if (cs == NULL) {
    kilnd_call_fail(c, KILN_ENOMEM, "out of memory");
    return;
  }
  kilnd_progress_init(&cs->progress, c, c->method->id == KILND_M_COMPILE_STREAM);
  c->state = cs;
  c->state_free = compile_state_free;
  if (answer_from_memo(c, (const Kiln__V1__CompileRequest *)req)) return;
  kilnd_compile_submit(c);
}

void kilnd_compile_submit(kilnd_call *c) {
  kilnd *srv = c->srv;
  if ((uint64_t)atomic_fetch_add(&srv->compiles, 1) >= srv->cfg.compile_queue_depth) {
    atomic_fetch_sub(&srv->compiles, 1);
    kilnd_call_fail(c, KILN_ELIMIT, "compile queue is full (%llu compiles, compile-queue-depth)",
                    (unsigned long long)srv->cfg.compile_queue_depth);
    return;
  }
  kilnd_progress *p = kilnd_progress_of(c);
  if (p) kilnd_progress_set(p, KILN__V1__COMPILE_PHASE__COMPILE_PHASE_QUEUED, NULL);
  int rc = kilnd_loop_queue_compile(srv, c);
  if (rc) {
    atomic_fetch_sub(&srv->compiles, 1);
    if (p) kilnd_progress_stop(p);
    kilnd_call_fail(c, rc, "%s",
                    rc == KILN_ENOMEM ? "out of memory queueing the compile"
                                      : "the server is shutting down");
  }
}

/* ---- the work ------------------------------------------------------------------------ */

typedef struct job {
  kilnd *srv;
  kilnd_call *c;
  kilnd_progress *progress; /* the call's (progress.h) */
  const Kiln__V1__CompileRequest *r;
  kilnd_compile_plan plan;
  kiln_module *m;
  kiln_arena *a; /* the response's pieces */
  Kiln__V1__CompileResponse resp;
  kiln_sbuf warnings_text;
  char **warnings;
  size_t nwarnings;
  Kiln__V1__PassTiming **timings;
  size_t ntimings;
  int64_t t0;
  uint8_t *blob; /* serialized executable */
  size_t blob_len;
  kiln_cache_key key;
  kiln_cache_policy policy;
  int source; /* Kiln__V1__CacheSource of the answer */
  /* The whole Compile's deadline (parse to stored executable): the call's,
   * or --compile-timeout after the work began when that is sooner; the
   * passes and transforms poll it (common/deadline.h). */
  kiln_deadline deadline;
  char limit[96];  /* deadline.limit's text */
  bool from_table; /* found in the loaded-executable table */
  /* The mesh (resolve_mesh): replicas x partitions devices per run; a
   * global program is partitioned into spmd before it is compiled. */
  uint32_t replicas, partitions;
  bool global;
  bool planned; /* auto_shard chose the shardings (over mesh_shape) */
  kiln_spmd_program *spmd;
  /* It calls user kernels: their digests are in the key, it stays out of
   * the shared tier and the memo, and never falls back to the interpreter. */
  bool user_kernels;
  kiln_status st;
} job;

static void warn(job *j, const char *msg) {
  char *w = kiln_arena_strdup(j->a, msg);
  if (w == NULL || j->nwarnings >= 16) return;
  j->warnings[j->nwarnings++] = w;
}

static uint32_t live_instrs(const kiln_module *m) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < m->ncomps; i++) n += m->comps[i]->ninstrs;
  return n;
}

static void timing(job *j, const char *pass, int64_t ns, uint32_t instrs) {
  if (j->ntimings >= KILND_MAX_TIMINGS) return;
  Kiln__V1__PassTiming *t = kiln_arena_alloc(j->a, sizeof *t);
  if (t == NULL) return;
  kiln__v1__pass_timing__init(t);
  t->pass = kiln_arena_strdup(j->a, pass);
  if (t->pass == NULL) return;
  t->wall_ns = ns;
  t->instructions_after = instrs;
  j->timings[j->ntimings++] = t;
}

static void set_deadline(job *j) {
  double cap = j->srv->cfg.compile_timeout;
  kiln_deadline *d = &j->deadline;
  *d = (kiln_deadline){.cancelled = &j->c->cancelled, .limit = j->limit};
  if (cap > 0) {
    d->at_ns = j->t0 + (int64_t)(cap * 1e9);
    snprintf(j->limit, sizeof j->limit, "the compile time limit of %g s (compile-timeout)", cap);
  }
  if (j->c->deadline_ns && (d->at_ns == 0 || j->c->deadline_ns < d->at_ns)) {
    d->at_ns = j->c->deadline_ns;
    snprintf(j->limit, sizeof j->limit, "the call's deadline");
  }
}

/* Seconds the C compiler may take: what the Compile has left. */
static double time_left(const job *j) {
  if (j->deadline.at_ns == 0) return 0; /* the compiler's own default */
  double left = (double)(j->deadline.at_ns - kiln_sched_now_ns()) / 1e9;
  return left < 0.001 ? 0.001 : left;
}

static int load_program(job *j) {
  const kilnd_config *cfg = &j->srv->cfg;
  int64_t t0 = kiln_sched_now_ns();
  int rc;
  if (j->r->program_case == KILN__V1__COMPILE_REQUEST__PROGRAM_HLO_TEXT) {
    kiln_parse_options po = {.max_elements = (int64_t)cfg->max_elements};
    rc = kiln_module_parse_text(j->r->hlo_text, strlen(j->r->hlo_text), "hlo_text", &po, &j->m,
                                &j->st);
    if (rc == 0) timing(j, "parse", kiln_sched_now_ns() - t0, live_instrs(j->m));
  } else {
    rc = kiln__proto_module_decode(j->r->module, &j->m, &j->st);
    if (rc == 0) timing(j, "decode", kiln_sched_now_ns() - t0, live_instrs(j->m));
  }
  if (rc) return rc;
  t0 = kiln_sched_now_ns();
  kiln_verify_options vo = {.max_elements = (int64_t)cfg->max_elements,
                            .max_nesting = (uint32_t)cfg->max_nesting};
  rc = kiln_module_verify(j->m, &vo, &j->st);
  if (rc == 0) timing(j, "verify", kiln_sched_now_ns() - t0, live_instrs(j->m));
  return rc;
}

#ifdef KILND_HAVE_COMPILER
/* The digests of the user kernels the program calls (an executable embeds
 * their code) into the options text; a call of a kernel that is not
 * registered, or any when they are off, is refused here. */
static int user_kernels_text(job *j, char *options, size_t size) {
  char *text = NULL;
  int rc = kiln_user_kernels_key(j->srv->user_kernels, j->m, &text, &j->st);
  if (rc) return rc;
  if (text[0]) {
    uint8_t d[KILN_CACHE_DIGEST_LEN];
    char hex[KILN_CACHE_HEX_LEN + 1];
    kiln_cache_sha256(text, strlen(text), d);
    kiln_cache_to_hex(d, 16, hex);
    size_t used = strlen(options);
    if (used + 14 + 32 + 2 > size)
      rc = kiln_status_set(&j->st, KILN_EINTERNAL, "compile", "options text too long");
    else
      snprintf(options + used, size - used, "user_kernels=%s\n", hex);
    j->user_kernels = true;
    if (rc == 0 && strcmp(j->plan.backend, "interp") == 0)
      rc = kiln_status_set(&j->st, KILN_EUNIMPL, "options.backend",
                           "the program calls user kernels, which run on the cpu backend only "
                           "(the interpreter runs no compiled code)");
  }
  kiln_free(text);
  return rc;
}
#endif

/* The key: everything that determines the code, hashed by component. */
static int make_key(job *j) {
  char target[KILN_CACHE_TEXT_MAX], options[KILN_CACHE_TEXT_MAX];
  char ident[KILN_CACHE_TEXT_MAX];
  const char *code_id = NULL; /* NVRTC's version and options, for cuda */
#ifdef KILND_HAVE_COMPILER
  if (j->plan.target)
    code_id = kiln_compile_code_identity(j->plan.target->backend, ident, sizeof ident);
#else
  (void)ident;
#endif
  if (j->plan.target) kiln_cache_code_target_text(j->plan.target->isa, code_id, target);
  kiln_cache_options_text(j->plan.opt_level, j->plan.ndevices, options);
  /* A budget changes the code; without one the key stays what it was. */
  size_t used = strlen(options);
  if (j->plan.memory_budget && used < sizeof options)
    snprintf(options + used, sizeof options - used, "memory_budget=%llu\n",
             (unsigned long long)j->plan.memory_budget);
  if (j->plan.ndevices > 1) { /* single-device keys stay as they were */
    size_t n = strlen(options);
    n += (size_t)snprintf(options + n, sizeof options - n,
                          "mesh=%ux%u\nprogram=%s\nshape=", j->replicas, j->partitions,
                          j->global ? "global" : "per-device");
    for (uint32_t i = 0; i < j->plan.nmesh && n < sizeof options; i++)
      n += (size_t)snprintf(options + n, sizeof options - n, "%s%lld", i ? "x" : "",
                            (long long)j->plan.mesh[i]);
    if (n < sizeof options) snprintf(options + n, sizeof options - n, "\n");
  }
#ifdef KILND_HAVE_COMPILER
  int rc = user_kernels_text(j, options, sizeof options);
  if (rc) return rc;
#endif
  kiln_cache_key_inputs in = {
      .backend = j->plan.backend, .target = j->plan.target ? target : NULL, .options = options};
  return kiln_cache_key_compute(j->m, &in, &j->key, &j->st);
}

static kiln_cache_policy policy_of(const Kiln__V1__CompileRequest *r) {
  switch (r->options ? r->options->cache_policy : KILN__V1__CACHE_POLICY__CACHE_POLICY_DEFAULT) {
  case KILN__V1__CACHE_POLICY__CACHE_POLICY_REFRESH: return KILN_CACHE_POLICY_REFRESH;
  case KILN__V1__CACHE_POLICY__CACHE_POLICY_BYPASS: return KILN_CACHE_POLICY_BYPASS;
  default: return KILN_CACHE_POLICY_DEFAULT;
  }
}

static int proto_source(kiln_cache_source s) {
  switch (s) {
  case KILN_CACHE_SRC_MEMORY: return KILN__V1__CACHE_SOURCE__CACHE_SOURCE_MEMORY;
  case KILN_CACHE_SRC_DISK: return KILN__V1__CACHE_SOURCE__CACHE_SOURCE_DISK;
  case KILN_CACHE_SRC_REDIS: return KILN__V1__CACHE_SOURCE__CACHE_SOURCE_SHARED;
  case KILN_CACHE_SRC_SINGLE_FLIGHT: return KILN__V1__CACHE_SOURCE__CACHE_SOURCE_SINGLE_FLIGHT;
  default: return KILN__V1__CACHE_SOURCE__CACHE_SOURCE_COMPILED;
  }
}

#ifdef KILND_HAVE_COMPILER
static void report_timings(job *j, const kiln_compile_report *rep) {
  for (uint32_t i = 0; i < rep->npasses; i++)
    if (rep->passes[i].ran) timing(j, rep->passes[i].name, (int64_t)(rep->passes[i].ms * 1e6), 0);
  timing(j, "buffer-assignment", (int64_t)(rep->assign_ms * 1e6), 0);
  timing(j, "codegen", (int64_t)(rep->codegen_ms * 1e6), 0);
  timing(j, "cc", (int64_t)(rep->cc_ms * 1e6), 0);
}

/* The compiler's phases and the cache's waits, as the call's phases. */
static void compiler_phase(void *arg, const char *phase) {
  kilnd_progress_set(arg,
                     strcmp(phase, "cc") == 0 ? KILN__V1__COMPILE_PHASE__COMPILE_PHASE_CC
                                              : KILN__V1__COMPILE_PHASE__COMPILE_PHASE_PASSES,
                     NULL);
}

static void cache_wait(void *arg, bool other_server) {
  kilnd_progress_set(arg, KILN__V1__COMPILE_PHASE__COMPILE_PHASE_WAITING,
                     other_server ? "another server's build" : "a build on this server");
}

/* cpu: compile; *fallback when the default backend should give way. */
static int compile_cpu(job *j, kiln_executable **exe, uint64_t *peak, bool *fallback,
                       kiln_status *out_st) {
  kiln_compile_options o;
  kiln_compile_options_init(&o);
  o.target = j->plan.target ? j->plan.target->name : NULL;
  o.opt_level = j->plan.opt_level;
  o.verify_each = j->r->options && j->r->options->verify_each_pass;
  o.cc_timeout_s = time_left(j);
  o.max_nesting = KILN_VERIFY_MAX_NESTING; /* the input's was checked at load */
  o.memory_budget = j->plan.memory_budget;
  o.user_kernels = j->srv->user_kernels;
  o.progress = compiler_phase;
  o.progress_arg = j->progress;
  kiln_compile_report rep;
  kiln_status st;
  kiln_status_clear(&st);
  int rc = kiln_compile(j->spmd ? j->spmd->module : j->m, &o, exe, &rep, &st);
  if (rc == 0) {
    report_timings(j, &rep);
    *peak = rep.peak_bytes;
    return 0;
  }
  /* The interpreter has no budget to keep: a budgeted program does not
   * fall back to it. */
  if (!j->plan.explicit_backend && !j->plan.memory_budget && !j->user_kernels &&
      (rc == KILN_EUNIMPL || rc == KILN_ENOTFOUND)) {
    char msg[KILN_STATUS_MSG_MAX + 96];
    snprintf(msg, sizeof msg, "running on the interpreter: the cpu compiler refused: %s", st.msg);
    warn(j, msg);
    *fallback = true;
    return kiln_status_set(out_st, KILN_EUNIMPL, "compile", "the cpu compiler refused");
  }
  /* The C compiler's limit is what the Compile had left: its running out
   * is the Compile's deadline. */
  if (rc == KILN_ELIMIT && j->deadline.at_ns && kiln_sched_now_ns() >= j->deadline.at_ns - 10000000)
    return kiln_status_set(out_st, KILN_EDEADLINE, "cc", "%s passed during the C compiler: %s",
                           j->deadline.limit, st.msg);
  if (rc == KILN_ENOTFOUND) rc = KILN_EINTERNAL; /* no C compiler: the server's fault */
  return kiln_status_set(out_st, rc, st.where, "%s", st.msg);
}

/* The cache's build callback: compile, and hand the cache the serialized
 * executable while this request keeps the executable itself. */
typedef struct build_ctx {
  job *j;
  kiln_executable *exe; /* built by this request */
  uint64_t peak;
  bool fallback; /* the cpu compiler refused: run on the interpreter */
} build_ctx;

static int build_cpu(void *ctx, uint8_t **payload, size_t *len, uint32_t *kind,
                     uint64_t *peak_bytes, uint64_t *compile_ns, kiln_status *st) {
  build_ctx *b = ctx;
  int64_t t0 = kiln_sched_now_ns();
  kiln_executable_destroy(b->exe); /* a REFRESH after a payload that did not load */
  b->exe = NULL;
  int rc = compile_cpu(b->j, &b->exe, &b->peak, &b->fallback, st);
  if (rc) return rc;
  *compile_ns = (uint64_t)(kiln_sched_now_ns() - t0);
  *kind = KILN_CACHE_PAYLOAD_CPU_EXE;
  *peak_bytes = b->peak;
  if (b->j->policy != KILN_CACHE_POLICY_BYPASS)
    kilnd_progress_set(b->j->progress, KILN__V1__COMPILE_PHASE__COMPILE_PHASE_STORING, NULL);
  return kiln_executable_serialize(b->exe, payload, len, st);
}

/* cpu through the cache. On success either *exe is the executable to
 * load (j->source says where it came from), or *loaded is the table's
 * entry (a concurrent request here loaded it first), or *fallback is set
 * (the program goes to the interpreter). */
static int cache_cpu(job *j, kiln_executable **exe, kilnd_exe **loaded, uint64_t *peak,
                     bool *fallback) {
  build_ctx b = {.j = j};
  kiln_cache_result res = {0};
  kiln_status st;
  kiln_status_clear(&st);
  kiln_cache_policy policy = j->policy;
  /* Code a client wrote stays on the server that compiled it. */
  if (j->user_kernels && policy == KILN_CACHE_POLICY_DEFAULT) policy = KILN_CACHE_POLICY_LOCAL;
  /* Waiting for another build (here or on a server holding the Redis lock)
   * may take half of the time the call has left; then this request builds
   * itself, with the other half still its own. */
  int64_t wait_until = 0;
  if (j->c->deadline_ns) {
    int64_t now = kiln_sched_now_ns();
    wait_until = j->c->deadline_ns > now ? now + (j->c->deadline_ns - now) / 2 : now;
  }
  int rc;
  for (int attempt = 0;; attempt++) {
    kiln_cache_set_wait_hook(cache_wait, j->progress);
    rc = kiln_cache_get_or_build(j->srv->cache, &j->key, policy, wait_until, build_cpu, &b, &res,
                                 &st);
    kiln_cache_set_wait_hook(NULL, NULL);
    if (rc || b.exe) break; /* failed, or built by this request */
    j->source = proto_source(res.source);
    if (kilnd_exes_get(j->srv->exes, j->key.hex, loaded, NULL) == 0) break;
    rc = kiln_executable_deserialize(res.payload, res.len, &b.exe, &st);
    if (rc == 0 || attempt > 0) break;
    /* It passed the MAC, so a Kiln wrote it: one whose executable format
     * differs, or a bug. Either way a rebuild replaces it. */
    kilnd_log("cache entry %s from %s does not load (%s: %s); rebuilding", j->key.hex,
              kiln_cache_source_name(res.source), st.where, st.msg);
    kiln_free(res.payload);
    res = (kiln_cache_result){0};
    kiln_status_clear(&st);
    policy = KILN_CACHE_POLICY_REFRESH;
  }
  if (rc) {
    kiln_executable_destroy(b.exe);
    kiln_free(res.payload);
    if (b.fallback) return *fallback = true, 0;
    return kiln_status_set(&j->st, rc, st.where, "%s", st.msg);
  }
  if (*loaded) {
    kiln_free(res.payload);
    return 0;
  }
  j->source = proto_source(res.source);
  *exe = b.exe;
  *peak = res.source == KILN_CACHE_SRC_COMPILED ? b.peak : res.meta.peak_bytes;
  if (j->r->options && j->r->options->return_executable && res.payload) {
    j->blob = res.payload; /* the response returns it: no second serialization */
    j->blob_len = res.len;
  } else {
    kiln_free(res.payload);
  }
  return 0;
}
#endif

/* Interpreter entries report the bytes of every value of the entry: the
 * interpreter keeps no buffer assignment, so this is an upper bound. */
static uint64_t interp_peak(const kiln_module *m) {
  const kiln_computation *e = kiln_module_entry(m);
  uint64_t sum = 0;
  for (uint32_t i = 0; e && i < e->ninstrs; i++) {
    int64_t b = kiln_shape_bytes(&kiln_module_instr(m, e->instrs[i])->shape);
    if (b > 0) sum += (uint64_t)b;
  }
  return sum;
}

/* A default-policy request found an executable that a BYPASS request
 * built: it goes to the tiers now, as if this request had built it. A
 * failure only costs other servers a compile; it is logged. */
static void store_uncached(job *j, kilnd_exe *e) {
#ifdef KILND_HAVE_COMPILER
  if (e->exe == NULL) return;
  uint8_t *blob = NULL;
  size_t len = 0;
  kiln_status st;
  kiln_status_clear(&st);
  kiln_cache_meta meta = {.kind = KILN_CACHE_PAYLOAD_CPU_EXE, .peak_bytes = e->peak_bytes};
  memcpy(meta.key, j->key.digest, sizeof meta.key);
  memcpy(meta.parts, j->key.parts, sizeof meta.parts);
  int rc = kiln_executable_serialize(e->exe, &blob, &len, &st);
  if (rc == 0) rc = kiln_cache_put(j->srv->cache, &meta, blob, len, &st);
  if (rc)
    kilnd_log("cache: storing %s built under BYPASS failed: %s: %s", j->key.hex, st.where, st.msg);
  kiln_free(blob);
#else
  (void)j, (void)e;
#endif
}

/* Finds or builds the executable; *out holds a reference. */
static int build(job *j, kilnd_exe **out) {
  int rc = make_key(j);
  if (rc) return rc;
  j->policy = policy_of(j->r);
  j->source = KILN__V1__CACHE_SOURCE__CACHE_SOURCE_COMPILED;
  if (j->policy == KILN_CACHE_POLICY_DEFAULT &&
      kilnd_exes_get(j->srv->exes, j->key.hex, out, NULL) == 0) {
    j->source = KILN__V1__CACHE_SOURCE__CACHE_SOURCE_MEMORY;
    j->from_table = true;
    if (atomic_exchange(&(*out)->uncached, false) && !j->user_kernels) store_uncached(j, *out);
    return 0;
  }
  if (j->global &&
      (rc = kiln_spmd_partition_mesh(j->m, j->replicas, j->partitions, NULL, &j->spmd, &j->st)))
    return rc;
  bool fallback = strcmp(j->plan.backend, "interp") == 0;
  kiln_executable *exe = NULL;
  uint64_t peak = 0;
#ifdef KILND_HAVE_COMPILER
  if (!fallback) {
    if ((rc = cache_cpu(j, &exe, out, &peak, &fallback))) return rc;
    if (*out) return 0;
  }
#else
  if (!fallback) {
    if (j->plan.explicit_backend)
      return kiln_status_set(&j->st, KILN_EUNIMPL, "options.backend",
                             "this server was built without the cpu compiler");
    warn(j, "running on the interpreter: this server was built without the cpu compiler");
    fallback = true;
  }
#endif
  if (fallback) {
    peak = interp_peak(j->spmd ? j->spmd->module : j->m);
    j->source = KILN__V1__CACHE_SOURCE__CACHE_SOURCE_COMPILED;
  }
  uint32_t slots = kiln_sched_class_devices(j->srv->sched, KILND_CLASS_CPU);
  kilnd_exe *e = kilnd_exe_create(j->key.hex, fallback ? KILND_CLASS_INTERP : KILND_CLASS_CPU,
                                  j->plan.ndevices, j->m, exe, slots);
  j->m = NULL;
  if (e == NULL) return kiln_status_set(&j->st, KILN_ENOMEM, "compile", "out of memory");
  e->replicas = j->replicas;
  e->partitions = j->partitions;
  e->per_device = j->plan.ndevices > 1 && !j->global;
  e->spmd = j->spmd; /* the entry's now */
  j->spmd = NULL;
  e->peak_bytes = peak;
  atomic_store(&e->uncached, exe != NULL && j->policy == KILN_CACHE_POLICY_BYPASS);
  /* REFRESH and BYPASS answer with what they built, in place of an entry
   * the table may hold (Executes running that one keep it alive). */
  return kilnd_exes_insert(j->srv->exes, e, j->policy != KILN_CACHE_POLICY_DEFAULT, out, &j->st);
}

static int fill_components(kiln_arena *a, Kiln__V1__CompileResponse *r, const kiln_cache_key *key) {
  r->key_components = kiln_arena_calloc(a, KILN_CACHE_NPARTS, sizeof *r->key_components);
  if (r->key_components == NULL) return KILN_ENOMEM;
  for (int i = 0; i < KILN_CACHE_NPARTS; i++) {
    Kiln__V1__KeyComponent *k = kiln_arena_alloc(a, sizeof *k);
    char *hex = kiln_arena_alloc(a, KILN_CACHE_HEX_LEN + 1);
    if (k == NULL || hex == NULL) return KILN_ENOMEM;
    kiln__v1__key_component__init(k);
    kiln_cache_to_hex(key->parts[i], KILN_CACHE_DIGEST_LEN, hex);
    k->name = (char *)kiln_cache_part_name(i);
    k->digest = hex;
    r->key_components[r->n_key_components++] = k;
  }
  return 0;
}

/* The signature's arrays point into the entry's module; the job releases
 * the entry before replying, so they are copied into the job's arena. */
static bool own_shape(kiln_arena *a, Kiln__V1__Shape *s) {
  if (s == NULL) return true;
  if (s->n_dimensions &&
      !(s->dimensions = kiln_arena_memdup(a, s->dimensions, s->n_dimensions * sizeof(int64_t))))
    return false;
  Kiln__V1__Layout *l = s->layout;
  if (l && l->n_minor_to_major &&
      !(l->minor_to_major =
            kiln_arena_memdup(a, l->minor_to_major, l->n_minor_to_major * sizeof(int64_t))))
    return false;
  if (l && l->tail && !(l->tail = kiln_arena_strdup(a, l->tail))) return false;
  for (size_t i = 0; i < s->n_tuple_shapes; i++)
    if (!own_shape(a, s->tuple_shapes[i])) return false;
  return true;
}

static bool own_signature(kiln_arena *a, Kiln__V1__ProgramSignature *sig) {
  for (size_t i = 0; i < sig->n_parameters; i++)
    if (!own_shape(a, sig->parameters[i])) return false;
  if (!own_shape(a, sig->result)) return false;
  for (size_t i = 0; i < sig->n_input_output_alias; i++) {
    Kiln__V1__InputOutputAlias *al = sig->input_output_alias[i];
    if (al->n_output_shape_index &&
        !(al->output_shape_index = kiln_arena_memdup(a, al->output_shape_index,
                                                     al->n_output_shape_index * sizeof(int64_t))))
      return false;
    if (al->n_parameter_shape_index &&
        !(al->parameter_shape_index = kiln_arena_memdup(
              a, al->parameter_shape_index, al->n_parameter_shape_index * sizeof(int64_t))))
      return false;
  }
  return true;
}

/* What every answer carries, from the key and the entry: the same whether
 * the compile pool or the completion-queue thread (the memo) answers. */
static int fill_answer(kiln_arena *a, Kiln__V1__CompileResponse *r, const kiln_cache_key *key,
                       const kilnd_exe *e, int source, char *request_id) {
  r->executable_id = (char *)key->hex; /* not e->id: e is released before the reply */
  r->cache_key = (char *)key->hex;
  r->cache_source = (Kiln__V1__CacheSource)source;
  r->peak_bytes = (int64_t)e->peak_bytes;
  r->device_count = (int32_t)e->ndevices;
  r->per_device = e->per_device;
  r->replica_count = (int32_t)(e->replicas ? e->replicas : 1);
  r->num_partitions = (int32_t)(e->partitions ? e->partitions : 1);
  r->request_id = request_id;
  r->signature = kilnd_signature_to_proto(a, e->module);
  if (r->signature == NULL || !own_signature(a, r->signature) || fill_components(a, r, key))
    return KILN_ENOMEM;
  return 0;
}

static int fill_response(job *j, kilnd_exe *e) {
  Kiln__V1__CompileResponse *r = &j->resp;
  bool hit = j->source != KILN__V1__CACHE_SOURCE__CACHE_SOURCE_COMPILED;
  if (fill_answer(j->a, r, &j->key, e, j->source, j->r->request_id))
    return kiln_status_set(&j->st, KILN_ENOMEM, "compile", "out of memory");
  if (j->r->options && j->r->options->return_executable) {
#ifdef KILND_HAVE_COMPILER
    if (e->exe && j->blob == NULL) {
      int rc = kiln_executable_serialize(e->exe, &j->blob, &j->blob_len, &j->st);
      if (rc) return rc;
    }
    if (e->exe) {
      r->serialized_executable.data = j->blob;
      r->serialized_executable.len = j->blob_len;
    }
#endif
    if (e->exe == NULL) /* the default backend fell back to the interpreter */
      return kiln_status_set(&j->st, KILN_EUNIMPL, "options.return_executable",
                             "the program runs on the interpreter, which has no serialized "
                             "executable");
  }
  r->pass_timings = j->timings;
  r->n_pass_timings = hit ? 0 : j->ntimings;
  r->warnings = j->warnings;
  r->n_warnings = j->nwarnings;
  r->compile_wall_ns = kiln_sched_now_ns() - j->t0;
  return 0;
}

/* CompileResponse.dumps[0]: the module as the transforms left it. */
static int dump_transforms(job *j) {
  Kiln__V1__PassDump *d = kiln_arena_alloc(j->a, sizeof *d);
  Kiln__V1__PassDump **list = kiln_arena_alloc(j->a, sizeof *list);
  char *text = kiln_module_print(j->m, NULL);
  char *copy = text ? kiln_arena_strdup(j->a, text) : NULL;
  kiln_free(text);
  if (d == NULL || list == NULL || copy == NULL)
    return kiln_status_set(&j->st, KILN_ENOMEM, "compile", "out of memory dumping the module");
  kiln__v1__pass_dump__init(d);
  d->pass = "transforms";
  d->hlo_text = copy;
  list[0] = d;
  j->resp.dumps = list;
  j->resp.n_dumps = 1;
  return 0;
}

/* Optimization level 3 includes auto-sharding (CompileOptions): a module
 * that names no mesh of its own, compiled for device_count > 1, gets the
 * shardings kiln_spmd_auto_shard chooses over options.mesh_shape (one axis
 * when absent), within memory_budget_bytes per device, and is then a
 * global program like any sharded one. A module it declines (a per-device
 * program, with collectives of its own) compiles as it is. */
static int auto_shard(job *j) {
  kiln_module *m = j->m;
  if (j->plan.opt_level < 3 || !j->plan.devices_given || j->plan.ndevices <= 1 ||
      m->replica_count > 1 || m->num_partitions > 1 || !kiln_spmd_auto_available())
    return 0;
  kiln_spmd_auto_options o;
  kiln_spmd_auto_options_init(&o);
  if (j->plan.nmesh > KILN_SPMD_MAX_MESH)
    return kiln_status_set(&j->st, KILN_EINVAL, "options.mesh_shape",
                           "%u axes: auto-sharding takes at most %d", j->plan.nmesh,
                           KILN_SPMD_MAX_MESH);
  o.mesh_rank = j->plan.nmesh;
  for (uint32_t i = 0; i < j->plan.nmesh; i++) o.mesh[i] = j->plan.mesh[i];
  o.memory_budget = (int64_t)j->plan.memory_budget;
  o.time_limit_s = 10;
  kiln_status st;
  kiln_status_clear(&st);
  int rc = kiln_spmd_auto_shard(m, j->plan.ndevices, &o, NULL, &st);
  if (rc == KILN_EINVAL) return 0; /* not a program it plans: compiled as written */
  if (rc) {
    j->st = st;
    return rc;
  }
  j->planned = true;
  return 0;
}

/* The mesh a Compile asks for (docs/spmd.md, "kilnd"): options.device_count
 * or the module's replica_count x num_partitions. A global program (its
 * ENTRY carries shardings) is partitioned over device_count / R partitions
 * (R replicas: the module's replica_count, or mesh_shape [R, P]); any
 * other module with more than one device is a per-device program, run on
 * replicas x partitions devices (mesh_shape [R, P] names both when the
 * module names neither). Every run takes that many devices of one class at
 * once, so it must fit on the server. */
static int resolve_mesh(job *j) {
  kiln_module *m = j->m;
  int rc;
  if ((rc = auto_shard(j))) return rc;
  uint32_t rm = m->replica_count > 1 ? (uint32_t)m->replica_count : 1;
  uint32_t pm = m->num_partitions > 1 ? (uint32_t)m->num_partitions : 1;
  j->global = kiln_spmd_module_is_sharded(m);
  uint32_t n = j->plan.devices_given ? j->plan.ndevices : j->global ? pm : rm * pm;
  if (j->global) {
    /* R replicas (the module's replica_count, or mesh_shape [R, P] unless
     * that was the auto-sharder's mesh) each run the program partitioned
     * over the rest */
    uint32_t R = rm;
    if (j->plan.nmesh == 2 && !j->planned) {
      if (rm > 1 && j->plan.mesh[0] != rm)
        return kiln_status_set(&j->st, KILN_EINVAL, "options.mesh_shape",
                               "[%lld, %lld], but the module runs on replica_count %u",
                               (long long)j->plan.mesh[0], (long long)j->plan.mesh[1], rm);
      R = (uint32_t)j->plan.mesh[0];
    }
    if (!j->plan.devices_given) n = R * pm;
    if (R < 1 || n % R != 0)
      return kiln_status_set(&j->st, KILN_EINVAL, "options.device_count",
                             "%u devices do not divide among %u replicas", n, R);
    if (pm > 1 && n / R != pm)
      return kiln_status_set(&j->st, KILN_EINVAL, "options.device_count",
                             "%u devices, but the module is partitioned %u ways (num_partitions)",
                             n, pm);
    j->replicas = R;
    j->partitions = n / R;
  } else if (rm * pm > 1) {
    if (n != rm * pm)
      return kiln_status_set(&j->st, KILN_EINVAL, "options.device_count",
                             "%u devices, but the module runs on replica_count %u x "
                             "num_partitions %u = %u",
                             n, rm, pm, rm * pm);
    if (j->plan.nmesh == 2 && (j->plan.mesh[0] != rm || j->plan.mesh[1] != pm))
      return kiln_status_set(&j->st, KILN_EINVAL, "options.mesh_shape",
                             "[%lld, %lld], but the module runs on replica_count %u x "
                             "num_partitions %u",
                             (long long)j->plan.mesh[0], (long long)j->plan.mesh[1], rm, pm);
    j->replicas = rm;
    j->partitions = pm;
  } else if (j->plan.nmesh == 2) {
    j->replicas = (uint32_t)j->plan.mesh[0];
    j->partitions = (uint32_t)j->plan.mesh[1];
  } else {
    j->replicas = 1;
    j->partitions = n;
  }
  j->plan.ndevices = n;
  if (n <= 1) {
    j->global = false;
    return 0;
  }
  bool interp = strcmp(j->plan.backend, "interp") == 0;
  uint32_t have = kiln_sched_class_devices(j->srv->sched, KILND_CLASS_CPU);
  if (interp && n > KILND_MAX_INTERP_MESH)
    return kiln_status_set(&j->st, KILN_EINVAL, "options.device_count",
                           "%u devices for one run: an interpreter mesh has at most %d", n,
                           KILND_MAX_INTERP_MESH);
  if (!interp && n > have)
    return kiln_status_set(&j->st, KILN_EINVAL, "options.device_count",
                           "%u devices for one run, but this server has %u cpu devices "
                           "(kilnd --cpu-devices)",
                           n, have);
  if (j->global && j->r->options && j->r->options->return_executable)
    return kiln_status_set(&j->st, KILN_EUNIMPL, "options.return_executable",
                           "a partitioned global program has no single serialized executable "
                           "(its shardings live on the server)");
  if (!j->global) { /* what the per-device program is compiled for */
    m->replica_count = j->replicas;
    m->num_partitions = j->partitions;
  }
  return 0;
}

static int run_job(job *j, kilnd_call *c) {
  int rc;
  if (kilnd_call_expired(c, &rc))
    return kiln_status_set(&j->st, rc, "Compile",
                           rc == KILN_EDEADLINE
                               ? "the call's deadline passed while the compile was queued"
                               : "the caller went away");
  kilnd_progress_set(j->progress, KILN__V1__COMPILE_PHASE__COMPILE_PHASE_LOADING, NULL);
  if ((rc = kilnd_compile_plan_make(j->srv, j->r->options, &j->plan, &j->st))) return rc;
  j->warnings = kiln_arena_calloc(j->a, 16, sizeof *j->warnings);
  j->timings = kiln_arena_calloc(j->a, KILND_MAX_TIMINGS, sizeof *j->timings);
  if (j->warnings == NULL || j->timings == NULL)
    return kiln_status_set(&j->st, KILN_ENOMEM, "compile", "out of memory");
  for (uint32_t i = 0; i < j->plan.nwarnings; i++) warn(j, j->plan.warnings[i]);
  if ((rc = load_program(j)) || (rc = kiln__deadline_check("verify", &j->st))) return rc;
  int64_t t0 = kiln_sched_now_ns();
  if ((rc = kilnd_compile_plan_apply(&j->plan, j->m, &j->st)) ||
      (rc = kiln__deadline_check("transforms", &j->st)))
    return rc;
  if (j->plan.ntransforms) timing(j, "transforms", kiln_sched_now_ns() - t0, live_instrs(j->m));
  if (j->plan.dump_transforms && (rc = dump_transforms(j))) return rc;
  if ((rc = resolve_mesh(j))) return rc;
  kilnd_exe *e = NULL;
  if ((rc = build(j, &e))) return rc;
  rc = fill_response(j, e);
  const compile_state *cs = c->state; /* a digest when the request may be memoized */
  /* (a kernel registered again changes the key, not the request) */
  if (rc == 0 && j->nwarnings == 0 && cs->has_digest && !j->user_kernels)
    kilnd_memo_put(j->srv->memo, cs->digest, &j->key);
  /* Released before the reply: a caller that evicts or compiles the next
   * program right after it must not find this entry still in use. */
  const char *backend = e->exe ? j->plan.backend : "interp";
  kilnd_exe_unref(e);
  kilnd_metrics_compile(j->srv, kiln_sched_now_ns() - j->t0, j->source, j->from_table);
  if (rc == 0) note_answer(c, &j->key, j->source, backend, kiln_sched_now_ns() - j->t0);
  if (rc == 0) kilnd_progress_finish(j->progress, &j->resp, 0, NULL);
  return rc ? rc : 1; /* 1: answered */
}

void kilnd_compile_work(kilnd_call *c) {
  kilnd *srv = c->srv;
  if (kilnd_progress_of(c) == NULL) { /* CacheList, CacheEvict, RegisterKernel */
    if (c->method->id == KILND_M_REGISTER_KERNEL)
      kilnd_kernel_work(c);
    else
      kilnd_cache_work(c);
    atomic_fetch_sub(&srv->compiles, 1);
    return;
  }
  job j = {.srv = srv,
           .c = c,
           .progress = kilnd_progress_of(c),
           .r = (const Kiln__V1__CompileRequest *)c->req,
           .t0 = kiln_sched_now_ns()};
  kiln__v1__compile_response__init(&j.resp);
  kiln_status_clear(&j.st);
  j.a = kiln_arena_create();
  set_deadline(&j);
  const kiln_deadline *outer = kiln__deadline_install(&j.deadline);
  int rc = j.a ? run_job(&j, c) : kiln_status_set(&j.st, KILN_ENOMEM, "compile", "out of memory");
  kiln__deadline_install(outer);
  if (rc < 0) kilnd_progress_finish(j.progress, NULL, rc, &j.st);
  kiln_module_destroy(j.m);
  kiln_spmd_program_destroy(j.spmd);
  kiln_free(j.blob);
  kiln_arena_destroy(j.a);
  kilnd_compile_plan_free(&j.plan);
  atomic_fetch_sub(&srv->compiles, 1);
}

/* ---- the memo: repeated requests answered on the completion-queue thread --------------- */

static bool answer_from_memo(kilnd_call *c, const Kiln__V1__CompileRequest *r) {
  kilnd *srv = c->srv;
  int64_t t0 = kiln_sched_now_ns();
  uint8_t digest[KILN_CACHE_DIGEST_LEN];
  kiln_cache_key key;
  kilnd_exe *e = NULL;
  if (!kilnd_memo_digest(r, digest)) return false;
  compile_state *cs = c->state;
  if (!kilnd_memo_get(srv->memo, digest, &key) ||
      kilnd_exes_get(srv->exes, key.hex, &e, NULL) != 0) {
    memcpy(cs->digest, digest, sizeof cs->digest);
    cs->has_digest = true;
    return false;
  }
  if (atomic_load(&e->uncached)) { /* the pool stores it first */
    kilnd_exe_unref(e);
    memcpy(cs->digest, digest, sizeof cs->digest);
    cs->has_digest = true;
    return false;
  }
  kiln_arena *a = kiln_arena_create();
  Kiln__V1__CompileResponse resp;
  kiln__v1__compile_response__init(&resp);
  int source = KILN__V1__CACHE_SOURCE__CACHE_SOURCE_MEMORY;
  bool ok = a && fill_answer(a, &resp, &key, e, source, r->request_id) == 0;
  kilnd_exe_unref(e);
  if (ok) {
    resp.compile_wall_ns = kiln_sched_now_ns() - t0;
    kilnd_metrics_compile(srv, resp.compile_wall_ns, source, true);
    note_answer(c, &key, source, "", resp.compile_wall_ns);
    kilnd_progress_finish(&cs->progress, &resp, 0, NULL);
  }
  kiln_arena_destroy(a);
  return ok;
}
