// \brief SM90 epilogue of the wgrad GEMM: out += acc through a TMA reduce-add store.
//
// Each consumer warpgroup stages its 128 x BLOCK_N/2 fp32 accumulators, one 64-row slice at a time, in
// its own smem buffer and one thread issues `cp.reduce.async.bulk.tensor ... .add.f32` per slice: the SM
// never reads `out`, the store clips rows/columns outside the M x N window (partial tiles, strided
// views), and the last slice's store runs asynchronously while the warpgroup starts the next tile's
// mainloop. The buffer is reused only after the previous store has finished reading it.
//
// The reduce-add works on 16-byte chunks of a row: a chunk that is only partly inside out would have
// its outside elements rewritten (x + 0: NaN payloads and -0.0 change). So the TMA covers the columns
// [0, N & ~3) and the 1-3 columns of a ragged right edge are added by the threads that own them, with
// plain global loads and stores (each element has one owner: no atomics, deterministic).
#pragma once

#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

#include <cuda.h>

#include "kernels/common/diag.h"
#include "kernels/common/named_barriers.h"
#include "kernels/gemm/tile_config.h"
#include "kernels/gemm/tile_scheduler.h"

namespace wgrad {

// Where out lives: for the ragged right edge (columns [tma_cols, n)), which the threads add.
struct OutView {
  float* ptr = nullptr;
  int64_t ld = 0;            // row stride (elements)
  int64_t group_stride = 0;  // stride between groups (elements)
  int m = 0, n = 0;
  int tma_cols = 0;          // n & ~3: the columns the TMA store covers
};

template <int kBlockN_>
struct EpilogueSm90 {
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kRowsPerSlice = kEpilogueSliceRows;       // 64
  static constexpr int kSliceCols = epilogue_slice_cols(kBlockN);  // BLOCK_N / 2: one warpgroup's columns
  static constexpr int kFragPerM = kBlockN / 4;
  static_assert(kSliceCols % 8 == 0, "a warpgroup's columns must be whole groups of 8 (16-byte chunks)");
  static_assert(kEpilogueSlices == 2 && kRowsPerSlice == 64, "one slice per m64 block of the fragment");

  struct SharedStorage {
    alignas(128) float out[2][kRowsPerSlice * kSliceCols];  // (64,BLK_N/2) row-major per warpgroup
  };

  // Fragment layout as documented in MainloopSm90::mma_tile. The warpgroup's 128 x BLOCK_N/2 block
  // goes out in two row slices (its two m64 blocks) through one smem buffer: write a slice, one thread
  // issues its reduce-add, and the next slice waits until that store has read the buffer.
  template <class Accum>
  __device__ static void store(const CUtensorMap* tma_out, const OutView& out, SharedStorage& smem,
                               const Accum& acc, const TileCoord& c, int consumer_tid, int diag) {
    const int wg = consumer_tid / 128;
    const int wg_tid = consumer_tid % 128;
    const int warp = wg_tid / 32;
    const int lane = wg_tid % 32;
    const uint32_t barrier = static_cast<uint32_t>(wg == 0 ? NamedBarrierId::EpilogueWg0 : NamedBarrierId::EpilogueWg1);
    float* buf = smem.out[wg];
    const int r = warp * 16 + lane / 4;  // and r + 8, within the slice
    const int c0 = 2 * (lane % 4);       // + 8 j, within the warpgroup's columns
    const int n0 = c.n_block * kBlockN + wg * kSliceCols;
    const int m0 = c.m_block * kBlockM;

    CUTE_UNROLL
    for (int slice = 0; slice < kEpilogueSlices; ++slice) {
      // The previous store (the previous slice, or the previous tile's last) must have read the buffer.
      if (wg_tid == 0) cute::tma_store_wait<0>();
      cutlass::arch::NamedBarrier::sync(128, barrier);
      CUTE_UNROLL
      for (int j = 0; j < kSliceCols / 8; ++j) {
        if (diag & kDiagNoStaging) break;
        const int i = kFragPerM * slice + 4 * j;
        *reinterpret_cast<float2*>(&buf[r * kSliceCols + 8 * j + c0]) = make_float2(acc(i + 0), acc(i + 1));
        *reinterpret_cast<float2*>(&buf[(r + 8) * kSliceCols + 8 * j + c0]) = make_float2(acc(i + 2), acc(i + 3));
      }
      cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read next by the TMA unit
      cutlass::arch::NamedBarrier::sync(128, barrier);
      if (wg_tid == 0 && n0 < out.tma_cols) {
        if (diag & kDiagPlainStore) {
          cute::SM90_TMA_STORE_3D::copy(tma_out, buf, n0, m0 + slice * kRowsPerSlice, c.group);
        } else {
          cute::SM90_TMA_REDUCE_ADD_3D::copy(tma_out, buf, n0, m0 + slice * kRowsPerSlice, c.group);
        }
        cute::tma_store_arrive();
      }
    }
    if (n0 + kSliceCols > out.tma_cols && out.tma_cols < out.n) store_ragged_edge(out, acc, c.group, m0 + r, n0 + c0);
  }

