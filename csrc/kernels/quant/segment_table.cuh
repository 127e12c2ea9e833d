// \brief The MoE segments casts' row-block table on the device: the sizes validated and turned into one
// entry per scale column (which rows of x, which q_t columns), built inside a kernel (every CTA for itself)
// or by a one-CTA kernel in global memory; and the fills of what has no rows (unused scale columns, the
// padded cast's zero columns). Torch-free.
#pragma once

#include <cstdint>

#include "kernels/common/layout.h"
#include "kernels/quant/numerics.cuh"
#include "kernels/quant/params.h"

namespace wgrad::quant {

// Where segment g starts: its first row of x, its first scale column (row block), its first q_t column.
struct SegmentStart {
  int32_t row_start;
  int32_t block_start;
  int32_t out_start;
};
static_assert(sizeof(SegmentStart) == sizeof(RowBlock), "one table area holds both");

template <int kWarps>
struct SegmentScanScratch {
  int64_t warp_rows[kWarps];
  int64_t warp_blocks[kWarps];
  int64_t warp_out[kWarps];
  int64_t carry_rows;
  int64_t carry_blocks;
  int64_t carry_out;
};

// Scale column `row_block` of a segment-table entry without rows, columns [tile_col, tile_col + 128) of
// it, one column per thread `c` (< 128): 0 for an unused trailing column (row_count == 0), NaN for invalid
// segment sizes (row_count < 0), so that any GEMM that consumes these scales produces NaN instead of a
// silently wrong result.
__device__ __forceinline__ void fill_empty_scale_column(const QuantizeParams& p, int64_t row_block, int64_t tile_col,
                                                        int row_count, int c) {
  const float fill = row_count == 0 ? 0.0f : __uint_as_float(kScaleNanBits);
  if (tile_col + c < p.cols) p.scales_t[row_block * p.scales_t_ld + tile_col + c] = fill;
}

// Padded segments (seg_pad > 0): zeros to q_t columns [from, q_t_ld) of output rows (x columns)
// [0, cols), 16 bytes per store; `from` is a multiple of 16. Task i of `count` = row i / chunks, chunk
// i % chunks; the caller's threads take tasks first, first + step, ...
__device__ __forceinline__ void q_t_zero_tail(const QuantizeParams& p, int64_t col_begin, int64_t col_end,
                                              int64_t from, int64_t first, int64_t step) {
  const int64_t chunks = (p.q_t_ld - from) / 16;
  if (chunks <= 0) return;
  for (int64_t i = first; i < (col_end - col_begin) * chunks; i += step) {
    const int64_t c = col_begin + i / chunks;
    *reinterpret_cast<uint4*>(p.q_t + c * p.q_t_ld + from + 16 * (i % chunks)) = make_uint4(0u, 0u, 0u, 0u);
  }
}

// ------------------------------------------------------------------ segment table ---------------------
// Inclusive prefix sums over the lanes of a warp of three values at once (rows, blocks, q_t columns):
// lane l ends with the sums of lanes 0..l. Every lane of the warp calls it.
template <class Rows, class Counts>
__device__ __forceinline__ void warp_inclusive_scan3(Rows& rows, Counts& blocks, Counts& out) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const Rows r = __shfl_up_sync(0xFFFFFFFFu, rows, offset);
    const Counts b = __shfl_up_sync(0xFFFFFFFFu, blocks, offset);
    const Counts o = __shfl_up_sync(0xFFFFFFFFu, out, offset);
    if (lane >= offset) {
      rows += r;
      blocks += b;
      out += o;
    }
  }
}

