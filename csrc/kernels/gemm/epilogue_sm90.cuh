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

// One slice of the loaded epilogue's buffer (64 rows x BLOCK_N/2 fp32 columns of a warpgroup) in shared
// memory, and the TMA boxes that move it, as tile_config.h's fp32_out_box_cols / fp32_out_swizzled give them to
// the host's tensor map. Swizzled (BLOCK_N 128): boxes of 32 columns (128-byte rows) in the 128B swizzle, byte
// (r, c) of a box at r * 128 + ((c / 4) ^ (r % 8)) * 16 + 4 (c % 4). A warp's float2 accesses to its fragment
// (8 rows x 4 lanes x 8 bytes) then take the two shared-memory wavefronts 256 bytes need, where plain rows of
// 64 floats put all 8 rows on the same banks (8 wavefronts); the add reads and writes the buffer, so it would
// pay that twice. Plain (the other widths): row-major rows of BLOCK_N/2 floats, one box per slice. (The
// reduce-add only writes its slice and keeps plain rows: one TMA reduce-add per slice; more, smaller ones
// measured slower, decisions 0007 and 0041.)
template <int kBlockN>
struct Fp32SliceLayout {
  static constexpr int kSliceCols = epilogue_slice_cols(kBlockN);
  static constexpr bool kSwizzled = fp32_out_swizzled(kBlockN, true);
  static constexpr int kRows = kEpilogueSliceRows;
  static constexpr int kBoxCols = fp32_out_box_cols(kBlockN, true);
  static constexpr int kBoxes = kSliceCols / kBoxCols;
  static constexpr int kBoxBytes = kRows * kBoxCols * 4;
  static constexpr int kBytes = kRows * kSliceCols * 4;
  static_assert(kBoxes * kBoxCols == kSliceCols, "a slice is whole boxes");
  static_assert(!kSwizzled || kBoxCols * 4 == 128, "a swizzled box row is the 128B swizzle's row");
  static_assert(!kSwizzled || kBytes % 1024 == 0, "every slice's first box must keep the swizzle's 1024-byte alignment");

  // The thread's byte offset of its float2 in row r and columns 2 (lane % 4) + {0, 1} (column group j = 0);
  // r % 8 == lane / 4 (the fragment's rows).
  __device__ static int thread_offset(int r, int lane) {
    return kSwizzled ? r * 128 + 16 * (((lane % 4) / 2) ^ (r % 8)) + 8 * (lane % 2) : (r * kSliceCols + 2 * (lane % 4)) * 4;
  }
  // Column group j (columns 8 j ..), row half h (rows + 8 h). Swizzled: the chunk index 2 (j % 4) + (lane % 4) / 2
  // is XORed with r % 8, one XOR per column group.
  __device__ static int offset(int thread, int j, int h) {
    if constexpr (kSwizzled) {
      return (j / 4) * kBoxBytes + (thread ^ (32 * (j % 4))) + 8 * 128 * h;
    } else {
      return thread + 4 * (8 * j + 8 * kSliceCols * h);
    }
  }
  // f(smem byte offset, first column) for each box of a slice whose columns start at n0 and that holds
  // columns of out (< tma_cols); the TMA clips a box's columns past tma_cols.
  template <class F>
  __device__ static void for_each_box(int n0, int tma_cols, F&& f) {
    CUTE_UNROLL
    for (int box = 0; box < kBoxes; ++box) {
      if (n0 + box * kBoxCols < tma_cols) f(box * kBoxBytes, n0 + box * kBoxCols);
    }
  }
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
// as Fp32SliceLayout: in swizzled boxes at BLOCK_N 128, the width the host picks for it) and one transaction
// barrier. The warpgroup's first thread loads its half: for the CTA's first tile before the mainloop, for
// every later tile as soon as the previous tile's stores have read the buffer, so the load runs under the
// next tile's mainloop. Tile i of a CTA (counting the tiles it does not skip) waits in phase i % 2. Each out
// tile is written by one CTA once (no split K), so loading and storing it is race-free. Columns past tma_cols
// (a ragged right edge) stay with the threads, as in EpilogueSm90.
template <int kBlockN_>
struct EpilogueLoadedSm90 {
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kRowsPerSlice = kEpilogueSliceRows;
  static constexpr int kSliceCols = epilogue_slice_cols(kBlockN);
  static constexpr int kSliceElems = kRowsPerSlice * kSliceCols;
  static constexpr int kFragPerM = kBlockN / 4;
  using Layout = Fp32SliceLayout<kBlockN>;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;

