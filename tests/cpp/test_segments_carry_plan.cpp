// \brief Tests of csrc/kernels/quant/segments_carry_plan.h: every CTA's walk of the carried-sectors segments
// kernel replayed on the host, with the kernel's own plan functions. Checked for each column tile: every
// byte of the q_t row [0, pitch) is stored exactly once; a sector is stored in parts only where two CTAs'
// ranges meet in it (or in the last sector of a row whose pitch is not a multiple of 32); each stored byte
// comes from the ring (produced by the current run of contiguous tiles, at most a ring's length back); and
// a thread's rows cover the block once, each byte landing at the block's own q_t column.
#include "kernels/quant/segments_carry_plan.h"

#include "bench_split.h"

#include "harness.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace wgrad::quant {
namespace {

struct Block {
  int64_t start;  // first q_t column: its first row of x
  int64_t count;  // rows, 1 to 128
};

// The blocks of the table (build_segment_table_warps): segment g's q_t columns start at its first row.
std::vector<Block> blocks_of(const std::vector<int64_t>& sizes) {
  std::vector<Block> blocks;
  int64_t start = 0;
  for (int64_t size : sizes) {
    for (int64_t r = 0; r < size; r += kCarryBlockRows) {
      blocks.push_back({start + r, size - r < kCarryBlockRows ? size - r : kCarryBlockRows});
    }
    start += size;
  }
  return blocks;
}

struct Stats {
  int64_t partial_sectors = 0;
  int64_t whole_sectors = 0;
};

// The dynamic tail to replay (CarryDynamic): static ranges of carry_split, then the remainder's tiles from
// the counter, taken by the CTAs in an order of `seed` (any order a launch could see).
struct DynamicTail {
  uint32_t seed;
};

// The ranges the kernel walks with a dynamic tail, each with the CTA that walks it: carry_split's static
// ranges, then the counter's tiles handed to CTAs in a random order, as the counter does (every CTA asks
// until it gets an index >= remainder). Checks that the launch hands out remainder + ctas indices and that
// the ranges tile [0, tiles).
void dynamic_walks(int64_t tiles, int64_t ctas, const DynamicTail& d, std::vector<CarryRange>* walks,
                   std::vector<int64_t>* owners) {
  const CarrySplit split = carry_split(tiles, ctas);
  ASSERT_EQ(split.static_tiles, split.per_cta * ctas);
  ASSERT_LE(split.static_tiles, tiles);
  ASSERT_EQ(split.per_cta, tiles / ctas);
  ASSERT_EQ(split.remainder, tiles % ctas);
  std::vector<std::pair<int64_t, CarryRange>> pieces;
  for (int64_t cta = 0; cta < ctas; ++cta) {
    const CarryRange r = carry_static_range(split, cta);
    if (r.first < r.last) pieces.push_back({r.first, r});
    walks->push_back(r);
    owners->push_back(cta);
  }
  std::mt19937 gen(d.seed);
  std::vector<bool> asking(ctas, true);
  int64_t next_index = 0, asking_ctas = split.remainder > 0 ? ctas : 0;
  while (asking_ctas > 0) {
    const int64_t cta = std::uniform_int_distribution<int64_t>(0, ctas - 1)(gen);
    if (!asking[cta]) continue;
    const int64_t i = next_index++;
    if (i >= split.remainder) {
      asking[cta] = false;
      --asking_ctas;
      continue;
    }
    const CarryRange r = carry_dynamic_run(split, i);
    ASSERT_EQ(r.last - r.first, 1) << "tile " << i << " from the counter";
    ASSERT_LE(r.last, tiles);
    ASSERT_EQ(r.up, (i & 1) == 0);
    pieces.push_back({r.first, r});
    walks->push_back(r);
    owners->push_back(cta);
  }
  ASSERT_EQ(next_index, split.remainder > 0 ? split.remainder + ctas : 0) << "indices a launch hands out";
  std::sort(pieces.begin(), pieces.end(), [](const auto& l, const auto& r) { return l.first < r.first; });
  int64_t covered = 0;
  for (const auto& piece : pieces) {
    ASSERT_EQ(piece.second.first, covered) << "the ranges leave a gap or overlap";
    covered = piece.second.last;
  }
  ASSERT_EQ(covered, tiles);
}

// Replays the kernel's walk (quantize_fp8_1x128_segments_carry_kernel, step 4) for `ctas` CTAs: each CTA's
// range of carry_range, or with `dynamic` the ranges of dynamic_walks. (void: ASSERT_* return from it.)
void replay(const std::vector<int64_t>& sizes, int32_t col_tiles, int64_t ctas, Stats* out = nullptr,
            const DynamicTail* dynamic = nullptr) {
  const std::vector<Block> blocks = blocks_of(sizes);
  int64_t rows = 0;
  for (int64_t s : sizes) rows += s;
  const int64_t pitch = align_up(rows, 16);
  const auto used = static_cast<int32_t>(blocks.size());
  Stats stats;
  if (used == 0) return;
  // Per column tile: how often each byte is stored, and which CTAs store in each sector.
  std::vector<std::vector<int>> stored(col_tiles, std::vector<int>(pitch, 0));
  std::vector<std::vector<std::set<int64_t>>> writers(col_tiles,
                                                      std::vector<std::set<int64_t>>(ceil_div(pitch, kCarrySector)));
  std::vector<std::vector<bool>> partial(col_tiles, std::vector<bool>(ceil_div(pitch, kCarrySector), false));
  std::vector<bool> is_data(pitch, false);  // q_t columns that hold a row of x (the rest are zeros)
  for (const Block& b : blocks) {
    for (int64_t i = 0; i < b.count; ++i) is_data[b.start + i] = true;
  }

  std::vector<CarryRange> walks;
  std::vector<int64_t> owners;  // the CTA of each walk
  if (dynamic == nullptr) {
    for (int64_t cta = 0; cta < ctas; ++cta) {
      walks.push_back(carry_range(int64_t{used} * col_tiles, cta, ctas));
      owners.push_back(cta);
    }
  } else {
    dynamic_walks(int64_t{used} * col_tiles, ctas, *dynamic, &walks, &owners);
    if (wgrad::test::has_fatal_failure()) return;
  }
  for (size_t w = 0; w < walks.size(); ++w) {
    const CarryRange walk = walks[w];
    const int64_t cta = owners[w];
    const int64_t count = walk.last - walk.first;
    for (int64_t idx = 0; idx + 1 < count; ++idx) {  // the kernel's cursor walks the same tiles
      const CarryTile stepped = carry_step(walk, carry_walk_tile(walk, idx, used), used);
      const CarryTile expected = carry_walk_tile(walk, idx + 1, used);
      ASSERT_TRUE(stepped.b == expected.b && stepped.c == expected.c) << "cta " << cta << " step " << idx;
    }
    int64_t done = 0, run_begin = 0, run_end = 0;  // the q_t columns the current run has produced
    for (int64_t idx = 0; idx < count; ++idx) {
      const CarryTile tile = carry_walk_tile(walk, idx, used);
      const Block blk = blocks[tile.b];
      const int64_t a = blk.start, e = a + blk.count;
      auto contiguous = [&](int64_t j) {
        if (j < 0 || j >= count) return false;
        const CarryTile o = carry_walk_tile(walk, j, used);
        return carry_contiguous(walk.up, j < idx, tile.c, a, e, o, blocks[o.b].start, blocks[o.b].count);
      };
      const bool carried_in = contiguous(idx - 1), carry_out = contiguous(idx + 1);
      if (carried_in) {
        run_begin = a < run_begin ? a : run_begin;
        run_end = e > run_end ? e : run_end;
      } else {
        run_begin = a;
        run_end = e;
      }
      // The kernel's end and data_end (carry_store_bounds: the last block also stores [R, pitch), zeros).
      ASSERT_EQ(tile.b + 1 == used, e == rows) << "the kernel's test of the last block";
      const CarryStoreBounds<int64_t> bounds = carry_store_bounds<int64_t>(e, rows, pitch);
      const int64_t end = bounds.end, data_end = bounds.data_end;
      ASSERT_TRUE(tile.b + 1 == used || end == e);
      const CarryStoreRange range = carry_store_range(walk.up, carried_in, carry_out, a, e, end, done);
      if (range.from >= range.to) continue;
      ASSERT_GE(range.from, 0);
      ASSERT_LE(range.to, pitch);
      // Every byte stored but the zeros (from data_end on) comes from the ring: produced by this run, and no
      // further back from the run's newest byte than the ring holds.
      for (int64_t pos = range.from; pos < range.to; ++pos) {  // data from the ring, zeros from data_end on
        ASSERT_EQ(is_data[pos], pos < data_end) << "cta " << cta << " tile " << idx << ": byte " << pos
                                                << (is_data[pos] ? " of a block stored as 0" : " of padding from the ring");
      }
      for (int64_t pos = range.from; pos < range.to && pos < data_end; ++pos) {
        ASSERT_GE(pos, run_begin) << "cta " << cta << " tile " << idx << ": byte " << pos << " not produced by the run";
        ASSERT_LT(pos, run_end) << "cta " << cta << " tile " << idx << ": byte " << pos << " not produced yet";
        ASSERT_LE(walk.up ? e - pos : pos - a + 1, kCarryRingBytes) << "byte " << pos << " left the ring";
      }
      const CarrySectors s = carry_sectors(range.from, range.to);
      auto store = [&](int64_t pos, bool whole) {
        ++stored[tile.c][pos];
        writers[tile.c][pos / kCarrySector].insert(static_cast<int64_t>(w));  // (a CTA may walk two runs that meet)
        if (!whole) partial[tile.c][pos / kCarrySector] = true;
      };
      for (int64_t pos = s.whole_from; pos < s.whole_to; ++pos) store(pos, true);
      if (s.whole_from < s.whole_to) {
        ASSERT_EQ(s.whole_from % kCarrySector, 0);
        ASSERT_EQ(s.whole_to % kCarrySector, 0);
        ASSERT_LE(s.whole_to - s.whole_from, 160) << "more chunks than a thread's lanes take (kernel: k and k + 8)";
        stats.whole_sectors += (s.whole_to - s.whole_from) / kCarrySector;
      }
      for (int32_t i = 0; i < s.head; ++i) store(range.from + i, false);
      for (int32_t i = 0; i < s.tail; ++i) store(s.tail_from + i, false);
      ASSERT_EQ((s.whole_to > s.whole_from ? s.whole_to - s.whole_from : 0) + s.head + s.tail, range.to - range.from)
          << "[" << range.from << ", " << range.to << ") split into whole sectors and parts loses or repeats bytes";
    }
  }
  for (int32_t c = 0; c < col_tiles; ++c) {
    for (int64_t pos = 0; pos < pitch; ++pos) {
      ASSERT_EQ(stored[c][pos], 1) << "column tile " << c << ", q_t column " << pos << " of " << pitch;
    }
    for (int64_t sector = 0; sector < ceil_div(pitch, kCarrySector); ++sector) {
      if (!partial[c][sector]) continue;
      ++stats.partial_sectors;
      const bool row_end = (sector + 1) * kCarrySector > pitch;
      EXPECT_TRUE(writers[c][sector].size() >= 2 || row_end)
          << "column tile " << c << ": sector " << sector << " stored in parts by one range";
    }
  }
  if (out != nullptr) *out = stats;
}

// The benchmark's uneven split (wgrad.bench.quant.segment_sizes, 8 segments).
std::vector<int64_t> bench_split(int64_t rows) { return wgrad::bench::segment_sizes<int64_t>(rows); }

std::vector<int64_t> random_split(int64_t rows, int groups, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int64_t> cuts = {0, rows};
  std::uniform_int_distribution<int64_t> dist(0, rows);
  for (int g = 0; g < groups - 1; ++g) cuts.push_back(dist(gen));
  std::sort(cuts.begin(), cuts.end());
  std::vector<int64_t> sizes;
  for (int g = 0; g < groups; ++g) sizes.push_back(cuts[g + 1] - cuts[g]);
  return sizes;
}

TEST(SegmentsCarryPlan, BlockRowsCoverTheBlockAtItsOwnColumns) {
  for (int group : {kCarryRowsPerThread}) {  // rows per thread
    for (int shift = 0; shift < group; ++shift) {
      std::vector<int> seen(kCarryBlockRows, 0);
      for (int pg = 0; pg < kCarryBlockRows / group; ++pg) {
        for (int i = 0; i < group; ++i) {
          const int row = carry_block_row(pg, i, shift);
          ASSERT_GE(row, 0);
          ASSERT_LT(row, kCarryBlockRows);
          ++seen[row];
          // The kernel's ring store: byte i of row group pg's group at (a - shift) + group pg + i, row group
          // 0's first `shift` bytes one block further.
          const int column = -shift + group * pg + i + (pg == 0 && i < shift ? kCarryBlockRows : 0);
          EXPECT_EQ(column, row) << "group " << group << ", shift " << shift << ", row group " << pg << ", byte " << i;
        }
      }
      for (int row = 0; row < kCarryBlockRows; ++row) {
        EXPECT_EQ(seen[row], 1) << "group " << group << ", shift " << shift << ", row " << row;
      }
    }
  }
}

TEST(SegmentsCarryPlan, BenchmarkSplitsOnAnH200Grid) {
  // The benchmark's shapes' column tiles (2112, 4096, 7168, 24576 columns) on 132 SMs x 3 CTAs.
  for (int64_t rows : {4096, 8192, 16384}) {
    for (int32_t col_tiles : {17, 32, 56}) {
      SCOPED_TRACE("rows " + std::to_string(rows) + ", column tiles " + std::to_string(col_tiles));
      Stats stats;
      replay(bench_split(rows), col_tiles, 396, &stats);
      EXPECT_GT(stats.whole_sectors, 0);
      // Parts only where two ranges meet: at most one sector per CTA boundary.
      EXPECT_LE(stats.partial_sectors, 395);
    }
  }
}

TEST(SegmentsCarryPlan, RandomSplitsAnyGrid) {
  // Tiny, one-row and empty segments, R not a multiple of 16 or 32, grids from one CTA (a range over every
  // column tile) to more CTAs than tiles (empty and one-tile ranges).
  uint32_t seed = 1;
  for (int64_t rows : {1, 31, 700, 3001, 6000}) {
    for (int groups : {1, 5, 32}) {
      for (int64_t ctas : {1, 2, 3, 7, 396}) {
        SCOPED_TRACE("rows " + std::to_string(rows) + ", groups " + std::to_string(groups) + ", ctas " +
                     std::to_string(ctas) + ", seed " + std::to_string(seed));
        replay(random_split(rows, groups, seed++), 3, ctas);
      }
    }
  }
}

TEST(SegmentsCarryPlan, DynamicTailStoresEveryByteOnce) {
  // Static ranges plus the remainder's tiles from the counter, taken by the CTAs in random orders: every byte
  // of q_t stored once, parts only where two ranges meet (a sector per boundary), on the benchmark's splits
  // and on random ones with tiny, one-row and empty segments; grids with more CTAs than tiles (no static
  // range at all).
  uint32_t seed = 1;
  for (int64_t rows : {4096, 8192}) {
    for (int32_t col_tiles : {17, 56}) {
      for (int order = 0; order < 3; ++order) {
        SCOPED_TRACE("rows " + std::to_string(rows) + ", column tiles " + std::to_string(col_tiles) + ", seed " +
                     std::to_string(seed));
        const DynamicTail d{seed++};
        Stats stats;
        replay(bench_split(rows), col_tiles, 396, &stats, &d);
        const auto used = static_cast<int64_t>(blocks_of(bench_split(rows)).size());
        const CarrySplit split = carry_split(used * col_tiles, 396);
        EXPECT_LE(stats.partial_sectors, 396 + split.remainder) << "more parts than boundaries of ranges";
      }
    }
  }
  for (int64_t rows : {1, 700, 6000}) {
    for (int64_t ctas : {1, 3, 396}) {
      SCOPED_TRACE("rows " + std::to_string(rows) + ", ctas " + std::to_string(ctas));
      const DynamicTail d{seed};
      replay(random_split(rows, 5, seed++), 3, ctas, nullptr, &d);
    }
  }
  // carry_split's arithmetic on either side of 2^31 and 2^32 tiles.
  for (const int64_t tiles : {int64_t{0}, int64_t{395}, int64_t{2016}, (int64_t{1} << 31) - 1, int64_t{1} << 31,
                              (int64_t{1} << 32) - 1, int64_t{1} << 32, (int64_t{1} << 33) + 7}) {
    const CarrySplit s = carry_split(tiles, 396);
    EXPECT_EQ(s.remainder, tiles % 396) << tiles;
    EXPECT_EQ(s.per_cta, tiles / 396) << tiles;
    EXPECT_EQ(s.static_tiles, tiles / 396 * 396) << tiles;
  }
}

TEST(SegmentsCarryPlan, RangesAndWalkExactInBothWidths) {
  // carry_range and carry_walk_tile divide in 32 bits while tiles x ctas (the tile index) fits, in 64 bits
  // beyond: both give the exact floor (tiles cta / ctas; t % used, t / used), on either side of 2^32.
  for (const int64_t ctas : {1, 7, 396, 792}) {
    const int64_t edge = (int64_t{1} << 32) / ctas;
    for (const int64_t tiles : {edge - 1, edge, edge + 1, 3 * edge + 5}) {
      SCOPED_TRACE("tiles " + std::to_string(tiles) + ", ctas " + std::to_string(ctas));
      int64_t next = 0;
      for (const int64_t cta : {int64_t{0}, int64_t{1}, ctas / 2, ctas - 2, ctas - 1}) {
        if (cta < 0 || cta >= ctas) continue;
        const CarryRange r = carry_range(tiles, cta, ctas);
        const auto lo = static_cast<int64_t>(static_cast<__int128>(tiles) * cta / ctas);
        const auto hi = static_cast<int64_t>(static_cast<__int128>(tiles) * (cta + 1) / ctas);
        ASSERT_EQ(r.first, lo) << "cta " << cta;
        ASSERT_EQ(r.last, hi) << "cta " << cta;
        next = r.last;
      }
      ASSERT_EQ(next, tiles);
    }
  }
  for (const int32_t used : {5, 37, 2048}) {  // (column tiles t / used below 2^31, as CarryTile holds them)
    for (const int64_t t : {int64_t{0}, (int64_t{1} << 32) - 1, int64_t{1} << 32, (int64_t{1} << 33) + 12345}) {
      const CarryTile tile = carry_walk_tile(CarryRange{t, t + 1, true}, 0, used);
      EXPECT_EQ(tile.b, t % used) << "t " << t << ", used " << used;
      EXPECT_EQ(tile.c, t / used) << "t " << t << ", used " << used;
    }
  }
}

TEST(SegmentsCarryPlan, SectorAlignedSplitsStoreNoParts) {
  // Every segment a multiple of 32 rows: no sector is shared, so none is stored in parts, whatever the grid.
  for (int64_t ctas : {1, 5, 396}) {
    Stats stats;
    replay({256, 32, 0, 96, 1024, 64, 3008}, 4, ctas, &stats);
    EXPECT_EQ(stats.partial_sectors, 0) << ctas << " CTAs";
  }
}

TEST(SegmentsCarryPlan, PartsStoredInAlignedPieces) {
  // A part is never a whole sector (carry_sectors stores those whole): head and tail < 32 for any range.
  for (int64_t from = 0; from < 96; ++from) {
    for (int64_t to = from + 1; to < 200; ++to) {
      const CarrySectors sec = carry_sectors(from, to);
      ASSERT_LT(sec.head, kCarrySector) << from << ", " << to;
      ASSERT_LT(sec.tail, kCarrySector) << from << ", " << to;
    }
  }
  // Every part a tile can store (bytes [from, from + len) inside one sector, len < 32, at any offset): the
  // pieces cover it exactly, in order, each aligned to its size (so inside one 16-byte chunk).
  for (int64_t base : {int64_t{0}, int64_t{4096}, (int64_t{1} << 33) + 64}) {
    for (int offset = 0; offset < kCarrySector; ++offset) {
      for (int len = 1; len < kCarrySector && offset + len <= kCarrySector; ++len) {
        const int64_t from = base + offset, end = from + len;
        int64_t cur = from;
        int pieces = 0;
        for (int k = 0; k < 9; ++k) {
          if (!carry_piece_taken(k, cur, end)) continue;
          const int size = carry_piece_size(k);
          EXPECT_EQ(cur % size, 0) << from << " + " << len << ", step " << k;
          EXPECT_EQ(cur / 16, (cur + size - 1) / 16) << from << " + " << len << ", step " << k;
          EXPECT_LE(cur + size, end);
          cur += size;
          ++pieces;
        }
        EXPECT_EQ(cur, end) << "part " << from << " + " << len << " not covered";
        EXPECT_LE(pieces, 9);
      }
    }
  }
}

TEST(SegmentsCarryPlan, AutomaticChoiceTakesSplitCastsOfEnoughRowsAndFeatures) {
  // The measured cells the carry kernel won or tied: 4096-32768 rows x 2112-24576 features in 8-32 segments
  // of >= 256 rows on average, R x C >= 2^24; not taken: one segment (ties), 4096 x 2112 (lost), shorter
  // segments or casts, and fewer than 2048 features (not measured).
  EXPECT_TRUE(carry_kernel_by_default(16384, 7168, 8));
  EXPECT_TRUE(carry_kernel_by_default(8192, 2112, 16));
  EXPECT_TRUE(carry_kernel_by_default(4096, 7168, 8));
  EXPECT_TRUE(carry_kernel_by_default(4096, 24576, 16));  // 256 rows per segment
  EXPECT_TRUE(carry_kernel_by_default(4096, 4096, 2));    // R x C = 2^24
  EXPECT_TRUE(carry_kernel_by_default(32768, 24576, 32));
  EXPECT_FALSE(carry_kernel_by_default(4096, 2112, 8));   // R x C < 2^24
  EXPECT_FALSE(carry_kernel_by_default(4096, 4095, 8));
  EXPECT_FALSE(carry_kernel_by_default(16384, 2047, 8));
  EXPECT_FALSE(carry_kernel_by_default(4096, 7168, 17));  // 240 rows per segment
  EXPECT_FALSE(carry_kernel_by_default(8192, 7168, 33));
  EXPECT_FALSE(carry_kernel_by_default(4095, 7168, 8));
  EXPECT_FALSE(carry_kernel_by_default(32768, 7168, 1));
  EXPECT_FALSE(carry_kernel_by_default(0, 0, 0));
}

}  // namespace
}  // namespace wgrad::quant
