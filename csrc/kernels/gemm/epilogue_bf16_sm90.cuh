// \brief SM90 epilogue of the m-grouped GEMM: out = acc in bf16, stored by the threads that hold it.
//
// A tile's rows outside its group belong to the neighbouring groups' tiles (another CTA writes them), so
// the store must stop at rows that no tensor map knows: each thread writes its own elements, two adjacent
// columns (one 4-byte bf16 pair) per store, rows past the group and columns past N skipped. The four
// lanes of a quad write 16 contiguous bytes of a row and the pairs of two consecutive column groups fill
// one 32-byte sector, which the L2 merges before it writes back. No shared memory, nothing left in flight.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/gemm/group_walker.cuh"
#include "kernels/gemm/tile_config.h"

namespace wgrad {

// Where the bf16 out lives: [T, N] with row stride ld (elements).
struct Bf16OutView {
  __nv_bfloat16* ptr = nullptr;
  int64_t ld = 0;
  int n = 0;
};

template <int kBlockN_>
struct EpilogueBf16Sm90 {
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kFragPerM = kBlockN / 4;
  static constexpr int kColGroups = kBlockN / 16;  // groups of 8 columns per warpgroup

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
