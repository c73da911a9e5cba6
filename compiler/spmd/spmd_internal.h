/* What the SPMD files share: tilings (the partitioner's view of a sharding)
 * and the helpers the propagation pass and the partitioner both use.
 *
 * A tiling of an array of rank r over n devices is a device array of shape
 * [tiles[0], ..., tiles[r-1], rep], read row-major: the device at position
 * (c0, ..., c_{r-1}, k) holds tile (c0, ..., c_{r-1}), and the rep devices of
 * one tile hold the same data. Every device holds exactly one tile, so the
 * product of all the counts is n. Replicated, maximal and unknown shardings
 * are the tiling with every count 1 (a maximal sharding computes everywhere,
 * which is correct); last_tile_dim_replicate and replicated last_tile_dims
 * are folded into rep. Manual shardings and subgroups are refused: they
 * mark the values of shard_map regions, which the partitioner builds per
 * device as written.
 *
 * Shards of a dim of size D tiled t ways hold ceil(D/t) elements each; the
 * last ones are padded (their pad holds garbage unless masked).
 */
#ifndef KILN_COMPILER_SPMD_SPMD_INTERNAL_H
#define KILN_COMPILER_SPMD_SPMD_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/arena.h"
#include "common/status.h"
#include "compiler/ir/ir.h"
#include "compiler/spmd/spmd.h"

#define SPMD_MAX_RANK 16

typedef struct spmd_tiling {
  uint32_t rank;
  int64_t tiles[SPMD_MAX_RANK];
  int64_t rep;  /* devices per tile */
  int64_t n;    /* devices in all */
  int64_t *dev; /* n entries, row-major over [tiles..., rep] */
  int64_t *pos; /* pos[device]: its position in dev */
} spmd_tiling;

/* The replicated tiling of rank `rank` over n devices (arena a). */
spmd_tiling *kiln__tiling_replicated(kiln_arena *a, uint32_t rank, int64_t n);
/* The tiling a sharding denotes for an array of rank `rank`; NULL sharding
 * is replicated. Fails (status naming `where`) on manual or malformed
 * shardings and device lists that are not 0..n-1. */
int kiln__tiling_from_sharding(kiln_arena *a, const kiln_sharding *s, uint32_t rank, int64_t n,
                               const char *where, spmd_tiling **out, kiln_status *st);
/* The sharding of a tiling (explicit devices), in arena a. */
kiln_sharding *kiln__tiling_to_sharding(kiln_arena *a, const spmd_tiling *t);
/* A tiling of rank `rank` whose dim j is t's dim map[j] (or an untiled dim
 * when map[j] < 0); t's dims that no j names are folded into rep. */
spmd_tiling *kiln__tiling_derive(kiln_arena *a, const spmd_tiling *t, const int64_t *map,
                                 uint32_t rank);
/* t with the dims fold[d] (true) folded into rep. */
spmd_tiling *kiln__tiling_fold(kiln_arena *a, const spmd_tiling *t, const bool *fold);
/* A tiling that splits every dim x or y splits, as they do (a dim split
 * by both the same way), when the devices allow one; else NULL. */
spmd_tiling *kiln__tiling_merge(kiln_arena *a, const spmd_tiling *x, const spmd_tiling *y);
/* Same tile counts and every device holds the same tile. */
bool kiln__tiling_equal(const spmd_tiling *a, const spmd_tiling *b);
bool kiln__tiling_is_replicated(const spmd_tiling *t);
int64_t kiln__tiling_count(const spmd_tiling *t); /* tiles (devices / rep) */
/* Device `dev`'s tile coordinate along dim d. */
int64_t kiln__tiling_coord(const spmd_tiling *t, int64_t dev, uint32_t d);
/* Whether every device's tile under `from` contains its tile under `to`
 * (a local slice reshards from -> to). */
bool kiln__tiling_covers(const spmd_tiling *from, const spmd_tiling *to);
/* The groups of devices that differ only in their coordinates along the
 * dims dims[d] (true), each ordered by those coordinates row-major: ngroups
 * groups of size members each into *out (arena a). */
int kiln__tiling_groups(kiln_arena *a, const spmd_tiling *t, const bool *dims, int64_t **out,
                        int64_t *ngroups, int64_t *size);

