/* Tests for the .npy reader and writer of the kiln command
 * (clients/cli/npy.c): round trips of every supported dtype, the header
 * forms NumPy writes (versions 1.0/2.0/3.0, spacing, trailing commas,
 * Python 2 longs), and rejection, with the exact message, of everything
 * malformed: bad magic, unknown versions, unsupported or big-endian dtypes,
 * Fortran order, broken dicts, truncated files, trailing data and shapes
 * whose size overflows. The CLI's sources are compiled in directly: the
 * kiln command is an executable, not a library. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clients/cli/fileio.c"
#include "clients/cli/npy.c"

/* A .npy image with header dict `dict` (padded as NumPy pads), version
 * major.0, followed by `ndata` bytes of `data`. */
static uint8_t *make_npy(int major, const char *dict, const void *data, size_t ndata, size_t *len) {
  size_t pre = major == 1 ? 10 : 12;
  size_t hlen = strlen(dict) + 1;
  while ((pre + hlen) % 64) hlen++;
  uint8_t *b = malloc(pre + hlen + ndata);
  memcpy(b, "\x93NUMPY", 6);
  b[6] = (uint8_t)major;
  b[7] = 0;
  if (major == 1) {
    b[8] = (uint8_t)hlen;
    b[9] = (uint8_t)(hlen >> 8);
  } else {
    for (int i = 0; i < 4; i++) b[8 + i] = (uint8_t)(hlen >> (8 * i));
  }
  memset(b + pre, ' ', hlen);
  memcpy(b + pre, dict, strlen(dict));
  b[pre + hlen - 1] = '\n';
  if (ndata) memcpy(b + pre + hlen, data, ndata);
  *len = pre + hlen + ndata;
  return b;
}

/* Parses a header dict with `ndata` zero bytes of data; returns the status
 * code and leaves the message in *st. */
static int parse_header(int major, const char *dict, size_t ndata, kiln_npy *a, kiln_status *st) {
  void *zeros = calloc(1, ndata + 1);
  size_t len;
  uint8_t *b = make_npy(major, dict, zeros, ndata, &len);
  kiln_status_clear(st);
  int rc = kiln_npy_parse(b, len, a, st);
  free(b);
  free(zeros);
  return rc;
}

START_TEST(test_roundtrip_all_dtypes) {
  static const kiln_dtype types[] = {KILN_F16,  KILN_F32, KILN_F64, KILN_C64, KILN_C128,
                                     KILN_PRED, KILN_S8,  KILN_S16, KILN_S32, KILN_S64,
                                     KILN_U8,   KILN_U16, KILN_U32, KILN_U64};
  for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
    int64_t dims[2] = {2, 3};
    size_t nbytes = 6 * kiln_dtype_size(types[t]);
    uint8_t data[96];
    for (size_t i = 0; i < nbytes; i++) data[i] = types[t] == KILN_PRED ? i % 2 : (uint8_t)(i * 7);
    uint8_t *buf;
    size_t len;
    kiln_status st;
    kiln_status_clear(&st);
    ck_assert_int_eq(kiln_npy_encode(types[t], dims, 2, data, nbytes, &buf, &len, &st), 0);
    ck_assert_uint_eq(len % 64, nbytes % 64); /* data starts 64-byte aligned */
    kiln_npy a;
    ck_assert_int_eq(kiln_npy_parse(buf, len, &a, &st), 0);
    ck_assert_int_eq(a.dtype, types[t]);
    ck_assert_uint_eq(a.rank, 2);
    ck_assert_int_eq(a.dims[0], 2);
    ck_assert_int_eq(a.dims[1], 3);
    ck_assert_uint_eq(a.nbytes, nbytes);
    ck_assert_mem_eq(a.data, data, nbytes);
    kiln_npy_free(&a);
    kiln_free(buf);
  }
}
END_TEST