// Validates the sizes (each >= 0, sum == rows) and writes, for every scale column b of the segmented
// column-wise output, the rows of x it quantizes: segment g's j-th block is scale column
// sum_{h<g} ceil(size_h / 128) + j and covers rows [off_g + 128 j, min(off_g + 128 (j + 1), off_g + size_g)),
// written to q_t from column out_g + 128 j (out_g = sum_{h<g} align_up(size_h, pad); without padding,
// out_g = off_g). Columns past the last block get row_count 0; invalid sizes give row_count -1 everywhere.
// Every thread of the CTA calls it (kThreads of them, whole warps): it synchronises them with
// __syncthreads, and on return the table is complete. seg ([num_segments]) and table ([num_row_blocks])
// are shared memory (the column kernel builds its own copy in every CTA) or global memory (the one-CTA
// kernel below, for tables too large for shared memory).
template <int kThreads>
__device__ void build_segment_table(const SegmentTableArgs& a, SegmentStart* seg, RowBlock* table,
                                    SegmentScanScratch<kThreads / 32>& s) {
  static_assert(kThreads % 32 == 0, "whole warps: the scan shuffles");
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  if (tid == 0) {
    s.carry_rows = 0;
    s.carry_blocks = 0;
    s.carry_out = 0;
  }
  bool negative = false;
  __syncthreads();

  // Exclusive prefix sums of sizes and of blocks, kThreads segments at a time.
  for (int64_t base = 0; base < a.num_segments; base += kThreads) {
    const int64_t g = base + tid;
    const int64_t size = g < a.num_segments ? a.sizes[g] : 0;
    negative |= size < 0;
    const int64_t blocks = size > 0 ? ceil_div(size, kBlock) : 0;
    const int64_t out = a.pad > 0 && size > 0 ? align_up(size, a.pad) : size;  // q_t columns
    int64_t rows_incl = size, blocks_incl = blocks, out_incl = out;
    warp_inclusive_scan3(rows_incl, blocks_incl, out_incl);
    if (lane == 31) {
      s.warp_rows[warp] = rows_incl;
      s.warp_blocks[warp] = blocks_incl;
      s.warp_out[warp] = out_incl;
    }
    __syncthreads();
    int64_t rows_before = s.carry_rows, blocks_before = s.carry_blocks, out_before = s.carry_out;
    for (int w = 0; w < warp; ++w) {
      rows_before += s.warp_rows[w];
      blocks_before += s.warp_blocks[w];
      out_before += s.warp_out[w];
    }
    rows_before += rows_incl - size;
    blocks_before += blocks_incl - blocks;
    out_before += out_incl - out;
    if (g < a.num_segments) {
      seg[g] = {static_cast<int32_t>(rows_before), static_cast<int32_t>(blocks_before),
                static_cast<int32_t>(out_before)};
      if (a.padded_sizes != nullptr && blockIdx.x == 0) {  // one CTA writes them (meaningless if invalid)
        a.padded_sizes[g] = static_cast<int32_t>(out);
      }
    }
    __syncthreads();  // everyone has read the carries
    if (tid == kThreads - 1) {
      s.carry_rows = rows_before + size;
      s.carry_blocks = blocks_before + blocks;
      s.carry_out = out_before + out;
    }
    __syncthreads();  // carries and seg complete
  }
  const bool valid = !__syncthreads_or(negative) && s.carry_rows == a.rows;
  const int64_t total_blocks = s.carry_blocks;

  for (int64_t b = tid; b < a.num_row_blocks; b += kThreads) {
    RowBlock rb{0, valid ? 0 : -1, 0};
    if (valid && b < total_blocks) {
      // The segment of block b: the last g with seg[g].block_start <= b (empty segments share their
      // start with the next non-empty one, which comes after them).
      int64_t lo = 0, hi = a.num_segments - 1;
      while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (seg[mid].block_start <= b) lo = mid; else hi = mid - 1;
      }
      const SegmentStart st = seg[lo];
      const int64_t j = b - st.block_start;
      const int64_t left = a.sizes[lo] - j * kBlock;
      rb.row_start = static_cast<int32_t>(st.row_start + j * kBlock);
      rb.row_count = static_cast<int32_t>(left < kBlock ? left : kBlock);
      rb.out_start = static_cast<int32_t>(st.out_start + j * kBlock);
    }
    table[b] = rb;
  }
  __syncthreads();  // the table is complete
}

// What build_segment_table_warps returns to every warp (the same in each).
struct SegmentSummary {
  int32_t used_blocks;  // row blocks with rows (0 when the sizes are invalid): a prefix of the table
  bool inside_sector;   // some used segment starts inside a 32-byte sector of q_t (out_start % 32 != 0)
  bool inside_chunk;    // some used segment starts inside a 16-byte chunk of q_t (out_start % 16 != 0)
};

constexpr int kMaxWarpSegments = 32;  // build_segment_table_warps: one segment per lane

