// Host-side checks of the segments cast's automatic tile order (kernels/quant/segment_order.h).
#include "harness.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/quant/segment_order.h"

namespace {

using wgrad::quant::auto_segment_strip;
using wgrad::quant::kSharedRanges;

// Tiles of the busiest consumer group when strips of S blocks (S >= 2) are dealt as the kernel deals
// them (TileCursor): shared strips (groups > 1) go round-robin to the CTAs, whose tiles go round-robin to
// its groups; one group per CTA: strips round-robin to the groups. S = 1: row-major, tile t to group
// (t % ctas, (t / ctas) % groups).
int64_t busiest_group(int32_t blocks, int32_t cols, int32_t ctas, int32_t groups, int32_t s) {
  std::vector<int64_t> per_group(static_cast<size_t>(ctas) * groups, 0);
  if (s == 1) {
    for (int64_t t = 0; t < int64_t{blocks} * cols; ++t) ++per_group[(t % ctas) * groups + (t / ctas) % groups];
  } else {
    const int32_t strips = (blocks + s - 1) / s;
    std::vector<int64_t> per_cta(ctas, 0);
    for (int64_t u = 0; u < int64_t{strips} * cols; ++u) {
      const int32_t strip = static_cast<int32_t>(u / cols);
      const int64_t len = std::min<int64_t>(s, blocks - int64_t{strip} * s);
      for (int64_t i = 0; i < len; ++i) {
        const int64_t cta = u % ctas;
        ++per_group[cta * groups + per_cta[cta]++ % groups];
      }
    }
  }
  return *std::max_element(per_group.begin(), per_group.end());
}

// Tiles of the busiest consumer group with shared ranges: CTA u holds tiles [floor(T u / ctas), floor(T (u +
// 1) / ctas)), which go to its groups in turn.
int64_t busiest_group_shared_ranges(int32_t blocks, int32_t cols, int32_t ctas, int32_t groups) {
  const int64_t tiles = int64_t{blocks} * cols;
  int64_t most = 0;
  for (int64_t u = 0; u < ctas; ++u) {
    const int64_t n = tiles * (u + 1) / ctas - tiles * u / ctas;
    most = std::max(most, (n + groups - 1) / groups);
  }
  return most;
}

TEST(SegmentOrder, BenchmarkShapesGetTheirMeasuredStrips) {
  // (blocks per column of the benchmark's 8 uneven segments, column tiles): strips shared by 3 groups on
  // 132 CTAs, as measured on an H200 (segment_order.h), for segments that start inside
  // 16-byte chunks (false) and on multiples of 16 bytes (true).
  for (bool starts16 : {false, true}) {
    EXPECT_EQ(auto_segment_strip(36, 56, 396, 3, starts16), 18);   // 4096 x 7168
    EXPECT_EQ(auto_segment_strip(68, 17, 396, 3, starts16), 1);    // 8192 x 2112: row-major
    EXPECT_EQ(auto_segment_strip(68, 32, 396, 3, starts16), 18);   // 8192 x 4096
    EXPECT_EQ(auto_segment_strip(36, 192, 396, 3, starts16), 18);  // 4096 x 24576
    // No strip keeps row-major's balance: shared ranges, at 16384 x 7168 (19 tiles per group; strips of 18
    // would give 20), 8192 x 7168 (10; strips of 9 would give 11) and 8192 x 5120 (7; faster than row-major).
    EXPECT_EQ(auto_segment_strip(132, 56, 396, 3, starts16), kSharedRanges);
    EXPECT_EQ(auto_segment_strip(68, 56, 396, 3, starts16), kSharedRanges);
    EXPECT_EQ(auto_segment_strip(68, 40, 396, 3, starts16), kSharedRanges);
    EXPECT_EQ(auto_segment_strip(1608, 3, 132, 1, starts16), 37);  // fp32, one group per CTA (test_quant.py)
    EXPECT_EQ(auto_segment_strip(1608, 3, 396, 3, starts16), 39);
  }
  // Small shapes: every split stays row-major up to 3 tiles per group (8192 x 1536: strips of 6 ran 10 points
  // under the row-major kernel), sizes that are multiples of 16 up to 4 (kMaxRowMajorTiles16).
  EXPECT_EQ(auto_segment_strip(68, 12, 396, 3, false), 1);   // 8192 x 1536
  EXPECT_EQ(auto_segment_strip(68, 12, 396, 3, true), 1);
  EXPECT_EQ(auto_segment_strip(68, 20, 396, 3, false), 12);  // 8192 x 2560
  EXPECT_EQ(auto_segment_strip(68, 20, 396, 3, true), 1);
}

TEST(SegmentOrder, TypicalBlocksDecideTheRowMajorKernel) {
  // The middle of the used-block range: the benchmark's uneven split in 8 segments uses 68 blocks at 8192
  // rows and 36 at 4096 (wgrad.bench.quant.segment_sizes), so 8192 x 2112 takes the row-major kernel and 4096 x
  // 7168 the kernel of any order (strips of 18).
  EXPECT_EQ(wgrad::quant::typical_segment_blocks(8192, 8), 68);
  EXPECT_EQ(wgrad::quant::typical_segment_blocks(4096, 8), 36);
  EXPECT_EQ(wgrad::quant::typical_segment_blocks(4096, 1), 32);   // one segment: the only count
  EXPECT_EQ(wgrad::quant::typical_segment_blocks(100, 1), 1);
  EXPECT_EQ(wgrad::quant::typical_segment_blocks(129, 2), 2);     // range [2, 2]: clipped to its end
  for (int64_t rows : {1, 127, 128, 1000, 4097, 8192}) {
    for (int64_t g : {1, 2, 3, 8, 32}) {
      const auto range = wgrad::quant::segment_block_range(rows, g);
      const int64_t b = wgrad::quant::typical_segment_blocks(rows, g);
      EXPECT_GE(b, range.first);
      EXPECT_LE(b, range.last);
    }
  }
}

TEST(SegmentOrder, BusiestWorkerFormulaMatchesTheDealing) {
  for (int32_t groups : {1, 3}) {
    for (int32_t ctas : {1, 7, 66, 132}) {
      for (int32_t cols = 1; cols <= 64; cols += 9) {
        for (int32_t blocks = 1; blocks <= 300; blocks += 7) {
          for (int32_t s : {2, 3, 5, 18, 19, 64}) {
            EXPECT_EQ(wgrad::quant::strip_busiest_worker(s, blocks, cols, ctas * groups, groups),
                      busiest_group(blocks, cols, ctas, groups, s))
                << "blocks " << blocks << " cols " << cols << " ctas " << ctas << " groups " << groups << " strip " << s;
          }
        }
      }
    }
  }
}

TEST(SegmentOrder, StripsKeepRowMajorsBalanceToOneTile) {
  // The rule's strip leaves no group more tiles than row-major, or (one group per CTA, shapes of
  // kMinTilesForOneMore or more tiles per group) one more, is a multiple of the groups per CTA, and leaves at
  // most a fifth of the CTAs idle; or the rule takes shared ranges (several groups per CTA), as balanced as
  // row-major.
  for (int32_t groups : {1, 3}) {
    for (int32_t ctas : {1, 7, 66, 132}) {
      for (int32_t cols = 1; cols <= 64; cols += 9) {
        for (int32_t blocks = 1; blocks <= 300; blocks += 7) {
          const int32_t s = auto_segment_strip(blocks, cols, ctas * groups, groups, false);
          const int64_t per_worker = (int64_t{blocks} * cols + ctas * groups - 1) / (ctas * groups);
          SCOPED_TRACE(wgrad::test::Message() << "blocks " << blocks << " cols " << cols << " ctas " << ctas
                                          << " groups " << groups << " strip " << s);
          if (per_worker > wgrad::quant::kMaxAutoStrip) {
            EXPECT_EQ(s, 0);  // ranges
            continue;
          }
          if (s == kSharedRanges) {  // no strip keeps row-major's balance; shared ranges do
            EXPECT_GT(groups, 1);
            EXPECT_GE(per_worker, wgrad::quant::kMinTilesForSharedRanges);
            EXPECT_EQ(busiest_group_shared_ranges(blocks, cols, ctas, groups), per_worker);
            EXPECT_EQ(auto_segment_strip(blocks, cols, ctas * groups, groups, true), s);
            continue;
          }
          ASSERT_TRUE(s == 1 || (s >= wgrad::quant::kMinAutoStrip && s % groups == 0 &&
                                 s <= std::min<int64_t>(groups * (per_worker + 1), 64)));
          if (s > 1) {
            EXPECT_GE(5 * ((blocks + s - 1) / s) * int64_t{cols}, 4 * int64_t{ctas});
          }
          if (per_worker <= wgrad::quant::kMaxRowMajorTiles) {
            EXPECT_EQ(s, 1);
          }
          if (per_worker <= wgrad::quant::kMaxRowMajorTiles16) {
            EXPECT_EQ(auto_segment_strip(blocks, cols, ctas * groups, groups, true), 1);
          } else {
            EXPECT_EQ(auto_segment_strip(blocks, cols, ctas * groups, groups, true), s);
          }
          const int64_t row_major = busiest_group(blocks, cols, ctas, groups, 1);
          EXPECT_EQ(row_major, per_worker);
          // (one more only with one group per CTA: with several, shared ranges come first)
          const int64_t extra = groups == 1 && per_worker >= wgrad::quant::kMinTilesForOneMore ? 1 : 0;
          EXPECT_LE(busiest_group(blocks, cols, ctas, groups, s), row_major + extra);
        }
      }
    }
  }
}

TEST(SegmentOrder, BlockRangeHoldsEverySplit) {
  std::mt19937 gen(7);
  for (int64_t rows : {1, 127, 128, 129, 1000, 8192, 8191, 200000}) {
    for (int64_t segments : {1, 2, 8, 31, 32}) {
      const auto range = wgrad::quant::segment_block_range(rows, segments);
      EXPECT_LE(range.last - range.first + 1, segments + 1);
      int64_t lo = range.last, hi = range.first;
      for (int trial = 0; trial < 300; ++trial) {
        // Random cut points (trial 0: all rows in one segment; trial 1: segments of 1 row, the rest last).
        std::vector<int64_t> cuts;
        for (int64_t g = 0; g + 1 < segments; ++g) {
          cuts.push_back(trial == 0 ? rows : trial == 1 ? std::min(rows, g + 1)
                                                        : std::uniform_int_distribution<int64_t>(0, rows)(gen));
        }
        std::sort(cuts.begin(), cuts.end());
        int64_t prev = 0, blocks = 0;
        for (int64_t c : cuts) {
          blocks += (c - prev + 127) / 128;
          prev = c;
        }
        blocks += (rows - prev + 127) / 128;
        EXPECT_GE(blocks, range.first);
        EXPECT_LE(blocks, range.last);
        lo = std::min(lo, blocks);
        hi = std::max(hi, blocks);
      }
      EXPECT_EQ(lo, range.first) << "one segment holding every row gives the fewest blocks";
    }
  }
}

// Packed tiles (build_packed_tiles): the tiles that packed_block_starts_tile cuts a column's blocks into,
// as block counts, for blocks of `rows` rows each.
std::vector<int32_t> packed_tiles(const std::vector<int32_t>& rows) {
  std::vector<int32_t> tiles;
  int32_t prefix = 0, prev_prefix = 0, prev_boxes = 0;
  for (size_t b = 0; b < rows.size(); ++b) {
    const int32_t boxes = wgrad::quant::packed_block_boxes(rows[b]);
    if (wgrad::quant::packed_block_starts_tile(b == 0, prev_prefix, prev_boxes, prefix, boxes)) tiles.push_back(0);
    ++tiles.back();
    prev_prefix = prefix;
    prev_boxes = boxes;
    prefix += boxes;
  }
  return tiles;
}

TEST(PackedTiles, HandPickedSplits) {
  EXPECT_EQ(packed_tiles({128, 128, 128}), (std::vector<int32_t>{1, 1, 1}));  // whole blocks: one each
  EXPECT_EQ(packed_tiles(std::vector<int32_t>(8, 1)), (std::vector<int32_t>{8}));  // 8 one-row blocks: 8 boxes
  EXPECT_EQ(packed_tiles(std::vector<int32_t>(9, 16)), (std::vector<int32_t>{8, 1}));
  EXPECT_EQ(packed_tiles({100, 20}), (std::vector<int32_t>{1, 1}));  // 7 + 2 boxes: the second crosses
  EXPECT_EQ(packed_tiles({100, 20, 16, 16}), (std::vector<int32_t>{1, 1, 2}));  // after one that crosses
  EXPECT_EQ(packed_tiles({40, 128, 40}), (std::vector<int32_t>{1, 1, 1}));  // 3, 8 (crosses), 3 boxes
  EXPECT_EQ(packed_tiles({48, 80, 17, 33}), (std::vector<int32_t>{2, 2}));  // 3 + 5, then 2 + 3 in the next window
}

// Every tile fits in one stage (8 boxes of 16 rows), the tiles cover the blocks in order, and there are
// never more tiles than blocks nor more than two per window of 8 boxes the blocks span; with many short
// segments far fewer than blocks.
TEST(PackedTiles, TilesFitOneStageOnRandomSplits) {
  std::mt19937 gen(21);
  for (int trial = 0; trial < 2000; ++trial) {
    // A column's used blocks: segments of random sizes (some short, some long), each cut into blocks of 128
    // rows and a partial last one.
    const int segments = std::uniform_int_distribution<int>(1, 300)(gen);
    const int longest = std::uniform_int_distribution<int>(1, 600)(gen);
    std::vector<int32_t> rows;
    for (int g = 0; g < segments; ++g) {
      int32_t size = std::uniform_int_distribution<int32_t>(0, longest)(gen);
      for (; size > 0; size -= 128) rows.push_back(std::min<int32_t>(size, 128));
    }
    if (rows.empty()) continue;
    const std::vector<int32_t> tiles = packed_tiles(rows);
    size_t b = 0;
    int32_t total_boxes = 0;
    for (int32_t n : tiles) {
      ASSERT_GE(n, 1);
      int32_t boxes = 0;
      for (int32_t i = 0; i < n; ++i) boxes += wgrad::quant::packed_block_boxes(rows[b + i]);
      EXPECT_LE(boxes, 8) << "trial " << trial << ": a tile of " << n << " blocks from block " << b;
      b += n;
      total_boxes += boxes;
    }
    EXPECT_EQ(b, rows.size());
    EXPECT_LE(tiles.size(), rows.size());
    EXPECT_LE(tiles.size(), 2 * static_cast<size_t>((total_boxes + 7) / 8));
  }
  std::vector<int32_t> short_blocks(256);  // 256 segments of 1-31 rows
  for (int32_t& r : short_blocks) r = std::uniform_int_distribution<int32_t>(1, 31)(gen);
  EXPECT_LE(packed_tiles(short_blocks).size(), short_blocks.size() / 3);
}

}  // namespace
