/* A module's kernels as several translation units, named by content.
 *
 * Generated code names kernels and helpers by index (kiln_kernel_7, kf3),
 * so the same kernel reads differently in two modules, and even the same
 * helper (an add reducer) appears under many numbers in one. Each kernel
 * is therefore rewritten into a canonical form that does not depend on
 * where it landed: the helpers it calls, transitively, are copied in front
 * of it (in their original order, so definitions precede uses) and renamed
 * kk<hash>_h<j> (j in order of first reference), and the kernel itself is
 * renamed kk<hash>, where <hash> is 16 hex digits of the SHA-256
 * of that same text written with a fixed placeholder prefix. Identical
 * kernels get one symbol and are compiled once; kiln_kernel_N is made an
 * alias of its kk<hash> by the link step (cc.c).
 *
 * Distinct kernels are grouped into units by their hashes, not by their
 * positions: the classes (heavy, light, tiny: compile flags) apart, each in
 * hash order, cut into units by content-defined boundaries (a cut after a
 * kernel whose hash's last byte is 0 mod 4 once the unit holds half the
 * target size; always at 1.5 times it). A module that shares most kernels
 * with another therefore shares most units, and a unit's cache key (the
 * SHA-256 of its text, flags and compiler, cc.c) hits. The target size
 * is a power of two between 8 KiB (or unit_bytes if less) and unit_bytes, at most the module's
 * kernel text over min_units (the compilers that may run at once), so
 * that every compiler has work and modules of about the same size cut
 * alike. Smaller modules (under 8 KiB per wanted unit: a compiler process
 * and the prelude cost more than such a unit saves) are instead spread
 * over total / 8 KiB units (at least one) by size, largest kernel first
 * into the lightest, one class at a time; under GCC (cc.c passes the
 * classes' optimize attributes) the tiny class, when it is at most 2 KiB,
 * joins the light class's units instead of paying for a compiler of its
 * own, and with a single compiler every class shares one unit. A unit
 * then holds of the prelude only the helpers its kernels call.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/sbuf.h"
#include "compiler/codegen/cc_internal.h"

#define UNIT_BYTES_DEFAULT (64 * 1024)
#define PLACEHOLDER "kk0000000000000000"

typedef struct span {
  const char *p;
  size_t n;
} span;

typedef struct helper {
  span name, text;
} helper;

/* One kernel of the module. */
typedef struct kern {
  span name, text;
  uint32_t *calls; /* helpers in its closure, in order of first reference */
  uint32_t ncalls;
  size_t bytes; /* its text and its helpers' */
  uint8_t hash[KILN__SHA256_LEN];
  uint8_t cls; /* kiln__cc_class */
} kern;

/* A piece of the prelude: a helper function ("KI ..." in column 0, to its
 * closing brace) or anything else (kept in every unit). */
typedef struct piece {
  span text, name; /* name: a helper's; empty for the rest */
} piece;

typedef struct splitter {
  const kiln__cc_program *p;
  piece *pre; /* the prelude in pieces; NULL: kept whole */
  uint32_t npre;
  uint32_t *pre_table; /* open addressing over helper pieces' names: index + 1 */
  uint32_t pre_cap;
  helper *h;
  uint32_t nh;
  uint32_t *table; /* open addressing over helper names: index + 1 */
  uint32_t cap;
  uint32_t *stamp, *local; /* per helper: kernel + 1 that saw it, its j there */
  kern *k;
  uint32_t nk;
} splitter;

static bool id_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static bool id_char(char c) { return id_start(c) || (c >= '0' && c <= '9'); }

/* The next identifier at or after *i in t[0..n) (not one that continues a
 * number such as 0x1p24f); false at the end. */
static bool next_id(const char *t, size_t n, size_t *i, span *out) {
  size_t j = *i;
  while (j < n) {
    char c = t[j];
    if (id_start(c) && (j == 0 || !(id_char(t[j - 1]) || t[j - 1] == '.'))) {
      size_t e = j;
      while (e < n && id_char(t[e])) e++;
      out->p = t + j;
      out->n = e - j;
      *i = e;
      return true;
    }
    j++;
  }
  *i = n;
  return false;
}

static uint32_t hash_name(const char *p, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 16777619u;
  return h;
}