START_TEST(test_header_text_is_numpys) {
  int64_t dims[1] = {3};
  float v[3] = {1, 2, 3};
  uint8_t *buf;
  size_t len;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_npy_encode(KILN_F32, dims, 1, v, sizeof v, &buf, &len, &st), 0);
  ck_assert_mem_eq(buf, "\x93NUMPY\x01\x00\x76\x00", 10);
  const char *want = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }";
  ck_assert_mem_eq(buf + 10, want, strlen(want));
  ck_assert_int_eq(buf[10 + 0x76 - 1], '\n');
  ck_assert_uint_eq(len, 128 + 12);
  kiln_free(buf);

  /* Scalars have shape (). */
  double d = 2.5;
  ck_assert_int_eq(kiln_npy_encode(KILN_F64, NULL, 0, &d, sizeof d, &buf, &len, &st), 0);
  const char *want0 = "{'descr': '<f8', 'fortran_order': False, 'shape': (), }";
  ck_assert_mem_eq(buf + 10, want0, strlen(want0));
  kiln_npy a;
  ck_assert_int_eq(kiln_npy_parse(buf, len, &a, &st), 0);
  ck_assert_uint_eq(a.rank, 0);
  ck_assert_double_eq(*(double *)a.data, 2.5);
  kiln_npy_free(&a);
  kiln_free(buf);
}
END_TEST

START_TEST(test_encode_rejects) {
  uint8_t *buf;
  size_t len;
  kiln_status st;
  kiln_status_clear(&st);
  int64_t dims[1] = {2};
  uint16_t h[2] = {0, 0};
  ck_assert_int_eq(kiln_npy_encode(KILN_BF16, dims, 1, h, sizeof h, &buf, &len, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "NumPy has no dtype for bf16");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_npy_encode(KILN_F32, dims, 1, h, 4, &buf, &len, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "array data is 4 bytes, its shape needs 8");
}
END_TEST

START_TEST(test_header_forms_accepted) {
  kiln_npy a;
  kiln_status st;
  /* Key order, spacing, double quotes, no trailing comma, Python 2 longs. */
  ck_assert_int_eq(
      parse_header(1, "{'shape':(2,3),'fortran_order':False,'descr':'<i4'}", 24, &a, &st), 0);
  ck_assert_int_eq(a.dtype, KILN_S32);
  ck_assert_int_eq(a.dims[1], 3);
  kiln_npy_free(&a);
  ck_assert_int_eq(
      parse_header(1, "{ \"descr\" : \"|b1\" , \"fortran_order\" : False , \"shape\" : ( 4 , ) , }",
                   4, &a, &st),
      0);
  ck_assert_int_eq(a.dtype, KILN_PRED);
  ck_assert_uint_eq(a.rank, 1);
  kiln_npy_free(&a);
  ck_assert_int_eq(
      parse_header(1, "{'descr': '<u2', 'fortran_order': False, 'shape': (2L, 1L), }", 4, &a, &st),
      0);
  ck_assert_int_eq(a.dtype, KILN_U16);
  kiln_npy_free(&a);
  /* Versions 2.0 and 3.0 have a 4-byte header length. */
  ck_assert_int_eq(
      parse_header(2, "{'descr': '<f2', 'fortran_order': False, 'shape': (5,), }", 10, &a, &st), 0);
  ck_assert_int_eq(a.dtype, KILN_F16);
  kiln_npy_free(&a);
  ck_assert_int_eq(
      parse_header(3, "{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", 8, &a, &st), 0);
  ck_assert_int_eq(a.dtype, KILN_C64);
  kiln_npy_free(&a);
  /* Zero-sized arrays have no data. */
  ck_assert_int_eq(
      parse_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 7), }", 0, &a, &st),
      0);
  ck_assert_uint_eq(a.nbytes, 0);
  kiln_npy_free(&a);
}
END_TEST

START_TEST(test_pred_bytes_normalized) {
  uint8_t data[3] = {0, 1, 0x80};
  size_t len;
  uint8_t *b =
      make_npy(1, "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", data, 3, &len);
  kiln_npy a;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_npy_parse(b, len, &a, &st), 0);
  ck_assert_mem_eq(a.data, "\x00\x01\x01", 3);
  kiln_npy_free(&a);
  free(b);
}
END_TEST