/* Shard size of a dim of size d tiled t ways. */
static inline int64_t kiln__shard_size(int64_t d, int64_t t) { return t > 1 ? (d + t - 1) / t : d; }

/* Bytes a reshard from -> to of an array of `bytes` global bytes moves,
 * roughly: 0 when a local slice does it, else the global bytes. */
int64_t kiln__reshard_cost(const spmd_tiling *from, const spmd_tiling *to, int64_t bytes);

/* ---- the correspondence of dims through ops ---------------------------- */

/* For a reshape from `in` to `out`: map[j] is the in dim that out dim j
 * shares its major elements with (a tiling of one tiles the other the same
 * way when the count divides lim[j]), or -1. */
void kiln__reshape_dims(const kiln_shape *in, const kiln_shape *out, int64_t *map, int64_t *lim);

/* The iteration space of a dot or a convolution: one entry per loop, with
 * the lhs, rhs and output dims it indexes (-1: none). Contracting loops
 * have out < 0; `fixed` loops (convolution windows) must stay untiled. */
typedef struct spmd_loop {
  int64_t l, r, o;
  bool fixed;
} spmd_loop;

/* The loops of ins (dot, or a convolution without feature or batch
 * groups); false when ins is neither. */
bool kiln__contraction_loops(const kiln_module *m, const kiln_instr *ins, spmd_loop *loops,
                             uint32_t *n);

/* The result tiling ins gets from operand k's tiling tk (forward), and the
 * tiling operand k needs for ins to compute result tiling tout locally
 * (backward); NULL when the op has no rule for that operand (dims.c). */
spmd_tiling *kiln__spmd_fwd(kiln_arena *a, const kiln_module *m, const kiln_instr *ins, uint32_t k,
                            const spmd_tiling *tk);
spmd_tiling *kiln__spmd_bwd(kiln_arena *a, const kiln_module *m, const kiln_instr *ins, uint32_t k,
                            const spmd_tiling *tout);

/* For a gather (scatter) of one operand indexed along one dim d
 * (start_index_map / scatter_dims_to_operand_dims {d}) by integer indices,
 * whose slice (window) along d is one element: d when tiling t of the
 * operand splits d and no other dim, else -1. Each device then gathers
 * (scatters) the indices that fall in its shard (partition.c). */
int kiln__indexed_dim(const kiln_module *m, const kiln_instr *ins, const spmd_tiling *t);

/* A gather computed locally, without communication: its result split only
 * along batch dims (the indices split so) and dims that take a whole
 * operand dim no index names (the table split so; e.g. an embedding's
 * feature dim). Of the result tilings the result asks (want), the table
 * (lt0) and the indices (lt1; NULL: replicated) offer, the one resharding
 * the fewest bytes: *tt and *ti the table's and indices' tilings, *tr the
 * result's (which covers want's splits along those dims). False for a
 * gather of another form. */
bool kiln__gather_plan(kiln_arena *a, const kiln_module *m, const kiln_instr *ins,
                       const spmd_tiling *lt0, const spmd_tiling *lt1, const spmd_tiling *want,
                       spmd_tiling **tt, spmd_tiling **ti, spmd_tiling **tr);

/* A gather from a table whose tiling t splits the dim it indexes (as
 * kiln__indexed_dim asks of it) and perhaps dims the result takes whole:
 * that dim, and in *rt the result's tiling (the latter splits passed
 * through) each device's masked local gather has before an all-reduce over
 * the devices splitting the indexed dim; -1 when t splits anything else. */
int kiln__gather_split(kiln_arena *a, const kiln_module *m, const kiln_instr *ins,
                       const spmd_tiling *t, spmd_tiling **rt);

/* A scatter (one operand) computed locally under tiling t of its operand
 * and result: t splits the dim the indices name (as kiln__indexed_dim asks:
 * *d, else -1) and/or operand dims whose window is the whole dim and that
 * no index names, *tu then the updates' tiling (split along those window
 * dims). False when t splits nothing or anything else. */
bool kiln__scatter_plan(kiln_arena *a, const kiln_module *m, const kiln_instr *ins,
                        const spmd_tiling *t, int *d, spmd_tiling **tu);

