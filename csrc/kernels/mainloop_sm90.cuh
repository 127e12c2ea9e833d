// \brief SM90 mainloop of the wgrad GEMM: TMA producer and WGMMA consumers with 1x128 promotion.
//
// Per 128-wide K block the producer loads, onto one transaction barrier, the A tile (128 x 128 fp8),
// the B tile (BLOCK_N x 128 fp8) and one column of fp32 scales for each. Each consumer warpgroup owns
// BLOCK_N/2 columns and all 128 rows: per K block it issues two groups of four m64n(BLOCK_N/2)k32 FP8
// WGMMAs (rows 0-63, rows 64-127) into scratch accumulators and promotes each half in fp32 registers
// while the other half's group runs:
//     acc[r][c] += sa[r] * sb[c] * scratch[r][c]
// Hopper's FP8 tensor-core accumulation is narrower than fp32; promoting every 128 K keeps accuracy.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include <cuda.h>

#include "group_walker.cuh"
#include "mma_atoms.h"
#include "named_barriers.h"
#include "tile_config.h"

namespace wgrad {

template <int kBlockN_, int kStages_>
struct MainloopSm90 {
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr int kNumConsumerThreads = 256;

  using Element = Fp8;
  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = cutlass::PipelineState<kStages>;
  using SmemLayoutA = SmemLayoutKSw128<kBlockM, kStages>;
  using SmemLayoutB = SmemLayoutKSw128<kBlockN, kStages>;
  using TiledMma = TiledMmaSm90<kBlockN>;

  // TMA writes each stage's scale column to a 128-byte aligned smem address: B's row of scales is
  // padded to a multiple of 32 floats.
  static constexpr int kScaleRowB = (kBlockN + 31) / 32 * 32;

  struct SharedStorage {
    alignas(1024) Element a[cute::cosize_v<SmemLayoutA>];  // (BLK_M,BLK_K,PIPE)
    alignas(1024) Element b[cute::cosize_v<SmemLayoutB>];  // (BLK_N,BLK_K,PIPE)
    alignas(128) float sa[kStages][kBlockM];               // (BLK_M,PIPE) scales of A's rows
    alignas(128) float sb[kStages][kScaleRowB];            // (BLK_N,PIPE) scales of B's rows
    typename Pipeline::SharedStorage pipeline;
  };

  static constexpr uint32_t kTransactionBytes =
      static_cast<uint32_t>(sizeof(Element) * (kBlockM + kBlockN) * kBlockK + sizeof(float) * (kBlockM + kBlockN));

  // ---- producer: one elected thread ----------------------------------------------------------------
  // With a cluster the A tile is shared by its CTAs (same m block): CTA `rank` loads rows
  // [rank * kRowsA, (rank + 1) * kRowsA) and multicasts them into every CTA's smem.
  static constexpr int kRowsA = kBlockM / kClusterN;
  static constexpr uint16_t kClusterMask = (1u << kClusterN) - 1;

  template <class Params>
  __device__ static void load_tile(const Params& p, Pipeline& pipeline, PipelineState& state,
                                   SharedStorage& smem, const WorkTile& w, int rank) {
    const CUtensorMap* desc_a = &p.tma_a;
    const CUtensorMap* desc_b = &p.tma_b;
    if constexpr (Params::kMode == GroupMode::Packed) {
      desc_a = &p.packed.a[w.coord.group];  // kernel parameters: immutable, no proxy fence needed
      desc_b = &p.packed.b[w.coord.group];
    }
    const int m0 = w.coord.m_block * kBlockM;
    const int n0 = w.coord.n_block * kBlockN;
    constexpr uint64_t kEvictNormal = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL);
    for (int kb = 0; kb < w.num_k_blocks; ++kb) {
      pipeline.producer_acquire(state);
      uint64_t* bar = reinterpret_cast<uint64_t*>(pipeline.producer_get_barrier(state));
      const int stage = state.index();
      const int k0 = w.k_col + kb * kBlockK;
      const int scale_col = w.k_block_base + kb;
      if constexpr (kClusterN == 1) {
        cute::SM90_TMA_LOAD_2D::copy(desc_a, bar, kEvictNormal, smem.a + stage * kBlockM * kBlockK, k0, m0);
      } else {
        cute::SM90_TMA_LOAD_MULTICAST_2D::copy(desc_a, bar, kClusterMask, kEvictNormal,
                                               smem.a + stage * kBlockM * kBlockK + rank * kRowsA * kBlockK, k0,
                                               m0 + rank * kRowsA);
      }
      cute::SM90_TMA_LOAD_2D::copy(desc_b, bar, kEvictNormal, smem.b + stage * kBlockN * kBlockK, k0, n0);
      cute::SM90_TMA_LOAD_2D::copy(&p.tma_sa, bar, kEvictNormal, smem.sa[stage], m0, scale_col);
      cute::SM90_TMA_LOAD_2D::copy(&p.tma_sb, bar, kEvictNormal, smem.sb[stage], n0, scale_col);
      ++state;
    }
  }

