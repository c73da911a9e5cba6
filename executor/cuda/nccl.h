/* NCCL, loaded lazily (dlopen("libnccl.so.2")) like the driver: here only
 * the unique id that a mesh's first rank mints and publishes for the
 * others (cache/rendezvous.h). ncclGetUniqueId needs no GPU. Communicators
 * (ncclCommInitRank, grouped when one thread drives several devices) come
 * with the device pool's execution.
 */
#ifndef KILN_EXECUTOR_CUDA_NCCL_H
#define KILN_EXECUTOR_CUDA_NCCL_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define KILN_NCCL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */

/* Mints a new NCCL unique id into id (n must be KILN_NCCL_ID_BYTES); the
 * signature of a kiln_rendezvous_mint_fn (ctx unused). No libnccl, or
 * ncclGetUniqueId failing, is KILN_EUNAVAIL saying which. Env
 * KILN_NCCL_LIB names another file to open. */
int kiln_nccl_mint_id(void *ctx, uint8_t *id, size_t n, kiln_status *st);

#endif /* KILN_EXECUTOR_CUDA_NCCL_H */
