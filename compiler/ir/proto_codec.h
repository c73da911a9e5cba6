/* IR <-> kiln.v1.Module (proto/kiln/v1/hlo.proto), lossless both ways:
 * decode(encode(m)) prints exactly as m does.
 *
 * The decoder treats its input as hostile: every id, index, enum and size is
 * range-checked and every failure is a status naming the field.
 */
#ifndef KILN_COMPILER_IR_PROTO_CODEC_H
#define KILN_COMPILER_IR_PROTO_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "compiler/ir/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Serializes m. *buf is kiln_malloc'd (free with kiln_free). */
int kiln_module_to_proto(const kiln_module *m, uint8_t **buf, size_t *len, kiln_status *st);

/* Decodes a serialized kiln.v1.Module. *out is owned by the caller. The
 * result is structurally sound (ids in range) but not verified. */
int kiln_module_from_proto(const uint8_t *buf, size_t len, kiln_module **out, kiln_status *st);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMPILER_IR_PROTO_CODEC_H */