/* The helper named s, or UINT32_MAX. */
static uint32_t find_helper(const splitter *sp, span s) {
  if (sp->cap == 0) return UINT32_MAX;
  for (uint32_t i = hash_name(s.p, s.n) & (sp->cap - 1);; i = (i + 1) & (sp->cap - 1)) {
    uint32_t v = sp->table[i];
    if (v == 0) return UINT32_MAX;
    const span *nm = &sp->h[v - 1].name;
    if (nm->n == s.n && memcmp(nm->p, s.p, s.n) == 0) return v - 1;
  }
}

static int oom(kiln_status *st) {
  return kiln_status_set(st, KILN_ENOMEM, "cc", "out of memory splitting the kernels");
}

static int bad_source(kiln_status *st, const char *what) {
  return kiln_status_set(st, KILN_EINTERNAL, "cc", "generated source: %s", what);
}

/* Helpers start in column 0 with anything but a brace or a blank. */
static int parse_helpers(splitter *sp, kiln_status *st) {
  const char *f = sp->p->funcs ? sp->p->funcs : "";
  size_t n = strlen(f);
  size_t cap = 0;
  for (size_t i = 0; i < n;) {
    size_t eol = i;
    while (eol < n && f[eol] != '\n') eol++;
    bool start = f[i] != ' ' && f[i] != '\t' && f[i] != '}' && f[i] != '\n';
    if (start) {
      if (kiln_grow((void **)&sp->h, &cap, sp->nh + 1, sizeof *sp->h)) return oom(st);
      helper *h = &sp->h[sp->nh++];
      h->text.p = f + i;
      /* The name: the last identifier before the first '(' of the line. */
      size_t j = i, paren = i;
      while (paren < eol && f[paren] != '(') paren++;
      span id = {0};
      h->name.n = 0;
      while (next_id(f, paren, &j, &id)) h->name = id;
      if (h->name.n == 0) return bad_source(st, "a helper function without a name");
    }
    i = eol + 1;
  }
  for (uint32_t k = 0; k < sp->nh; k++) {
    const char *end = k + 1 < sp->nh ? sp->h[k + 1].text.p : f + n;
    sp->h[k].text.n = (size_t)(end - sp->h[k].text.p);
  }
  sp->cap = 16;
  while (sp->cap < 2 * sp->nh) sp->cap *= 2;
  sp->table = kiln_calloc(sp->cap, sizeof *sp->table);
  sp->stamp = kiln_calloc(sp->nh + 1, sizeof *sp->stamp);
  sp->local = kiln_calloc(sp->nh + 1, sizeof *sp->local);
  if (!sp->table || !sp->stamp || !sp->local) return oom(st);
  for (uint32_t k = 0; k < sp->nh; k++) {
    if (find_helper(sp, sp->h[k].name) != UINT32_MAX)
      return bad_source(st, "two helper functions of one name");
    uint32_t i = hash_name(sp->h[k].name.p, sp->h[k].name.n) & (sp->cap - 1);
    while (sp->table[i]) i = (i + 1) & (sp->cap - 1);
    sp->table[i] = k + 1;
  }
  return 0;
}

static int parse_kernels(splitter *sp, kiln_status *st) {
  static const char head[] = "void kiln_kernel_";
  const char *t = sp->p->kernels ? sp->p->kernels : "";
  size_t n = strlen(t);
  sp->k = kiln_calloc(sp->p->nkernels + 1, sizeof *sp->k);
  if (sp->k == NULL) return oom(st);
  for (size_t i = 0; i < n;) {
    size_t eol = i;
    while (eol < n && t[eol] != '\n') eol++;
    if (strncmp(t + i, head, sizeof head - 1) == 0) {
      if (sp->nk == sp->p->nkernels) return bad_source(st, "more kernels than announced");
      kern *k = &sp->k[sp->nk];
      k->text.p = t + i;
      k->name.p = t + i + 5;
      char *e;
      unsigned long idx = strtoul(t + i + sizeof head - 1, &e, 10);
      if (idx != sp->nk || *e != '(') return bad_source(st, "kernels out of order");
      k->name.n = (size_t)(e - k->name.p);
      k->cls = sp->p->cls && sp->p->cls[sp->nk] < KILN__CC_NCLASSES ? sp->p->cls[sp->nk]
                                                                    : KILN__CC_HEAVY;
      sp->nk++;
    } else if (sp->nk == 0 && i < eol) {
      return bad_source(st, "text before the first kernel");
    }
    i = eol + 1;
  }
  if (sp->nk != sp->p->nkernels) return bad_source(st, "fewer kernels than announced");
  for (uint32_t k = 0; k < sp->nk; k++) {
    const char *end = k + 1 < sp->nk ? sp->k[k + 1].text.p : t + n;
    sp->k[k].text.n = (size_t)(end - sp->k[k].text.p);
  }
  return 0;
}

