/* A check of serialized protobuf bytes before protobuf-c unpacks them.
 *
 * protobuf-c's unpacker trusts its input more than a server can: it recurses
 * once per nested message with no limit (a few megabytes of nested tuple
 * shapes overflow the stack), and it copies string fields into C strings
 * without checking UTF-8 or embedded NULs (which would silently cut the
 * string short). So every message is first walked here, driven by the
 * same generated descriptors: tags, varints and lengths are bounds-checked,
 * nesting is counted, and string fields are validated where they lie. The
 * walk allocates nothing and touches each byte once.
 *
 * Errors name the field path the way the decoder does
 * ("computations[0].instructions[3].name: not valid UTF-8"); bytes that are
 * not a protobuf message at all get the same message protobuf-c's own
 * failure gets: "not a valid kiln.v1.Module message".
 */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "compiler/ir/proto_internal.h"

/* Paths past this many characters are cut with "..."; the depth error is
 * reported where nesting began to exceed the limit, so the head of the path
 * is the informative part. */
#define PATH_CAP 200
#define MAX_COUNTED_FIELDS 64

/* The walk keeps the fields it is inside as (descriptor, index) frames and
 * spells them out as a path only when it reports an error: nearly every
 * message is fine, and formatting a path segment per field was a visible
 * share of a server's time per small request. One frame per nesting level
 * (the depth check fails with its frame pushed, so the limit plus one). */
typedef struct frame {
  const ProtobufCFieldDescriptor *f;
  uint32_t index;
} frame;

typedef struct walker {
  kiln_status *st;
  const ProtobufCMessageDescriptor *top;
  frame frames[KILN_PROTO_MAX_MESSAGE_DEPTH + 1];
  unsigned nframes;
} walker;

static int malformed(walker *w) {
  return kiln_status_set(w->st, KILN_EINVAL, NULL, "not a valid %s message", w->top->name);
}

/* Appends one segment ("name" or "name[i]", after a "." unless first) the
 * way the path has always been cut: a segment that would pass PATH_CAP
 * becomes "..." and nothing is added after it. */
static void path_append(char *path, size_t *plen, const frame *fr) {
  if (*plen >= PATH_CAP) return;
  char seg[96];
  int n = fr->f->label == PROTOBUF_C_LABEL_REPEATED
              ? snprintf(seg, sizeof seg, "%s%s[%u]", *plen ? "." : "", fr->f->name, fr->index)
              : snprintf(seg, sizeof seg, "%s%s", *plen ? "." : "", fr->f->name);
  if (n < 0) n = 0;
  if ((size_t)n >= sizeof seg) n = sizeof seg - 1;
  if (*plen + (size_t)n > PATH_CAP) {
    memcpy(path + *plen, "...", 4);
    *plen = PATH_CAP;
    return;
  }
  memcpy(path + *plen, seg, (size_t)n + 1);
  *plen += (size_t)n;
}

static int field_error(walker *w, const char *what) {
  char path[PATH_CAP + 8];
  size_t plen = 0;
  path[0] = '\0';
  for (unsigned i = 0; i < w->nframes; i++) path_append(path, &plen, &w->frames[i]);
  return kiln_status_set(w->st, KILN_EINVAL, NULL, "%s: %s", path, what);
}

static bool read_varint(const uint8_t **p, const uint8_t *end, uint64_t *out) {
  uint64_t v = 0;
  for (unsigned shift = 0; shift < 70; shift += 7) {
    if (*p == end) return false;
    uint8_t b = *(*p)++;
    if (shift < 64) v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *out = v;
      return true;
    }
  }
  return false; /* more than 10 bytes */
}

/* Strict UTF-8, as protobuf's other runtimes require for proto3 strings:
 * no overlong forms, no surrogates, nothing above U+10FFFF. */