static const struct {
  const char *dict;
  size_t ndata;
  const char *msg;
} bad_headers[] = {
    {"{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8,
     "big-endian .npy dtype '>f4' is not supported (save little-endian)"},
    {"{'descr': '<V2', 'fortran_order': False, 'shape': (2,), }", 4,
     "unsupported .npy dtype '<V2' (supported: <f2 <f4 <f8 <c8 <c16 |b1 |i1 <i2 <i4 <i8 |u1 "
     "<u2 <u4 <u8)"},
    {"{'descr': '|f4', 'fortran_order': False, 'shape': (2,), }", 8,
     "unsupported .npy dtype '|f4' (supported: <f2 <f4 <f8 <c8 <c16 |b1 |i1 <i2 <i4 <i8 |u1 "
     "<u2 <u4 <u8)"},
    {"{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16,
     ".npy array is in Fortran order; save it in C order (numpy.ascontiguousarray)"},
    {"{'descr': '<f4', 'fortran_order': 0, 'shape': (2,), }", 8,
     "malformed .npy header: 'fortran_order' is not True or False at header offset 34"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (2), }", 8,
     "malformed .npy header: 'shape' is not a tuple at header offset 53"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': [2], }", 8,
     "malformed .npy header: 'shape' is not a tuple at header offset 50"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", 8,
     "malformed .npy header: expected a dimension size at header offset 51"},
    {"{'descr': '<f4', 'fortran_order': False, }", 8, "malformed .npy header: missing 'shape'"},
    {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 8,
     "malformed .npy header: unexpected or repeated key 'descr'"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", 8,
     "malformed .npy header: unexpected or repeated key 'x'"},
    {"{'descr': '<f4' 'fortran_order': False, 'shape': (2,), }", 8,
     "malformed .npy header: expected ',' or '}' at header offset 16"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), } junk", 8,
     "malformed .npy header: trailing characters after the dict at header offset 58"},
    {"{'descr': '<f4, 'fortran_order': False, 'shape': (2,), }", 8,
     "unsupported .npy dtype '<f4, ' (supported: <f2 <f4 <f8 <c8 <c16 |b1 |i1 <i2 <i4 <i8 |u1 "
     "<u2 <u4 <u8)"},
    {"{'descr': '<f4', 'fortran_order' False, 'shape': (2,), }", 8,
     "malformed .npy header: expected ':' at header offset 33"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 8,
     "malformed .npy header: dimension size too large at header offset 70"},
    {"{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", 8,
     ".npy shape has too many elements"},
    {"{'descr': '<f8', 'fortran_order': False, 'shape': (1152921504606846976,), }", 8,
     ".npy shape has too many elements"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", 8,
     ".npy file is truncated: 12 bytes of data expected, 8 found"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 8,
     ".npy file has 4 bytes of data after the 4 expected"},
};

START_TEST(test_bad_header) {
  kiln_npy a;
  kiln_status st;
  ck_assert_int_eq(parse_header(1, bad_headers[_i].dict, bad_headers[_i].ndata, &a, &st),
                   KILN_EINVAL);
  ck_assert_str_eq(st.msg, bad_headers[_i].msg);
  ck_assert_ptr_null(a.data);
}
END_TEST

START_TEST(test_bad_preamble) {
  kiln_npy a;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_npy_parse((const uint8_t *)"", 0, &a, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "not a .npy file (bad magic)");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_npy_parse((const uint8_t *)"PK\x03\x04zipfile!", 14, &a, &st), KILN_EINVAL);
  ck_assert_str_eq(st.msg, "not a .npy file (bad magic)");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_npy_parse((const uint8_t *)"\x93NUMPY\x04\x00\x10\x00", 10, &a, &st),
                   KILN_EINVAL);
  ck_assert_str_eq(st.msg, "unsupported .npy format version 4.0");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_npy_parse((const uint8_t *)"\x93NUMPY\x01\x00\xff\xff{'d", 13, &a, &st),
                   KILN_EINVAL);
  ck_assert_str_eq(st.msg, ".npy file is truncated: header of 65535 bytes, file has 3");
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_npy_parse((const uint8_t *)"\x93NUMPY\x02\x00\xff\xff", 10, &a, &st),
                   KILN_EINVAL);
  ck_assert_str_eq(st.msg, ".npy file is truncated");
  kiln_status_clear(&st);
  /* A header without its final newline. */
  ck_assert_int_eq(kiln_npy_parse((const uint8_t *)"\x93NUMPY\x01\x00\x02\x00{}", 12, &a, &st),
                   KILN_EINVAL);
  ck_assert_str_eq(st.msg, "malformed .npy header: no final newline");
}
END_TEST