  // ---- consumers ---------------------------------------------------------------------------------
  // Zeroes K columns [valid, 128) of a stage's A and B tiles: the next group's tokens, which a
  // contiguous-K group's last partial block would otherwise reduce. Byte (r, k) of a 128B-swizzled
  // K-major tile sits at r * 128 + ((k / 16) ^ (r % 8)) * 16 + k % 16. Both warpgroups share B, so
  // all 256 consumer threads split the work and meet at a named barrier.
  __device__ static void zero_tail(SharedStorage& smem, int stage, int valid, int consumer_tid) {
    uint8_t* a = reinterpret_cast<uint8_t*>(smem.a + stage * kBlockM * kBlockK);
    uint8_t* b = reinterpret_cast<uint8_t*>(smem.b + stage * kBlockN * kBlockK);
    const int first_chunk = valid / 16;
    const int chunks = kBlockK / 16 - first_chunk;
    for (int i = consumer_tid; i < (kBlockM + kBlockN) * chunks; i += kNumConsumerThreads) {
      const int r = i / chunks;
      const int chunk = first_chunk + i % chunks;
      uint8_t* row = r < kBlockM ? a + r * kBlockK : b + (r - kBlockM) * kBlockK;
      const int rr = r < kBlockM ? r : r - kBlockM;
      uint8_t* dst = row + ((chunk ^ (rr % 8)) * 16);
      const int from = chunk == first_chunk ? valid % 16 : 0;
      for (int j = from; j < 16; ++j) dst[j] = 0;
    }
    cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read next by WGMMA (async proxy)
    cutlass::arch::NamedBarrier::sync(kNumConsumerThreads, static_cast<uint32_t>(NamedBarrierId::TailMask));
  }

  // Accumulates every K block of one tile into `acc` (cleared here). Warpgroup wg owns tile columns
  // [wg * BLOCK_N/2, (wg + 1) * BLOCK_N/2); fragment element i = v + kFragPerM * m of a thread (warp w
  // of its warpgroup, lane l, v < kFragPerM = BLOCK_N/4, m in {0, 1}) holds
  //     row 64 * m + 16 * w + l / 4 + 8 * ((v / 2) % 2),  column wg * BLOCK_N/2 + 8 * (v / 4) + 2 * (l % 4) + v % 2
  // of the tile (tests/cpp checks this against CuTe's own layout).
  static constexpr int kFragPerM = kBlockN / 4;   // fragment elements per m64 block
  static constexpr int kColGroups = kBlockN / 16;  // groups of 8 columns per warpgroup

