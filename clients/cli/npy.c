/* NumPy .npy reader and writer (see npy.h).
 *
 * The header is a Python dict literal; rather than a general Python parser
 * this reads exactly the grammar NumPy writes ('descr', 'fortran_order',
 * 'shape', each once, in any order, any spacing, optional trailing commas)
 * and rejects everything else. Every size derived from the header is
 * overflow-checked before it is used, and the payload must be exactly as
 * long as the header says. */
#include "clients/cli/npy.h"

#include <inttypes.h>
#include <stdbool.h>
#include <string.h>

#include "clients/cli/fileio.h"
#include "common/alloc.h"
#include "common/sbuf.h"

static const char npy_magic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

/* Byte-sized dtypes may be written '|' (what NumPy writes) or '<'. */
static const struct {
  const char *descr;
  kiln_dtype dtype;
} npy_types[] = {
    {"<f2", KILN_F16},   {"<f4", KILN_F32},  {"<f8", KILN_F64},  {"<c8", KILN_C64},
    {"<c16", KILN_C128}, {"|b1", KILN_PRED}, {"|i1", KILN_S8},   {"<i2", KILN_S16},
    {"<i4", KILN_S32},   {"<i8", KILN_S64},  {"|u1", KILN_U8},   {"<u2", KILN_U16},
    {"<u4", KILN_U32},   {"<u8", KILN_U64},  {"<b1", KILN_PRED}, {"<i1", KILN_S8},
    {"<u1", KILN_U8},
};

const char *kiln_npy_descr(kiln_dtype t) {
  for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++)
    if (npy_types[i].dtype == t) return npy_types[i].descr;
  return NULL;
}

/* ---- header dict -------------------------------------------------------- */

typedef struct hdr {
  const char *start, *p, *end;
  kiln_status *st;
} hdr;

static void skip_ws(hdr *h) {
  while (h->p < h->end && (*h->p == ' ' || *h->p == '\t' || *h->p == '\n' || *h->p == '\r')) h->p++;
}

static bool eat(hdr *h, char c) {
  skip_ws(h);
  if (h->p < h->end && *h->p == c) {
    h->p++;
    return true;
  }
  return false;
}

static int bad(hdr *h, const char *what) {
  return kiln_status_set(h->st, KILN_EINVAL, NULL, "malformed .npy header: %s at header offset %td",
                         what, h->p - h->start);
}

/* A quoted string without escapes; s and n locate it in the header. */
static int read_str(hdr *h, const char **s, size_t *n) {
  skip_ws(h);
  if (h->p >= h->end || (*h->p != '\'' && *h->p != '"')) return bad(h, "expected a string");
  char q = *h->p++;
  const char *start = h->p;
  while (h->p < h->end && *h->p != q) {
    if (*h->p == '\\' || (unsigned char)*h->p < 0x20) return bad(h, "unsupported string");
    h->p++;
  }
  if (h->p >= h->end) return bad(h, "unterminated string");
  *s = start;
  *n = (size_t)(h->p - start);
  h->p++;
  return 0;
}

static bool word(hdr *h, const char *w) {
  skip_ws(h);
  size_t n = strlen(w);
  if ((size_t)(h->end - h->p) >= n && memcmp(h->p, w, n) == 0) {
    const char *after = h->p + n;
    if (after < h->end && ((*after >= 'a' && *after <= 'z') || (*after >= 'A' && *after <= 'Z') ||
                           (*after >= '0' && *after <= '9') || *after == '_'))
      return false;
    h->p = after;
    return true;
  }
  return false;
}

static int read_dim(hdr *h, int64_t *out) {
  skip_ws(h);
  if (h->p >= h->end || *h->p < '0' || *h->p > '9') return bad(h, "expected a dimension size");
  int64_t v = 0;
  while (h->p < h->end && *h->p >= '0' && *h->p <= '9') {
    int d = *h->p++ - '0';
    if (v > (INT64_MAX - d) / 10) return bad(h, "dimension size too large");
    v = v * 10 + d;
  }
  if (h->p < h->end && *h->p == 'L') h->p++; /* Python 2 longs in old files */
  *out = v;
  return 0;
}

/* (), (3,), (2, 3), (2, 3,) -- a bare (3) is an int, not a tuple. */
static int read_shape(hdr *h, kiln_npy *a) {
  if (!eat(h, '(')) return bad(h, "'shape' is not a tuple");
  a->rank = 0;
  if (eat(h, ')')) return 0;
  for (;;) {
    if (a->rank == KILN_NPY_MAX_RANK)
      return kiln_status_set(h->st, KILN_EINVAL, NULL, ".npy array has more than %d dimensions",
                             KILN_NPY_MAX_RANK);
    int rc = read_dim(h, &a->dims[a->rank++]);
    if (rc) return rc;
    bool comma = eat(h, ',');
    if (eat(h, ')')) {
      if (a->rank == 1 && !comma) return bad(h, "'shape' is not a tuple");
      return 0;
    }
    if (!comma) return bad(h, "expected ',' or ')' in 'shape'");
  }
}