/* Every prefix of a valid file is rejected, never over-read. */
START_TEST(test_every_truncation) {
  int64_t dims[2] = {3, 5};
  int32_t v[15] = {0};
  uint8_t *buf;
  size_t len;
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_npy_encode(KILN_S32, dims, 2, v, sizeof v, &buf, &len, &st), 0);
  for (size_t n = 0; n < len; n++) {
    uint8_t *copy = malloc(n ? n : 1); /* exact size, so ASan sees any over-read */
    memcpy(copy, buf, n);
    kiln_npy a;
    kiln_status_clear(&st);
    ck_assert_int_eq(kiln_npy_parse(copy, n, &a, &st), KILN_EINVAL);
    free(copy);
  }
  kiln_free(buf);
}
END_TEST

START_TEST(test_file_roundtrip_and_io_errors) {
  char dir[] = "/tmp/kiln_npy_XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char path[256];
  snprintf(path, sizeof path, "%s/a.npy", dir);
  int64_t dims[3] = {2, 1, 2};
  int64_t v[4] = {-1, 2, INT64_MIN, INT64_MAX};
  kiln_status st;
  kiln_status_clear(&st);
  ck_assert_int_eq(kiln_npy_write(path, KILN_S64, dims, 3, v, sizeof v, &st), 0);
  kiln_npy a;
  ck_assert_int_eq(kiln_npy_read(path, &a, &st), 0);
  ck_assert_int_eq(a.dtype, KILN_S64);
  ck_assert_uint_eq(a.rank, 3);
  ck_assert_mem_eq(a.data, v, sizeof v);
  kiln_npy_free(&a);

  ck_assert_int_eq(kiln_npy_read(dir, &a, &st), KILN_EIO);
  ck_assert_str_eq(st.where, dir);
  ck_assert_str_eq(st.msg, "cannot read: is a directory");
  kiln_status_clear(&st);
  char missing[300];
  snprintf(missing, sizeof missing, "%s/missing.npy", dir);
  ck_assert_int_eq(kiln_npy_read(missing, &a, &st), KILN_EIO);
  ck_assert_str_eq(st.msg, "cannot open: No such file or directory");
  kiln_status_clear(&st);
  FILE *f = fopen(path, "wb");
  fputs("not numpy at all", f);
  fclose(f);
  ck_assert_int_eq(kiln_npy_read(path, &a, &st), KILN_EINVAL);
  ck_assert_str_eq(st.where, path);
  ck_assert_str_eq(st.msg, "not a .npy file (bad magic)");
  unlink(path);
  rmdir(dir);
}
END_TEST

/* Random bytes after a valid magic: any outcome but a crash or over-read. */
START_TEST(test_random_headers) {
  uint64_t s = 12345;
  for (int iter = 0; iter < 20000; iter++) {
    uint8_t b[96];
    memcpy(b, "\x93NUMPY\x01\x00", 8);
    size_t n = 8 + (size_t)(iter % 88);
    for (size_t i = 8; i < n; i++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      b[i] = (uint8_t)(s >> 56);
    }
    if (n > 10) b[9] = 0, b[8] = (uint8_t)(b[8] % 90);
    uint8_t *copy = malloc(n);
    memcpy(copy, b, n);
    kiln_npy a;
    kiln_status st;
    kiln_status_clear(&st);
    if (kiln_npy_parse(copy, n, &a, &st) == 0) kiln_npy_free(&a);
    free(copy);
  }
}
END_TEST

static Suite *npy_suite(void) {
  Suite *s = suite_create("npy");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_roundtrip_all_dtypes);
  tcase_add_test(tc, test_header_text_is_numpys);
  tcase_add_test(tc, test_encode_rejects);
  tcase_add_test(tc, test_header_forms_accepted);
  tcase_add_test(tc, test_pred_bytes_normalized);
  tcase_add_loop_test(tc, test_bad_header, 0, (int)(sizeof bad_headers / sizeof bad_headers[0]));
  tcase_add_test(tc, test_bad_preamble);
  tcase_add_test(tc, test_every_truncation);
  tcase_add_test(tc, test_file_roundtrip_and_io_errors);
  tcase_add_test(tc, test_random_headers);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(npy_suite());
  srunner_set_fork_status(sr, CK_FORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
