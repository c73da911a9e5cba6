/* Per-client overrides of the server-wide quotas: a token's own limits
 * (`memory=... buffers=... queue=...` on its line of kilnd's --tokens file).
 * One table, replaced whole on a token reload, consulted by the buffer
 * store (memory, buffer count) and the scheduler (queued executions) under
 * their own locks. A client not in the table, or a field left 0, gets the
 * server-wide value.
 */
#ifndef KILN_EXECUTOR_QUOTA_H
#define KILN_EXECUTOR_QUOTA_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_client_quota {
  const char *client;    /* copied by kiln_quota_table_make */
  uint64_t memory_bytes; /* server-resident buffer bytes; 0: the server-wide quota */
  uint32_t buffers;      /* buffers held at once; 0: the server-wide limit */
  uint32_t queued;       /* executions queued at once; 0: the server-wide limit */
} kiln_client_quota;

typedef struct kiln_quota_table kiln_quota_table;

/* A table holding copies of q[0..n); *out NULL when n is 0. */
int kiln_quota_table_make(const kiln_client_quota *q, size_t n, kiln_quota_table **out,
                          kiln_status *st);
void kiln_quota_table_free(kiln_quota_table *t);
/* The entry of client, or NULL (also for a NULL table). */
const kiln_client_quota *kiln_quota_table_find(const kiln_quota_table *t, const char *client);

#ifdef __cplusplus
}
#endif
#endif /* KILN_EXECUTOR_QUOTA_H */
