/* ll_units.h: the order in which the LSA dispatch send's warps take their
 * work units, and how a receive block deals its slot copies to its warps.
 * Plain C, so the kernels and a host test share it.
 *
 * The send's index space is E expert-list units, then the row units, then
 * the slot-list fill units; warp w of block b takes unit
 * mep_ll_send_first_unit(...) and then every (grid * warps_per_block)-th.
 * The lists fill the first ceil(E / warps_per_block) blocks warp by warp
 * (block-major: those blocks end their send together and early); every
 * unit after them goes one per block, round robin over the other blocks
 * (block-minor), so a small call's row units each have an SM to
 * themselves. With no block left over, the order is block-major
 * throughout. A bijection on the grid's warps: each pass covers
 * grid * warps_per_block consecutive units exactly once. */
#ifndef MEP_LL_UNITS_H_
#define MEP_LL_UNITS_H_

#ifdef __CUDACC__
#define MEP_LL_UNITS_HD __host__ __device__
#else
#define MEP_LL_UNITS_HD
#endif

static inline MEP_LL_UNITS_HD int mep_ll_send_first_unit(int lists, int block, int warp,
                                                         int grid, int warps_per_block) {
  const int block_major = block * warps_per_block + warp;
  const int list_blocks = (lists + warps_per_block - 1) / warps_per_block;
  const int rest = grid - list_blocks;
  if (block < list_blocks || rest <= 0) return block_major;
  return list_blocks * warps_per_block + warp * rest + (block - list_blocks);
}

/* The receive's row copies: a block deals the slots of its local experts
 * (blockIdx, blockIdx + grid, ...) to its warps round robin, as one
 * sequence: slot j of an expert whose earlier experts in the block filled
 * `dealt` slots goes to warp (dealt + j) % warps. So warp w starts that
 * expert at the slot returned here and takes every warps-th after it;
 * over the whole block each warp copies floor or ceil of slots / warps
 * rows, however the slots fall on the experts. */
static inline MEP_LL_UNITS_HD int mep_ll_deal_first_slot(int warp, int dealt, int warps) {
  return (warp - dealt % warps + warps) % warps;
}

#endif /* MEP_LL_UNITS_H_ */
