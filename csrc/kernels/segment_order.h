// \brief Torch-free, CUDA-free rule of the MoE segments cast's automatic tile order (TileOrder in
// quantize_colwise_sm90.cuh): shared by the kernel (choose_segment_order), the host's per-shape table
// (auto_strips of ColwiseSm90Params) and the C++ tests.
#pragma once

#include <cstdint>

#include "layout.h"

namespace wgrad::quant {

constexpr int32_t kMaxAutoStrip = 64;  // longer strips: ranges
constexpr int32_t kMinAutoStrip = 4;   // shorter strips: row-major

// Does a strip of S blocks keep row-major's balance? Row-major gives no consumer group more than
// per_worker = ceil(B C / W) tiles (B blocks per column, C column tiles, W groups). Strips make
// U = ceil(B / S) C units; with several groups per CTA (shared strips) the units go to the W / groups
// CTAs, at most S ceil(U / CTAs) tiles each, a groups-th of them per group; one group per CTA: the same
// formula with groups = 1. (An upper bound: a column's last strip may be shorter.)
WGRAD_HOST_DEVICE inline bool strip_keeps_balance(int32_t s, int32_t blocks_per_col, int32_t num_col_tiles,
                                                  int32_t workers, int32_t groups, int32_t per_worker) {
  const int32_t units = (blocks_per_col + s - 1) / s * num_col_tiles;
  const int32_t ctas = workers / groups;
  const int32_t per_cta = s * ((units + ctas - 1) / ctas);
  return (per_cta + groups - 1) / groups == per_worker;
}

// The rule for segments that start inside a sector (measured in docs/perf-notes.md, sessions 10 and 12):
// 0 (ranges) beyond kMaxAutoStrip tiles per group, else the longest strip S <= min(groups * per_worker,
// kMaxAutoStrip) that keeps the balance, or 1 (row-major) when that is shorter than kMinAutoStrip.
WGRAD_HOST_DEVICE inline int32_t auto_segment_strip(int32_t blocks_per_col, int32_t num_col_tiles, int32_t workers,
                                                    int32_t groups) {
  const int32_t tiles = blocks_per_col * num_col_tiles;
  const int32_t per_worker = (tiles + workers - 1) / workers;
  if (per_worker > kMaxAutoStrip) return 0;
  const int32_t longest = groups * per_worker < kMaxAutoStrip ? groups * per_worker : kMaxAutoStrip;
  for (int32_t s = longest; s >= kMinAutoStrip; --s) {
    if (strip_keeps_balance(s, blocks_per_col, num_col_tiles, workers, groups, per_worker)) return s;
  }
  return 1;
}

// The used row blocks B = sum_g ceil(size_g / 128) of any valid split of `rows` rows into `segments`
// segments lie in [first, last]: first = ceil(rows / 128) (one segment), last = floor((rows + 127 G) /
// 128) (every segment adds at most 127 / 128 of a block). At most G + 1 values.
struct SegmentBlockRange {
  int64_t first;
  int64_t last;
};
WGRAD_HOST_DEVICE constexpr SegmentBlockRange segment_block_range(int64_t rows, int64_t segments) {
  return {ceil_div(rows, kScaleBlockK), (rows + (kScaleBlockK - 1) * segments) / kScaleBlockK};
}

}  // namespace wgrad::quant
