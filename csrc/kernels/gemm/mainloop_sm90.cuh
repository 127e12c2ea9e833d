// \brief SM90 mainloop of the wgrad GEMM: TMA producer and WGMMA consumers with 1x128 promotion.
//
// Per 128-wide K block the producer loads, onto one transaction barrier, the A tile (128 x 128 fp8),
// the B tile (BLOCK_N x 128 fp8) and one column of fp32 scales for each (for A only in the m-grouped
// GEMM, whose B scales come in 128 x 128 blocks: mma_tile_block_scaled). Each consumer warpgroup owns
// BLOCK_N/2 columns and all 128 rows: per K block it issues two groups of four m64n(BLOCK_N/2)k32 FP8
// WGMMAs (rows 0-63, rows 64-127) into scratch accumulators and promotes each half in fp32 registers
// while the other half's group runs:
//     acc[r][c] += sa[r] * sb[c] * scratch[r][c]
// Hopper's FP8 tensor-core accumulation is narrower than fp32; promoting every 128 K keeps accuracy.
//
// A contiguous-K group that starts inside a 16-byte chunk (any token counts) cannot be loaded by TMA at
// its own K offset (a box's innermost coordinate must be 16-byte aligned). For its blocks the producer
// thread loads the aligned window that starts k_shift columns early onto the stage's staging barrier,
// and the other three warps of the producer warpgroup ("shifters") shift each row k_shift bytes to the
// left in shared memory, append the next k_shift bytes (from the next stage when it holds the block that
// follows, else from global memory), zero what lies past the group, and only then arrive on the stage's
// full barrier. The consumers see the same tile as for an aligned group. The producer thread tells the
// shifters what each stage holds through a small record per stage (ShiftJob), published by an arrival
// on the staging barrier for every stage it fills; the shifters release every stage on its empty
// barrier beside the consumers, so that no stage is refilled (and no job overwritten) before they have
// seen it.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include <cuda.h>

#include "kernels/common/diag.h"
#include "kernels/gemm/group_walker.cuh"
#include "kernels/gemm/mma_atoms.h"
#include "kernels/common/named_barriers.h"
#include "kernels/gemm/tile_config.h"

namespace wgrad {

// One stage's job for the shifters (contiguous-K). shift == 0: the stage was loaded aligned, nothing
// to do; shift < 0: the producer is done, no more stages follow.
struct ShiftJob {
  int shift;    // k_shift of the block's group (0 to 15), or -1
  int window;   // first (16-aligned) K column of the loaded window
  int valid;    // columns of the block inside its group (1 to 128)
  int m0, n0;   // first rows of the A and B tiles
  int follows;  // 1: the next stage holds the next block of the same tile (the window 128 columns on)
};

// m-grouped: b's fp32 scales, one per 128 x 128 block, [G, ceil(N/128), KB] with any strides (elements).
struct BlockScalesView {
  const float* ptr = nullptr;
  int64_t stride_g = 0, stride_n = 0, stride_k = 0;
  int n_blocks = 0;  // ceil(N / 128) >= 1

  // Block column `nb` of group g at K block 0. A tile's last warpgroup may lie wholly past N (its columns
  // are zeros and never stored): it reads the last block column instead of past the tensor.
  __device__ const float* column(int g, int nb) const {
    return ptr + g * stride_g + (nb < n_blocks ? nb : n_blocks - 1) * stride_n;
  }
};

// kBlockScaledB: the m-grouped GEMM, whose B scales do not go through shared memory.
template <int kBlockN_, int kStages_, bool kBlockScaledB = false>
struct MainloopSm90 {
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr int kNumConsumerThreads = 256;
  static constexpr int kNumShifters = 96;  // contiguous-K: warps 1-3 of the producer warpgroup
  // Arrivals that release a stage: the consumers, and for contiguous-K the shifters too.
  template <GroupMode kMode>
  static constexpr int kEmptyArrivals = kNumConsumerThreads + (kMode == GroupMode::Contiguous ? kNumShifters : 0);

