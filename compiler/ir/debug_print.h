/* kiln.debug_print: a custom call that prints a value and passes it on.
 *
 *   y = f32[3] custom-call(x), custom_call_target="kiln.debug_print",
 *                              backend_config="x = {}"
 *
 * The result is the operand, unchanged (one array operand, the result of
 * its shape); as a side effect the backend that runs it hands the text of
 * the format with "{}" replaced by the value (HLO literal syntax, "{1, 2,
 * 3}") to the run's debug sink: the CLI prints it, kilnd returns it to the
 * caller in the `kiln-debug` trailing metadata. No sink: nothing printed.
 *
 * The format is client data. It is checked here (printable ASCII without quotes or backslashes, at
 * most KILN_DEBUG_FORMAT_MAX bytes, braces only as "{}" or the escapes "{{" and "}}", at most one
 * "{}") and is never put into generated code: a compiled executable carries it as data in a
 * debug-print step, and the runtime renders it with kiln_debug_print_render.
 */
#ifndef KILN_COMPILER_IR_DEBUG_PRINT_H
#define KILN_COMPILER_IR_DEBUG_PRINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/sbuf.h"
#include "common/status.h"
#include "compiler/ir/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_DEBUG_PRINT_TARGET "kiln.debug_print"
#define KILN_DEBUG_FORMAT_MAX 256
/* At most this many bytes of one rendered message; longer values are cut
 * with "...". */
#define KILN_DEBUG_MESSAGE_MAX 4096

/* Where printed text goes: write(ctx, text, n) once per message (a line
 * ending in '\n'), from whichever thread runs the program; it must be
 * safe to call from the threads that run programs. */
typedef struct kiln_debug_sink {
  void (*write)(void *ctx, const char *text, size_t n);
  void *ctx;
} kiln_debug_sink;

/* Whether ins is a custom call to kiln.debug_print. */
bool kiln_debug_print_is(const kiln_instr *ins);

/* Checks a debug-print instruction: one array operand, a result of the
 * same shape, a valid format. KILN_EINVAL naming the instruction. */
int kiln_debug_print_check(const kiln_module *m, const kiln_instr *ins, kiln_status *st);

/* The format of an instruction: the contents of its backend_config string
 * (*n bytes, not NUL-terminated; empty when none is given). */
const char *kiln_debug_print_format(const kiln_instr *ins, size_t *n);

/* Checks a format on its own; false with the reason in why. */
bool kiln_debug_format_ok(const char *fmt, size_t n, char *why, size_t nwhy);

/* Renders format fmt[0..n) (checked) with the array `value` (shape in
 * default layout, data as the IR stores literals) into out, ending in a
 * newline, at most KILN_DEBUG_MESSAGE_MAX bytes. */
void kiln_debug_print_render(kiln_sbuf *out, const char *fmt, size_t n, const kiln_literal *value);

/* The record a compiled debug-print step carries as constant bytes: u32
 * dtype, u32 rank, rank i64 dims, u32 format length, the format (all
 * little-endian as the host; executables are per target). */
#define KILN_DEBUG_MAX_RANK 16
typedef struct kiln_debug_record {
  kiln_dtype dtype;
  uint32_t rank;
  int64_t dims[KILN_DEBUG_MAX_RANK];
  const char *fmt; /* points into the record bytes; not NUL-terminated */
  uint32_t nfmt;
} kiln_debug_record;

/* Bytes of the record of (shape, fmt); 0 when the shape cannot have one. */
size_t kiln_debug_record_size(const kiln_shape *s, size_t nfmt);
/* Writes it into buf (kiln_debug_record_size bytes). */
void kiln_debug_record_write(uint8_t *buf, const kiln_shape *s, const char *fmt, size_t nfmt);
/* Reads and checks a record of n bytes describing a value of value_bytes
 * bytes: false with why when it is malformed (hostile executables). */
bool kiln_debug_record_read(const uint8_t *buf, uint64_t n, uint64_t value_bytes,
                            kiln_debug_record *out, char *why, size_t nwhy);
/* Renders a message of a record and the value's bytes. */
void kiln_debug_record_render(kiln_sbuf *out, const kiln_debug_record *r, const void *data);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMPILER_IR_DEBUG_PRINT_H */