/* Adds the helpers text t calls that kernel kk has not seen yet. */
static int scan_calls(splitter *sp, uint32_t kk, span t, size_t *cap, kiln_status *st) {
  kern *k = &sp->k[kk];
  size_t i = 0;
  span id;
  while (next_id(t.p, t.n, &i, &id)) {
    uint32_t h = find_helper(sp, id);
    if (h == UINT32_MAX || sp->stamp[h] == kk + 1) continue;
    if (kiln_grow((void **)&k->calls, cap, k->ncalls + 1, sizeof *k->calls)) return oom(st);
    sp->stamp[h] = kk + 1;
    sp->local[h] = k->ncalls;
    k->calls[k->ncalls++] = h;
  }
  return 0;
}

static int closure(splitter *sp, uint32_t kk, kiln_status *st) {
  kern *k = &sp->k[kk];
  size_t cap = 0;
  int rc = scan_calls(sp, kk, k->text, &cap, st);
  for (uint32_t c = 0; rc == 0 && c < k->ncalls; c++)
    rc = scan_calls(sp, kk, sp->h[k->calls[c]].text, &cap, st);
  k->bytes = k->text.n;
  for (uint32_t c = 0; c < k->ncalls; c++) k->bytes += sp->h[k->calls[c]].text.n;
  return rc;
}

/* Copies t renaming kernel kk's helpers and its own name after prefix
 * (the stamps must be kk's: emit() sets them). */
static void put_renamed(const splitter *sp, uint32_t kk, span t, const char *prefix, kiln_sbuf *b) {
  const kern *k = &sp->k[kk];
  size_t i = 0, done = 0;
  span id;
  while (next_id(t.p, t.n, &i, &id)) {
    uint32_t h = UINT32_MAX;
    bool self = id.n == k->name.n && memcmp(id.p, k->name.p, id.n) == 0;
    if (!self && (h = find_helper(sp, id)) == UINT32_MAX) continue;
    kiln_sbuf_putn(b, t.p + done, (size_t)(id.p - (t.p + done)));
    if (self)
      kiln_sbuf_puts(b, prefix);
    else
      kiln_sbuf_printf(b, "%s_h%u", prefix, sp->local[h]);
    done = (size_t)(id.p + id.n - t.p);
  }
  kiln_sbuf_putn(b, t.p + done, t.n - done);
}

static int by_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* Kernel kk in canonical form, its names after prefix. */
static int emit(splitter *sp, uint32_t kk, const char *prefix, kiln_sbuf *b, kiln_status *st) {
  kern *k = &sp->k[kk];
  uint32_t *order = kiln_malloc((k->ncalls + 1) * sizeof *order);
  if (order == NULL) return oom(st);
  for (uint32_t c = 0; c < k->ncalls; c++) {
    order[c] = k->calls[c];
    sp->stamp[k->calls[c]] = kk + 1;
    sp->local[k->calls[c]] = c;
  }
  qsort(order, k->ncalls, sizeof *order, by_u32);
  for (uint32_t c = 0; c < k->ncalls; c++) put_renamed(sp, kk, sp->h[order[c]].text, prefix, b);
  put_renamed(sp, kk, k->text, prefix, b);
  kiln_free(order);
  return kiln_sbuf_failed(b) ? oom(st) : 0;
}

/* ---- the prelude a unit needs ----------------------------------------- */

/* The prelude's helper functions (KI, static inline) cost the compiler
 * time to parse whether or not a unit calls them, 3-4 ms of a small
 * unit's 20; a unit gets those its kernels call, transitively, and every
 * other line (types, declarations, macros, which may name helpers too).
 * A helper starts with "KI " in column 0 (not inside a macro) and ends on
 * its first line when that balances its braces, else at the next line
 * that starts with '}'. A prelude that does not parse so is kept whole. */