/* A scatter-add (its computation an add of its parameters) whose updates
 * arrive in tiling lt[2] split along their scatter dims (the indices'
 * batch dims, evenly), when that moves fewer bytes than gathering the
 * updates and indices: each device scatters its updates (tiling *tb: only
 * those splits) at its indices (*ti) into zeros of the operand's shape, an
 * all-reduce (add) over the devices differing along dims[u] of *tb sums
 * them, and the operand (whole) is added. lt[k]: the operands' tilings
 * (NULL: replicated). */
bool kiln__scatter_partial(kiln_arena *a, const kiln_module *m, const kiln_instr *ins,
                           const spmd_tiling *const *lt, spmd_tiling **tb, spmd_tiling **ti,
                           bool *dims);

/* Annotations on an instruction: its sharding= attribute, or for a
 * sharding custom call (with_sharding_constraint, Shardy markers) the
 * sharding it names (sharding=, or the xla.sdy.sharding frontend attribute
 * read against the module's meshes). NULL when there is none. */
int kiln__user_sharding(kiln_arena *a, const kiln_module *m, const kiln_instr *ins,
                        const kiln_sharding **out, kiln_status *st);

/* A manual region's (shard_map's) sharding of value i: of operand i of an
 * xla.sdy.GlobalToLocalShape (its in_shardings), of result i of an
 * xla.sdy.LocalToGlobalShape (out_shardings), for an array of rank `rank`.
 * Only the region's manual axes split it: a region manual over some axes of
 * its mesh holds its values whole along the others. KILN_EUNIMPL naming
 * the instruction for a sharding not understood (a manual axis minor to an
 * automatic one in a dim among them). */
int kiln__sdy_region_sharding(kiln_arena *a, const kiln_module *m, const kiln_instr *ins,
                              uint32_t i, uint32_t rank, const kiln_sharding **out,
                              kiln_status *st);

/* The Shardy sharding text "#sdy.sharding<@mesh, [{"x"}, {}]>" (or the
 * first of a sharding_per_value list) as an HLO sharding, against the
 * module's xla.sdy.meshes frontend attribute. NULL *out when the text is
 * not understood (the annotation is then ignored: propagation decides). */
int kiln__sdy_parse(kiln_arena *a, const kiln_module *m, const char *text, uint32_t rank,
                    const kiln_sharding **out);

/* A manual region's mesh: its axes' sizes and which are manual (at most
 * 16 axes), from its GlobalToLocalShape or LocalToGlobalShape; false when
 * not understood. */
bool kiln__sdy_region_axes(const kiln_module *m, const kiln_instr *ins, int64_t *sizes,
                           bool *manual, uint32_t *naxes);
/* The Shardy sharding (xla.sdy.sharding) of array instruction ins with only
 * the mesh axes keep[k] splitting it; NULL *out when it has none or it is
 * not understood. */
int kiln__sdy_instr_sharding_axes(kiln_arena *a, const kiln_module *m, const kiln_instr *ins,
                                  const bool *keep, const kiln_sharding **out);
/* Whether tiling t of a region's values (a region manual over the axes
 * manual[k] of a mesh of axes sizes[k], device = row-major index) is split
 * only along automatic axes, consistently: every device's tile depends only
 * on its automatic coordinates, and its position among a tile's holders
 * determines its manual ones (so the partitioner's groups and exchanges
 * never mix values of different manual shards). */
bool kiln__tiling_auto_only(const spmd_tiling *t, const int64_t *sizes, const bool *manual,
                            uint32_t naxes);

/* Inlines the calls computation `comp` makes (propagate.c). */
int kiln__spmd_inline_calls(kiln_module *m, uint32_t comp, kiln_status *st);

/* Whether reduce ins may be split into partial reductions combined by an
 * all-reduce with its own reducer (partition.c). */
bool kiln__reduce_splittable(const kiln_module *m, const kiln_instr *ins);

/* Whether the partitioner builds pad, slice or concatenate ins under
 * `want` on n devices by halo exchange (the result split along a dim it
 * moves, every window within reach of the neighbours): its operands then
 * arrive as `want` (a pad's value whole) and *sent receives the
 * collective-permutes it sends (partition.c; the cost model's mirror). */