  // Columns [tma_cols, n) of this thread's rows: at most 3 columns, in the last column tile only.
  template <class Accum>
  __device__ static void store_ragged_edge(const OutView& out, const Accum& acc, int group, int row, int col0) {
    float* base = out.ptr + group * out.group_stride;
    CUTE_UNROLL
    for (int i = 0; i < 2 * kFragPerM; ++i) {
      const int v = i % kFragPerM;
      const int col = col0 + 8 * (v / 4) + v % 2;
      const int r = row + 8 * ((v / 2) % 2) + kRowsPerSlice * (i / kFragPerM);
      if (col >= out.tma_cols && col < out.n && r < out.m) base[r * out.ld + col] += acc(i);
    }
  }

  // Before the CTA exits: its stores must have read their smem.
  __device__ static void drain(int consumer_tid) {
    if (consumer_tid % 128 == 0) cute::tma_store_wait<0>();
  }
};

// The fp32 epilogue with out loaded ahead: while a tile's mainloop runs, its window of out is TMA-loaded into
// shared memory; the consumers add their accumulators to it there and store it back with plain TMA stores.
// Same bytes as the reduce-add (out read once, written once), but the L2 serves a load and a store instead
// of a read-modify-write of every 16-byte chunk, whose rate binds the kernel when tiles have few K blocks
// (decision 0040). The price is a whole fp32 tile of shared memory (64 to 80 KB), one pipeline stage fewer,
// so the host picks it for short K only (tile_config.h: select_fp32_config).
//
// Each consumer warpgroup owns its half of the buffer (its BLOCK_N/2 columns, as two 64-row slices laid out
// as EpilogueSm90's) and one transaction barrier. The warpgroup's first thread loads its half: for the CTA's
// first tile before the mainloop, for every later tile as soon as the previous tile's stores have read the
// buffer, so the load runs under the next tile's mainloop. Tile i of a CTA (counting the tiles it does not
// skip) waits in phase i % 2. Each out tile is written by one CTA once (no split K), so loading and storing
// it is race-free. Columns past tma_cols (a ragged right edge) stay with the threads, as in EpilogueSm90.
template <int kBlockN_>
struct EpilogueLoadedSm90 {
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kRowsPerSlice = kEpilogueSliceRows;
  static constexpr int kSliceCols = epilogue_slice_cols(kBlockN);
  static constexpr int kSliceElems = kRowsPerSlice * kSliceCols;
  static constexpr int kFragPerM = kBlockN / 4;
  static constexpr uint32_t kWarpgroupBytes = static_cast<uint32_t>(4 * kEpilogueSlices * kSliceElems);
  using Barrier = cutlass::arch::ClusterTransactionBarrier;

  struct SharedStorage {
    alignas(128) float out[2][kEpilogueSlices][kSliceElems];  // [warpgroup][slice] (64,BLK_N/2) row-major
    alignas(8) uint64_t full[2];                                // [warpgroup]: its half has landed
  };

