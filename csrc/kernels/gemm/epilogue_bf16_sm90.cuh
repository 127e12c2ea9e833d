// \brief SM90 bf16 epilogue: out = acc in bf16, written, not accumulated. It serves the m-grouped GEMM
// (MoE fprop and dgrad, BLOCK_N = 256) and the weight-gradient GEMMs' bf16 form (BLOCK_N = 128 / 144 / 160,
// out [G, M, N]).
//
// A tile whose rows all belong to its group goes out through shared memory and TMA stores: each consumer
// warpgroup converts one m64 slice of its BLOCK_N/2 columns at a time into its own buffer, as 64 x 64 boxes
// of 128-byte rows in the 128B swizzle (a quad's 16 bytes land in distinct banks) and, for the 8 or 16
// columns past the last whole box (BLOCK_N 144 / 160), 64 x 8 boxes of 16-byte rows (rows of a warp's 8
// lanes fall in distinct banks without a swizzle); one thread issues the slice's stores, which clip rows
// and columns outside out. The stores run while the warpgroup starts the next tile's mainloop: the
// output's write traffic, a large part of the bytes of a short-K GEMM, overlaps the tensor cores' work.
// The buffer holds the whole tile, so the next tile's epilogue is the first to wait for these stores to
// have read it.
//
// m-grouped: a tile that straddles a group boundary holds rows of the neighbouring groups' tiles (another
// CTA writes them), and no tensor map knows where the group ends: each thread then writes its own
// elements, two adjacent columns (one 4-byte bf16 pair) per store, rows outside the group and columns past
// N skipped. The same path serves every tile when out's layout cannot be a tensor map (a pointer or row
// stride that is not a multiple of 16 bytes).
//
// Weight gradient: the tensor maps cover the columns [0, N & ~7) (whole 16-byte chunks), and the threads
// that own the 1-7 columns of a ragged right edge store them one element at a time.
#pragma once

#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/common/named_barriers.h"
#include "kernels/gemm/group_walker.cuh"
#include "kernels/gemm/tile_config.h"

namespace wgrad {

// Where the bf16 out lives: [G, rows, N] with row stride ld and group stride group_stride (elements).
struct Bf16OutView {
  __nv_bfloat16* ptr = nullptr;
  int64_t ld = 0;
  int64_t group_stride = 0;
  int n = 0;
  int tma = 0;       // 1: the kernel's tensor maps describe out, and whole tiles go through them
  int tma_cols = 0;  // the columns the tensor maps cover (weight gradient: N & ~7; m-grouped: N)
  int m = 0;         // weight gradient: M, the rows of each group of out
};

// The tensor maps of a bf16 out: 64 x 64 boxes in the 128B swizzle, and 8 x 64 boxes for the columns past
// the last whole 64 of a warpgroup (unused at BLOCK_N 128 and 256).
struct Bf16OutMaps {
  const CUtensorMap* wide;
  const CUtensorMap* narrow;
};

template <int kBlockN_>
struct EpilogueBf16Sm90 {
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kFragPerM = kBlockN / 4;
  static constexpr int kColGroups = kBlockN / 16;  // groups of 8 columns per warpgroup
  static constexpr int kSliceRows = kEpilogueSliceRows;  // 64: one m64 block of the fragment
  static constexpr int kSliceCols = kBlockN / 2;         // one warpgroup's columns
  static constexpr int kBoxCols = 64;                    // 128 bytes of bf16: the 128B swizzle's row
  static constexpr int kBoxBytes = kSliceRows * kBoxCols * 2;
  static constexpr int kWideBoxes = kSliceCols / kBoxCols;
  static constexpr int kNarrowCols = 8;                  // 16 bytes: one chunk per row
  static constexpr int kNarrowBoxBytes = kSliceRows * kNarrowCols * 2;
  static constexpr int kNarrowBoxes = (kSliceCols % kBoxCols) / kNarrowCols;
  static_assert(kSliceCols % kNarrowCols == 0, "a warpgroup's columns must be whole 16-byte chunks");

  static constexpr int kSliceBytes = kSliceRows * kSliceCols * 2;
  static_assert(kSliceBytes % 1024 == 0, "every slice's first box must keep the swizzle's 1024-byte alignment");

  struct SharedStorage {
    // Per warpgroup, its two slices, each kWideBoxes swizzled boxes and then kNarrowBoxes plain ones.
    alignas(1024) __nv_bfloat16 out[2][2 * kSliceRows * kSliceCols];
  };

  __device__ static bool whole_tile(const Bf16OutView& out, const WorkTile& w) {
    return out.tma != 0 && w.m0 >= w.m_begin && w.m0 + kBlockM <= w.m_end;
  }

