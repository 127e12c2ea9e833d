// \brief Tests of csrc/kernels/common/layout.h: the index math of the operand contract (torch-free).
#include "kernels/common/layout.h"

#include "harness.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace wgrad {
namespace {

// The helpers are constexpr so that kernels can size shared memory and tiles with them.
static_assert(ceil_div(129, 128) == 2);
static_assert(align_up(33, 4) == 36);
static_assert(scale_ld(33) == 36);
static_assert(k_block_capacity(160, 3) == 4);

TEST(Layout, CeilDiv) {
  EXPECT_EQ(ceil_div(0, 128), 0);
  EXPECT_EQ(ceil_div(1, 128), 1);
  EXPECT_EQ(ceil_div(127, 128), 1);
  EXPECT_EQ(ceil_div(128, 128), 1);
  EXPECT_EQ(ceil_div(129, 128), 2);
  EXPECT_EQ(ceil_div(8208, 128), 65);
}

TEST(Layout, CeilDivHas64BitRange) {
  // K_total * M of a MoE layer passes 2^31: the math must not wrap in 32 bits.
  const int64_t big = (int64_t{1} << 40) + 1;
  EXPECT_EQ(ceil_div(big, 128), (int64_t{1} << 33) + 1);
  EXPECT_EQ(align_up(big, 16), (int64_t{1} << 40) + 16);
}

TEST(Layout, AlignUp) {
  for (int64_t b : {4, 16, 128}) {
    for (int64_t a = 0; a < 3 * b; ++a) {
      const int64_t r = align_up(a, b);
      EXPECT_EQ(r % b, 0) << a << " " << b;
      EXPECT_GE(r, a);
      EXPECT_LT(r - a, b);
    }
  }
}

TEST(Layout, ScaleLeadingDimension) {
  // ld = align_up(mn, 4): every K block's column of scales starts 16-byte aligned (TMA).
  EXPECT_EQ(scale_ld(1), 4);
  EXPECT_EQ(scale_ld(4), 4);
  EXPECT_EQ(scale_ld(33), 36);
  EXPECT_EQ(scale_ld(4097), 4100);
  // An empty operand still gets a valid (non-zero) leading dimension.
  EXPECT_EQ(scale_ld(0), 4);
  for (int64_t mn = 1; mn < 300; ++mn) {
    EXPECT_EQ(scale_ld(mn) * 4 % kTmaAlignBytes, 0) << mn;
    EXPECT_GE(scale_ld(mn), mn);
    EXPECT_LT(scale_ld(mn) - mn, 4);
  }
}

TEST(Layout, Constants) {
  EXPECT_EQ(kScaleBlockK, 128);
  EXPECT_EQ(kTmaAlignBytes, 16);
}

// Blocks a split of K_total into the given group sizes needs: blocks restart at every group.
int64_t blocks_of_split(const std::vector<int64_t>& ks) {
  int64_t blocks = 0;
  for (int64_t k : ks) blocks += ceil_div(k, kScaleBlockK);
  return blocks;
}

// Every split of k_total into `groups` sizes that are multiples of `step` (zeros included).
void for_each_split(int64_t k_total, int64_t groups, int64_t step, const std::function<void(std::vector<int64_t>&)>& f) {
  std::vector<int64_t> ks(groups, 0);
  std::function<void(int64_t, int64_t)> rec = [&](int64_t g, int64_t left) {
    if (g == groups - 1) {
      ks[g] = left;
      f(ks);
      return;
    }
    for (int64_t k = 0; k <= left; k += step) {
      ks[g] = k;
      rec(g + 1, left - k);
    }
  };
  rec(0, k_total);
}

TEST(Layout, KBlockCapacityBoundsEverySplit) {
  // Exhaustive over small totals: no split of K_total into G groups (multiples of 16, zeros included)
  // needs more scale columns than the capacity the contiguous-K scales are allocated with.
  for (int64_t groups = 1; groups <= 4; ++groups) {
    for (int64_t k_total = 0; k_total <= 4 * 128 + 16; k_total += 16) {
      const int64_t cap = k_block_capacity(k_total, groups);
      for_each_split(k_total, groups, 16, [&](std::vector<int64_t>& ks) {
        EXPECT_LE(blocks_of_split(ks), cap) << "K_total " << k_total << " G " << groups;
      });
    }
  }
}

TEST(Layout, KBlockCapacityIsAttained) {
  // G groups of 128 q + 16 tokens each need G (q + 1) blocks, exactly the capacity (G <= 8): the bound
  // cannot be lowered without breaking such a split.
  for (int64_t groups = 1; groups <= 8; ++groups) {
    for (int64_t q = 0; q < 4; ++q) {
      const std::vector<int64_t> ks(groups, 128 * q + 16);
      EXPECT_EQ(blocks_of_split(ks), k_block_capacity(groups * (128 * q + 16), groups)) << groups << " " << q;
    }
  }
}

TEST(Layout, KBlockCapacityUnalignedSizes) {
  // Contiguous-K sizes need not be multiples of 16: 1-wide groups, each in a block of its own.
  for_each_split(7, 3, 1, [&](std::vector<int64_t>& ks) { EXPECT_LE(blocks_of_split(ks), k_block_capacity(7, 3)); });
  EXPECT_EQ(k_block_capacity(3, 3), 3);
  EXPECT_EQ(k_block_capacity(16 + 100 + 1008, 3), 9 + 2);
}

TEST(Layout, KBlockCapacityEdgeCases) {
  EXPECT_EQ(k_block_capacity(0, 1), 0);
  EXPECT_EQ(k_block_capacity(128, 1), 1);
  EXPECT_EQ(k_block_capacity(129, 1), 2);
  // No tokens at all: G - 1 "boundaries" are still reserved, never a negative count.
  EXPECT_EQ(k_block_capacity(0, 4), 3);
  EXPECT_EQ(k_block_capacity(0, 0), 0);
  // DESIGN's MoE seed: 8 experts over 32768 tokens.
  EXPECT_EQ(k_block_capacity(32768, 8), 256 + 7);
}

}  // namespace
}  // namespace wgrad
