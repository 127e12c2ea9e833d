// \brief Torch-free device code of the FP8 1x128 quantization kernels (row-wise, column-wise/transposed,
// both at once, and column-wise over per-expert row segments).
//
// Numerics (python/wgrad/reference.py is the definition; these kernels match it bit for bit):
//   a      = |x| in fp32, with NaN and +-Inf mapped to +Inf
//   amax   = max of a over the 128-element block
//   block with amax == +Inf (any NaN or Inf in it): scale = NaN (0x7FC00000), every q = NaN (0x7F)
//   else   scale = max(amax, 1e-4f) / 448            (IEEE fp32 division)
//          ue8m0: scale = 2^ceil(log2(scale))        (exact, from the fp32 bits)
//          q = e4m3_rne(clamp(x / scale, -448, 448)) (IEEE fp32 division)
//
// One CTA quantizes a 128 x 128 tile of x [R, C] (row-major). Each thread holds 4 consecutive rows x 8
// consecutive columns, so that
//   - a row of the tile is 16 threads (one half-warp): row amax = 4 xor-shuffles;
//   - the 4 rows of one column make one 32-bit word of the transposed output q_t, staged in shared memory
//     and written to global memory as 16-byte rows of q_t.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>

#include "layout.h"

namespace wgrad::quant {

constexpr int kBlock = 128;                                 // 1x128 scaling block
constexpr int kTileRows = kBlock;                           // one column block per CTA
constexpr int kTileCols = kBlock;                           // one row block per CTA
constexpr int kColsPerThread = 8;                           // one 16-byte load of bf16/fp16
constexpr int kRowsPerThread = 4;                           // one 32-bit word of q_t per column
constexpr int kColGroups = kTileCols / kColsPerThread;      // 16 threads cover one tile row
constexpr int kRowGroups = kTileRows / kRowsPerThread;      // 32
constexpr int kThreads = kColGroups * kRowGroups;           // 512
constexpr int kWarps = kThreads / 32;                       // 16
constexpr int kMinCtasPerSm = 2;                            // caps registers at 64 per thread
constexpr int kQtWordsPerCol = kTileRows / 4;               // 32 words = 128 bytes of q_t per column
constexpr int kQtChunksPerCol = kTileRows / 16;             // 8 16-byte chunks per column
constexpr int kTableThreads = 1024;                         // the segment-table kernel is one CTA

constexpr float kE4m3Max = 448.0f;
constexpr float kAmaxFloor = 1e-4f;
constexpr uint32_t kScaleNanBits = 0x7FC00000u;  // scale of a block holding NaN or Inf
constexpr uint8_t kQNan = 0x7F;                  // e4m3fn NaN: every q of such a block

static_assert(kColGroups == 16, "row amax reduces over the 16 lanes of a half-warp");
static_assert(kRowGroups == 2 * kWarps, "a warp holds two row groups (lanes 0-15 and 16-31)");

enum class QuantMode { Rowwise, Colwise, Both, ColwiseSegments };

constexpr bool has_rowwise(QuantMode m) { return m == QuantMode::Rowwise || m == QuantMode::Both; }
constexpr bool has_colwise(QuantMode m) { return m != QuantMode::Rowwise; }

// One 128-row block of the column-wise output: rows [row_start, row_start + row_count) of x.
// row_count == 0: an unused scale column (its scales are zeroed); row_count < 0: the segment sizes
// failed validation (every scale becomes NaN, q_t is not written).
struct RowBlock {
  int32_t row_start;
  int32_t row_count;
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

