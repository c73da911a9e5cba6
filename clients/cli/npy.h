/* NumPy .npy files: the array format `kiln run` reads arguments from and
 * writes results to.
 *
 * A .npy file is a magic string, a version, a header length, a Python dict
 * literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded
 * with spaces to a newline, then the raw elements in C order. The reader
 * treats the file as hostile: the dict is parsed strictly (exactly those
 * three keys, Python literal syntax, any spacing), sizes are overflow-checked
 * and the data length must equal what the header implies. Only
 * little-endian (or byte-sized) C-order arrays of the dtypes Kiln shares with
 * NumPy are accepted; everything else is an error with a message saying what
 * was found.
 */
#ifndef KILN_CLIENTS_CLI_NPY_H
#define KILN_CLIENTS_CLI_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "compiler/ir/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_NPY_MAX_RANK 64

typedef struct kiln_npy {
  kiln_dtype dtype; /* F16 F32 F64 C64 C128 PRED S8..S64 U8..U64 */
  uint32_t rank;
  int64_t dims[KILN_NPY_MAX_RANK];
  void *data; /* kiln_malloc'd, row-major, nbytes long (NULL when empty) */
  size_t nbytes;
} kiln_npy;

/* The NumPy descr of a Kiln element type ("<f4"), or NULL when NumPy has no
 * such dtype (bf16, f8 types, s4, token, ...). */
const char *kiln_npy_descr(kiln_dtype t);

/* Decodes a whole .npy image. On success `out` owns its data (release with
 * kiln_npy_free). Errors are KILN_EINVAL with a message; `where` in the status
 * is left empty for the caller to fill with the file name. */
int kiln_npy_parse(const uint8_t *buf, size_t len, kiln_npy *out, kiln_status *st);

/* Reads and decodes `path`. I/O failures are KILN_EIO; the status's where is
 * the path. */
int kiln_npy_read(const char *path, kiln_npy *out, kiln_status *st);

/* Encodes an array as a version 1.0 .npy image into a kiln_malloc'd buffer. */
int kiln_npy_encode(kiln_dtype t, const int64_t *dims, uint32_t rank, const void *data,
                    size_t nbytes, uint8_t **buf, size_t *len, kiln_status *st);

/* Encodes and writes `path` (created or truncated). */
int kiln_npy_write(const char *path, kiln_dtype t, const int64_t *dims, uint32_t rank,
                   const void *data, size_t nbytes, kiln_status *st);

void kiln_npy_free(kiln_npy *a);

#ifdef __cplusplus
}
#endif
#endif /* KILN_CLIENTS_CLI_NPY_H */
