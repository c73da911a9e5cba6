/* The per-client quota table (quota.h): a sorted array of copies, looked
 * up by binary search on the client name.
 */
#include "executor/quota.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"

struct kiln_quota_table {
  kiln_client_quota *v;
  size_t n;
};

static int by_client(const void *a, const void *b) {
  return strcmp(((const kiln_client_quota *)a)->client, ((const kiln_client_quota *)b)->client);
}

void kiln_quota_table_free(kiln_quota_table *t) {
  if (t == NULL) return;
  for (size_t i = 0; i < t->n; i++) kiln_free((char *)t->v[i].client);
  kiln_free(t->v);
  kiln_free(t);
}

int kiln_quota_table_make(const kiln_client_quota *q, size_t n, kiln_quota_table **out,
                          kiln_status *st) {
  *out = NULL;
  if (n == 0) return 0;
  kiln_quota_table *t = kiln_calloc(1, sizeof *t);
  if (t) t->v = kiln_calloc(n, sizeof *t->v);
  if (t == NULL || t->v == NULL) {
    kiln_free(t);
    return kiln_status_set(st, KILN_ENOMEM, "quotas", "out of memory");
  }
  for (size_t i = 0; i < n; i++) {
    t->v[i] = q[i];
    t->v[i].client = kiln_strdup(q[i].client ? q[i].client : "");
    if (t->v[i].client == NULL) {
      kiln_quota_table_free(t);
      return kiln_status_set(st, KILN_ENOMEM, "quotas", "out of memory");
    }
    t->n = i + 1;
  }
  qsort(t->v, t->n, sizeof *t->v, by_client);
  for (size_t i = 1; i < t->n; i++)
    if (strcmp(t->v[i - 1].client, t->v[i].client) == 0) {
      int rc = kiln_status_set(st, KILN_EINVAL, "quotas", "client '%.64s' has two quota entries",
                               t->v[i].client);
      kiln_quota_table_free(t);
      return rc;
    }
  *out = t;
  return 0;
}

const kiln_client_quota *kiln_quota_table_find(const kiln_quota_table *t, const char *client) {
  if (t == NULL || client == NULL) return NULL;
  kiln_client_quota key = {.client = client};
  return bsearch(&key, t->v, t->n, sizeof *t->v, by_client);
}