  // One thread, before the CTA's first barrier sync.
  __device__ static void init(SharedStorage& smem) {
    Barrier::init(&smem.full[0], 1);
    Barrier::init(&smem.full[1], 1);
  }

  // The first thread of warpgroup wg: its half of tile c's window. A half wholly past tma_cols (nothing
  // for the TMA) lands no bytes.
  __device__ static void load(const CUtensorMap* tma_out, const OutView& out, SharedStorage& smem,
                              const TileCoord& c, int wg) {
    constexpr uint64_t kEvictFirst = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_FIRST);
    const int n0 = c.n_block * kBlockN + wg * kSliceCols;
    if (n0 < out.tma_cols) {
      Barrier::arrive_and_expect_tx(&smem.full[wg], kWarpgroupBytes);
      CUTE_UNROLL
      for (int slice = 0; slice < kEpilogueSlices; ++slice) {
        cute::SM90_TMA_LOAD_3D::copy(tma_out, &smem.full[wg], kEvictFirst, smem.out[wg][slice], n0,
                                     c.m_block * kBlockM + slice * kRowsPerSlice, c.group);
      }
    } else {
      Barrier::arrive(&smem.full[wg]);
    }
  }

  // acc added to the loaded window of tile c (the CTA's index-th), stored back. `next`: the CTA's next tile
  // (if has_next), whose load follows once the stores have read the buffer.
  template <class Accum>
  __device__ static void store(const CUtensorMap* tma_out, const OutView& out, SharedStorage& smem,
                               const Accum& acc, const TileCoord& c, bool has_next, const TileCoord& next,
                               int consumer_tid, int index) {
    const int wg = consumer_tid / 128;
    const int wg_tid = consumer_tid % 128;
    const int warp = wg_tid / 32;
    const int lane = wg_tid % 32;
    const uint32_t barrier = static_cast<uint32_t>(wg == 0 ? NamedBarrierId::EpilogueWg0 : NamedBarrierId::EpilogueWg1);
    const int r = warp * 16 + lane / 4;  // and r + 8, within the slice
    const int c0 = 2 * (lane % 4);       // + 8 j, within the warpgroup's columns
    const int n0 = c.n_block * kBlockN + wg * kSliceCols;
    const int m0 = c.m_block * kBlockM;

    Barrier::wait(&smem.full[wg], index & 1);
    CUTE_UNROLL
    for (int slice = 0; slice < kEpilogueSlices; ++slice) {
      float* buf = smem.out[wg][slice];
      CUTE_UNROLL
      for (int j = 0; j < kSliceCols / 8; ++j) {
        const int i = kFragPerM * slice + 4 * j;
        float2* lo = reinterpret_cast<float2*>(&buf[r * kSliceCols + 8 * j + c0]);
        float2* hi = reinterpret_cast<float2*>(&buf[(r + 8) * kSliceCols + 8 * j + c0]);
        const float2 x = *lo, y = *hi;
        *lo = make_float2(x.x + acc(i + 0), x.y + acc(i + 1));
        *hi = make_float2(y.x + acc(i + 2), y.y + acc(i + 3));
      }
    }
    cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read next by the TMA unit
    cutlass::arch::NamedBarrier::sync(128, barrier);
    if (wg_tid == 0) {
      if (n0 < out.tma_cols) {
        CUTE_UNROLL
        for (int slice = 0; slice < kEpilogueSlices; ++slice) {
          cute::SM90_TMA_STORE_3D::copy(tma_out, smem.out[wg][slice], n0, m0 + slice * kRowsPerSlice, c.group);
        }
        cute::tma_store_arrive();
        cute::tma_store_wait<0>();  // the stores have read the buffer (not yet written out)
      }
      if (has_next) load(tma_out, out, smem, next, wg);
    }
    if (n0 + kSliceCols > out.tma_cols && out.tma_cols < out.n) {
      EpilogueSm90<kBlockN>::store_ragged_edge(out, acc, c.group, m0 + r, n0 + c0);
    }
  }
};

}  // namespace wgrad