  struct SharedStorage {
    alignas(1024) float out[2][kEpilogueSlices][kSliceElems];  // [warpgroup][slice], as Layout
    alignas(8) uint64_t full[2];                                 // [warpgroup]: its half has landed
  };

  // One thread, before the CTA's first barrier sync.
  __device__ static void init(SharedStorage& smem) {
    Barrier::init(&smem.full[0], 1);
    Barrier::init(&smem.full[1], 1);
  }

  // The first thread of warpgroup wg: its half of tile c's window, the boxes that hold columns of out (a
  // half wholly past tma_cols lands no bytes).
  __device__ static void load(const CUtensorMap* tma_out, const OutView& out, SharedStorage& smem,
                              const TileCoord& c, int wg) {
    constexpr uint64_t kEvictFirst = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_FIRST);
    const int n0 = c.n_block * kBlockN + wg * kSliceCols;
    uint32_t bytes = 0;
    Layout::for_each_box(n0, out.tma_cols, [&](int, int) { bytes += Layout::kBoxBytes; });
    if (bytes == 0) {
      Barrier::arrive(&smem.full[wg]);
      return;
    }
    Barrier::arrive_and_expect_tx(&smem.full[wg], kEpilogueSlices * bytes);
    CUTE_UNROLL
    for (int slice = 0; slice < kEpilogueSlices; ++slice) {
      uint8_t* buf = reinterpret_cast<uint8_t*>(smem.out[wg][slice]);
      const int r0 = c.m_block * kBlockM + slice * kRowsPerSlice;
      Layout::for_each_box(n0, out.tma_cols, [&](int offset, int col) {
        cute::SM90_TMA_LOAD_3D::copy(tma_out, &smem.full[wg], kEvictFirst, buf + offset, col, r0, c.group);
      });
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
    const int at = Layout::thread_offset(r, lane);

    Barrier::wait(&smem.full[wg], index & 1);
    CUTE_UNROLL
    for (int slice = 0; slice < kEpilogueSlices; ++slice) {
      uint8_t* buf = reinterpret_cast<uint8_t*>(smem.out[wg][slice]);
      // All of the slice's loads before its first store: interleaved, every store could alias the next load,
      // and each pair would wait out a shared-memory round trip in turn.
      float2 loaded[kSliceCols / 8][2];
      CUTE_UNROLL
      for (int j = 0; j < kSliceCols / 8; ++j) {
        loaded[j][0] = *reinterpret_cast<const float2*>(buf + Layout::offset(at, j, 0));
        loaded[j][1] = *reinterpret_cast<const float2*>(buf + Layout::offset(at, j, 1));
      }
      CUTE_UNROLL
      for (int j = 0; j < kSliceCols / 8; ++j) {
        const int i = kFragPerM * slice + 4 * j;
        *reinterpret_cast<float2*>(buf + Layout::offset(at, j, 0)) =
            make_float2(loaded[j][0].x + acc(i + 0), loaded[j][0].y + acc(i + 1));
        *reinterpret_cast<float2*>(buf + Layout::offset(at, j, 1)) =
            make_float2(loaded[j][1].x + acc(i + 2), loaded[j][1].y + acc(i + 3));
      }
    }
    cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read next by the TMA unit
    cutlass::arch::NamedBarrier::sync(128, barrier);
    if (wg_tid == 0) {
      if (n0 < out.tma_cols) {
        CUTE_UNROLL
        for (int slice = 0; slice < kEpilogueSlices; ++slice) {
          uint8_t* buf = reinterpret_cast<uint8_t*>(smem.out[wg][slice]);
          const int r0 = m0 + slice * kRowsPerSlice;
          Layout::for_each_box(n0, out.tma_cols, [&](int offset, int col) {
            cute::SM90_TMA_STORE_3D::copy(tma_out, buf + offset, col, r0, c.group);
          });
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
