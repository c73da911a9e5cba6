/* The texts of the target and options components of cache keys (key.h):
 * one definition for kilnd and for `kiln cache explain`, so that a key
 * computed locally is the key a server gives the same request.
 *
 * "native" code is whatever cc -march=native makes of this machine, so its
 * target component names the machine's CPU: the vendor, family, model and
 * feature flags of the first processor in /proc/cpuinfo, hashed. Servers
 * on identical hardware share entries; a server whose CPU lacks a feature
 * another one used can never load that one's code. The text is computed
 * once per process.
 *
 * Layering: kiln_cache links kiln_ir only, and the target table with its
 * resolver (compiler/target.h) is the compiler's. So names are never
 * resolved here: kilnd's plan and `kiln cache explain` resolve --target
 * with kiln_target_resolve and hand over the row's ISA, the already
 * canonical text. Only the meaning of "native" for a key is the cache's.
 */
#include "cache/key.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/sbuf.h"

static char native_target[KILN_CACHE_TEXT_MAX];
static pthread_once_t native_once = PTHREAD_ONCE_INIT;

/* Lines of the first processor block that decide what -march=native
 * selects (x86 and arm spellings). */
static bool identifies_cpu(const char *line) {
  static const char *const keys[] = {
      "vendor_id",       "cpu family",       "model",       "model name", "flags", "Features",
      "CPU implementer", "CPU architecture", "CPU variant", "CPU part"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    size_t n = strlen(keys[i]);
    if (strncmp(line, keys[i], n) == 0 && (line[n] == '\t' || line[n] == ' ' || line[n] == ':'))
      return true;
  }
  return false;
}

static void compute_native(void) {
  kiln_sbuf b = KILN_SBUF_INIT;
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[8192];
  while (f && fgets(line, sizeof line, f)) {
    if (line[0] == '\n' && b.len) break; /* end of the first processor */
    if (identifies_cpu(line)) kiln_sbuf_puts(&b, line);
  }
  if (f) fclose(f);
  uint8_t d[KILN_CACHE_DIGEST_LEN];
  if (b.len && !b.failed) {
    kiln_cache_sha256(b.data, b.len, d);
  } else {
    /* No description of the CPU: only this host may reuse its code. */
    char host[256] = "host ";
    if (gethostname(host + 5, sizeof host - 6) != 0) snprintf(host + 5, sizeof host - 5, "?");
    host[sizeof host - 1] = '\0';
    kiln_cache_sha256(host, strlen(host), d);
  }
  kiln_sbuf_free(&b);
  char hex[2 * KILN_CACHE_DIGEST_LEN + 1];
  kiln_cache_to_hex(d, KILN_CACHE_DIGEST_LEN, hex);
  snprintf(native_target, sizeof native_target, "native-%.16s", hex);
}

void kiln_cache_target_text(const char *isa, char out[KILN_CACHE_TEXT_MAX]) {
  if (isa == NULL || strcmp(isa, "native") == 0) {
    pthread_once(&native_once, compute_native);
    snprintf(out, KILN_CACHE_TEXT_MAX, "%s", native_target);
    return;
  }
  snprintf(out, KILN_CACHE_TEXT_MAX, "%.80s", isa);
}

void kiln_cache_code_target_text(const char *isa, const char *identity,
                                 char out[KILN_CACHE_TEXT_MAX]) {
  if (identity == NULL || identity[0] == '\0') {
    kiln_cache_target_text(isa, out);
    return;
  }
  snprintf(out, KILN_CACHE_TEXT_MAX, "%.16s;%.78s", isa ? isa : "", identity);
}

void kiln_cache_options_text(int opt_level, uint32_t ndevices, char out[KILN_CACHE_TEXT_MAX]) {
  snprintf(out, KILN_CACHE_TEXT_MAX, "opt=%d\ndevices=%u\n", opt_level, ndevices);
}
