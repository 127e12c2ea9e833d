// \brief The generic tile kernel of the FP8 1x128 quantization: any alignment, any C, the path of the
// inputs the vector kernels cannot take. The fast kernels: rowwise.cuh (row-wise), colwise_kernel_sm90.cuh
// (column-wise, both, segments) and segments_carry.cuh (segments). Numerics: numerics.cuh. Torch-free.
//
// Generic tile kernel: one CTA quantizes a 128 x 128 tile of x [R, C] (row-major). Each thread holds 4
// consecutive rows x 8 consecutive columns, so that
//   - a row of the tile is 16 threads (one half-warp): row amax = 4 xor-shuffles;
//   - the 4 rows of one column make one 32-bit word of the transposed output q_t, staged in shared memory
//     and written to global memory as 16-byte rows of q_t.
#pragma once

#include <cstdint>

#include "kernels/common/layout.h"
#include "kernels/quant/numerics.cuh"
#include "kernels/quant/params.h"
#include "kernels/quant/segment_table.cuh"

namespace wgrad::quant {

constexpr int kTileRows = kBlock;                           // one column block per CTA
constexpr int kTileCols = kBlock;                           // one row block per CTA
constexpr int kRowsPerThread = 4;                           // one 32-bit word of q_t per column
constexpr int kColGroups = kTileCols / kColsPerThread;      // 16 threads cover one tile row
constexpr int kRowGroups = kTileRows / kRowsPerThread;      // 32
constexpr int kThreads = kColGroups * kRowGroups;           // 512
constexpr int kWarps = kThreads / 32;                       // 16
constexpr int kMinCtasPerSm = 1;                            // Both needs > 64 registers (no spills)
constexpr int kQtWordsPerCol = kTileRows / 4;               // 32 words = 128 bytes of q_t per column

static_assert(kColGroups == 16, "row amax reduces over the 16 lanes of a half-warp");
static_assert(kRowGroups == 2 * kWarps, "a warp holds two row groups (lanes 0-15 and 16-31)");

// ------------------------------------------------------------------ q_t staging -----------------------
// Shared memory holds the tile's q_t as [kTileCols][32 words]; word w of column c sits at w ^ swz(c).
// The XOR makes the 32 lanes of a warp (16 columns x 2 words) hit 32 different banks when they store,
// while a 16-byte chunk of a column stays one physical 16-byte chunk (its words pairwise swapped when
// bit 1 of swz is set), so the reads are conflict-free 16-byte loads.
__device__ __forceinline__ int qt_swizzle(int col) { return ((col >> 3) & (kColGroups - 1)) << 1; }

__device__ __forceinline__ uint8_t qt_staged_byte(const uint32_t* s_qt, int col, int row) {
  const int word = (row >> 2) ^ qt_swizzle(col);
  return reinterpret_cast<const uint8_t*>(s_qt)[(col * kQtWordsPerCol + word) * 4 + (row & 3)];
}

__device__ __forceinline__ uint4 qt_staged_chunk(const uint32_t* s_qt, int col, int chunk) {
  const int swz = qt_swizzle(col);
  const uint4 raw = reinterpret_cast<const uint4*>(s_qt + col * kQtWordsPerCol)[chunk ^ (swz >> 2)];
  return (swz & 2) ? make_uint4(raw.z, raw.w, raw.x, raw.y) : raw;
}

// ------------------------------------------------------------------ the generic tile kernel -----------
// grid.x: row blocks (128-row blocks of x, or the entries of row_blocks for ColwiseSegments); grid.y:
// 128-column tiles. (A 1-D grid with column tiles fastest measured the same on H200 and spilled.)
// Element-wise accesses with bounds checks: this kernel serves only the inputs the vector kernels
// cannot take (C % 8 != 0, an x that is not 16-byte aligned, R == 0 segments).
template <typename T, QuantMode kMode>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm) quantize_fp8_1x128_kernel(const QuantizeParams p) {
  constexpr bool kRow = has_rowwise(kMode);
  constexpr bool kCol = has_colwise(kMode);

  __shared__ alignas(16) uint32_t s_qt[kCol ? kTileCols * kQtWordsPerCol : 1];
  __shared__ alignas(16) float s_col_amax[kCol ? kWarps : 1][kTileCols];
  __shared__ alignas(16) float s_col_scale[kCol ? kTileCols : 1];

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int col_group = tid % kColGroups;
  const int row_group = tid / kColGroups;
  const int64_t col_tile = blockIdx.y;
  const int64_t tile_col = col_tile * kTileCols;
  const int64_t thread_col = tile_col + col_group * kColsPerThread;
  const int64_t row_block = blockIdx.x;

  int64_t row_start;
  int64_t out_start;  // first q_t column of the block
  int row_count;
  if constexpr (kMode == QuantMode::ColwiseSegments) {
    const RowBlock rb = p.row_blocks[row_block];
    row_start = rb.row_start;
    out_start = rb.out_start;
    row_count = rb.row_count;
    if (row_count <= 0) {
      for (int c = tid; c < kTileCols; c += kThreads) fill_empty_scale_column(p, row_block, tile_col, row_count, c);
      return;
    }
  } else {
    row_start = row_block * kTileRows;
    out_start = row_start;
    row_count = static_cast<int>(p.rows - row_start < kTileRows ? p.rows - row_start : kTileRows);
  }

  // ---- load: rows [row_start + 4 * row_group, +4), columns [thread_col, +8); missing elements are 0,
  // which never changes an amax (and the floor keeps the scale positive).
  const T* x = static_cast<const T*>(p.x);
  float v[kRowsPerThread][kColsPerThread];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int local_row = row_group * kRowsPerThread + i;
    const bool row_ok = local_row < row_count;
    const T* src = x + (row_start + local_row) * p.cols + thread_col;
#pragma unroll
    for (int j = 0; j < kColsPerThread; ++j) {
      v[i][j] = (row_ok && thread_col + j < p.cols) ? to_float(src[j]) : 0.0f;
    }
  }

  // ---- row-wise: amax over the half-warp that holds the row, scale, q, scales
  if constexpr (kRow) {
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      float amax = 0.0f;
#pragma unroll
      for (int j = 0; j < kColsPerThread; ++j) amax = fmaxf(amax, abs_or_inf(v[i][j]));
#pragma unroll
      for (int offset = kColGroups / 2; offset > 0; offset >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
      }
      const float scale = block_scale(amax, p.ue8m0);
      const float inv_scale = scale_reciprocal(scale);
      const int local_row = row_group * kRowsPerThread + i;
      if (local_row >= row_count) continue;
      const int64_t row = row_start + local_row;
      if (col_group == 0) p.scales[col_tile * p.scales_ld + row] = scale;
      const uint2 packed = quantize_eight(v[i], scale, inv_scale);
      uint8_t* dst = p.q + row * p.cols + thread_col;
#pragma unroll
      for (int j = 0; j < kColsPerThread; ++j) {
        if (thread_col + j < p.cols) dst[j] = uint8_t((j < 4 ? packed.x : packed.y) >> (8 * (j % 4)));
      }
    }
  }

  if constexpr (kCol) {
    // ---- column amax: 4 rows in the thread, 2 row groups in the warp, 16 warps through shared memory
    {
      float amax[kColsPerThread];
#pragma unroll
      for (int j = 0; j < kColsPerThread; ++j) {
        amax[j] = abs_or_inf(v[0][j]);
#pragma unroll
        for (int i = 1; i < kRowsPerThread; ++i) amax[j] = fmaxf(amax[j], abs_or_inf(v[i][j]));
        amax[j] = fmaxf(amax[j], __shfl_xor_sync(0xFFFFFFFFu, amax[j], kColGroups));
      }
      if (lane < kColGroups) {
        float4* dst = reinterpret_cast<float4*>(&s_col_amax[warp][col_group * kColsPerThread]);
        dst[0] = make_float4(amax[0], amax[1], amax[2], amax[3]);
        dst[1] = make_float4(amax[4], amax[5], amax[6], amax[7]);
      }
    }
    __syncthreads();
    if (tid < kTileCols) {
      float amax = s_col_amax[0][tid];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) amax = fmaxf(amax, s_col_amax[w][tid]);
      const float scale = block_scale(amax, p.ue8m0);
      s_col_scale[tid] = scale;
      if (tile_col + tid < p.cols) p.scales_t[row_block * p.scales_t_ld + tile_col + tid] = scale;
    }
    __syncthreads();

    // ---- quantize: the 4 rows of column j are one word of q_t (row 4 * row_group + i in byte i).
    // Rows past the block are staged as 0 even in a NaN block: they may land in q_t's padding.
    const int valid_rows = row_count - row_group * kRowsPerThread;
    const uint32_t row_mask =
        valid_rows >= kRowsPerThread ? 0xFFFFFFFFu : (valid_rows <= 0 ? 0u : (1u << (8 * valid_rows)) - 1u);
