// \brief Torch-free device code of the FP8 1x128 quantization: the parameters every kernel takes, the
// generic tile kernel (any alignment, any C: the path of inputs the vector kernels cannot take), and the
// segment-table kernel of the MoE path. The fast kernels: rowwise.cuh (row-wise) and
// colwise_sm90.cuh (column-wise, both, segments). Numerics: numerics.cuh.
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
constexpr int kTableThreads = 1024;                         // the segment-table kernel is one CTA

static_assert(kColGroups == 16, "row amax reduces over the 16 lanes of a half-warp");
static_assert(kRowGroups == 2 * kWarps, "a warp holds two row groups (lanes 0-15 and 16-31)");

enum class QuantMode { Rowwise, Colwise, Both, ColwiseSegments };

constexpr bool has_rowwise(QuantMode m) { return m == QuantMode::Rowwise || m == QuantMode::Both; }
constexpr bool has_colwise(QuantMode m) { return m != QuantMode::Rowwise; }

// One 128-row block of the column-wise output: rows [row_start, row_start + row_count) of x, written to
// q_t columns [out_start, out_start + row_count) (out_start == row_start but for padded segments).
// row_count == 0: an unused scale column (its scales are zeroed); row_count < 0: the segment sizes
// failed validation (every scale becomes NaN, q_t is not written).
struct RowBlock {
  int32_t row_start;
  int32_t row_count;
  int32_t out_start;
};

struct QuantizeParams {
  const void* x;          // [rows, cols], row-major, bf16 / fp16 / fp32
  int64_t rows;
  int64_t cols;
  bool ue8m0;             // power-of-two scales, rounded up

  uint8_t* q;             // rowwise: [rows, cols] e4m3, row-major
  float* scales;          // rowwise: (r, kb) at kb * scales_ld + r
  int64_t scales_ld;

  uint8_t* q_t;           // colwise: [cols, q_t_ld] e4m3, (c, r) at c * q_t_ld + r; q_t_ld % 16 == 0
  int64_t q_t_ld;
  float* scales_t;        // colwise: (c, rb) at rb * scales_t_ld + c
  int64_t scales_t_ld;

  const RowBlock* row_blocks;  // ColwiseSegments: one entry per scale column (row block)
  // ColwiseSegments: 0, or the padding of every segment's q_t columns (16, 32, 64 or 128): segment g then
  // starts at q_t column sum_{h<g} align_up(size_h, seg_pad), the columns between segments and those
  // after the last one (up to q_t_ld) are 0.
  int64_t seg_pad;
};

// The segments of the MoE path, on the device: validated and turned into the row-block table by
// build_segment_table below (inside the column kernel, or by build_segment_table_kernel).
struct SegmentTableArgs {
  const int32_t* sizes = nullptr;  // [num_segments] rows of each segment; must be >= 0 and sum to rows
  int64_t num_segments = 0;
  int64_t rows = 0;
  int64_t num_row_blocks = 0;      // the scale columns of the output: entries of the table
  int64_t pad = 0;                 // QuantizeParams::seg_pad
  int64_t out_cols = 0;            // padded: the q_t columns K
  int32_t* padded_sizes = nullptr; // padded: [num_segments] align_up(size_g, pad), the last one K - the others
};

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
        a.padded_sizes[g] = static_cast<int32_t>(g == a.num_segments - 1 ? a.out_cols - out_before : out);
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
// scan on the critical path of the first load (docs/perf-notes.md, session 11). `after_load` runs once the
// sizes' load is issued, before its value is used (the carry kernel's L2 prefetch: work that needs no table
// goes out behind the load, not ahead of it).
struct NoTableHook {
  __device__ void operator()() const {}
};
template <typename AfterLoad = NoTableHook>
__device__ __forceinline__ SegmentSummary build_segment_table_warps(const SegmentTableArgs& a, RowBlock* table,
                                                                    int warp, int warps,
                                                                    AfterLoad&& after_load = AfterLoad{}) {
  const int lane = threadIdx.x & 31;
  const int groups = static_cast<int>(a.num_segments);  // in [1, 32]
  const int32_t size = lane < groups ? a.sizes[lane] : 0;
  after_load();
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
    a.padded_sizes[lane] =
        static_cast<int32_t>(lane == groups - 1 ? static_cast<uint32_t>(a.out_cols) - out_start : out);
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

// The table in global memory, one CTA: for the inputs whose table does not fit in the column kernel's
// shared memory, and for the generic kernel. seg: [num_segments] scratch; table: [num_row_blocks].
__global__ void __launch_bounds__(kTableThreads)
    build_segment_table_kernel(const SegmentTableArgs a, SegmentStart* seg, RowBlock* table) {
  __shared__ SegmentScanScratch<kTableThreads / 32> scratch;
  build_segment_table<kTableThreads>(a, seg, table, scratch);
}

}  // namespace wgrad::quant
