/* Internals shared by the proto codec's files: proto_codec.c (encoder and
 * entry points), proto_decode.c (message -> IR, every field checked) and
 * proto_wire.c (a pass over the raw bytes before protobuf-c sees them).
 *
 * Not a public header: the server may include it to check its own request
 * messages with kiln__proto_check_wire before unpacking them.
 */
#ifndef KILN_COMPILER_IR_PROTO_INTERNAL_H
#define KILN_COMPILER_IR_PROTO_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "compiler/ir/ir.h"
#include "kiln/v1/hlo.pb-c.h"

/* Limits the decoder enforces. */
#define KILN_PROTO_MAX_DIM (INT64_C(1) << 40) /* one dimension, and elements per array */
#define KILN_PROTO_MAX_TUPLE_DEPTH 64         /* tuple shapes, literals, shardings */
/* Arrays (brace pairs) that the literals of one message write beyond
 * KILN_PROTO_ARRAYS_PER_ELEMENT per element. The data pays for the
 * elements, and a literal of rank r writes at most r arrays per element,
 * but nothing pays for arrays under a dim of size 0, yet the printer writes
 * each one (f32[2^20,2^20,0] holds nothing and would write 2^40 "{}"):
 * this keeps a decoded module's text linear in the message. No program
 * comes near; in HLO text each one would have to be spelled out. */
#define KILN_PROTO_ARRAYS_PER_ELEMENT 64
#define KILN_PROTO_MAX_EXTRA_ARRAYS (INT64_C(1) << 16)
#define KILN_PROTO_MAX_MESSAGE_DEPTH 100 /* nested messages on the wire */

/* Checks a serialized message of type `desc` before unpacking: well-formed
 * wire data (tags, varints, lengths within bounds, no groups), messages
 * nested at most KILN_PROTO_MAX_MESSAGE_DEPTH deep (protobuf-c's unpacker
 * recurses without a limit), and every string field valid UTF-8 without NUL
 * (protobuf-c checks neither, and a NUL would silently cut a C string).
 * Errors are KILN_EINVAL: malformed data is "not a valid <type> message";
 * the others name the field path. */
int kiln__proto_check_wire(const ProtobufCMessageDescriptor *desc, const uint8_t *buf, size_t len,
                           kiln_status *st);

/* A protobuf-c allocator over the allocation hook, with a budget: an
 * unpacked message tree of real modules takes about 10-15 times the bytes
 * of the message, but a hostile one (millions of empty sub-messages) can
 * take 100 times; past the budget allocations fail. `failed` and
 * `over_budget` tell a NULL from unpack apart from invalid data. */
typedef struct kiln__proto_alloc {
  ProtobufCAllocator base;
  size_t used, budget; /* budget 0: none */
  bool failed, over_budget;
} kiln__proto_alloc;
/* The budget for unpacking a message of `len` bytes. */
#define KILN_PROTO_UNPACK_BUDGET(len) \
  (((size_t)16 << 20) + ((len) < SIZE_MAX / 64 ? (size_t)(len)*32 : SIZE_MAX / 2))
void kiln__proto_alloc_init(kiln__proto_alloc *a, size_t budget);

/* Message <-> IR for the pieces other messages reuse (Execute arguments
 * are Literals). The decoders check everything and name fields relative to
 * `path` ("" at the top). */
int kiln__proto_literal_decode(kiln_arena *a, const Kiln__V1__Literal *pl, const char *path,
                               kiln_literal **out, kiln_status *st);
int kiln__proto_module_decode(const Kiln__V1__Module *pm, kiln_module **out, kiln_status *st);

#endif /* KILN_COMPILER_IR_PROTO_INTERNAL_H */
