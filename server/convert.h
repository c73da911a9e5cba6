/* Shapes and literals between the IR and the reply messages.
 *
 * Encoders build protobuf-c structs in a scratch arena that point at the IR's
 * own arrays and data (nothing large is copied until the reply is packed);
 * the arena must outlive the packing. The shape decoder is the strict one
 * uploads need: an array shape only, every dimension and the element count
 * within limits.
 */
#ifndef KILN_SERVER_CONVERT_H
#define KILN_SERVER_CONVERT_H

#include <stdint.h>

#include "compiler/ir/ir.h"
#include "kiln/v1/hlo.pb-c.h"
#include "kiln/v1/kiln.pb-c.h"

Kiln__V1__Shape *kilnd_shape_to_proto(kiln_arena *a, const kiln_shape *s);
Kiln__V1__Literal *kilnd_literal_to_proto(kiln_arena *a, const kiln_literal *lit);

/* Decodes an array shape (no tuples, tokens or dynamic dimensions) with at
 * most max_elements elements. Errors name `path`. */
int kilnd_array_shape_from_proto(kiln_arena *a, const Kiln__V1__Shape *ps, uint64_t max_elements,
                                 const char *path, kiln_shape *out, kiln_status *st);

/* BufferInfo of a stored buffer (pointing at its handle and shape). */
struct kiln_stored;
Kiln__V1__BufferInfo *kilnd_buffer_info(kiln_arena *a, const struct kiln_stored *b);

/* "f32[2,3]" into buf. */
void kilnd_shape_str(const kiln_shape *s, char *buf, size_t size);

#endif /* KILN_SERVER_CONVERT_H */