  // Each warpgroup overlaps the promotion of a block's first m64 half with the WGMMAs of its second:
  //     issue m0(k), m1(k) -> wait m0(k) -> promote m0(k) -> wait m1(k) -> promote m1(k) -> release
  // while the other warpgroup's WGMMAs fill the tensor cores during the second promotion.
  // scratch0/scratch1 are the two halves' WGMMA accumulators ((MMA,1,1), 64 x BLOCK_N/2 each). (Issuing
  // block k+1's first half before promoting block k's second would overlap more, but then a WGMMA
  // group is in flight across the loop's back edge; ptxas cannot follow that and serializes every
  // WGMMA (C7514). Measured in docs/perf-notes.md, v5.)
  template <class Accum, class Scratch>
  __device__ static void mma_tile(Pipeline& pipeline, PipelineState& state, SharedStorage& smem,
                                  const WorkTile& w, Accum& acc, Scratch& scratch0, Scratch& scratch1,
                                  int consumer_tid) {
    using namespace cute;
    TiledMma tiled_mma;
    auto thr_mma = tiled_mma.get_thread_slice(consumer_tid);
    Tensor sA = make_tensor(make_smem_ptr(smem.a), SmemLayoutA{});  // (BLK_M,BLK_K,PIPE)
    Tensor sB = make_tensor(make_smem_ptr(smem.b), SmemLayoutB{});  // (BLK_N,BLK_K,PIPE)
    Tensor tCrA = thr_mma.make_fragment_A(thr_mma.partition_A(sA));  // (MMA,MMA_M=2,MMA_K,PIPE)
    Tensor tCrB = thr_mma.make_fragment_B(thr_mma.partition_B(sB));  // (MMA,MMA_N=1,MMA_K,PIPE)

    const int wg = consumer_tid / 128;
    const int warp = (consumer_tid % 128) / 32;
    const int lane = consumer_tid % 32;
    const int row0 = warp * 16 + lane / 4;                 // + 8, + 64, + 72
    const int col0 = wg * (kBlockN / 2) + 2 * (lane % 4);  // + 8 j, + {0, 1}

    // The four k32 WGMMAs of one m64 half of a K block, as one commit group.
    auto issue_half = [&](int m, int stage, Scratch& scratch) {
      warpgroup_fence_operand(scratch);
      warpgroup_arrive();
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tCrA); ++k) {
        cute::gemm(tiled_mma, tCrA(_, m, k, stage), tCrB(_, 0, k, stage), scratch(_, 0, 0));
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      // No fence on `scratch` here: it is in flight until a wait, and ptxas serializes every WGMMA if
      // anything else touches in-flight accumulator registers (C7514).
    };
    float sa[4];
    float2 sb[kColGroups];
    auto load_scales = [&](int stage) {
      CUTE_UNROLL
      for (int h = 0; h < 4; ++h) sa[h] = smem.sa[stage][row0 + 8 * (h % 2) + 64 * (h / 2)];
      CUTE_UNROLL
      for (int j = 0; j < kColGroups; ++j) sb[j] = *reinterpret_cast<const float2*>(&smem.sb[stage][8 * j + col0]);
    };
    auto promote_half = [&](int m, Scratch& scratch) {
      warpgroup_fence_operand(scratch);
      CUTE_UNROLL
      for (int j = 0; j < kColGroups; ++j) {
        const int i = kFragPerM * m + 4 * j;
        acc(i + 0) += (sa[2 * m] * sb[j].x) * scratch(4 * j + 0);
        acc(i + 1) += (sa[2 * m] * sb[j].y) * scratch(4 * j + 1);
        acc(i + 2) += (sa[2 * m + 1] * sb[j].x) * scratch(4 * j + 2);
        acc(i + 3) += (sa[2 * m + 1] * sb[j].y) * scratch(4 * j + 3);
      }
    };
    // A contiguous-K group's partial last block: zero its tail before any WGMMA reads it.
    auto prepare = [&](int kb, int stage) {
      if (w.tail_valid != 0 && kb == w.num_k_blocks - 1) zero_tail(smem, stage, w.tail_valid, consumer_tid);
    };

    clear(acc);
    for (int kb = 0; kb < w.num_k_blocks; ++kb) {
      pipeline.consumer_wait(state);
      const int stage = state.index();
      prepare(kb, stage);
      load_scales(stage);  // before the WGMMAs: shared-memory loads wait behind their operand reads
      issue_half(0, stage, scratch0);
      issue_half(1, stage, scratch1);
      warpgroup_wait<1>();  // m0 done, m1 may still run
      promote_half(0, scratch0);
      warpgroup_wait<0>();
      promote_half(1, scratch1);
      // Released after the last use of the scale registers: only then have their shared-memory loads
      // provably completed (the next TMA write into this stage must not overtake them).
      pipeline.consumer_release(state);
      ++state;
    }
  }
};

}  // namespace wgrad
