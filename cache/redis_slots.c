/* Redis Cluster's routing arithmetic: hash slots, redirections and the
 * CLUSTER SLOTS reply (see redis_slots.h). Nothing here opens a socket.
 */
#include "cache/redis_slots.h"

#include <hiredis/hiredis.h>
#include <stdio.h>
#include <string.h>

uint16_t kiln__redis_crc16(const uint8_t *s, size_t n) {
  uint16_t crc = 0;
  for (size_t i = 0; i < n; i++) {
    crc ^= (uint16_t)((uint16_t)s[i] << 8);
    for (int b = 0; b < 8; b++)
      crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
  }
  return crc;
}

uint16_t kiln__redis_slot(const char *key, size_t n) {
  const char *open = memchr(key, '{', n);
  if (open) {
    size_t rest = n - (size_t)(open - key) - 1;
    const char *close = memchr(open + 1, '}', rest);
    if (close && close > open + 1) {
      key = open + 1;
      n = (size_t)(close - key);
    }
  }
  return kiln__redis_crc16((const uint8_t *)key, n) & (KILN__REDIS_SLOTS - 1);
}

/* Decimal s[0..n) in [0, hi]; -1 otherwise. */
static long decimal(const char *s, size_t n, long hi) {
  if (n == 0 || n > 10) return -1;
  long v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return -1;
    v = v * 10 + (s[i] - '0');
  }
  return v > hi ? -1 : v;
}

bool kiln__redis_parse_redirect(const char *err, size_t n, kiln__redis_redirect *out) {
  memset(out, 0, sizeof *out);
  size_t word;
  if (n > 6 && memcmp(err, "MOVED ", 6) == 0) {
    word = 6;
  } else if (n > 4 && memcmp(err, "ASK ", 4) == 0) {
    out->ask = true;
    word = 4;
  } else {
    return false;
  }
  const char *p = err + word, *end = err + n;
  const char *sp = memchr(p, ' ', (size_t)(end - p));
  if (!sp) return false;
  long slot = decimal(p, (size_t)(sp - p), KILN__REDIS_SLOTS - 1);
  if (slot < 0) return false;
  const char *addr = sp + 1;
  /* The port follows the last colon (IPv6 hosts hold colons of their own). */
  const char *colon = NULL;
  for (const char *q = addr; q < end; q++)
    if (*q == ':') colon = q;
  if (!colon) return false;
  long port = decimal(colon + 1, (size_t)(end - colon - 1), 65535);
  size_t hostn = (size_t)(colon - addr);
  if (port < 1 || hostn >= KILN__REDIS_HOST_MAX) return false;
  for (size_t i = 0; i < hostn; i++)
    if ((unsigned char)addr[i] <= ' ') return false;
  memcpy(out->host, addr, hostn);
  out->host[hostn] = 0;
  out->slot = (uint16_t)slot;
  out->port = (int)port;
  return true;
}

int kiln__redis_walk_slots(const redisReply *rep, kiln__redis_range_fn fn, void *ctx, char *why,
                           size_t whyn) {
  if (!rep || rep->type != REDIS_REPLY_ARRAY) {
    snprintf(why, whyn, "CLUSTER SLOTS answered %s, not an array",
             rep && rep->type == REDIS_REPLY_ERROR ? rep->str : "something else");
    return -1;
  }
  for (size_t i = 0; i < rep->elements; i++) {
    const redisReply *r = rep->element[i];
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 ||
        r->element[0]->type != REDIS_REPLY_INTEGER || r->element[1]->type != REDIS_REPLY_INTEGER) {
      snprintf(why, whyn, "CLUSTER SLOTS range %zu is not [first, last, primary, ...]", i);
      return -1;
    }
    long long first = r->element[0]->integer, last = r->element[1]->integer;
    if (first < 0 || last < first || last >= KILN__REDIS_SLOTS) {
      snprintf(why, whyn, "CLUSTER SLOTS range %zu (%lld-%lld) is out of bounds", i, first, last);
      return -1;
    }
    const redisReply *node = r->element[2];
    if (node->type != REDIS_REPLY_ARRAY || node->elements < 2 ||
        node->element[0]->type != REDIS_REPLY_STRING ||
        node->element[1]->type != REDIS_REPLY_INTEGER) {
      snprintf(why, whyn, "CLUSTER SLOTS range %zu has no primary [host, port]", i);
      return -1;
    }
    const redisReply *h = node->element[0];
    long long port = node->element[1]->integer;
    if (h->len >= KILN__REDIS_HOST_MAX || memchr(h->str, 0, h->len) || port < 1 || port > 65535) {
      snprintf(why, whyn, "CLUSTER SLOTS range %zu names an unusable address", i);
      return -1;
    }
    int rc = fn(ctx, (uint16_t)first, (uint16_t)last, h->str, (int)port);
    if (rc) return rc;
  }
  return 0;
}