static int read_descr(hdr *h, kiln_npy *a) {
  const char *s;
  size_t n;
  int rc = read_str(h, &s, &n);
  if (rc) return rc;
  for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++) {
    if (strlen(npy_types[i].descr) == n && memcmp(npy_types[i].descr, s, n) == 0) {
      a->dtype = npy_types[i].dtype;
      return 0;
    }
  }
  if (n > 0 && s[0] == '>')
    return kiln_status_set(h->st, KILN_EINVAL, NULL,
                           "big-endian .npy dtype '%.*s' is not supported (save little-endian)",
                           (int)(n > 32 ? 32 : n), s);
  return kiln_status_set(h->st, KILN_EINVAL, NULL,
                         "unsupported .npy dtype '%.*s' (supported: <f2 <f4 <f8 <c8 <c16 |b1 |i1 "
                         "<i2 <i4 <i8 |u1 <u2 <u4 <u8)",
                         (int)(n > 32 ? 32 : n), s);
}

static int parse_dict(hdr *h, kiln_npy *a) {
  bool seen_descr = false, seen_order = false, seen_shape = false;
  if (!eat(h, '{')) return bad(h, "expected '{'");
  for (;;) {
    if (eat(h, '}')) break;
    const char *key;
    size_t n;
    int rc = read_str(h, &key, &n);
    if (rc) return rc;
    if (!eat(h, ':')) return bad(h, "expected ':'");
    if (n == 5 && memcmp(key, "descr", 5) == 0 && !seen_descr) {
      seen_descr = true;
      rc = read_descr(h, a);
    } else if (n == 13 && memcmp(key, "fortran_order", 13) == 0 && !seen_order) {
      seen_order = true;
      if (word(h, "True"))
        return kiln_status_set(h->st, KILN_EINVAL, NULL,
                               ".npy array is in Fortran order; save it in C order "
                               "(numpy.ascontiguousarray)");
      if (!word(h, "False")) return bad(h, "'fortran_order' is not True or False");
    } else if (n == 5 && memcmp(key, "shape", 5) == 0 && !seen_shape) {
      seen_shape = true;
      rc = read_shape(h, a);
    } else {
      return kiln_status_set(h->st, KILN_EINVAL, NULL,
                             "malformed .npy header: unexpected or repeated key '%.*s'",
                             (int)(n > 32 ? 32 : n), key);
    }
    if (rc) return rc;
    if (eat(h, '}')) break;
    if (!eat(h, ',')) return bad(h, "expected ',' or '}'");
  }
  if (!seen_descr || !seen_order || !seen_shape)
    return kiln_status_set(h->st, KILN_EINVAL, NULL, "malformed .npy header: missing '%s'",
                           !seen_descr   ? "descr"
                           : !seen_order ? "fortran_order"
                                         : "shape");
  skip_ws(h);
  if (h->p != h->end) return bad(h, "trailing characters after the dict");
  return 0;
}

/* ---- reading ------------------------------------------------------------ */

int kiln_npy_parse(const uint8_t *buf, size_t len, kiln_npy *out, kiln_status *st) {
  memset(out, 0, sizeof *out);
  if (len < 10 || memcmp(buf, npy_magic, sizeof npy_magic) != 0)
    return kiln_status_set(st, KILN_EINVAL, NULL, "not a .npy file (bad magic)");
  unsigned major = buf[6], minor = buf[7];
  size_t hlen, off;
  if (major == 1 && minor == 0) {
    hlen = (size_t)buf[8] | (size_t)buf[9] << 8;
    off = 10;
  } else if ((major == 2 || major == 3) && minor == 0) {
    if (len < 12) return kiln_status_set(st, KILN_EINVAL, NULL, ".npy file is truncated");
    hlen = (size_t)buf[8] | (size_t)buf[9] << 8 | (size_t)buf[10] << 16 | (size_t)buf[11] << 24;
    off = 12;
  } else {
    return kiln_status_set(st, KILN_EINVAL, NULL, "unsupported .npy format version %u.%u", major,
                           minor);
  }
  if (hlen > len - off)
    return kiln_status_set(st, KILN_EINVAL, NULL,
                           ".npy file is truncated: header of %zu bytes, file has %zu", hlen,
                           len - off);
  const char *htext = (const char *)buf + off;
  if (hlen == 0 || htext[hlen - 1] != '\n')
    return kiln_status_set(st, KILN_EINVAL, NULL, "malformed .npy header: no final newline");
  hdr h = {htext, htext, htext + hlen, st};
  int rc = parse_dict(&h, out);
  if (rc) return rc;

  /* Sizes: never trust the header. */
  size_t item = kiln_dtype_size(out->dtype);
  uint64_t elems = 1;
  for (uint32_t i = 0; i < out->rank; i++) {
    if (__builtin_mul_overflow(elems, (uint64_t)out->dims[i], &elems) || elems > INT64_MAX)
      return kiln_status_set(st, KILN_EINVAL, NULL, ".npy shape has too many elements");
  }
  uint64_t nbytes;
  if (__builtin_mul_overflow(elems, (uint64_t)item, &nbytes) || nbytes > INT64_MAX ||
      nbytes > SIZE_MAX)
    return kiln_status_set(st, KILN_EINVAL, NULL, ".npy shape has too many elements");
  size_t have = len - off - hlen;
  if (have < nbytes)
    return kiln_status_set(st, KILN_EINVAL, NULL,
                           ".npy file is truncated: %" PRIu64 " bytes of data expected, %zu found",
                           nbytes, have);
  if (have > nbytes)
    return kiln_status_set(st, KILN_EINVAL, NULL,
                           ".npy file has %zu bytes of data after the %" PRIu64 " expected",
                           have - (size_t)nbytes, nbytes);
  out->nbytes = (size_t)nbytes;
  if (nbytes) {
    out->data = kiln_malloc((size_t)nbytes);
    if (out->data == NULL) return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
    memcpy(out->data, buf + off + hlen, (size_t)nbytes);
    if (out->dtype == KILN_PRED) { /* canonical 0/1 bytes, as Kiln stores pred */
      uint8_t *b = out->data;
      for (size_t i = 0; i < out->nbytes; i++) b[i] = b[i] != 0;
    }
  }
  return 0;
}

