/* Server-resident buffers addressed by handle.
 *
 * A buffer store keeps arrays in device memory (a kiln_buffer of
 * executor/backend.h, host memory on cpu and interp) with their shape,
 * element type and layout, for remote clients under unguessable handles:
 * 128 random bits written as 32 lowercase hex digits. Every buffer belongs to
 * the client that created it; another client naming its handle gets exactly
 * what an unknown handle gets (KILN_ENOTFOUND), so handles leak nothing.
 *
 * Memory is charged to the owning client from the moment an upload reserves
 * it until the bytes are actually freed, which may be after the handle is
 * released (a running Execute may still hold a reference). A client past its
 * quota, or the store past its total, gets KILN_ELIMIT.
 *
 * Lifetime: a kiln_stored is reference counted. The table holds one
 * reference while the handle is live; acquire hands out another, which the
 * caller returns with kiln_buffer_store_unref. The array of a kiln_stored is
 * immutable once added, so holders may read it without the store's lock;
 * only the holder of a taken (donated) buffer may let a run write it.
 *
 * Threads: every function may be called from any thread.
 */
#ifndef KILN_EXECUTOR_BUFFERS_H
#define KILN_EXECUTOR_BUFFERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "executor/quota.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_literal kiln_literal;
typedef struct kiln_buffer kiln_buffer;
typedef struct kiln_shape kiln_shape;
typedef struct kiln_buffer_store kiln_buffer_store;

#define KILN_HANDLE_HEX_LEN 32 /* 128 bits */

/* One stored array. Fields are read-only for holders of a reference. */
typedef struct kiln_stored {
  char handle[KILN_HANDLE_HEX_LEN + 1];
  kiln_buffer *buf;        /* device memory, owned: the array's bytes in shape's layout */
  const kiln_shape *shape; /* an array shape with its layout (NULL: row-major), owned */
  uint64_t bytes;          /* kiln_buffer_size(buf): what the owner is charged */
  int32_t device;          /* where the client asked to place it (the server's id) */
  char *label;             /* free-form, from the client; never NULL */
} kiln_stored;

typedef struct kiln_buffer_store_options {
  uint64_t client_quota_bytes;     /* per client, live plus reserved; 0: no limit */
  uint64_t total_quota_bytes;      /* the whole store; 0: no limit */
  uint32_t max_buffers_per_client; /* 0: no limit */
} kiln_buffer_store_options;

typedef struct kiln_buffer_store_totals {
  uint64_t live_buffers; /* handles in the table */
  uint64_t live_bytes;   /* bytes charged: stored, released-but-held, reserved */
  uint64_t clients;      /* clients holding buffers or reservations */
} kiln_buffer_store_totals;

/* `o` may be NULL (no limits). Fails only with KILN_ENOMEM. */
int kiln_buffer_store_create(const kiln_buffer_store_options *o, kiln_buffer_store **out,
                             kiln_status *st);
/* Replaces the per-client overrides of the quotas (executor/quota.h):
 * charges already made stay; the new limits apply from the next charge. */
int kiln_buffer_store_set_quotas(kiln_buffer_store *s, const kiln_client_quota *q, size_t n,
                                 kiln_status *st);
/* Frees every buffer still stored. References still held must have been
 * returned before. NULL is a no-op. */
void kiln_buffer_store_destroy(kiln_buffer_store *s);

/* Charges `bytes` to `client` ahead of an upload whose data arrives later.
 * KILN_ELIMIT naming the quota when it would be exceeded. */
int kiln_buffer_store_reserve(kiln_buffer_store *s, const char *client, uint64_t bytes,
                              kiln_status *st);
/* Returns a reservation that will not be used (an upload that failed). */
void kiln_buffer_store_unreserve(kiln_buffer_store *s, const char *client, uint64_t bytes);

/* Stores device buffer `buf`, holding an array of `shape` (copied; its
 * layout says how the bytes lie), for `client` under a fresh handle. Takes
 * ownership of buf in every case (freed on failure). A tuple shape, or a
 * buffer whose size is not the shape's, is KILN_EINVAL. When `reserved`,
 * the bytes were reserved before and the reservation becomes the charge;
 * otherwise they are charged now (KILN_ELIMIT over quota). `label` may be
 * NULL. With out non-NULL, *out receives an extra reference. */
int kiln_buffer_store_add(kiln_buffer_store *s, const char *client, kiln_buffer *buf,
                          const kiln_shape *shape, int32_t device, const char *label, bool reserved,
                          kiln_stored **out, kiln_status *st);

/* A literal viewing a stored array in place (no copy): view->data is the
 * buffer's host memory. KILN_EUNIMPL when the device's memory is not host
 * memory or the bytes are not row-major (literals are); the caller then
 * reads or relayouts a copy. The view lives as long as the reference. */
int kiln_stored_view(const kiln_stored *b, kiln_literal *view, kiln_status *st);

/* Reads the array held in `buf`, its bytes laid out as `shape`'s layout
 * says, into dst in row-major order (kiln_shape_bytes(shape) bytes, which
 * must be the buffer's size): a plain read when the layout is row-major, a
 * relayout otherwise. */
int kiln_array_read_row_major(const kiln_buffer *buf, const kiln_shape *shape, void *dst,
                              kiln_status *st);

/* Finds `handle` among `client`'s buffers and returns a reference in *out.
 * With `take`, the handle is also removed from the table (donation,
 * get-and-release): no one else can acquire it after. Unknown, malformed
 * and foreign handles are all KILN_ENOTFOUND. */
int kiln_buffer_store_acquire(kiln_buffer_store *s, const char *client, const char *handle,
                              bool take, kiln_stored **out, kiln_status *st);
/* Returns a reference; the last one frees the array and its charge. NULL is
 * a no-op. */
void kiln_buffer_store_unref(kiln_buffer_store *s, kiln_stored *b);

/* Removes `handle` of `client` from the table. 0 with *bytes its size, or
 * KILN_ENOTFOUND (unknown, malformed or foreign). */
int kiln_buffer_store_release(kiln_buffer_store *s, const char *client, const char *handle,
                              uint64_t *bytes);

/* Leases: the store remembers when each client last used it (reserve, add,
 * acquire, release, or touch), so that the buffers of a client that went
 * away without releasing them (killed) can be reclaimed. touch renews
 * `client`'s lease without creating a record for a client that holds
 * nothing. expire releases every handle of each client idle for longer than
 * `idle_ns`, as kiln_buffer_store_release would (a held reference keeps the
 * array until it is returned); returns how many, with their bytes in *bytes
 * (may be NULL). */
void kiln_buffer_store_touch(kiln_buffer_store *s, const char *client);
uint64_t kiln_buffer_store_expire(kiln_buffer_store *s, int64_t idle_ns, uint64_t *bytes);

/* Bytes charged to `client` now (0 for an unknown client). */
uint64_t kiln_buffer_store_client_bytes(kiln_buffer_store *s, const char *client);
void kiln_buffer_store_get_totals(kiln_buffer_store *s, kiln_buffer_store_totals *out);

/* Writes 16 bytes from the system's random source as 32 hex digits and a
 * NUL into out. Returns 0 or KILN_EIO. */
int kiln_random_hex128(char out[KILN_HANDLE_HEX_LEN + 1]);

#ifdef __cplusplus
}
#endif
#endif /* KILN_EXECUTOR_BUFFERS_H */