  using Element = Fp8;
  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using ClusterTransactionBarrier = cutlass::arch::ClusterTransactionBarrier;
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
    alignas(128) float sb[kStages][kBlockScaledB ? 1 : kScaleRowB];  // (BLK_N,PIPE) scales of B's rows
    typename Pipeline::SharedStorage pipeline;
    alignas(8) uint64_t staging[kStages];  // contiguous-K: the stage's job is posted (and its windows have landed)
    ShiftJob jobs[kStages];                // contiguous-K: what the shifters do with each stage
  };

  static constexpr uint32_t kOperandBytes = static_cast<uint32_t>(sizeof(Element) * (kBlockM + kBlockN) * kBlockK);
  static constexpr uint32_t kScaleBytes = static_cast<uint32_t>(sizeof(float) * (kBlockM + kBlockN));
  static constexpr uint32_t kTransactionBytes = kOperandBytes + kScaleBytes;
  static constexpr uint32_t kBytesB = static_cast<uint32_t>(sizeof(Element) * kBlockN * kBlockK);
  // m-grouped: A's scale column only (B's block scales do not go through shared memory).
  static constexpr uint32_t kTransactionBytesMGrouped = kOperandBytes + static_cast<uint32_t>(sizeof(float) * kBlockM);

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
    const int m0 = w.m0;
    const int n0 = w.coord.n_block * kBlockN;
    constexpr uint64_t kEvictNormal = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL);
    for (int kb = 0; kb < w.num_k_blocks; ++kb) {
      pipeline.producer_acquire(state);  // waits for the stage to be free (the pipeline has no leader)
      uint64_t* full = reinterpret_cast<uint64_t*>(pipeline.producer_get_barrier(state));
      const int stage = state.index();
      const int k0 = w.k_col + kb * kBlockK;
      const int scale_col = w.k_block_base + kb;
      const int k_load = k0 - w.k_shift;
      // (Measurement build: contiguous-K only where the block is loaded unshifted, which the shifters leave.)
      const bool skip_b = Params::kMode != GroupMode::MGrouped && (diag_of(p) & kDiagHalfB) && (kb & 1) &&
                          (Params::kMode != GroupMode::Contiguous || w.k_shift == 0);
      // Aligned: everything lands on the full barrier. Shifted: the operand windows land on the staging
      // barrier, and the full barrier expects the scales now and the shifters' arrival later.
      uint64_t* operand_bar = full;
      if constexpr (Params::kMode == GroupMode::Contiguous) {
        const int valid = kb == w.num_k_blocks - 1 ? w.last_valid : kBlockK;
        // Published by the arrival below.
        smem.jobs[stage] = ShiftJob{w.k_shift, k_load, valid, m0, n0, kb + 1 < w.num_k_blocks ? 1 : 0};
        if (w.k_shift == 0) {
          ClusterTransactionBarrier::arrive_and_expect_tx(full, kTransactionBytes - (skip_b ? kBytesB : 0u));
          ClusterTransactionBarrier::arrive(&smem.staging[stage]);
        } else {
          operand_bar = &smem.staging[stage];
          ClusterTransactionBarrier::expect_transaction(full, kScaleBytes);
          ClusterTransactionBarrier::arrive_and_expect_tx(operand_bar, kOperandBytes);
        }
      } else if constexpr (Params::kMode == GroupMode::MGrouped) {
        ClusterTransactionBarrier::arrive_and_expect_tx(full, kTransactionBytesMGrouped);
      } else {
        ClusterTransactionBarrier::arrive_and_expect_tx(full, kTransactionBytes - (skip_b ? kBytesB : 0u));
      }
      if constexpr (kClusterN == 1) {
        cute::SM90_TMA_LOAD_2D::copy(desc_a, operand_bar, kEvictNormal, smem.a + stage * kBlockM * kBlockK, k_load, m0);
      } else {
        cute::SM90_TMA_LOAD_MULTICAST_2D::copy(desc_a, operand_bar, kClusterMask, kEvictNormal,
                                               smem.a + stage * kBlockM * kBlockK + rank * kRowsA * kBlockK, k_load,
                                               m0 + rank * kRowsA);
      }
      if constexpr (Params::kMode == GroupMode::MGrouped) {
        // b is [G, N, K]: the group is the third coordinate, so a tile's rows past N are zero-filled rather
        // than the next group's. Its block scales are read by the consumers (mma_tile_block_scaled).
        cute::SM90_TMA_LOAD_3D::copy(desc_b, operand_bar, kEvictNormal, smem.b + stage * kBlockN * kBlockK, k_load, n0,
                                     w.coord.group);
      } else {
        if (!skip_b) {
          cute::SM90_TMA_LOAD_2D::copy(desc_b, operand_bar, kEvictNormal, smem.b + stage * kBlockN * kBlockK, k_load, n0);
        }
        cute::SM90_TMA_LOAD_2D::copy(&p.tma_sb, full, kEvictNormal, smem.sb[stage], n0, scale_col);
      }
      cute::SM90_TMA_LOAD_2D::copy(&p.tma_sa, full, kEvictNormal, smem.sa[stage], m0, scale_col);
      ++state;
    }
  }

  // ---- shifters: warps 1-3 of the producer warpgroup, contiguous-K only --------------------------
  // They follow the stages in the producer thread's order: wait for the stage's staging barrier, read
  // its job; for a shifted block, shift every row of A and B in place, then arrive on the stage's full
  // barrier (its one expected arrival; its transaction bytes are the scales). Every shifter then arrives
  // on the stage's empty barrier, which counts them beside the consumers (kEmptyArrivals): without
  // that, a run of aligned blocks (which the consumers take without the shifters) could let the
  // producer fill a stage twice before a late shifter waits on its staging barrier, and a parity wait
  // would then skip a phase.
  static constexpr int kTileRows = kBlockM + kBlockN;  // A's rows, then B's
  static_assert(kBlockM % 8 == 0, "row r of the stacked tiles has the swizzle r % 8, in A and in B");
  static constexpr int kRowsPerShifter = (kTileRows + kNumShifters - 1) / kNumShifters;
  static_assert(kClusterN == 1, "a shifted window is loaded whole by its own CTA");

  template <class Params>
  __device__ static void shift_stages(const Params& p, SharedStorage& smem, int shifter) {
    PipelineState state;  // index 0, phase 0: the staging barriers' first phase
    for (;;) {
      const int stage = state.index();
      cutlass::arch::ClusterBarrier::wait(&smem.staging[stage], state.phase());
      const ShiftJob job = smem.jobs[stage];
      if (job.shift < 0) return;
      if (job.shift > 0) {
        // The block's last `shift` columns lie past the window, in the 16 bytes after it (needed only if
        // the block reaches them). When the next stage holds the next block of the tile, they are that
        // window's first chunk, still unshifted (these threads shift it next, row for row); otherwise one
        // aligned 16-byte global load per row (then window + 128 < the group's end <= K_total, so the
        // chunk lies in the row's storage).
        const bool past_window = job.shift + job.valid > kBlockK;
        const bool from_smem = past_window && job.follows != 0;
        const int next_stage = stage + 1 < kStages ? stage + 1 : 0;
        if (from_smem) {
          const uint32_t next_phase = state.phase() ^ (next_stage == 0 ? 1u : 0u);
          cutlass::arch::ClusterBarrier::wait(&smem.staging[next_stage], next_phase);
        }
        auto shift_one = [&](int row, const uint4& next) {
          uint8_t* tile = row_ptr(smem, stage, row);
          switch (job.shift / 4) {  // the same for the whole warp: no divergence
            case 0: shift_row<0>(tile, row % 8, next, job.shift, job.valid); break;
            case 1: shift_row<1>(tile, row % 8, next, job.shift, job.valid); break;
            case 2: shift_row<2>(tile, row % 8, next, job.shift, job.valid); break;
            default: shift_row<3>(tile, row % 8, next, job.shift, job.valid); break;
          }
        };
        if (from_smem) {
          CUTE_UNROLL
          for (int i = 0; i < kRowsPerShifter; ++i) {
            const int row = shifter + i * kNumShifters;
            if (row >= kTileRows) break;
            // Logical chunk 0 of the row in the next stage.
            shift_one(row, *reinterpret_cast<const uint4*>(row_ptr(smem, next_stage, row) + (row % 8) * 16));
          }
        } else {
          auto load_next = [&](int row) {
            const bool in_a = row < kBlockM;
            const int64_t grow = in_a ? job.m0 + row : job.n0 + (row - kBlockM);
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (past_window && row < kTileRows && grow < (in_a ? p.out.m : p.out.n)) {
              const uint8_t* src = (in_a ? p.a + grow * p.lda : p.b + grow * p.ldb) + job.window + kBlockK;
              v = __ldg(reinterpret_cast<const uint4*>(src));
            }
            return v;
          };
          // One row's 16 bytes in flight while the previous row shifts (56 registers allow no more).
          uint4 next = load_next(shifter);
          CUTE_UNROLL
          for (int i = 0; i < kRowsPerShifter; ++i) {
            const int row = shifter + i * kNumShifters;
            if (row >= kTileRows) break;
            const uint4 after = i + 1 < kRowsPerShifter ? load_next(row + kNumShifters) : make_uint4(0u, 0u, 0u, 0u);
            shift_one(row, next);
            next = after;
          }
        }
        cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read next by WGMMA (async proxy)
        cutlass::arch::NamedBarrier::sync(kNumShifters, static_cast<uint32_t>(NamedBarrierId::ShiftDone));
        if (shifter == 0) smem.pipeline.full_barrier_[stage].arrive();
      }
      smem.pipeline.empty_barrier_[stage].arrive();  // this thread is done with the stage and its job
      ++state;
    }
  }

  // The producer thread's end (instead of PipelineTmaAsync::producer_tail): waits until the consumers
  // have released every stage, and tells the shifters in the first free one that nothing follows.
  template <class Params>
  __device__ static void producer_finish(Pipeline& pipeline, PipelineState state, SharedStorage& smem) {
    for (int i = 0; i < kStages; ++i) {
      pipeline.producer_acquire(state);
      if constexpr (Params::kMode == GroupMode::Contiguous) {
        if (i == 0) {
          smem.jobs[state.index()] = ShiftJob{-1, 0, 0, 0, 0, 0};
          ClusterTransactionBarrier::arrive(&smem.staging[state.index()]);
        }
      }
      ++state;
    }
  }

  // Row `row` of a stage's tiles: A's rows, then B's (128 bytes each).
  __device__ static uint8_t* row_ptr(SharedStorage& smem, int stage, int row) {
    return row < kBlockM ? reinterpret_cast<uint8_t*>(smem.a + stage * kBlockM * kBlockK) + row * kBlockK
                         : reinterpret_cast<uint8_t*>(smem.b + stage * kBlockN * kBlockK) + (row - kBlockM) * kBlockK;
  }

  // One 128-byte row of a 128B-swizzled K-major tile (logical chunk c at physical chunk c ^ swz): the row
  // becomes bytes [shift, shift + 128) of (row, next), with bytes from `valid` on zeroed. kWords =
  // shift / 4 is a template parameter so that no register array is indexed at run time.
  template <int kWords>
  __device__ static void shift_row(uint8_t* row, int swz, uint4 next, int shift, int valid) {
    constexpr int kChunks = kBlockK / 16;
    auto chunk = [&](int c) { return reinterpret_cast<uint4*>(row + ((c ^ swz) * 16)); };
    const uint32_t bits = 8u * static_cast<uint32_t>(shift % 4);
    // Chunk j of the result is made of chunks j and j + 1, read one chunk ahead of the stores (the
    // producer warpgroup runs on 56 registers).
    uint4 c0 = *chunk(0), c1 = *chunk(1);
    CUTE_UNROLL
    for (int j = 0; j < kChunks; ++j) {
      const uint4 c2 = j + 2 < kChunks ? *chunk(j + 2) : next;
      const uint32_t x[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
      uint32_t o[4];
      CUTE_UNROLL
      for (int t = 0; t < 4; ++t) o[t] = __funnelshift_r(x[t + kWords], x[t + kWords + 1], bits);
      *chunk(j) = make_uint4(o[0], o[1], o[2], o[3]);
      c0 = c1;
      c1 = c2;
    }
    if (valid < kBlockK) {  // the group's last block: zero its bytes from `valid` on
      int j = valid / 16;
      if (valid % 16 != 0) {  // (keep_bytes's arithmetic, written out: called here, it spills 56 registers)
        uint4 v = *chunk(j);
        uint32_t* w = reinterpret_cast<uint32_t*>(&v);
        CUTE_UNROLL
        for (int t = 0; t < 4; ++t) {
          const int keep = valid % 16 - 4 * t;  // bytes of word t inside the block
          w[t] = keep <= 0 ? 0u : keep >= 4 ? w[t] : w[t] & ((1u << (8 * keep)) - 1u);
        }
        *chunk(j++) = v;
      }
      for (; j < kChunks; ++j) *chunk(j) = make_uint4(0u, 0u, 0u, 0u);
    }
  }

  // A 16-byte chunk with its bytes from `keep` (0 to 16) on zeroed.
  __device__ static uint4 keep_bytes(uint4 v, int keep) {
    // `bytes` of a word are kept (none if <= 0, all if >= 4).
    auto word = [](uint32_t x, int bytes) { return bytes <= 0 ? 0u : bytes >= 4 ? x : x & ((1u << (8 * bytes)) - 1u); };
    return make_uint4(word(v.x, keep), word(v.y, keep - 4), word(v.z, keep - 8), word(v.w, keep - 12));
  }

  // ---- consumers ---------------------------------------------------------------------------------
  // A contiguous-K group's partial last block holds the next group's tokens past its `valid` columns.
  // The consumers issue only the k32 steps up to round_up(valid, 32) (mma_tile), so only the columns
  // [valid, round_up(valid, 32)) of a stage's A and B tiles are read and must be zeroed: one or two
  // 16-byte chunks per row, the first kept up to `valid`. Byte (r, k) of a 128B-swizzled K-major tile
  // sits at r * 128 + ((k / 16) ^ (r % 8)) * 16 + k % 16. Both warpgroups share B, so all 256 consumer
  // threads split the rows and meet at a named barrier.
  __device__ static void zero_tail(SharedStorage& smem, int stage, int valid, int consumer_tid) {
    const int end_chunk = (valid + kMmaStepK - 1) / kMmaStepK * (kMmaStepK / 16);
    for (int r = consumer_tid; r < kTileRows; r += kNumConsumerThreads) {
      uint8_t* const row = row_ptr(smem, stage, r);
      for (int c = valid / 16; c < end_chunk; ++c) {
        uint4* const dst = reinterpret_cast<uint4*>(row + ((c ^ (r % 8)) * 16));
        *dst = c == valid / 16 ? keep_bytes(*dst, valid % 16) : make_uint4(0u, 0u, 0u, 0u);
      }
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
  static constexpr int kMmaStepK = 32;             // K of one FP8 WGMMA (m64nNk32)
  static constexpr int kMmaSteps = kBlockK / kMmaStepK;

  // Each warpgroup overlaps the promotion of a block's first m64 half with the WGMMAs of its second:
  //     issue m0(k), m1(k) -> wait m0(k) -> promote m0(k) -> wait m1(k) -> promote m1(k) -> release
  // while the other warpgroup's WGMMAs fill the tensor cores during the second promotion.
  // scratch0/scratch1 are the two halves' WGMMA accumulators ((MMA,1,1), 64 x BLOCK_N/2 each).
  // In the contiguous-K layout a tile's last K block issues only the k32 steps that hold its w.last_valid
  // columns: past them lie zeros (TMA's fill past the tensor, the shifters' or zero_tail's) or the next
  // group's tokens, which the skipped steps would read. Short groups of padded MoE segments (K_g a multiple
  // of 32) save a quarter to three quarters of a block per tile, and zero nothing. The dense and packed
  // layouts keep one loop body: TMA fills their last block with zeros, and the peeled last block measured
  // slower there (decision 0037). (Issuing
  // block k+1's first half before promoting block k's second would overlap more, but then a WGMMA
  // group is in flight across the loop's back edge; ptxas cannot follow that and serializes every
  // WGMMA (warning C7514), which measured slower.)
  template <GroupMode kMode, class Accum, class Scratch>
  __device__ static void mma_tile(Pipeline& pipeline, PipelineState& state, SharedStorage& smem,
                                  const WorkTile& w, Accum& acc, Scratch& scratch0, Scratch& scratch1,
                                  int consumer_tid, int diag) {
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

    static_assert(size<2>(decltype(tCrA){}) == kMmaSteps, "one K block is kMmaSteps WGMMAs");

    // The first `steps` (a cute::Int) k32 WGMMAs of one m64 half of a K block, as one commit group.
    auto issue_half = [&](auto steps, int m, int stage, Scratch& scratch, int kb) {
      warpgroup_fence_operand(scratch);
      warpgroup_arrive();
      tiled_mma.accumulate_ = (diag & kDiagNoPromotion) && kb > 0 ? GMMA::ScaleOut::One : GMMA::ScaleOut::Zero;
      CUTE_UNROLL
      for (int k = 0; k < decltype(steps)::value; ++k) {
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
    auto promote_half = [&](int m, Scratch& scratch, int kb) {
      warpgroup_fence_operand(scratch);
      if (diag & kDiagNoPromotion) {  // measurement variant: the tile's WGMMAs accumulate in scratch
        if (kb == w.num_k_blocks - 1) {
          CUTE_UNROLL
          for (int v = 0; v < kFragPerM; ++v) acc(kFragPerM * m + v) = scratch(v);
        }
        return;
      }
      CUTE_UNROLL
      for (int j = 0; j < kColGroups; ++j) {
        const int i = kFragPerM * m + 4 * j;
        acc(i + 0) += (sa[2 * m] * sb[j].x) * scratch(4 * j + 0);
        acc(i + 1) += (sa[2 * m] * sb[j].y) * scratch(4 * j + 1);
        acc(i + 2) += (sa[2 * m + 1] * sb[j].x) * scratch(4 * j + 2);
        acc(i + 3) += (sa[2 * m + 1] * sb[j].y) * scratch(4 * j + 3);
      }
    };
    // K block kb with its first `steps` k32 steps.
    auto k_block = [&](auto steps, int kb) {
      pipeline.consumer_wait(state);
      const int stage = state.index();
      // A contiguous-K group's partial last block whose last step reads the next group's tokens.
      if (w.tail_valid % kMmaStepK != 0 && kb == w.num_k_blocks - 1) {
        zero_tail(smem, stage, w.tail_valid, consumer_tid);
      }
      // Scales before the WGMMAs: shared-memory loads wait behind their operand reads.
      if (!(diag & kDiagScalesOnce) || kb == 0) load_scales(stage);
      issue_half(steps, 0, stage, scratch0, kb);
      issue_half(steps, 1, stage, scratch1, kb);
      warpgroup_wait<1>();  // m0 done, m1 may still run
      promote_half(0, scratch0, kb);
      warpgroup_wait<0>();
      promote_half(1, scratch1, kb);
      // Released after the last use of the scale registers: only then have their shared-memory loads
      // provably completed (the next TMA write into this stage must not overtake them).
      pipeline.consumer_release(state);
      ++state;
    };

    clear(acc);
    if constexpr (kMode == GroupMode::Contiguous) {
      const int last = w.num_k_blocks - 1;
      for (int kb = 0; kb < last; ++kb) k_block(Int<kMmaSteps>{}, kb);
      if (last >= 0) {
        static_assert(kMmaSteps == 4, "one case per step count below");
        switch ((w.last_valid + kMmaStepK - 1) / kMmaStepK) {
          case 1: k_block(Int<1>{}, last); break;
          case 2: k_block(Int<2>{}, last); break;
          case 3: k_block(Int<3>{}, last); break;
          default: k_block(Int<4>{}, last); break;
        }
      }
    } else {
      for (int kb = 0; kb < w.num_k_blocks; ++kb) k_block(Int<kMmaSteps>{}, kb);
    }
  }

  // m-grouped: B's scales are one per 128 x 128 block, and with BLOCK_N = 256 (n0 a multiple of 256) each
  // warpgroup's 128 columns lie in one block column of b: per K block the warpgroup needs one B scale, read
  // from global memory one K block ahead (all its threads read the same word: one broadcast load per warp),
  // and the promotion is one FFMA per element with sa[r] * sb folded per row:
  //     acc[r][c] += (sa[r] * sb) * scratch[r][c]
  // (the same expression, so the same bits, as mma_tile's with every column's scale equal). 128 accumulators
  // and 64 scratch registers per thread leave no room for a second scratch: each m64 half is issued, waited
  // for and promoted in turn, and the other warpgroup's WGMMAs keep the tensor cores busy meanwhile.
  // `sb_col` points at the warpgroup's block column of b's scales for K block 0 (whose value the caller has
  // loaded ahead: `sb_first`); `sb_k_stride` steps one K block.
  template <class Accum, class Scratch>
  __device__ static void mma_tile_block_scaled(Pipeline& pipeline, PipelineState& state, SharedStorage& smem,
                                               const WorkTile& w, const float* sb_col, float sb_first,
                                               int64_t sb_k_stride, Accum& acc, Scratch& scratch, int consumer_tid) {
    using namespace cute;
    static_assert(kBlockN / 2 == kScaleBlockK, "a warpgroup's columns must be one block column of b");
    TiledMma tiled_mma;
    auto thr_mma = tiled_mma.get_thread_slice(consumer_tid);
    Tensor sA = make_tensor(make_smem_ptr(smem.a), SmemLayoutA{});  // (BLK_M,BLK_K,PIPE)
    Tensor sB = make_tensor(make_smem_ptr(smem.b), SmemLayoutB{});  // (BLK_N,BLK_K,PIPE)
    Tensor tCrA = thr_mma.make_fragment_A(thr_mma.partition_A(sA));  // (MMA,MMA_M=2,MMA_K,PIPE)
    Tensor tCrB = thr_mma.make_fragment_B(thr_mma.partition_B(sB));  // (MMA,MMA_N=1,MMA_K,PIPE)
    const int warp = (consumer_tid % 128) / 32;
    const int row0 = warp * 16 + (consumer_tid % 32) / 4;  // + 8, + 64, + 72

    float sb_next = sb_first;
    clear(acc);
    for (int kb = 0; kb < w.num_k_blocks; ++kb) {
      const float sb = sb_next;
      if (kb + 1 < w.num_k_blocks) sb_next = __ldg(sb_col + (kb + 1) * sb_k_stride);
      pipeline.consumer_wait(state);
      const int stage = state.index();
      float sa[4];
      CUTE_UNROLL
      for (int h = 0; h < 4; ++h) sa[h] = smem.sa[stage][row0 + 8 * (h % 2) + 64 * (h / 2)];
      CUTE_UNROLL
      for (int m = 0; m < 2; ++m) {
        warpgroup_fence_operand(scratch);
        warpgroup_arrive();
        tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
        CUTE_UNROLL
        for (int k = 0; k < size<2>(tCrA); ++k) {
          cute::gemm(tiled_mma, tCrA(_, m, k, stage), tCrB(_, 0, k, stage), scratch(_, 0, 0));
          tiled_mma.accumulate_ = GMMA::ScaleOut::One;
        }
        warpgroup_commit_batch();
        warpgroup_wait<0>();
        warpgroup_fence_operand(scratch);
        const float s0 = sa[2 * m] * sb, s1 = sa[2 * m + 1] * sb;
        CUTE_UNROLL
        for (int j = 0; j < kColGroups; ++j) {
          const int i = kFragPerM * m + 4 * j;
          acc(i + 0) += s0 * scratch(4 * j + 0);
          acc(i + 1) += s0 * scratch(4 * j + 1);
          acc(i + 2) += s1 * scratch(4 * j + 2);
          acc(i + 3) += s1 * scratch(4 * j + 3);
        }
      }
      pipeline.consumer_release(state);  // after the scale registers' last use (see mma_tile)
      ++state;
    }
  }
};

}  // namespace wgrad
