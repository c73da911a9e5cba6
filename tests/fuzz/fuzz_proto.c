/* libFuzzer target for the protobuf decoder (kiln_module_from_proto).
 *
 * Every input is decoded as a kiln.v1.Module. Besides the sanitizers'
 * findings (crash, leak, overflow, undefined behaviour, hang), the target
 * checks the codec's contract: failure is a negative code with a message in
 * the status and no module; success means the module is structurally sound
 * enough to print, and to encode again — and the encoded bytes decode to a
 * module that prints the same and encodes to the same bytes (encoding is a
 * fixed point after one decode).
 *
 * Seeds: any serialized kiln.v1.Module, e.g. the corpus modules converted
 * with the CLI, or the bytes test_proto's modules encode to.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/status.h"
#include "compiler/ir/proto_codec.h"
#include "compiler/ir/text.h"

static void die(const char *what, const kiln_status *st) {
  char buf[KILN_STATUS_WHERE_MAX + KILN_STATUS_MSG_MAX + 16];
  kiln_status_format(st, buf, sizeof buf);
  fprintf(stderr, "fuzz_proto: %s\nstatus: %s\n", what, buf);
  abort();
}

/* Nothing to set up; defined for replay.c, which the ordinary build links
 * this target with (ctest fuzz_proto_replay). */
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  kiln_status st = {0};
  kiln_module *m = NULL;
  int rc = kiln_module_from_proto(data, size, &m, &st);
  if (rc != 0) {
    if (rc > 0 || st.code != rc || st.msg[0] == '\0') die("failure without a status", &st);
    if (m != NULL) die("failure left a module behind", &st);
    return 0;
  }
  if (m == NULL || st.code != 0) die("success without a module, or with an error", &st);

  uint8_t *buf = NULL;
  size_t len = 0;
  if (kiln_module_to_proto(m, &buf, &len, &st) != 0) die("a decoded module does not encode", &st);
  kiln_module *back = NULL;
  if (kiln_module_from_proto(buf, len, &back, &st) != 0)
    die("an encoded module does not decode", &st);

  char *t1 = kiln_module_print(m, NULL), *t2 = kiln_module_print(back, NULL);
  if (t1 == NULL || t2 == NULL) die("printing failed", &st);
  if (strcmp(t1, t2) != 0) die("the module prints differently after encode/decode", &st);

  uint8_t *buf2 = NULL;
  size_t len2 = 0;
  if (kiln_module_to_proto(back, &buf2, &len2, &st) != 0) die("re-encoding failed", &st);
  if (len2 != len || memcmp(buf, buf2, len) != 0) die("encoding is not a fixed point", &st);

  kiln_free(t1);
  kiln_free(t2);
  kiln_free(buf);
  kiln_free(buf2);
  kiln_module_destroy(back);
  kiln_module_destroy(m);
  return 0;
}