  const RowBlock* row_blocks;  // ColwiseSegments: one entry per scale column (gridDim.x of them)
};

struct SegmentTableParams {
  const int32_t* sizes;   // [num_segments] rows of each segment, on the device
  int64_t num_segments;
  int64_t rows;           // sizes must be >= 0 and sum to rows
  int64_t num_row_blocks; // k_block_capacity(rows, num_segments): entries of row_blocks
  int32_t* segment_row_start;    // [num_segments] scratch
  int32_t* segment_block_start;  // [num_segments] scratch
  RowBlock* row_blocks;   // [num_row_blocks] output
};

// ------------------------------------------------------------------ numerics --------------------------

// |v| with NaN and Inf mapped to +Inf, so that one max-reduction also detects non-finite blocks
// (fmaxf would silently drop a NaN).
__device__ __forceinline__ float abs_or_inf(float v) {
  const float a = fabsf(v);
  return a <= FLT_MAX ? a : __int_as_float(0x7F800000);
}

__device__ __forceinline__ float block_scale(float amax, bool ue8m0) {
  if (!(amax <= FLT_MAX)) return __uint_as_float(kScaleNanBits);
  const float s = __fdiv_rn(fmaxf(amax, kAmaxFloor), kE4m3Max);
  if (!ue8m0) return s;
  // s is a positive normal number (>= 1e-4 / 448), so rounding up to a power of two is: keep it if the
  // mantissa is zero, else bump the exponent and clear the mantissa. Never overflows (s < 2^120).
  uint32_t bits = __float_as_uint(s);
  if (bits & 0x007FFFFFu) bits = (bits & 0x7F800000u) + 0x00800000u;
  return __uint_as_float(bits);
}

// Quantizes v0, v1 with one block's scale into two e4m3 bytes (v0 in the low byte).
// inv_scale is 1 / scale, exact when ue8m0 (a power of two): then v * inv_scale is bit-identical to
// v / scale, and cheaper.
__device__ __forceinline__ uint32_t quantize_pair(float v0, float v1, float scale, float inv_scale, bool ue8m0) {
  float t0, t1;
  if (ue8m0) {
    t0 = v0 * inv_scale;
    t1 = v1 * inv_scale;
  } else {
    t0 = __fdiv_rn(v0, scale);
    t1 = __fdiv_rn(v1, scale);
  }
  t0 = fminf(fmaxf(t0, -kE4m3Max), kE4m3Max);
  t1 = fminf(fmaxf(t1, -kE4m3Max), kE4m3Max);
  const uint32_t pair = __nv_cvt_float2_to_fp8x2(make_float2(t0, t1), __NV_SATFINITE, __NV_E4M3);
  return isnan(scale) ? (uint32_t(kQNan) | (uint32_t(kQNan) << 8)) : pair;
}

__device__ __forceinline__ float inverse_scale(float scale, bool ue8m0) {
  return ue8m0 ? __frcp_rn(scale) : 0.0f;
}

// ------------------------------------------------------------------ loads -----------------------------

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// 8 consecutive elements starting at p (16-byte aligned for 16-bit types, 32-byte for fp32).
template <typename T>
__device__ __forceinline__ void load8_vec(const T* p, float (&v)[8]) {
  if constexpr (sizeof(T) == 4) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p));
    const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  } else {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = to_float(e[j]);
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

// ------------------------------------------------------------------ the tile kernel -------------------
// grid.x: row blocks (128-row blocks of x, or the entries of row_blocks for ColwiseSegments); grid.y:
// 128-column tiles. (A 1-D grid with column tiles fastest measured the same on H200 and spilled.)
// kVec: cols % 8 == 0 and x 16-byte aligned, so every thread's 8 columns are one aligned vector load
// (and, row-wise, one 8-byte store); otherwise element-wise accesses with bounds checks.
template <typename T, QuantMode kMode, bool kVec>
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
  int row_count;
  if constexpr (kMode == QuantMode::ColwiseSegments) {
    const RowBlock rb = p.row_blocks[row_block];
    row_start = rb.row_start;
    row_count = rb.row_count;
    if (row_count <= 0) {
      // Unused trailing scale column (0), or invalid segment sizes (NaN, so that any GEMM that consumes
      // these scales produces NaN instead of a silently wrong result).
      const float fill = row_count == 0 ? 0.0f : __uint_as_float(kScaleNanBits);
      for (int c = tid; c < kTileCols; c += kThreads) {
        if (tile_col + c < p.cols) p.scales_t[row_block * p.scales_t_ld + tile_col + c] = fill;
      }
      return;
    }
  } else {
    row_start = row_block * kTileRows;
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
    if constexpr (kVec) {
      if (row_ok && thread_col < p.cols) {
        load8_vec(src, v[i]);
      } else {
#pragma unroll
        for (int j = 0; j < kColsPerThread; ++j) v[i][j] = 0.0f;
      }
    } else {
#pragma unroll
      for (int j = 0; j < kColsPerThread; ++j) {
        v[i][j] = (row_ok && thread_col + j < p.cols) ? to_float(src[j]) : 0.0f;
      }
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
      const float inv_scale = inverse_scale(scale, p.ue8m0);
      const int local_row = row_group * kRowsPerThread + i;
      if (local_row >= row_count) continue;
      const int64_t row = row_start + local_row;
      if (col_group == 0) p.scales[col_tile * p.scales_ld + row] = scale;
      uint32_t packed[kColsPerThread / 4];
#pragma unroll
      for (int j = 0; j < kColsPerThread; j += 4) {
        packed[j / 4] = quantize_pair(v[i][j], v[i][j + 1], scale, inv_scale, p.ue8m0) |
                        (quantize_pair(v[i][j + 2], v[i][j + 3], scale, inv_scale, p.ue8m0) << 16);
      }
      uint8_t* dst = p.q + row * p.cols + thread_col;
      if constexpr (kVec) {
        if (thread_col < p.cols) *reinterpret_cast<uint2*>(dst) = make_uint2(packed[0], packed[1]);
      } else {
#pragma unroll
        for (int j = 0; j < kColsPerThread; ++j) {
          if (thread_col + j < p.cols) dst[j] = uint8_t(packed[j / 4] >> (8 * (j % 4)));
        }
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
      const float inv_scale = inverse_scale(scale, p.ue8m0);
      const uint32_t word = quantize_pair(v[0][j], v[1][j], scale, inv_scale, p.ue8m0) |
                            (quantize_pair(v[2][j], v[3][j], scale, inv_scale, p.ue8m0) << 16);
      s_qt[col * kQtWordsPerCol + (row_group ^ qt_swizzle(col))] = word & row_mask;
    }
    __syncthreads();

    // ---- store q_t rows [row_start, row_start + write_count) of every column of the tile. The block
    // that ends at row `rows` also writes q_t's padding columns [rows, q_t_ld) (with 0: rows past the
    // block were loaded as 0), so q_t never holds uninitialised bytes.
    const int write_count =
        row_start + row_count == p.rows ? static_cast<int>(p.q_t_ld - row_start) : row_count;
    const int64_t first_chunk = row_start / 16;
    const int num_chunks = static_cast<int>((row_start + write_count + 15) / 16 - first_chunk);  // <= 9
    const bool aligned = row_start % 16 == 0;
    for (int task = tid; task < kTileCols * num_chunks; task += kThreads) {
      const int col = task / num_chunks;
      const int64_t chunk = first_chunk + task % num_chunks;
      if (tile_col + col >= p.cols) continue;
      const int64_t lo = chunk * 16 > row_start ? chunk * 16 : row_start;
      const int64_t hi = chunk * 16 + 16 < row_start + write_count ? chunk * 16 + 16 : row_start + write_count;
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
          const int64_t local = chunk * 16 + b - row_start;
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
  }
}

// ------------------------------------------------------------------ segment table ---------------------
// One CTA. Validates the sizes (each >= 0, sum == rows) and writes, for every scale column b of the
// segmented column-wise output, the rows of x it quantizes: segment g's j-th block is scale column
// sum_{h<g} ceil(size_h / 128) + j and covers rows [off_g + 128 j, min(off_g + 128 (j + 1), off_g + size_g)).
// Columns past the last block get row_count 0; invalid sizes give row_count -1 everywhere.
__global__ void __launch_bounds__(kTableThreads) build_segment_table_kernel(const SegmentTableParams p) {
  __shared__ int64_t s_warp_rows[kTableThreads / 32];
  __shared__ int64_t s_warp_blocks[kTableThreads / 32];
  __shared__ int64_t s_carry_rows;
  __shared__ int64_t s_carry_blocks;

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  if (tid == 0) {
    s_carry_rows = 0;
    s_carry_blocks = 0;
  }
  bool negative = false;
  __syncthreads();

  // Exclusive prefix sums of sizes and of blocks, 1024 segments at a time.
  for (int64_t base = 0; base < p.num_segments; base += kTableThreads) {
    const int64_t g = base + tid;
    const int64_t size = g < p.num_segments ? p.sizes[g] : 0;
    negative |= size < 0;
    const int64_t blocks = size > 0 ? ceil_div(size, kBlock) : 0;
    int64_t rows_incl = size, blocks_incl = blocks;
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
      const int64_t r = __shfl_up_sync(0xFFFFFFFFu, rows_incl, offset);
      const int64_t b = __shfl_up_sync(0xFFFFFFFFu, blocks_incl, offset);
      if (lane >= offset) {
        rows_incl += r;
        blocks_incl += b;
      }
    }
    if (lane == 31) {
      s_warp_rows[warp] = rows_incl;
      s_warp_blocks[warp] = blocks_incl;
    }
    __syncthreads();
    int64_t rows_before = s_carry_rows, blocks_before = s_carry_blocks;
    for (int w = 0; w < warp; ++w) {
      rows_before += s_warp_rows[w];
      blocks_before += s_warp_blocks[w];
    }
    rows_before += rows_incl - size;
    blocks_before += blocks_incl - blocks;
    if (g < p.num_segments) {
      p.segment_row_start[g] = static_cast<int32_t>(rows_before);
      p.segment_block_start[g] = static_cast<int32_t>(blocks_before);
    }
    __syncthreads();  // everyone has read the carries
    if (tid == kTableThreads - 1) {
      s_carry_rows = rows_before + size;
      s_carry_blocks = blocks_before + blocks;
    }
    __syncthreads();
  }
  const bool valid = !__syncthreads_or(negative) && s_carry_rows == p.rows;
  const int64_t total_blocks = s_carry_blocks;

  for (int64_t b = tid; b < p.num_row_blocks; b += kTableThreads) {
    RowBlock rb{0, valid ? 0 : -1};
    if (valid && b < total_blocks) {
      // The segment of block b: the last g with segment_block_start[g] <= b (empty segments share
      // their start with the next non-empty one, which comes after them).
      int64_t lo = 0, hi = p.num_segments - 1;
      while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (p.segment_block_start[mid] <= b) lo = mid; else hi = mid - 1;
      }
      const int64_t j = b - p.segment_block_start[lo];
      const int64_t left = p.sizes[lo] - j * kBlock;
      rb.row_start = static_cast<int32_t>(p.segment_row_start[lo] + j * kBlock);
      rb.row_count = static_cast<int32_t>(left < kBlock ? left : kBlock);
    }
    p.row_blocks[b] = rb;
  }
}

}  // namespace wgrad::quant