// The same table for at most kMaxWarpSegments segments, built without shared memory or a barrier
// between warps: every warp of the CTA loads the sizes (lane g: segment g), scans them with shuffles,
// and writes the entries warp * 32 + lane + k * 32 * warps; an entry's segment is found by a binary
// search over the lanes (the last g whose first block is <= b). Every thread of the CTA calls it; the
// caller synchronises the CTA before the table is read. In the column kernel it replaces the CTA-wide
// scan on the critical path of the first load: the producer's first load then trails the plain column
// cast's by ~1.2 us instead of ~3 us (measured on an H200).
__device__ __forceinline__ SegmentSummary build_segment_table_warps(const SegmentTableArgs& a, RowBlock* table,
                                                                    int warp, int warps) {
  const int lane = threadIdx.x & 31;
  const int groups = static_cast<int>(a.num_segments);  // in [1, 32]
  const int32_t size = lane < groups ? a.sizes[lane] : 0;
  // Rows in 64 bits (their total validates the sizes); blocks and q_t columns in 32 unsigned bits, exact
  // whenever the sizes are valid (sums of at most R or K < 2^31) and only wrapping when they are not.
  const uint32_t usize = size > 0 ? static_cast<uint32_t>(size) : 0u;
  const uint32_t blocks = (usize + (kBlock - 1)) / kBlock;
  const uint32_t out = a.pad > 0 && size > 0
                           ? (usize + static_cast<uint32_t>(a.pad - 1)) & ~static_cast<uint32_t>(a.pad - 1)
                           : static_cast<uint32_t>(size);  // q_t columns (as build_segment_table's)
  int64_t rows_incl = size;
  uint32_t blocks_incl = blocks, out_incl = out;
  warp_inclusive_scan3(rows_incl, blocks_incl, out_incl);
  const bool valid = __ballot_sync(0xFFFFFFFFu, size < 0) == 0u && __shfl_sync(0xFFFFFFFFu, rows_incl, 31) == a.rows;
  const int32_t row_start = static_cast<int32_t>(rows_incl - size);
  const int32_t block_start = static_cast<int32_t>(blocks_incl - blocks);
  const int32_t out_start = static_cast<int32_t>(out_incl - out);
  if (a.padded_sizes != nullptr && blockIdx.x == 0 && warp == 0 && lane < groups) {  // meaningless if invalid
    a.padded_sizes[lane] = static_cast<int32_t>(out);
  }
  SegmentSummary summary;
  summary.used_blocks = valid ? static_cast<int32_t>(__shfl_sync(0xFFFFFFFFu, blocks_incl, 31)) : 0;
  summary.inside_sector = valid && __ballot_sync(0xFFFFFFFFu, usize > 0 && (out_start & 31) != 0) != 0u;
  summary.inside_chunk = valid && __ballot_sync(0xFFFFFFFFu, usize > 0 && (out_start & 15) != 0) != 0u;

  for (int64_t base = int64_t{warp} * 32; base < a.num_row_blocks; base += int64_t{warps} * 32) {
    const int32_t b = static_cast<int32_t>(base + lane);
    int g = 0;  // the last segment whose first block is <= b (empty ones share it with the next)
#pragma unroll
    for (int step = 16; step > 0; step >>= 1) {
      const int32_t start = __shfl_sync(0xFFFFFFFFu, block_start, (g + step) & 31);
      if (g + step < groups && start <= b) g += step;
    }
    const int32_t seg_rows = __shfl_sync(0xFFFFFFFFu, row_start, g);
    const int32_t seg_block = __shfl_sync(0xFFFFFFFFu, block_start, g);
    const int32_t seg_out = __shfl_sync(0xFFFFFFFFu, out_start, g);
    const int32_t seg_size = __shfl_sync(0xFFFFFFFFu, size, g);
    if (base + lane >= a.num_row_blocks) continue;
    RowBlock rb{0, valid ? 0 : -1, 0};
    if (b < summary.used_blocks) {
      const int32_t j = b - seg_block;
      const int32_t left = seg_size - j * kBlock;
      rb.row_start = seg_rows + j * kBlock;
      rb.row_count = left < kBlock ? left : kBlock;
      rb.out_start = seg_out + j * kBlock;
    }
    table[b] = rb;
  }
  return summary;
}

constexpr int kTableThreads = 1024;  // build_segment_table_kernel is one CTA

// The table in global memory, one CTA of kThreads threads: for the inputs whose table does not fit in the
// column kernel's shared memory, and for the generic kernel. seg: [num_segments] scratch; table:
// [num_row_blocks]. (A template so that every host file may include this header.)
template <int kThreads = kTableThreads>
__global__ void __launch_bounds__(kThreads)
    build_segment_table_kernel(const SegmentTableArgs a, SegmentStart* seg, RowBlock* table) {
  __shared__ SegmentScanScratch<kThreads / 32> scratch;
  build_segment_table<kThreads>(a, seg, table, scratch);
}

}  // namespace wgrad::quant
