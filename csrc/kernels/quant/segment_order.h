// \brief Torch-free, CUDA-free rule of the MoE segments cast's automatic tile order (TileOrder in
// colwise_tile_order.cuh): shared by the kernel (choose_segment_order), the host's per-shape table
// (auto_strips of ColwiseSm90Params) and the C++ tests.
#pragma once

#include <cstdint>

#include "kernels/common/layout.h"

namespace wgrad::quant {

constexpr int32_t kMaxAutoStrip = 64;  // longer strips: ranges
constexpr int32_t kMinAutoStrip = 4;   // shorter strips: row-major

// Tiles of the busiest worker when strips of S blocks are dealt as the kernel deals them (TileCursor):
// U = ceil(B / S) C units (B blocks per column, C column tiles), unit u to CTA u % ctas; a column's last
// strip has L = B - (ceil(B / S) - 1) S blocks (its units are the last C). CTA g then holds
// S n(g) - (S - L) m(g) tiles, n(g) its units and m(g) its short ones, both largest for g = 0:
//     S qU - (S - L) (qU - qA) + [rU > 0] L + [rA > 0] (S - L),
// qX, rX = X / ctas, X % ctas for X = U and A = U - C. With several groups per CTA (shared strips) a
// CTA's tiles go to its groups in turn, so its busiest group holds ceil(tiles / groups); one group per
// CTA: the worker is the CTA.
WGRAD_HOST_DEVICE inline int64_t strip_busiest_worker(int32_t s, int32_t blocks_per_col, int32_t num_col_tiles,
                                                      int32_t workers, int32_t groups) {
  const int64_t strips = (blocks_per_col + s - 1) / s;
  const int64_t ctas = workers / groups;
  const int64_t u = strips * num_col_tiles, a = u - num_col_tiles;
  const int64_t last = blocks_per_col - (strips - 1) * s;
  const int64_t qu = u / ctas, qa = a / ctas;
  const int64_t cta = s * qu - (s - last) * (qu - qa) + (u % ctas > 0 ? last : 0) + (a % ctas > 0 ? s - last : 0);
  return (cta + groups - 1) / groups;
}

// May the rule take a strip of S blocks? S a multiple of the groups per CTA (with shared strips every
// group then takes the same blocks of every unit; strips of 17 and 19 ran 1-8 points under 18 on all four
// shapes that take 18, H200), at most a fifth of the CTAs without a unit (row-major keeps them
// all busy; 8192 x 1536: strips of 9 left 36 of 132 idle and ran 6 points under row-major, 4096 x 7168:
// strips of 18 leave 20 idle and are 10 points faster), and its busiest worker no busier than `allowed`
// tiles.
WGRAD_HOST_DEVICE inline bool strip_allowed(int32_t s, int32_t blocks_per_col, int32_t num_col_tiles, int32_t workers,
                                            int32_t groups, int64_t allowed) {
  const int64_t units = int64_t{(blocks_per_col + s - 1) / s} * num_col_tiles;
  return s % groups == 0 && 5 * units >= 4 * int64_t{workers / groups} &&
         strip_busiest_worker(s, blocks_per_col, num_col_tiles, workers, groups) <= allowed;
}

// Row-major's busiest worker: ceil(B C / W) tiles.
WGRAD_HOST_DEVICE inline int32_t row_major_busiest_worker(int32_t blocks_per_col, int32_t num_col_tiles,
                                                          int32_t workers) {
  return static_cast<int32_t>((int64_t{blocks_per_col} * num_col_tiles + workers - 1) / workers);
}

// Segments whose starts are all multiples of 16 bytes of q_t (and some not of 32) stay row-major up to
// this many tiles per worker: row-major writes their shared sectors as whole 16-byte halves, and strips
// ran 2-11 points under it there (H200: 8192 x 1536 / 2112 / 2560, 3-4 tiles per group,
// row-major 83.4 / 79.3 / 79.3 % against strips of 6 / 3 / 12 at 72.7 / 77.3 / 75.3 %); from 6 tiles per
// group on, strips win for them too (4096 x 7168: 77.4 against 71.8 %).
constexpr int32_t kMaxRowMajorTiles16 = 4;

// Every split stays row-major up to this many tiles per worker: strips there are short (a CTA's groups walk
// a few blocks each) and, since the row-major launches take a kernel without strips
// (SegmentTiles::kRowMajorBlocks), it ran 5-10 points of a copy ahead of them (H200, % of a copy,
// row-major / the strips an earlier rule took: 8192 x 1536 in the benchmark's 8 unaligned segments 71.1 /
// 61.2 (6), in 32 random ones 63.9 / 53.6 (9); 4096 x 2112 in 16 random segments 59.7 / 49.5 (6)); at 4
// tiles per worker strips of 12 were ahead (8192 x 2560: 70.8 against 68.7, in 16 random segments 62.5
// against 56.9).
constexpr int32_t kMaxRowMajorTiles = 3;

// Shapes of at least this many tiles per worker may take a strip that gives the busiest worker one tile
// more than row-major when no strip keeps row-major's balance (H200, unaligned /
// 16-aligned sizes, % of a copy): 16384 x 7168 (19 per group), strips of 18 (20) 2-5 points over every
// balanced strip; at 10 per group, 8192 x 7168 strips of 9 73.0-74.9 / 75.1-75.5 against row-major's
// 61.9-62.7 / 66.0-66.9, 2048 x 24576 strips of 12 68.9 / 72.7 against 65.4 / 61.4; but at 8, 2048 x 18432
// strips of 6 66.1 / 65.2 against row-major's 67.3 / 66.7.
constexpr int32_t kMinTilesForOneMore = 10;

// The rule's value for ranges, which the kernel's automatic order shares among a CTA's groups (TileOrder:
// strip 0, shared): every CTA one contiguous range of about T / ctas tiles in column-major order, its groups
// taking them in turn (one group per CTA: one range per group). They keep row-major's balance
// (the busiest group holds ceil(ceil(T / ctas) / groups) = ceil(T / workers) tiles) and carry the sectors
// inside each range. Where no strip keeps row-major's balance they ran faster than the strip with one tile
// more and than row-major (H200, three measurements, % of a copy, unaligned / 16-aligned, their gain over
// that strip: 8192 x 7168 +0.8 to +3.8 / +0.7 to +3.6, 8192 x 10240 +2.5 / +2.8, 16384 x 7168 +1.1 to
// +1.6 / +0.8 to +1.5, 8192 x 18432 +2.6 / +2.8, 32768 x 7168 +2.7 / +3.6, and over row-major at 8192 x 5120,
// 7 tiles per group, +2.8 / +7.4), but not on small shapes (8192 x 2112, 3 tiles per group: 62-64 against
// row-major's 69-70 %), nor in place of a balanced strip (4096 x 7168, strips of 18: 1-3 points under).
constexpr int32_t kSharedRanges = 0;
// Shared ranges from this many tiles per group on (fewer: row-major).
constexpr int32_t kMinTilesForSharedRanges = 6;

// The tiles per worker the rule allows in its two tries (see auto_segment_strip): row-major's, then, on
// shapes of at least kMinTilesForOneMore tiles per worker, one more (one group per CTA only: with several,
// shared ranges come first).
WGRAD_HOST_DEVICE inline int32_t strip_allowance(int32_t per_worker, int try_index) {
  return try_index == 0 ? per_worker : per_worker >= kMinTilesForOneMore ? per_worker + 1 : 0;
}

// The longest strip the rule tries when it allows `allowed` tiles per worker.
WGRAD_HOST_DEVICE inline int32_t longest_strip(int32_t groups, int32_t allowed) {
  return groups * allowed < kMaxAutoStrip ? groups * allowed : kMaxAutoStrip;
}

// The orders the rule takes without trying strips, or -1: 0 (ranges, shared by a CTA's groups) beyond
// kMaxAutoStrip tiles per worker; 1 (row-major) up to kMaxRowMajorTiles,
// and for segments that all start on multiples of 16 bytes up to kMaxRowMajorTiles16.
WGRAD_HOST_DEVICE inline int32_t fixed_segment_strip(int32_t per_worker, bool starts16) {
  if (per_worker > kMaxAutoStrip) return 0;
  if (per_worker <= kMaxRowMajorTiles || (starts16 && per_worker <= kMaxRowMajorTiles16)) return 1;
  return -1;
}

// The rule for segments that start inside a sector (the measurements are beside each constant above): 0
// (ranges, shared by a CTA's groups) beyond kMaxAutoStrip tiles per worker, else the longest strip S
// in [kMinAutoStrip, min(groups * allowed, kMaxAutoStrip)] that strip_allowed takes with allowed =
// row-major's busiest worker; failing that, with several groups per CTA and at least
// kMinTilesForSharedRanges tiles per worker, kSharedRanges (0); with one group per CTA, on shapes of at
// least kMinTilesForOneMore tiles per worker, a strip with one tile more (measured without shared ranges:
// 16384 x 7168 strips of 18 leave a group 20 tiles against row-major's 19 and ran 2-5 points faster than
// every balanced strip; 8192 x 7168: strips of 9, 11 against 10, +10 points over row-major); failing all, 1
// (row-major). Row-major too up to kMaxRowMajorTiles tiles per worker, and for starts16 (every segment starts
// on a multiple of 16 bytes of q_t) up to kMaxRowMajorTiles16.
// One rule for the host's table and the kernel's fallback (choose_segment_order): each caller tries the
// strips first, first + step, ... up to the longest (the host all of them, a lane of a warp every 32nd),
// and `combine` takes the longest allowed one over the callers that share the search (the host: itself;
// the kernel: the warp's maximum).
template <class Combine>
WGRAD_HOST_DEVICE inline int32_t segment_strip_rule(int32_t blocks_per_col, int32_t num_col_tiles, int32_t workers,
                                                    int32_t groups, bool starts16, int32_t first, int32_t step,
                                                    Combine combine) {
  const int32_t per_worker = row_major_busiest_worker(blocks_per_col, num_col_tiles, workers);
  const int32_t fixed = fixed_segment_strip(per_worker, starts16);
  if (fixed >= 0) return fixed;
  for (int try_index = 0; try_index < 2; ++try_index) {
    // (The same for every caller that shares the search: no caller leaves it alone.)
    if (try_index == 1 && groups > 1 && per_worker >= kMinTilesForSharedRanges) return kSharedRanges;
    const int32_t allowed = strip_allowance(per_worker, try_index);
    const int32_t longest = longest_strip(groups, allowed);
    int32_t best = 1;
    for (int32_t s = first; s <= longest; s += step) {
      if (strip_allowed(s, blocks_per_col, num_col_tiles, workers, groups, allowed)) best = s;
    }
    best = combine(best);
    if (best >= kMinAutoStrip) return best;
  }
  return 1;
}

struct OneSearcher {  // segment_strip_rule's combine for a caller that tries every strip itself
  WGRAD_HOST_DEVICE int32_t operator()(int32_t best) const { return best; }
};

WGRAD_HOST_DEVICE inline int32_t auto_segment_strip(int32_t blocks_per_col, int32_t num_col_tiles, int32_t workers,
                                                    int32_t groups, bool starts16) {
  return segment_strip_rule(blocks_per_col, num_col_tiles, workers, groups, starts16, 1, 1, OneSearcher{});
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

// The count of used row blocks that decides which segments kernel a launch takes (the host does not read the
// sizes): ceil(rows / 128) + G / 2, the middle of segment_block_range. B = rows / 128 + the sum over the G
// segments of what rounding each up to whole blocks adds (each in [0, 1)), so B lies near the middle for
// sizes that are not multiples of 128 (the benchmark's uneven split: 68 at 8192 rows in 8 segments). Where
// the automatic order at this B is row-major (for both kinds of starts), the launch takes the kernel
// without strips (SegmentTiles::kRowMajorBlocks; it ran 2-4.5 points of a copy faster than the kernel of any
// order on the same row-major walk, H200) for every B, also the rarer ones for which the rule
// would take strips: the order changes only the speed, never the bits.
WGRAD_HOST_DEVICE constexpr int64_t typical_segment_blocks(int64_t rows, int64_t segments) {
  const SegmentBlockRange range = segment_block_range(rows, segments);
  const int64_t mid = range.first + segments / 2;
  return mid < range.last ? mid : range.last;
}

// Packed tiles (build_packed_tiles in colwise_tile_order.cuh): a block of `boxes` boxes of 16 rows (in
// [1, 8]) with `prefix` boxes in the blocks before it lies across a window of kPackedWindowBoxes boxes when
// it does not end in the window it starts in; it starts a tile when it is the first block, lies across a
// window, follows a block that does, or starts a new window. Then a tile's blocks lie in one window from
// its first block's box on, or it is one block: at most 8 boxes, one stage.
// (Prefixes are >= 0: windows by shifts and masks.)
constexpr int32_t kPackedWindowBoxes = 8;
constexpr int32_t kPackedBoxRows = 16;  // the column kernel's box (ColwiseSm90Config::kBoxRows)
WGRAD_HOST_DEVICE constexpr int32_t packed_block_boxes(int32_t rows) {  // the boxes a block of `rows` rows takes
  return (rows + kPackedBoxRows - 1) / kPackedBoxRows;
}
WGRAD_HOST_DEVICE constexpr bool packed_block_crosses_window(int32_t prefix, int32_t boxes) {
  return (prefix & (kPackedWindowBoxes - 1)) + boxes > kPackedWindowBoxes;
}
WGRAD_HOST_DEVICE constexpr bool packed_window_changes(int32_t prev_prefix, int32_t prefix) {
  return (prev_prefix >> 3) != (prefix >> 3);
}
// (build_packed_tiles evaluates the same terms in this order, reading the previous block only when needed.)
WGRAD_HOST_DEVICE constexpr bool packed_block_starts_tile(bool first, int32_t prev_prefix, int32_t prev_boxes,
                                                          int32_t prefix, int32_t boxes) {
  return first || packed_block_crosses_window(prefix, boxes) || packed_block_crosses_window(prev_prefix, prev_boxes) ||
         packed_window_changes(prev_prefix, prefix);
}
static_assert(kPackedWindowBoxes == 8, "the window of packed_block_starts_tile is 1 << 3 boxes");

}  // namespace wgrad::quant