static bool parse_prelude(splitter *sp) {
  const char *t = sp->p->prelude ? sp->p->prelude : "";
  size_t n = strlen(t), cap = 0, other = 0;
  bool continued = false, ok = true;
  for (size_t i = 0; i < n && ok;) {
    size_t eol = i;
    while (eol < n && t[eol] != '\n') eol++;
    bool fn = !continued && strncmp(t + i, "KI ", 3) == 0;
    continued = eol > i && t[eol - 1] == '\\';
    if (!fn) {
      i = eol + 1;
      continue;
    }
    int depth = 0;
    bool brace = false;
    for (size_t j = i; j < eol; j++) {
      if (t[j] == '{') depth++, brace = true;
      if (t[j] == '}') depth--;
    }
    size_t end = eol;
    if (brace && depth != 0) { /* to the line that starts with '}' */
      while (end < n && !(t[end] == '\n' && end + 1 < n && t[end + 1] == '}')) end++;
      if (end >= n) {
        ok = false;
        break;
      }
      end++;
      while (end < n && t[end] != '\n') end++;
    }
    end = end < n ? end + 1 : n;
    if (kiln_grow((void **)&sp->pre, &cap, sp->npre + 2, sizeof *sp->pre)) {
      ok = false;
      break;
    }
    if (i > other) sp->pre[sp->npre++] = (piece){{t + other, i - other}, {NULL, 0}};
    piece *h = &sp->pre[sp->npre++];
    h->text = (span){t + i, end - i};
    size_t paren = i, j = i;
    while (paren < eol && t[paren] != '(') paren++;
    span id = {0};
    h->name = (span){NULL, 0};
    while (next_id(t, paren, &j, &id)) h->name = id;
    if (h->name.n == 0) ok = false;
    i = other = end;
  }
  if (ok && other < n) {
    if (kiln_grow((void **)&sp->pre, &cap, sp->npre + 1, sizeof *sp->pre))
      ok = false;
    else
      sp->pre[sp->npre++] = (piece){{t + other, n - other}, {NULL, 0}};
  }
  sp->pre_cap = 16;
  while (ok && sp->pre_cap < 2 * sp->npre) sp->pre_cap *= 2;
  if (ok && (sp->pre_table = kiln_calloc(sp->pre_cap, sizeof *sp->pre_table)) == NULL) ok = false;
  for (uint32_t k = 0; ok && k < sp->npre; k++) {
    if (sp->pre[k].name.n == 0) continue;
    uint32_t i = hash_name(sp->pre[k].name.p, sp->pre[k].name.n) & (sp->pre_cap - 1);
    while (sp->pre_table[i]) i = (i + 1) & (sp->pre_cap - 1);
    sp->pre_table[i] = k + 1;
  }
  if (!ok) {
    kiln_free(sp->pre);
    kiln_free(sp->pre_table);
    sp->pre = NULL, sp->npre = 0, sp->pre_table = NULL;
  }
  return ok;
}

/* The prelude helper piece named s, or UINT32_MAX. */
static uint32_t find_piece(const splitter *sp, span s) {
  for (uint32_t i = hash_name(s.p, s.n) & (sp->pre_cap - 1);; i = (i + 1) & (sp->pre_cap - 1)) {
    uint32_t v = sp->pre_table[i];
    if (v == 0) return UINT32_MAX;
    const span *nm = &sp->pre[v - 1].name;
    if (nm->n == s.n && memcmp(nm->p, s.p, s.n) == 0) return v - 1;
  }
}

/* Marks the helper pieces text t names, queuing those not seen yet. */
static void mark_pieces(const splitter *sp, span t, uint8_t *used, uint32_t *queue, uint32_t *nq) {
  size_t i = 0;
  span id;
  while (next_id(t.p, t.n, &i, &id)) {
    uint32_t k = find_piece(sp, id);
    if (k == UINT32_MAX || used[k]) continue;
    used[k] = 1;
    queue[(*nq)++] = k;
  }
}

