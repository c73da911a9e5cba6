/* libFuzzer target for the HLO text parser.
 *
 * Every input is parsed; a module that parses is also printed, verified and
 * destroyed, so the printer and the verifier see every odd-but-accepted
 * module the parser lets through. Besides the sanitizers' findings (crash,
 * leak, overflow, undefined behaviour, hang), the target checks the parser's
 * contract: success means a module and a clean status, failure means a
 * negative code recorded in the status with a message.
 *
 * With KILN_FUZZ_ROUNDTRIP=1 in the environment it also checks that the
 * printed text parses again and prints identically (text.h promises that
 * print -> parse -> print is a fixed point).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/status.h"
#include "compiler/ir/text.h"
#include "compiler/ir/verify.h"

/* Small enough that a fuzzed shape cannot ask the verifier or printer for a
 * huge literal; large enough for every corpus module. */
#define FUZZ_MAX_ELEMENTS (INT64_C(1) << 24)

static int roundtrip;

static void die(const char *what, const kiln_status *st, const char *text) {
  char buf[KILN_STATUS_WHERE_MAX + KILN_STATUS_MSG_MAX + 16];
  kiln_status_format(st, buf, sizeof buf);
  fprintf(stderr, "fuzz_parse: %s\nstatus: %s\n", what, buf);
  if (text) fprintf(stderr, "---- text ----\n%s\n--------------\n", text);
  abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  const char *e = getenv("KILN_FUZZ_ROUNDTRIP");
  roundtrip = e != NULL && strcmp(e, "1") == 0;
  return 0;
}

static void check_roundtrip(const char *printed, size_t len, const kiln_parse_options *opts) {
  kiln_status st;
  kiln_status_clear(&st);
  kiln_module *m2 = NULL;
  if (kiln_module_parse_text(printed, len, "printed", opts, &m2, &st) != 0)
    die("printed module does not parse", &st, printed);
  size_t len2 = 0;
  char *again = kiln_module_print(m2, &len2);
  if (again == NULL) die("out of memory printing the reparsed module", NULL, NULL);
  if (len2 != len || memcmp(printed, again, len) != 0) {
    fprintf(stderr, "---- second print ----\n%s\n", again);
    die("print -> parse -> print is not a fixed point", NULL, printed);
  }
  kiln_free(again);
  kiln_module_destroy(m2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  kiln_parse_options opts = {.max_elements = FUZZ_MAX_ELEMENTS};
  kiln_status st;
  kiln_status_clear(&st);
  kiln_module *m = NULL;
  int rc = kiln_module_parse_text((const char *)data, size, "fuzz.hlo", &opts, &m, &st);
  if (rc != 0) {
    if (rc > 0) die("parser returned a positive code", &st, NULL);
    if (st.code != rc) die("parser failed without recording its code in the status", &st, NULL);
    if (st.msg[0] == '\0') die("parser failed with an empty message", &st, NULL);
    return 0;
  }
  if (m == NULL) die("parser succeeded without a module", &st, NULL);
  if (!kiln_status_is_ok(&st)) die("parser succeeded but recorded an error", &st, NULL);

  size_t len = 0;
  char *printed = kiln_module_print(m, &len);
  if (printed == NULL) die("out of memory printing a parsed module", NULL, NULL);
  if (strlen(printed) != len) die("printed length disagrees with the text", NULL, printed);

  kiln_verify_options vopts = {.max_elements = FUZZ_MAX_ELEMENTS};
  kiln_status vst;
  kiln_status_clear(&vst);
  int vrc = kiln_module_verify(m, &vopts, &vst);
  if (vrc > 0) die("verifier returned a positive code", &vst, printed);
  if (vrc != 0 && (vst.code != vrc || vst.msg[0] == '\0'))
    die("verifier failed without a status", &vst, printed);

  if (roundtrip) check_roundtrip(printed, len, &opts);
  kiln_free(printed);
  kiln_module_destroy(m);
  return 0;
}
