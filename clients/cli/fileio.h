/* Whole-file reads and writes for the kiln command, with errors as statuses.
 *
 * Inputs are read into memory in one piece (modules and .npy files are
 * parsed from a buffer); a directory, a missing file or a short read is a
 * KILN_EIO status naming the path and the system's reason.
 */
#ifndef KILN_CLIENTS_CLI_FILEIO_H
#define KILN_CLIENTS_CLI_FILEIO_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Reads all of `path` into a kiln_malloc'd buffer (NUL-terminated one byte
 * past *len, so text parsers may rely on it). */
int kiln__file_read(const char *path, uint8_t **buf, size_t *len, kiln_status *st);

/* Creates or truncates `path` and writes `len` bytes. */
int kiln__file_write(const char *path, const void *buf, size_t len, kiln_status *st);

/* Creates directory `path` and its missing parents (like mkdir -p). */
int kiln__dir_make(const char *path, kiln_status *st);

#ifdef __cplusplus
}
#endif
#endif /* KILN_CLIENTS_CLI_FILEIO_H */