#pragma unroll
    for (int j = 0; j < kColsPerThread; ++j) {
      const int col = col_group * kColsPerThread + j;
      const float scale = s_col_scale[col];
      const uint32_t word = quantize_quad(v[0][j], v[1][j], v[2][j], v[3][j], scale, scale_reciprocal(scale));
      s_qt[col * kQtWordsPerCol + (row_group ^ qt_swizzle(col))] = word & row_mask;
    }
    __syncthreads();

    // ---- store q_t columns [out_start, out_start + write_count) of every column of the tile. The block
    // that ends at row `rows` also writes q_t's padding columns [rows, q_t_ld) (with 0: rows past the
    // block were loaded as 0), so q_t never holds uninitialised bytes; padded segments: every block writes
    // its segment's zero columns up to the next multiple of seg_pad, and the block that ends at row `rows`
    // also the zero columns after it (see q_t_zero_tail).
    const bool last_block = row_start + row_count == p.rows;
    const int write_count =
        p.seg_pad > 0 ? static_cast<int>(align_up(out_start + row_count, p.seg_pad) - out_start)
                      : (last_block ? static_cast<int>(p.q_t_ld - out_start) : row_count);
    const int64_t first_chunk = out_start / 16;
    const int num_chunks = static_cast<int>((out_start + write_count + 15) / 16 - first_chunk);  // <= 9
    const bool aligned = out_start % 16 == 0;
    for (int task = tid; task < kTileCols * num_chunks; task += kThreads) {
      const int col = task / num_chunks;
      const int64_t chunk = first_chunk + task % num_chunks;
      if (tile_col + col >= p.cols) continue;
      const int64_t lo = chunk * 16 > out_start ? chunk * 16 : out_start;
      const int64_t hi = chunk * 16 + 16 < out_start + write_count ? chunk * 16 + 16 : out_start + write_count;
      uint8_t* dst = p.q_t + (tile_col + col) * p.q_t_ld + chunk * 16;
      uint4 data;
      if (kMode != QuantMode::ColwiseSegments || aligned) {  // then write_count <= 128: a staged chunk
        data = qt_staged_chunk(s_qt, col, static_cast<int>(chunk - first_chunk));
      } else {
        // A segment that starts mid-chunk: gather the chunk's bytes (the neighbours belong to other
        // blocks and are not written below).
        uint32_t words[4] = {0u, 0u, 0u, 0u};
#pragma unroll
        for (int b = 0; b < 16; ++b) {
          const int64_t local = chunk * 16 + b - out_start;
          if (local >= 0 && local < kTileRows) {
            words[b / 4] |= uint32_t(qt_staged_byte(s_qt, col, static_cast<int>(local))) << (8 * (b % 4));
          }
        }
        data = make_uint4(words[0], words[1], words[2], words[3]);
      }
      if (hi - lo == 16) {
        *reinterpret_cast<uint4*>(dst) = data;
      } else {
        for (int64_t r = lo; r < hi; ++r) {
          const int b = static_cast<int>(r - chunk * 16);
          const uint32_t word = b < 8 ? (b < 4 ? data.x : data.y) : (b < 12 ? data.z : data.w);
          dst[b] = uint8_t(word >> (8 * (b % 4)));
        }
      }
    }
    if (p.seg_pad > 0 && last_block) {
      const int64_t col_end = tile_col + kTileCols < p.cols ? tile_col + kTileCols : p.cols;
      q_t_zero_tail(p, tile_col, col_end, out_start + write_count, tid, kThreads);
    }
  }
}

}  // namespace wgrad::quant