  // A tile through the warpgroup's buffer and TMA stores (see the top of the file): rows from m0 of group
  // `group` of out, columns from the tile's. Byte (r, c) of a wide box sits at r * 128 + ((c / 16) ^ (r % 8))
  // * 16 + c % 16, of a narrow one at r * 16 + c.
  template <class Accum>
  __device__ static void store_staged(Bf16OutMaps maps, const Bf16OutView& out, SharedStorage& smem,
                                      const Accum& acc, int m0, int n_block, int group, int consumer_tid) {
    const int wg = consumer_tid / 128;
    const int wg_tid = consumer_tid % 128;
    const int lane = wg_tid % 32;
    const uint32_t barrier = static_cast<uint32_t>(wg == 0 ? NamedBarrierId::EpilogueWg0 : NamedBarrierId::EpilogueWg1);
    uint8_t* buf = reinterpret_cast<uint8_t*>(smem.out[wg]);
    // Row r = 16 warp + lane / 4 (and r + 8) of the slice, both r % 8 == lane / 4: chunk c of the row sits
    // at (row bytes + 4 (lane % 4) + 16 (lane / 4)) ^ 16 c, one XOR per column group.
    const int row = (wg_tid / 32) * 16 + lane / 4;
    const int row_bytes = row * 128 + 4 * (lane % 4) + 16 * (lane / 4);
    const int narrow_bytes = kWideBoxes * kBoxBytes + row * 16 + 4 * (lane % 4);
    const int n0 = n_block * kBlockN + wg * kSliceCols;
    // The previous tile's stores from this buffer have read it.
    if (wg_tid == 0) cute::tma_store_wait<0>();
    cutlass::arch::NamedBarrier::sync(128, barrier);
    CUTE_UNROLL
    for (int slice = 0; slice < 2; ++slice) {
      uint8_t* const slice_buf = buf + slice * kSliceBytes;
      CUTE_UNROLL
      for (int j = 0; j < kColGroups; ++j) {
        const int box = j / (kBoxCols / 8), chunk = j % (kBoxCols / 8);
        CUTE_UNROLL
        for (int h = 0; h < 2; ++h) {
          const int i = kFragPerM * slice + 4 * j + 2 * h;
          const __nv_bfloat162 v = __floats2bfloat162_rn(acc(i), acc(i + 1));
          const int offset = box < kWideBoxes ? box * kBoxBytes + 8 * 128 * h + (row_bytes ^ (16 * chunk))
                                              : narrow_bytes + chunk * kNarrowBoxBytes + 8 * 16 * h;
          *reinterpret_cast<__nv_bfloat162*>(slice_buf + offset) = v;
        }
      }
      cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read next by the TMA unit
      cutlass::arch::NamedBarrier::sync(128, barrier);
      if (wg_tid == 0) {
        const int r0 = m0 + slice * kSliceRows;
        CUTE_UNROLL
        for (int box = 0; box < kWideBoxes; ++box) {
          if (n0 + box * kBoxCols < out.tma_cols) {
            cute::SM90_TMA_STORE_3D::copy(maps.wide, slice_buf + box * kBoxBytes, n0 + box * kBoxCols, r0, group);
          }
        }
        CUTE_UNROLL
        for (int box = 0; box < kNarrowBoxes; ++box) {
          const int c = n0 + kWideBoxes * kBoxCols + box * kNarrowCols;
          if (c < out.tma_cols) {
            cute::SM90_TMA_STORE_3D::copy(maps.narrow, slice_buf + kWideBoxes * kBoxBytes + box * kNarrowBoxBytes,
                                          c, r0, group);
          }
        }
        cute::tma_store_arrive();
      }
    }
  }

  // Weight gradient: columns [tma_cols, n) of this thread's rows (at most 7, in the last column tile only),
  // one element per store. Rows past M are skipped.
  template <class Accum>
  __device__ static void store_ragged_edge(const Bf16OutView& out, const Accum& acc, int m0, int n_block, int group,
                                           int consumer_tid) {
    const int wg = consumer_tid / 128;
    const int warp = (consumer_tid % 128) / 32;
    const int lane = consumer_tid % 32;
    const int n0 = n_block * kBlockN + wg * kSliceCols;
    if (n0 + kSliceCols <= out.tma_cols || out.tma_cols >= out.n) return;
    __nv_bfloat16* base = out.ptr + group * out.group_stride;
    const int col0 = n0 + 2 * (lane % 4);
    CUTE_UNROLL
    for (int i = 0; i < 2 * kFragPerM; ++i) {
      const int v = i % kFragPerM;
      const int col = col0 + 8 * (v / 4) + v % 2;
      const int r = m0 + 16 * warp + lane / 4 + 8 * ((v / 2) % 2) + kSliceRows * (i / kFragPerM);
      if (col >= out.tma_cols && col < out.n && r < out.m) base[int64_t{r} * out.ld + col] = __float2bfloat16_rn(acc(i));
    }
    __syncwarp();  // converged before the next tile's WGMMAs (see store)
  }

  // Before the CTA exits: its stores must have read their smem.
  __device__ static void drain(int consumer_tid) {
    if (consumer_tid % 128 == 0) cute::tma_store_wait<0>();
  }

  // Fragment layout as documented in MainloopSm90::mma_tile: element 4 j + 2 h + e of m64 block m sits at
  // row 64 m + 16 warp + lane / 4 + 8 h, column wg * BLOCK_N/2 + 8 j + 2 (lane % 4) + e of the tile.
  template <class Accum>
  __device__ static void store(const Bf16OutView& out, const Accum& acc, const WorkTile& w, int consumer_tid) {
    const int wg = consumer_tid / 128;
    const int warp = (consumer_tid % 128) / 32;
    const int lane = consumer_tid % 32;
    const int col0 = w.coord.n_block * kBlockN + wg * (kBlockN / 2) + 2 * (lane % 4);
    CUTE_UNROLL
    for (int m = 0; m < 2; ++m) {
      CUTE_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int row = w.m0 + 64 * m + 16 * warp + lane / 4 + 8 * h;
        const bool row_ok = row >= w.m_begin && row < w.m_end;
        __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(out.ptr + int64_t{row} * out.ld + col0);
        CUTE_UNROLL
        for (int j = 0; j < kColGroups; ++j) {
          // N is even: a pair is inside out or entirely past it. Predicated stores, no early exits.
          const int i = kFragPerM * m + 4 * j + 2 * h;
          if (row_ok && col0 + 8 * j < out.n) dst[4 * j] = __floats2bfloat162_rn(acc(i), acc(i + 1));
        }
      }
    }
    // The bounds differ from lane to lane; the next tile's WGMMAs (.sync.aligned) need the warp converged,
    // whatever the compiler makes of the conditions above.
    __syncwarp();
  }
};

}  // namespace wgrad
