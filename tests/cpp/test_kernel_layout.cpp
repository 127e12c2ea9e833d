// Host-side checks of the facts the SM90 kernel's promotion and epilogue are written against.
#include "harness.h"

#include <cstdint>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/gemm/mma_atoms.h"
#include "kernels/gemm/tile_config.h"
#include "kernels/gemm/tile_scheduler.h"

namespace {

// mainloop_sm90.cuh: fragment element i = v + (BLOCK_N/4) * m of consumer thread t (warpgroup t / 128)
// sits at
//   row = 64 * m + 16 * warp + lane / 4 + 8 * ((v / 2) % 2),
//   col = (t / 128) * BLOCK_N/2 + 8 * (v / 4) + 2 * (lane % 4) + v % 2
template <int kBlockN>
void expect_fragment_layout() {
  using namespace cute;
  wgrad::TiledMmaSm90<kBlockN> tiled_mma;
  Tensor coords = make_identity_tensor(Shape<Int<wgrad::kBlockM>, Int<kBlockN>>{});  // (BLK_M,BLK_N)
  std::set<std::pair<int, int>> seen;
  constexpr int kPerM = kBlockN / 4;
  for (int t = 0; t < 256; ++t) {
    auto thr = tiled_mma.get_thread_slice(t);
    Tensor tCcC = thr.partition_C(coords);  // (MMA,MMA_M,MMA_N)
    ASSERT_EQ(int(size(tCcC)), kBlockN / 2);
    Tensor frag = thr.partition_fragment_C(coords);
    ASSERT_EQ(int(size(frag)), kBlockN / 2);
    const int warp = (t % 128) / 32, lane = t % 32;
    for (int i = 0; i < kBlockN / 2; ++i) {
      const int v = i % kPerM, m = i / kPerM;
      // The kernel indexes the register fragment linearly: its i-th element must be tCcC's i-th.
      const int row = get<0>(tCcC(i));
      const int col = get<1>(tCcC(i));
      EXPECT_EQ(frag.layout()(i), i) << "register fragment is not compact in linear order";
      EXPECT_EQ(row, 64 * m + 16 * warp + lane / 4 + 8 * ((v / 2) % 2)) << "t=" << t << " i=" << i;
      EXPECT_EQ(col, (t / 128) * (kBlockN / 2) + 8 * (v / 4) + 2 * (lane % 4) + v % 2) << "t=" << t << " i=" << i;
      seen.insert({row, col});
    }
  }
  EXPECT_EQ(seen.size(), size_t(wgrad::kBlockM) * kBlockN);  // every element owned exactly once
}

TEST(KernelLayout, FragmentLayoutN128) { expect_fragment_layout<128>(); }
TEST(KernelLayout, FragmentLayoutN144) { expect_fragment_layout<144>(); }
TEST(KernelLayout, FragmentLayoutN160) { expect_fragment_layout<160>(); }

// mainloop_sm90.cuh zero_tail: byte (r, k) of a stage at r * 128 + ((k / 16) ^ (r % 8)) * 16 + k % 16.
TEST(KernelLayout, SmemSwizzleMatchesTailMaskFormula) {
  using namespace cute;
  using Layout = wgrad::SmemLayoutKSw128<wgrad::kBlockM, 2>;
  Layout layout{};
  for (int s = 0; s < 2; ++s)
    for (int r = 0; r < wgrad::kBlockM; ++r)
      for (int k = 0; k < wgrad::kBlockK; ++k) {
        const int expected = s * wgrad::kBlockM * wgrad::kBlockK + r * 128 + ((k / 16) ^ (r % 8)) * 16 + k % 16;
        ASSERT_EQ(int(layout(r, k, s)), expected) << "r=" << r << " k=" << k << " s=" << s;
      }
}

TEST(TileConfig, EveryCandidateFitsAtLeastThreeStages) {
  for (int bn : wgrad::kBlockNCandidates) {
    EXPECT_GE(wgrad::stages_for(bn), 3) << bn;
    EXPECT_LE(wgrad::stages_for(bn) * wgrad::stage_bytes(bn) + wgrad::epilogue_bytes(bn), wgrad::kSmemBudgetBytes);
    EXPECT_EQ(bn % 16, 0) << "each warpgroup's WGMMA N = BLOCK_N/2 and its B rows need multiples of 8";
    // With out loaded ahead (a whole fp32 tile in shared memory).
    EXPECT_GE(wgrad::stages_for(bn, true), 3) << bn;
    EXPECT_LT(wgrad::stages_for(bn, true), wgrad::stages_for(bn)) << bn;
    EXPECT_LE(wgrad::stages_for(bn, true) * wgrad::stage_bytes(bn) + wgrad::loaded_out_bytes(bn),
              wgrad::kSmemBudgetBytes);
  }
}

TEST(TileConfig, LoadedOutForShortKOnly) {
  EXPECT_TRUE(wgrad::use_loaded_out(128));
  EXPECT_TRUE(wgrad::use_loaded_out(512));
  EXPECT_TRUE(wgrad::use_loaded_out(1024)) << "K = 1024, however few waves: loaded";
  EXPECT_FALSE(wgrad::use_loaded_out(1025));
  EXPECT_FALSE(wgrad::use_loaded_out(2048));
  EXPECT_FALSE(wgrad::use_loaded_out(8192));
}

TEST(TileConfig, Fp32ConfigNarrowsLoadedTiles) {
  constexpr int kSms = 132;
  // 64 experts of 256 tokens, 16 of 1024, dense K = 1024: loaded, at the narrowest width.
  for (const auto& c : {wgrad::select_fp32_config(4096, 7168, 64, 256, kSms, 0, -1),
                        wgrad::select_fp32_config(4096, 7168, 16, 1024, kSms, 0, -1),
                        wgrad::select_fp32_config(4096, 4096, 1, 1024, kSms, 0, -1)}) {
    EXPECT_TRUE(c.load_out);
    EXPECT_EQ(c.block_n, wgrad::kBlockNCandidates[0]);
  }
  // Long K: the reduce-add at the heuristic's width.
  const wgrad::GemmConfig dense = wgrad::select_fp32_config(7168, 2112, 1, 4096, kSms, 0, -1);
  EXPECT_FALSE(dense.load_out);
  EXPECT_EQ(dense.block_n, wgrad::select_block_n(7168, 2112, 1, kSms));
  // Forced width or epilogue: taken as given.
  const wgrad::GemmConfig forced = wgrad::select_fp32_config(4096, 7168, 64, 256, kSms, 160, -1);
  EXPECT_TRUE(forced.load_out);
  EXPECT_EQ(forced.block_n, 160);
  const wgrad::GemmConfig reduce = wgrad::select_fp32_config(4096, 7168, 64, 256, kSms, 0, 0);
  EXPECT_FALSE(reduce.load_out);
  EXPECT_EQ(reduce.block_n, wgrad::select_block_n(4096, 7168, 64, kSms));
  const wgrad::GemmConfig loaded = wgrad::select_fp32_config(7168, 2112, 1, 4096, kSms, 0, 1);
  EXPECT_TRUE(loaded.load_out);
  EXPECT_EQ(loaded.block_n, wgrad::kBlockNCandidates[0]);
}

TEST(TileConfig, Bf16NarrowsShortKTiles) {
  constexpr int kSms = 132;
  EXPECT_EQ(wgrad::select_bf16_block_n(7168, 2048, 32, 512, kSms, 0), wgrad::kBlockNCandidates[0]);
  EXPECT_EQ(wgrad::select_bf16_block_n(4096, 4096, 1, 512, kSms, 0), wgrad::kBlockNCandidates[0]);
  EXPECT_EQ(wgrad::select_bf16_block_n(4096, 4096, 1, 1024, kSms, 0), wgrad::select_block_n(4096, 4096, 1, kSms));
  EXPECT_EQ(wgrad::select_bf16_block_n(2048, 7168, 8, 2048, kSms, 0), wgrad::select_block_n(2048, 7168, 8, kSms));
  EXPECT_EQ(wgrad::select_bf16_block_n(7168, 2112, 1, 8192, kSms, 0), wgrad::select_block_n(7168, 2112, 1, kSms));
  EXPECT_EQ(wgrad::select_bf16_block_n(7168, 2048, 32, 512, kSms, 160), 160) << "a forced width is taken as given";
}

TEST(TileConfig, Fp32OutSwizzledOnlyWhereLoadedSlicesAreWholeBoxes) {
  for (int bn : wgrad::kBlockNCandidates) {
    EXPECT_FALSE(wgrad::fp32_out_swizzled(bn, false)) << bn << ": the reduce-add keeps one plain box per slice";
    EXPECT_EQ(wgrad::fp32_out_box_cols(bn, false), bn / 2);
    const bool whole = (bn / 2) % wgrad::kFp32OutSwizzledBoxCols == 0;
    EXPECT_EQ(wgrad::fp32_out_swizzled(bn, true), whole) << bn;
    EXPECT_EQ(wgrad::fp32_out_box_cols(bn, true), whole ? 32 : bn / 2) << bn;
  }
  EXPECT_TRUE(wgrad::fp32_out_swizzled(wgrad::kBlockNCandidates[0], true)) << "the loaded epilogue's width is swizzled";
  EXPECT_EQ(wgrad::kFp32OutSwizzledBoxCols * 4, 128) << "one 128B-swizzle row";
}

TEST(TileConfig, MGroupedFitsThreeStagesBesideItsEpilogue) {
  EXPECT_GE(wgrad::kMGroupedStages, 3);
  EXPECT_LE(wgrad::kMGroupedStages * wgrad::kMGroupedStageBytes + wgrad::kMGroupedEpilogueBytes,
            wgrad::kSmemBudgetBytes);
  EXPECT_EQ(wgrad::kMGroupedBlockN / 2, wgrad::kScaleBlockK) << "a warpgroup's columns are one block column of b";
}

TEST(TileConfig, SelectionAvoidsRaggedLastWaves) {
  // 7168 x 2112 on 132 SMs: 160 gives 56 x 14 = 784 tiles = 5.94 waves (128 gives 7.2 waves).
  EXPECT_EQ(wgrad::select_block_n(7168, 2112, 1, 132), 160);
  // Every choice is a candidate, for any shape.
  for (int64_t m : {1, 128, 1000, 16384})
    for (int64_t n : {1, 100, 4096, 32768}) {
      const int bn = wgrad::select_block_n(m, n, 1, 132);
      bool ok = false;
      for (int c : wgrad::kBlockNCandidates) ok |= c == bn;
      EXPECT_TRUE(ok) << m << "x" << n << " -> " << bn;
    }
}

// The tile cost model was fitted to a sweep of every width on every dense seed shape (H200,
// scripts/profile_dense.py): it must keep picking the measured-best width on each.
TEST(TileConfig, SeedShapesGetTheirMeasuredBestWidth) {
  const struct {
    int64_t m, n;
    int block_n;
  } seeds[] = {{7168, 2112, 160}, {1536, 24576, 160}, {512, 32768, 144},
               {16384, 7168, 160}, {7168, 4096, 160}, {2048, 7168, 160}};
  for (const auto& s : seeds) EXPECT_EQ(wgrad::select_block_n(s.m, s.n, 1, 132), s.block_n) << s.m << "x" << s.n;
}

// The tile scheduler's divisions: every quotient and remainder equal to `/` and `%`, at both ends of the
// range (n up to 2^31 - 1) for every small divisor, powers of two and their neighbours, and large ones.
TEST(Divisor, QuotientsAndRemaindersMatchDivision) {
  std::vector<int> divisors;
  for (int d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (int b = 12; b <= 30; ++b)
    for (int delta : {-1, 0, 1}) divisors.push_back((1 << b) + delta);
  for (int d : {7 * 56, 8 * 45, 2147483646, 2147483647, 1000000007, 123456789}) divisors.push_back(d);
  std::vector<int> numerators;
  for (int n = 0; n < 2048; ++n) numerators.push_back(n);
  for (int n = 0; n < 2048; ++n) numerators.push_back(2147483647 - n);
  uint32_t x = 12345;
  for (int i = 0; i < 2048; ++i) {
    x = x * 1664525u + 1013904223u;
    numerators.push_back(static_cast<int>(x >> 1));
  }
  for (int d : divisors) {
    const wgrad::Divisor div(d);
    for (int n : numerators) {
      const int q = div.div(n);
      ASSERT_EQ(q, n / d) << n << " / " << d;
      ASSERT_EQ(div.mod(n, q), n % d) << n << " % " << d;
    }
    // Around every multiple of d near the top of the range, where a rounding error would show first.
    for (int64_t multiple = int64_t{2147483647} / d * d, j = 0; j < 4 && multiple - j * d > 0; ++j) {
      for (int64_t n = multiple - j * d - 1; n <= multiple - j * d + 1 && n <= 2147483647; ++n) {
        ASSERT_EQ(div.div(static_cast<int>(n)), static_cast<int>(n / d)) << n << " / " << d;
      }
    }
  }
}

TEST(TileScheduler, EnumeratesEveryTileOnce) {
  constexpr int kC = wgrad::PersistentTileScheduler::kClusterN;
  for (int tiles_m : {1, 3, 8, 9, 56})
    for (int tiles_n : {1, 5, 27, 28})
      for (int groups : {1, 3}) {
        wgrad::PersistentTileScheduler s{tiles_m, tiles_n, groups};
        std::set<std::tuple<int, int, int>> seen;
        int phantoms = 0;
        for (int t = 0; t < s.total_cluster_tiles(); ++t) {
          const auto first = s.coord(t, 0);
          ASSERT_EQ(first.n_block % kC, 0);
          for (int rank = 0; rank < kC; ++rank) {
            const auto c = s.coord(t, rank);
            // A cluster's CTAs share the m block and group (A multicast) and take adjacent n blocks.
            ASSERT_EQ(c.m_block, first.m_block);
            ASSERT_EQ(c.group, first.group);
            ASSERT_EQ(c.n_block, first.n_block + rank);
            ASSERT_GE(c.m_block, 0);
            ASSERT_LT(c.m_block, tiles_m);
            ASSERT_EQ(c.group, t / (int64_t(tiles_m) * ((tiles_n + kC - 1) / kC)));
            if (c.n_block >= tiles_n) {
              ++phantoms;  // past N: computed on zero-filled B, store clipped
              continue;
            }
            seen.insert({c.group, c.m_block, c.n_block});
          }
        }
        EXPECT_EQ(int64_t(seen.size()), int64_t(tiles_m) * tiles_n * groups);
        EXPECT_EQ(phantoms, ((kC - tiles_n % kC) % kC) * tiles_m * groups);
      }
}

TEST(TileScheduler, ConsecutiveClusterTilesWalkABandOfRowBlocks) {
  constexpr int kC = wgrad::PersistentTileScheduler::kClusterN;
  wgrad::PersistentTileScheduler s{20, 10 * kC, 1};
  // The first band is 8 row blocks tall: cluster tiles 0..7 share their n blocks, tile 8 moves right.
  for (int t = 0; t < 8; ++t) {
    EXPECT_EQ(s.coord(t, 0).m_block, t);
    EXPECT_EQ(s.coord(t, 0).n_block, 0);
    EXPECT_EQ(s.coord(t, kC - 1).n_block, kC - 1);
  }
  EXPECT_EQ(s.coord(8, 0).m_block, 0);
  EXPECT_EQ(s.coord(8, 0).n_block, kC);
  // The last band holds the remaining 4 row blocks.
  const int last_band_start = 2 * 8 * 10;
  EXPECT_EQ(s.coord(last_band_start, 0).m_block, 16);
  EXPECT_EQ(s.coord(last_band_start + 4, 0).m_block, 16);
  EXPECT_EQ(s.coord(last_band_start + 4, 0).n_block, kC);
}

}  // namespace