/* The prelude for a unit whose kernels (and their helpers) are body. */
static int put_prelude(const splitter *sp, span body, kiln_sbuf *b, kiln_status *st) {
  if (sp->pre == NULL) {
    kiln_sbuf_puts(b, sp->p->prelude ? sp->p->prelude : "");
    return 0;
  }
  uint8_t *used = kiln_calloc(sp->npre + 1, 1);
  uint32_t *queue = kiln_malloc((sp->npre + 1) * sizeof *queue), nq = 0;
  if (used == NULL || queue == NULL) {
    kiln_free(used);
    kiln_free(queue);
    return oom(st);
  }
  mark_pieces(sp, body, used, queue, &nq);
  for (uint32_t k = 0; k < sp->npre; k++)
    if (sp->pre[k].name.n == 0) mark_pieces(sp, sp->pre[k].text, used, queue, &nq);
  for (uint32_t q = 0; q < nq; q++) mark_pieces(sp, sp->pre[queue[q]].text, used, queue, &nq);
  for (uint32_t k = 0; k < sp->npre; k++)
    if (sp->pre[k].name.n == 0 || used[k]) kiln_sbuf_putn(b, sp->pre[k].text.p, sp->pre[k].text.n);
  kiln_free(used);
  kiln_free(queue);
  return 0;
}

/* A kernel as the grouping sees it (sorted without a context pointer, so
 * that concurrent compiles need no lock). */
typedef struct rec {
  uint8_t hash[KILN__SHA256_LEN];
  uint8_t cls;
  size_t bytes;
  uint32_t idx;
} rec;