int kiln_npy_read(const char *path, kiln_npy *out, kiln_status *st) {
  memset(out, 0, sizeof *out);
  uint8_t *buf;
  size_t len;
  int rc = kiln__file_read(path, &buf, &len, st);
  if (rc) return rc;
  kiln_status local;
  kiln_status_clear(&local);
  rc = kiln_npy_parse(buf, len, out, &local);
  kiln_free(buf);
  if (rc) kiln_status_set(st, rc, path, "%s", local.msg);
  return rc;
}

void kiln_npy_free(kiln_npy *a) {
  if (a == NULL) return;
  kiln_free(a->data);
  a->data = NULL;
  a->nbytes = 0;
}

/* ---- writing ------------------------------------------------------------ */

int kiln_npy_encode(kiln_dtype t, const int64_t *dims, uint32_t rank, const void *data,
                    size_t nbytes, uint8_t **buf, size_t *len, kiln_status *st) {
  *buf = NULL;
  *len = 0;
  const char *descr = kiln_npy_descr(t);
  if (descr == NULL)
    return kiln_status_set(st, KILN_EINVAL, NULL, "NumPy has no dtype for %s", kiln_dtype_name(t));
  uint64_t elems = 1;
  for (uint32_t i = 0; i < rank; i++)
    if (dims[i] < 0 || __builtin_mul_overflow(elems, (uint64_t)dims[i], &elems))
      return kiln_status_set(st, KILN_EINVAL, NULL, "bad array shape");
  uint64_t want;
  if (__builtin_mul_overflow(elems, (uint64_t)kiln_dtype_size(t), &want) || want != nbytes)
    return kiln_status_set(st, KILN_EINVAL, NULL,
                           "array data is %zu bytes, its shape needs %" PRIu64, nbytes, want);

  kiln_sbuf h = KILN_SBUF_INIT;
  kiln_sbuf_printf(&h, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
  for (uint32_t i = 0; i < rank; i++) kiln_sbuf_printf(&h, "%s%" PRId64, i ? ", " : "", dims[i]);
  kiln_sbuf_puts(&h, rank == 1 ? ",), }" : "), }");
  /* Pad with spaces so the data starts 64-byte aligned; the last byte is '\n'. */
  size_t pre = 10;
  if (h.len + 1 + pre > 65535) pre = 12;
  while ((pre + h.len + 1) % 64 != 0) kiln_sbuf_putc(&h, ' ');
  kiln_sbuf_putc(&h, '\n');
  if (kiln_sbuf_failed(&h)) {
    kiln_sbuf_free(&h);
    return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
  }
  size_t total = pre + h.len + nbytes;
  uint8_t *out = kiln_malloc(total);
  if (out == NULL) {
    kiln_sbuf_free(&h);
    return kiln_status_set(st, KILN_ENOMEM, NULL, "out of memory");
  }
  memcpy(out, npy_magic, sizeof npy_magic);
  if (pre == 10) {
    out[6] = 1, out[7] = 0;
    out[8] = (uint8_t)(h.len & 0xff), out[9] = (uint8_t)(h.len >> 8);
  } else {
    out[6] = 2, out[7] = 0;
    for (int i = 0; i < 4; i++) out[8 + i] = (uint8_t)(h.len >> (8 * i));
  }
  memcpy(out + pre, h.data, h.len);
  if (nbytes) memcpy(out + pre + h.len, data, nbytes);
  kiln_sbuf_free(&h);
  *buf = out;
  *len = total;
  return 0;
}

int kiln_npy_write(const char *path, kiln_dtype t, const int64_t *dims, uint32_t rank,
                   const void *data, size_t nbytes, kiln_status *st) {
  uint8_t *buf;
  size_t len;
  kiln_status local;
  kiln_status_clear(&local);
  int rc = kiln_npy_encode(t, dims, rank, data, nbytes, &buf, &len, &local);
  if (rc) return kiln_status_set(st, rc, path, "%s", local.msg);
  rc = kiln__file_write(path, buf, len, st);
  kiln_free(buf);
  return rc;
}
