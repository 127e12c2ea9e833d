// \brief The tile configurations of the SM90 wgrad GEMM and the one heuristic that picks among them.
// Torch-free and host-only: shared by the host entries and the C++ tests.
#pragma once

#include <cstdint>

#include "kernels/common/layout.h"

namespace wgrad {

// Every config is BLOCK_M = 128 x BLOCK_N (two consumer warpgroups of BLOCK_N/2 columns) x BLOCK_K = 128.
constexpr int kBlockM = 128;
constexpr int kBlockK = 128;

// BLOCK_N candidates. Each consumer warpgroup owns BLOCK_N/2 columns (mma_atoms.h), so BLOCK_N/2 must
// be a multiple of 8 (WGMMA N, and whole 8-row swizzle atoms of the B tile). Upper bound: each
// consumer thread holds BLOCK_N/2 fp32 accumulators, BLOCK_N/2 scratch WGMMA accumulators and BLOCK_N/8
// column scales within its register budget. Three widths so that some tile count fills the last wave.
constexpr int kBlockNCandidates[] = {128, 144, 160};

// The m-grouped GEMM's tile width: each consumer warpgroup's 128 columns are one block column of b's
// 128x128 block scales (MainloopSm90::mma_tile_block_scaled).
constexpr int kMGroupedBlockN = 256;

// Shared memory one pipeline stage needs: A and B tiles plus one column of fp32 scales for each.
constexpr int64_t stage_bytes(int block_n) {
  return int64_t{kBlockM} * kBlockK + int64_t{block_n} * kBlockK + 4 * (kBlockM + align_up(block_n, 32));
}
// The epilogue stages each consumer warpgroup's 128 x BLOCK_N/2 block in kEpilogueSlices row slices of
// 64 rows (one TMA reduce-add store each, the buffer reused in between): half the smem of a whole
// tile, which buys every BLOCK_N one more pipeline stage.
constexpr int kEpilogueSlices = 2;
constexpr int kEpilogueSliceRows = kBlockM / kEpilogueSlices;
constexpr int epilogue_slice_cols(int block_n) { return block_n / 2; }
constexpr int64_t epilogue_bytes(int block_n) { return int64_t{4} * 2 * kEpilogueSliceRows * epilogue_slice_cols(block_n); }
// Where a slice of fp32 out is whole boxes of 32 columns (128-byte rows), the loaded epilogue keeps it in the
// 128B swizzle, whose boxes its float2 adds reach without bank conflicts (epilogue_sm90.cuh: Fp32SliceLayout);
// elsewhere a slice is plain rows, one TMA box.
constexpr int kFp32OutSwizzledBoxCols = 32;
constexpr bool fp32_out_swizzled(int block_n, bool load_out) {
  return load_out && epilogue_slice_cols(block_n) % kFp32OutSwizzledBoxCols == 0;
}
constexpr int fp32_out_box_cols(int block_n, bool load_out) {
  return fp32_out_swizzled(block_n, load_out) ? kFp32OutSwizzledBoxCols : epilogue_slice_cols(block_n);
}

// 227 KB opt-in limit of dynamic shared memory per block, minus room for the pipeline's barriers and
// alignment padding (launch_gemm_sm90_bn asserts the real size).
constexpr int64_t kSmemBudgetBytes = 232448 - 512;
constexpr int kMaxStages = 6;

// The fp32 epilogue with out loaded ahead (EpilogueLoadedSm90) holds a whole tile of fp32 out, plus its
// four barriers.
constexpr int64_t loaded_out_bytes(int block_n) { return int64_t{4} * kBlockM * block_n + 128; }

constexpr int stages_for(int block_n, bool load_out = false) {
  const int64_t epilogue = load_out ? loaded_out_bytes(block_n) : epilogue_bytes(block_n);
  int s = static_cast<int>((kSmemBudgetBytes - epilogue) / stage_bytes(block_n));
  return s > kMaxStages ? kMaxStages : s;
}

// Which fp32 epilogue a call runs, from the K of its tiles (dense K, or the mean K_g of a k-grouped call): out
// loaded ahead where a tile's K blocks take less time than its out window's traffic, the reduce-add (one
// pipeline stage more, and no wait for each tile's stores) beyond. Measured (decisions 0040, 0041), loaded at
// BLOCK_N 128 against the reduce-add: faster from K = 256 to 1024 (dense 4096 x 4096 x 1024: 4 %; 16 to 64
// experts: 16-23 %), slower from K = 2048 on (8-14 %).
constexpr int64_t kLoadedOutMaxK = 1024;
constexpr bool use_loaded_out(int64_t k_per_tile) { return k_per_tile <= kLoadedOutMaxK; }
// The m-grouped GEMM: a stage holds the A and B tiles and A's scales (B's block scales are read from global
// memory), and the bf16 epilogue stages a whole tile (each warpgroup's 128 x 128 bf16), so that a tile's
// stores never wait for one another. Three stages fit beside it.
constexpr int64_t kMGroupedStageBytes = int64_t{kBlockM} * kBlockK + int64_t{kMGroupedBlockN} * kBlockK + 4 * kBlockM;
constexpr int64_t kMGroupedEpilogueBytes = int64_t{2} * kBlockM * kMGroupedBlockN;
constexpr int kMGroupedStages = static_cast<int>((kSmemBudgetBytes - kMGroupedEpilogueBytes) / kMGroupedStageBytes) > kMaxStages
                                    ? kMaxStages
                                    : static_cast<int>((kSmemBudgetBytes - kMGroupedEpilogueBytes) / kMGroupedStageBytes);

// Relative cost of a tile of width block_n, in units of columns: block_n + a fixed part. The kernel is
// bound by shared-memory reads (mma_atoms.h): per K block a tile's WGMMAs read the A tile twice (once
// per warpgroup) and the B tile twice (once per m64 block), 2 * 128 + 2 * block_n rows of 128 bytes, so
// a tile costs in proportion to block_n + 128. (Fitted against a BLOCK_N sweep of the twelve seed
// shapes, scripts/profile_dense.py: this picks the measured-best width on each.)
constexpr int64_t kTileFixedCostColumns = 128;

// CTAs of a cluster take adjacent n blocks of one m block and share the A tile by TMA multicast.
// 1 = no cluster. 2 was measured slower on the seed shapes: the two CTAs' pipelines run in lockstep and
// an odd number of n blocks leaves a phantom tile.
constexpr int kClusterN = 1;

// Picks BLOCK_N for an M x N output repeated `batches` times (the groups of a k-grouped GEMM), run
// persistently on `num_sms` SMs in clusters of kClusterN: minimises (waves, rounded up) x per-tile
// cost. Ties go to the wider tile.
inline int select_block_n(int64_t m, int64_t n, int64_t batches, int num_sms) {
  int best = kBlockNCandidates[0];
  int64_t best_cost = -1;
  const int64_t clusters = num_sms / kClusterN > 0 ? num_sms / kClusterN : 1;
  for (int bn : kBlockNCandidates) {
    const int64_t cluster_tiles = ceil_div(m, kBlockM) * ceil_div(ceil_div(n, bn), kClusterN) * (batches > 0 ? batches : 1);
    const int64_t waves = ceil_div(cluster_tiles, clusters);
    const int64_t cost = waves * (bn + kTileFixedCostColumns);
    if (best_cost < 0 || cost < best_cost || (cost == best_cost && bn > best)) {
      best = bn;
      best_cost = cost;
    }
  }
  return best;
}

// An fp32 GEMM call's tile width and epilogue. forced_block_n: 0 (the heuristic) or one of kBlockNCandidates;
// forced_load_out: -1 (the heuristic), 0 (reduce-add) or 1 (loaded). Out loaded ahead takes the narrowest
// width: its whole-tile buffer leaves 4 pipeline stages there (BLOCK_N 160: 3), and its slices are whole
// swizzled boxes (fp32_out_swizzled); measured 4-13 % faster than select_block_n's width (160 on those shapes)
// from 256 to 1024 tokens per expert (decision 0041).
struct GemmConfig {
  int block_n;
  bool load_out;
};
inline GemmConfig select_fp32_config(int64_t m, int64_t n, int64_t batches, int64_t k_per_tile, int num_sms,
                                     int forced_block_n, int forced_load_out) {
  const bool load_out = forced_load_out >= 0 ? forced_load_out == 1 : use_loaded_out(k_per_tile);
  int block_n = forced_block_n;
  if (block_n == 0) block_n = load_out ? kBlockNCandidates[0] : select_block_n(m, n, batches, num_sms);
  return {block_n, load_out};
}

// A bf16 weight-gradient call's tile width (forced_block_n: 0 or one of kBlockNCandidates): with K <= 512 per
// tile the narrowest, else select_block_n's. Measured (decision 0041): 6-7 % faster than the heuristic's width
// on 32 experts of ~512 tokens (7168 x 2048 and 2048 x 7168), 2 % slower on 8 experts of ~2048.
constexpr int64_t kBf16NarrowMaxK = 512;
inline int select_bf16_block_n(int64_t m, int64_t n, int64_t batches, int64_t k_per_tile, int num_sms,
                               int forced_block_n) {
  if (forced_block_n != 0) return forced_block_n;
  return k_per_tile <= kBf16NarrowMaxK ? kBlockNCandidates[0] : select_block_n(m, n, batches, num_sms);
}

}  // namespace wgrad