static int by_hash(const void *a, const void *b) {
  const rec *x = a, *y = b;
  int c = memcmp(x->hash, y->hash, KILN__SHA256_LEN);
  return c ? c : x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Heavy kernels first, then light, then tiny, each class in hash order. */
static int by_class_hash(const void *a, const void *b) {
  const rec *x = a, *y = b;
  if (x->cls != y->cls) return x->cls < y->cls ? -1 : 1;
  return by_hash(a, b);
}

static int by_bytes_desc(const void *a, const void *b) {
  const rec *x = a, *y = b;
  if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
  return by_hash(a, b);
}

/* Programs below this many bytes per wanted unit are spread by size. */
#define TINY_UNIT_BYTES 8192
/* Tiny kernels of at most this many bytes in all cost GCC less at -O1
 * (about 8 ms a KiB) than a unit of their own (the driver, cc1, as and the
 * prelude: 15-20 ms): they join another unit. More would lengthen that
 * unit by more than running them alongside costs when a CPU is free. */
#define TINY_JOIN_BYTES 2048

/* Assigns each distinct kernel (d[0..nd), sorted by class and hash) its
 * unit in d[].idx's place of unit_of; returns the number of units. */
static uint32_t group(rec *d, uint32_t nd, uint32_t min_units, size_t target, bool mix,
                      uint32_t *unit_of, uint64_t *load) {
  size_t tiny = target < TINY_UNIT_BYTES ? target : TINY_UNIT_BYTES, total = 0;
  for (uint32_t i = 0; i < nd; i++) total += d[i].bytes;
  uint32_t nunits = 0;
  if (total < (uint64_t)min_units * tiny) {
    bool one_compiler = min_units == 1;
    min_units = (uint32_t)(total / tiny);
    if (min_units < 1) min_units = 1;
    /* Tiny: min_units bins per the classes' shares, largest kernel first
     * into the lightest bin (d is re-sorted; unit_of is by kernel index).
     * Mixing, the tiny class (sorted last) joins the bins of the light
     * class (of the heavy one when there are none) when it is small, and
     * with one compiler every class joins the first's. */
    uint32_t light_first = 0, light_bins = 0;
    size_t tiny_bytes = 0;
    for (uint32_t i = 0; i < nd; i++) tiny_bytes += d[i].cls == KILN__CC_TINY ? d[i].bytes : 0;
    for (uint32_t start = 0, cnt; start < nd; start += cnt) {
      rec *r = d + start;
      size_t bytes = 0;
      for (cnt = 0; start + cnt < nd && d[start + cnt].cls == r->cls; cnt++)
        bytes += d[start + cnt].bytes;
      bool join = mix && nunits > 0 &&
                  ((r->cls == KILN__CC_TINY && tiny_bytes <= TINY_JOIN_BYTES) || one_compiler);
      uint32_t bins = (uint32_t)(((uint64_t)min_units * bytes + total / 2) / (total ? total : 1));
      if (bins < 1) bins = 1;
      if (bins > cnt) bins = cnt;
      uint32_t first = join ? 0 : nunits;
      if (join) bins = nunits;
      if (join && r->cls == KILN__CC_TINY && light_bins) first = light_first, bins = light_bins;
      if (!join && r->cls == KILN__CC_LIGHT) light_first = first, light_bins = bins;
      qsort(r, cnt, sizeof *r, by_bytes_desc);
      for (uint32_t b = 0; b < bins && !join; b++) load[first + b] = 0;
      for (uint32_t i = 0; i < cnt; i++) {
        uint32_t best = 0;
        for (uint32_t b = 1; b < bins; b++)
          if (load[first + b] < load[first + best]) best = b;
        load[first + best] += r[i].bytes;
        unit_of[r[i].idx] = first + best;
      }
      if (!join) nunits += bins;
    }
    return nunits;
  }
  /* Content-defined cuts; the target is a power of two (so that modules of
   * about the same size cut alike) no larger than total / min_units. */
  size_t t = tiny;
  while (2 * t <= target && 2 * t * min_units <= total) t *= 2;
  size_t acc = 0;
  for (uint32_t i = 0; i < nd; i++) {
    if (i > 0 && d[i].cls != d[i - 1].cls && acc > 0) nunits++, acc = 0;
    unit_of[d[i].idx] = nunits;
    acc += d[i].bytes;
    bool cut = (acc >= t / 2 && d[i].hash[KILN__SHA256_LEN - 1] % 4 == 0) || acc >= t + t / 2;
    if (cut && i + 1 < nd) nunits++, acc = 0;
  }
  return nd ? nunits + 1 : 0;
}

/* A unit's flags: its one class's, or the light class's when it mixes
 * classes (a kernel of another class then carries its class's flags as
 * an attribute, and the prelude's helpers inline into every kernel). */
static uint8_t unit_class(uint8_t mask) {
  for (uint8_t c = 0; c < KILN__CC_NCLASSES; c++)
    if (mask == 1u << c) return c;
  return KILN__CC_LIGHT;
}

static int build_units(splitter *sp, uint32_t min_units, size_t target, const char *const *attrs,
                       kiln__cc_split *out, kiln_status *st) {
  int rc = 0;
  kiln_sbuf *bufs = NULL;
  rec *r = kiln_malloc((sp->nk + 1) * sizeof *r);
  uint32_t *rep = kiln_malloc((sp->nk + 1) * sizeof *rep); /* kernel -> its group's first */
  uint32_t *unit_of = kiln_malloc((sp->nk + 1) * sizeof *unit_of);
  uint64_t *load = kiln_malloc((sp->nk + 2) * sizeof *load);
  if (!r || !rep || !unit_of || !load) {
    rc = oom(st);
    goto out_free;
  }
  /* Identical kernels: one group, standing for it its lowest index, of
   * the heaviest class of its members. */
  for (uint32_t i = 0; i < sp->nk; i++) {
    memcpy(r[i].hash, sp->k[i].hash, KILN__SHA256_LEN);
    r[i].cls = sp->k[i].cls;
    r[i].bytes = sp->k[i].bytes;
    r[i].idx = i;
  }
  qsort(r, sp->nk, sizeof *r, by_hash);
  uint32_t nd = 0;
  for (uint32_t i = 0; i < sp->nk;) {
    uint32_t j = i;
    uint8_t cls = KILN__CC_NCLASSES - 1;
    while (j < sp->nk && memcmp(r[j].hash, r[i].hash, KILN__SHA256_LEN) == 0) {
      if (r[j].cls < cls) cls = r[j].cls;
      rep[r[j].idx] = r[i].idx; /* the sort put the lowest index first */
      j++;
    }
    r[nd] = r[i];
    r[nd++].cls = cls;
    i = j;
  }
  out->ndistinct = nd;
  qsort(r, nd, sizeof *r, by_class_hash);
  out->nunits = group(r, nd, min_units ? min_units : 1, target, attrs != NULL, unit_of, load);
  out->units = kiln_calloc(out->nunits + 1, sizeof *out->units);
  bufs = kiln_calloc(out->nunits + 1, sizeof *bufs);
  if (out->units == NULL || bufs == NULL) {
    rc = oom(st);
    goto out_free;
  }
  for (uint32_t u = 0; u < out->nunits; u++) {
    out->units[u].first = UINT32_MAX;
    kiln_sbuf_init(&bufs[u]);
  }
  for (uint32_t i = 0; i < nd; i++) out->units[unit_of[r[i].idx]].classes |= 1u << r[i].cls;
  for (uint32_t u = 0; u < out->nunits; u++) {
    out->units[u].cls = unit_class(out->units[u].classes);
    out->nmixed += out->units[u].classes != 1u << out->units[u].cls;
  }
  /* Within a unit kernels go in hash order: its text depends only on
   * which kernels it holds, never on where they stood in the module. */
  qsort(r, nd, sizeof *r, by_hash);
  for (uint32_t i = 0; rc == 0 && i < nd; i++) {
    uint32_t k = r[i].idx, u = unit_of[k];
    out->units[u].nkernels++;
    if (k < out->units[u].first) out->units[u].first = k;
    if (r[i].cls != out->units[u].cls)
      kiln_sbuf_printf(&bufs[u], "void %s(void *const *, int64_t, int64_t) %s;\n", out->sym[k],
                       attrs[r[i].cls]);
    rc = emit(sp, k, out->sym[k], &bufs[u], st);
  }
  /* Then each unit's text: the prelude it needs and its kernels. */
  kiln_sbuf text = KILN_SBUF_INIT;
  for (uint32_t u = 0; u < out->nunits; u++) {
    if (rc == 0 && kiln_sbuf_failed(&bufs[u])) rc = oom(st);
    if (rc == 0) {
      kiln_sbuf_init(&text);
      rc = put_prelude(sp, (span){kiln_sbuf_str(&bufs[u]), bufs[u].len}, &text, st);
      kiln_sbuf_putc(&text, '\n');
      kiln_sbuf_putn(&text, bufs[u].data, bufs[u].len);
      if (rc == 0 && (out->units[u].src = kiln_sbuf_detach(&text, &out->units[u].len)) == NULL)
        rc = oom(st);
      kiln_sbuf_free(&text);
    }
    kiln_sbuf_free(&bufs[u]);
  }
  /* Every kernel index answers to its group's symbol. */
  for (uint32_t i = 0; rc == 0 && i < sp->nk; i++)
    memcpy(out->sym[i], out->sym[rep[i]], KILN__CC_SYM_LEN);
out_free:
  kiln_free(bufs);
  kiln_free(r);
  kiln_free(rep);
  kiln_free(unit_of);
  kiln_free(load);
  return rc;
}

int kiln__cc_split_program(const kiln__cc_program *p, uint32_t min_units, size_t unit_bytes,
                           const char *const *attrs, kiln__cc_split *out, kiln_status *st) {
  memset(out, 0, sizeof *out);
  splitter sp = {.p = p};
  kiln_sbuf b = KILN_SBUF_INIT;
  int rc = parse_helpers(&sp, st);
  if (rc == 0) rc = parse_kernels(&sp, st);
  if (rc == 0) parse_prelude(&sp);
  if (rc == 0) {
    out->nkernels = sp.nk;
    out->sym = kiln_calloc(sp.nk + 1, sizeof *out->sym);
    if (out->sym == NULL) rc = oom(st);
  }
  for (uint32_t k = 0; rc == 0 && k < sp.nk; k++) {
    if ((rc = closure(&sp, k, st))) break;
    kiln_sbuf_reset(&b);
    if ((rc = emit(&sp, k, PLACEHOLDER, &b, st))) break;
    kiln__sha256_of(b.data, b.len, sp.k[k].hash);
    out->sym[k][0] = out->sym[k][1] = 'k';
    kiln__hex(sp.k[k].hash, 8, out->sym[k] + 2);
  }
  if (rc == 0)
    rc = build_units(&sp, min_units, unit_bytes ? unit_bytes : UNIT_BYTES_DEFAULT, attrs, out, st);
  kiln_sbuf_free(&b);
  for (uint32_t k = 0; k < sp.nk; k++) kiln_free(sp.k[k].calls);
  kiln_free(sp.k);
  kiln_free(sp.h);
  kiln_free(sp.table);
  kiln_free(sp.stamp);
  kiln_free(sp.local);
  kiln_free(sp.pre);
  kiln_free(sp.pre_table);
  if (rc) kiln__cc_split_free(out);
  return rc;
}

void kiln__cc_split_free(kiln__cc_split *s) {
  for (uint32_t u = 0; s->units && u < s->nunits; u++) kiln_free(s->units[u].src);
  kiln_free(s->units);
  kiln_free(s->sym);
  memset(s, 0, sizeof *s);
}