bool kiln__movement_halo_sent(kiln_arena *a, const kiln_module *m, const kiln_instr *ins,
                              const spmd_tiling *want, int64_t n, kiln_spmd_stats *sent);

/* A dot built as a windowed einsum (partition.c): operand `x` (0 lhs, 1
 * rhs) stays in its tiling `cur`, which splits its dim `dim` (not
 * contracted, not batch) `steps` ways where the dot needs it whole; the
 * result's dim `odim` takes the blocks. Each of the steps - 1 permutes
 * sends block_bytes. */
typedef struct spmd_window {
  int x;
  uint32_t dim, odim;
  int64_t steps, block_bytes;
} spmd_window;

/* Whether dot ins, whose operand x arrives as cur and is needed as need,
 * is built as a windowed einsum under options o on n devices (*w filled). */
bool kiln__window_plan(const kiln_module *m, const kiln_instr *ins, int x, const spmd_tiling *cur,
                       const spmd_tiling *need, const kiln_spmd_options *o, spmd_window *w);

/* ---- the cost model (model.c) ------------------------------------------ */

/* What the model needs to know: the module, the devices and the machine. */
typedef struct spmd_model {
  const kiln_module *m;
  kiln_arena *a; /* tilings the model derives */
  int64_t n;
  double flops_per_s, mem_bytes_per_s, link_bytes_per_s;
  kiln_spmd_options opts; /* the partitioner's (windowed einsum) */
} spmd_model;

/* What a piece of the per-device program costs each device. */
typedef struct spmd_charge {
  double flops, compute_s, comm_s;
  kiln_spmd_stats comm;
} spmd_charge;

/* The machine numbers of o (NULL: defaults) into md. */
void kiln__model_init(spmd_model *md, const kiln_module *m, kiln_arena *a, int64_t n,
                      const kiln_spmd_auto_options *o);

/* The collectives the partitioner's reshard from -> to of an array of
 * global shape g inserts (partition.c's reshard(), step by step). */
void kiln__model_reshard(const spmd_model *md, const kiln_shape *g, const spmd_tiling *from,
                         const spmd_tiling *to, spmd_charge *c);

/* What the partitioner's rule for ins does, given the tilings its operands
 * are in (lt[k]; NULL for operands that are not arrays; for
 * get-tuple-element lt[0] is the element's tiling, NULL: replicated) and
 * the tiling `want` asked of its result (NULL for tuple-valued ins): the
 * tiling it reshards each array operand to (need[k]; NULL for the others)
 * and, into c, its own compute and the collectives it inserts itself (the
 * all-reduce of a split reduction or the reduce-scatter it becomes, and
 * the reshard of its result to want). *whole: it computes ins whole
 * (tuple operands are then gathered too). The reshards of the operands
 * are the caller's to charge. */
void kiln__model_rule(const spmd_model *md, const kiln_instr *ins, spmd_tiling *const *lt,
                      const spmd_tiling *want, spmd_tiling **need, bool *whole, spmd_charge *c);

/* The seconds of a charge's collectives and compute. */
static inline double kiln__charge_seconds(const spmd_charge *c) { return c->compute_s + c->comm_s; }

/* Bytes of the shard of an array of global shape g under t. */
int64_t kiln__shard_bytes(const kiln_shape *g, const spmd_tiling *t);

/* Lifetimes in computation comp for the memory measure: last[i] is the
 * position in comp's instruction list of the last use of its i-th
 * instruction (through aliases; the root and parameters: ninstrs), and
 * counted[i] whether it holds bytes of its own (arrays other than
 * get-tuple-element, bitcast and sharding annotations). Arrays of
 * ninstrs entries, in arena a. */
int kiln__model_lifetimes(kiln_arena *a, const kiln_module *m, uint32_t comp, uint32_t **last,
                          bool **counted);

/* In place (replicas.c): partitioned program m (over `partitions`) as the
 * program every replica of a replicas x partitions mesh runs, its
 * collectives kept within each replica; sets m's replica_count. */
int kiln__spmd_replicate(kiln_module *m, int64_t replicas, int64_t partitions, kiln_status *st);

#endif /* KILN_COMPILER_SPMD_SPMD_INTERNAL_H */