static bool valid_utf8(const uint8_t *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    uint8_t c = s[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t len;
    uint32_t cp, min;
    if ((c & 0xe0) == 0xc0)
      len = 2, cp = c & 0x1f, min = 0x80;
    else if ((c & 0xf0) == 0xe0)
      len = 3, cp = c & 0x0f, min = 0x800;
    else if ((c & 0xf8) == 0xf0)
      len = 4, cp = c & 0x07, min = 0x10000;
    else
      return false;
    if (n - i < len) return false;
    for (size_t k = 1; k < len; k++) {
      if ((s[i + k] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (s[i + k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += len;
  }
  return true;
}

static int walk(walker *w, const ProtobufCMessageDescriptor *desc, const uint8_t *p,
                const uint8_t *end, unsigned depth);

/* A length-delimited field of a known type: strings are validated, messages
 * walked; bytes and packed numbers need nothing beyond the length check. */
static int check_delimited(walker *w, const ProtobufCFieldDescriptor *f, uint32_t index,
                           const uint8_t *p, size_t len, unsigned depth) {
  int rc = 0;
  if (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE) return 0;
  /* nframes < the array's size: one frame per level, and depth is checked
   * below before a message one level deeper is walked */
  w->frames[w->nframes++] = (frame){f, index};
  if (f->type == PROTOBUF_C_TYPE_STRING) {
    if (memchr(p, 0, len) != NULL)
      rc = field_error(w, "contains a NUL character");
    else if (!valid_utf8(p, len))
      rc = field_error(w, "not valid UTF-8");
  } else if (depth + 1 > KILN_PROTO_MAX_MESSAGE_DEPTH) {
    char msg[80];
    snprintf(msg, sizeof msg, "messages nested deeper than %d levels",
             KILN_PROTO_MAX_MESSAGE_DEPTH);
    rc = field_error(w, msg);
  } else {
    rc = walk(w, f->descriptor, p, p + len, depth + 1);
  }
  w->nframes--;
  return rc;
}

static int walk(walker *w, const ProtobufCMessageDescriptor *desc, const uint8_t *p,
                const uint8_t *end, unsigned depth) {
  /* Occurrences so far of each repeated field, to index the path. */
  uint32_t counts[MAX_COUNTED_FIELDS] = {0};
  while (p < end) {
    uint64_t tag, v;
    if (!read_varint(&p, end, &tag)) return malformed(w);
    uint64_t number = tag >> 3;
    if (number == 0 || number > 0x1fffffff) return malformed(w);
    switch (tag & 7) {
    case 0: /* varint */
      if (!read_varint(&p, end, &v)) return malformed(w);
      break;
    case 1: /* fixed64 */
      if (end - p < 8) return malformed(w);
      p += 8;
      break;
    case 5: /* fixed32 */
      if (end - p < 4) return malformed(w);
      p += 4;
      break;
    case 2: { /* length-delimited */
      if (!read_varint(&p, end, &v) || v > (uint64_t)(end - p)) return malformed(w);
      const ProtobufCFieldDescriptor *f =
          protobuf_c_message_descriptor_get_field(desc, (unsigned)number);
      if (f != NULL) {
        size_t fi = (size_t)(f - desc->fields);
        uint32_t index = fi < MAX_COUNTED_FIELDS ? counts[fi]++ : 0;
        int rc = check_delimited(w, f, index, p, (size_t)v, depth);
        if (rc) return rc;
      }
      p += v;
      break;
    }
    default: /* groups (3, 4) are not proto3; 6 and 7 do not exist */ return malformed(w);
    }
  }
  return 0;
}

int kiln__proto_check_wire(const ProtobufCMessageDescriptor *desc, const uint8_t *buf, size_t len,
                           kiln_status *st) {
  walker w; /* not zeroed: frames are written before they are read */
  w.st = st;
  w.top = desc;
  w.nframes = 0;
  if (len == 0) return 0;
  if (buf == NULL) return malformed(&w);
  return walk(&w, desc, buf, buf + len, 1);
}

/* ---- the allocator ------------------------------------------------------- */

static void *hook_alloc(void *data, size_t size) {
  kiln__proto_alloc *a = data;
  if (a->budget && (size > a->budget || a->used > a->budget - size)) {
    a->over_budget = true;
    return NULL;
  }
  void *p = kiln_malloc(size ? size : 1);
  if (p == NULL)
    a->failed = true;
  else
    a->used += size;
  return p;
}

static void hook_free(void *data, void *p) {
  (void)data;
  kiln_free(p);
}

void kiln__proto_alloc_init(kiln__proto_alloc *a, size_t budget) {
  a->base.alloc = hook_alloc;
  a->base.free = hook_free;
  a->base.allocator_data = a;
  a->used = 0;
  a->budget = budget;
  a->failed = false;
  a->over_budget = false;
}
