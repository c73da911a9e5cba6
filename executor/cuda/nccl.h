/* NCCL, loaded lazily (dlopen("libnccl.so.2"), env KILN_NCCL_LIB names
 * another file) like the driver: the unique id that a mesh's first rank
 * mints and publishes for the others (cache/rendezvous.h; ncclGetUniqueId
 * needs no GPU), and meshes of cuda devices that span hosts.
 *
 * Within one process the cuda backend makes its own communicators: one per
 * device set and replica group, created at the first collective that needs
 * it and reused (cuda_backend.c; nccl_api.h has the internals). A mesh
 * across hosts needs the id agreed first; kiln_cuda_mesh_open then creates
 * this host's ranks of it, and kiln_cuda_mesh_collective runs a collective
 * over the whole mesh with this host's buffers.
 *
 * Nothing here needs the toolkit's headers.
 */
#ifndef KILN_EXECUTOR_CUDA_NCCL_H
#define KILN_EXECUTOR_CUDA_NCCL_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_NCCL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */

typedef struct kiln_backend kiln_backend;
typedef struct kiln_device kiln_device;
typedef struct kiln_collective kiln_collective;
typedef struct kiln__nccl_clique kiln__nccl_clique;

/* Mints a new NCCL unique id into id (n must be KILN_NCCL_ID_BYTES); the
 * signature of a kiln_rendezvous_mint_fn (ctx unused). No libnccl, or
 * ncclGetUniqueId failing, is KILN_EUNAVAIL saying which. */
int kiln_nccl_mint_id(void *ctx, uint8_t *id, size_t n, kiln_status *st);

/* This host's part of a mesh of nranks cuda devices across hosts. */
typedef struct kiln_cuda_mesh kiln_cuda_mesh;

/* Creates ranks first .. first + n - 1 of a communicator of nranks on this
 * host's devices[0..n) (all of backend b, which must be the cuda backend),
 * from the id every rank agreed on. Waits for the other hosts' ranks at
 * most timeout_s (<= 0: 60 s): past it, KILN_EDEADLINE naming the init.
 * Built without CUDA, or b not cuda: KILN_EUNAVAIL. */
int kiln_cuda_mesh_open(kiln_backend *b, const uint8_t id[KILN_NCCL_ID_BYTES], uint32_t nranks,
                        uint32_t first, kiln_device *const *devices, uint32_t n, double timeout_s,
                        kiln_cuda_mesh **out, kiln_status *st);
void kiln_cuda_mesh_close(kiln_cuda_mesh *m); /* NULL is a no-op */

/* A collective over the whole mesh (kiln_collective as for kiln_comm:
 * op, dtype, reduce_op, count per rank; send/recv hold this host's n
 * ranks' buffers, in rank order; collective-permute pairs name global
 * ranks). Returns once this host's results are in its buffers, or fails
 * with a status naming the NCCL call; past timeout_s (<= 0: 60 s) the
 * mesh is aborted (KILN_EDEADLINE) and every later call fails until it is
 * opened again. */
int kiln_cuda_mesh_collective(kiln_cuda_mesh *m, const kiln_collective *desc, double timeout_s,
                              kiln_status *st);

#ifdef __cplusplus
}
#endif
#endif /* KILN_EXECUTOR_CUDA_NCCL_H */
