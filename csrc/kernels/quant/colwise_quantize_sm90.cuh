// \brief The column-wise cast's consumer arithmetic, stage by stage for one tile of one consumer group: the
// thread's 8 rows x 8 columns from the stage into registers, the row-wise outputs (Both), the column maxima,
// the block scales, and the quantized q_t staged in shared memory (GroupStorage::qt) for the stores
// (colwise_store_sm90.cuh). Torch-free.
//
// Thread layout (ConsumerThread): column group cc = tid % 16 (tile columns [8 cc, 8 cc + 8)), row group
// rg = tid / 16 (tile rows [8 rg, 8 rg + 8)); so a warp holds 16 rows x 128 columns, a tile row is a
// half-warp (row amax for Both: 4 xor-shuffles) and a thread's 8 rows of one column are 8 bytes of q_t (one
// staging slot).
#pragma once

#include <cstdint>

#include "kernels/common/layout.h"
#include "kernels/quant/colwise_config_sm90.cuh"
#include "kernels/quant/numerics.cuh"
#include "kernels/quant/segment_order.h"

namespace wgrad::quant {

// A consumer thread's place: its group, its index in the group, its column and row groups, warp and lane.
struct ConsumerThread {
  int group;
  int tid;   // < kConsumerThreads
  int cc;    // column group: tile columns [8 cc, 8 cc + 8)
  int rg;    // row group: tile rows [8 rg, 8 rg + 8)
  int warp;  // in the group
  int lane;
};

template <class Cfg>
__device__ __forceinline__ ConsumerThread consumer_thread() {
  ConsumerThread c;
  c.group = threadIdx.x / Cfg::kConsumerThreads;
  c.tid = threadIdx.x % Cfg::kConsumerThreads;
  c.cc = c.tid % Cfg::kColGroups;
  c.rg = c.tid / Cfg::kColGroups;
  c.warp = c.tid / 32;
  c.lane = c.tid % 32;
  return c;
}

template <class Cfg, typename T>
using TileRows = RawVec<T>[Cfg::kRowsPerThread];  // a thread's rows of the tile, as loaded

// Packed tiles: warp w's rows are box w, of one block (or of none, past the tile's last block). valid: the
// thread's valid rows; else its first row among the tile's q_t rows (the blocks' rows one after the other).
// Walked twice, at the load and at the staging, instead of keeping the second in a register through the
// tile (kept live, it cost the packed kernel 12 bytes of spills at 72 registers).
template <class Cfg>
__device__ __forceinline__ int packed_rows(const RowBlock* table, const QuantTile& t, const ConsumerThread& thr,
                                           bool valid) {
  int box = 0;
  for (int i = 0; i < t.blocks; ++i) {
    const RowBlock rb = table[t.row_block + i];
    const int nb = packed_block_boxes(rb.row_count);
    if (thr.warp >= box && thr.warp < box + nb) {
      const int r = Cfg::kBoxRows * (thr.warp - box) + Cfg::kRowsPerThread * (thr.rg & 1);  // row in the block
      return valid ? rb.row_count - r : static_cast<int>(rb.row_start - t.row_start) + r;
    }
    box += nb;
  }
  return 0;  // (a warp past the tile's last block: no rows)
}

// ---- 1. tile rows [8 rg, 8 rg + 8), columns [8 cc, 8 cc + 8) from the stage into registers (raw). Rows past
// the block are zero-filled by TMA past R, but a segment's neighbour rows are data: they are zeroed here.
// Returns the thread's valid rows (<= 0: none, >= 8: all).
template <class Cfg, typename T>
__device__ __forceinline__ int load_tile_rows(const T* s_x, const RowBlock* table, const QuantTile& t,
                                              const ConsumerThread& thr, TileRows<Cfg, T>& raw) {
#pragma unroll
  for (int i = 0; i < Cfg::kRowsPerThread; ++i) {
    load8_shared_raw(s_x + (thr.rg * Cfg::kRowsPerThread + i) * Cfg::kTileCols + thr.cc * kColsPerThread, raw[i]);
  }
  int valid_rows = t.row_count - thr.rg * Cfg::kRowsPerThread;
  if constexpr (Cfg::kPacked) valid_rows = packed_rows<Cfg>(table, t, thr, true);
  if (valid_rows < Cfg::kRowsPerThread) {
#pragma unroll
    for (int i = 0; i < Cfg::kRowsPerThread; ++i) {
#pragma unroll
      for (int k = 0; k < RawVec<T>::kLoads; ++k) {
        if (i >= valid_rows) raw[i].raw[k] = make_uint4(0u, 0u, 0u, 0u);
      }
    }
  }
  return valid_rows;
}

// ---- 2. Both (and BothSegments): the row-wise outputs q and scales (a tile row is one half-warp; columns past C are
// zero-filled). Row amaxes: each of the thread's 8 rows reduced over its half-warp (4 xor-shuffles). Then
// lane cc < 8 of the half-warp computes row cc's scale and reciprocal once, and every lane fetches the 8
// pairs by shuffle (instead of 16 lanes each dividing 8 times).
template <class Cfg, typename T>
__device__ __forceinline__ void quantize_rows(const QuantizeParams& p, const QuantTile& t, int64_t tile_col,
                                              const ConsumerThread& thr, const TileRows<Cfg, T>& raw, int valid_rows) {
  const int cc = thr.cc;
  uint32_t row_bits = 0;
  if constexpr (sizeof(T) == 2) {
    // Two rows per word (row 2 p in the low half): the fold of both halfwords and the shuffles serve two
    // rows at once.
#pragma unroll
    for (int pr = 0; pr < Cfg::kRowsPerThread / 2; ++pr) {
      const uint32_t a = abs_bits_max(raw[2 * pr], 0u);
      const uint32_t b = abs_bits_max(raw[2 * pr + 1], 0u);
      uint32_t bits = __vmaxu2(__byte_perm(a, b, 0x5410), __byte_perm(a, b, 0x7632));
#pragma unroll
      for (int offset = Cfg::kColGroups / 2; offset > 0; offset >>= 1) {
        bits = __vmaxu2(bits, __shfl_xor_sync(0xFFFFFFFFu, bits, offset));
      }
      row_bits = cc == 2 * pr ? (bits & 0xFFFFu) : (cc == 2 * pr + 1 ? bits >> 16 : row_bits);
    }
  } else {
#pragma unroll
    for (int i = 0; i < Cfg::kRowsPerThread; ++i) {
      uint32_t bits = fold_abs_bits<T>(abs_bits_max(raw[i], 0u));
#pragma unroll
      for (int offset = Cfg::kColGroups / 2; offset > 0; offset >>= 1) {
        bits = max(bits, __shfl_xor_sync(0xFFFFFFFFu, bits, offset));
      }
      row_bits = cc == i ? bits : row_bits;
    }
  }
  const float my_scale = block_scale(amax_from_bits<T>(row_bits), p.ue8m0);
  const float my_inv_scale = scale_reciprocal(my_scale);
  const int64_t col = tile_col + cc * kColsPerThread;
  const int half_warp = thr.lane & ~(Cfg::kColGroups - 1);
  // Rows past R (zero-filled) are quantized too and only their stores are skipped: no branch around the
  // arithmetic. The q row pointer steps by C (one add per row, predicated stores): per-row 64-bit index
  // arithmetic under nested branches cost ~30 instructions a row (ncu, H200). Lane cc < 8 stores the scale of
  // row cc, which it computed.
  const int64_t row0 = t.row_start + thr.rg * Cfg::kRowsPerThread;
  uint8_t* q_ptr = p.q + row0 * p.cols + col;
  const int64_t q_step = p.cols;
  if (cc < Cfg::kRowsPerThread && cc < valid_rows) p.scales[t.col_tile * p.scales_ld + row0 + cc] = my_scale;
  const bool col_ok = col < p.cols;
#pragma unroll
  for (int i = 0; i < Cfg::kRowsPerThread; ++i) {
    const float scale = __shfl_sync(0xFFFFFFFFu, my_scale, half_warp + i);
    const float inv_scale = __shfl_sync(0xFFFFFFFFu, my_inv_scale, half_warp + i);
    float v[kColsPerThread];
    unpack8(raw[i], v);
    const uint2 packed = quantize_eight(v, scale, inv_scale);
    if (col_ok && i < valid_rows) *reinterpret_cast<uint2*>(q_ptr) = packed;
    q_ptr += q_step;
  }
}

// ---- 2'. BothSegments with invalid sizes: there are no tiles (the column-wise scales become NaN, q_t is not
// written), but the row-wise outputs do not depend on the sizes. Every 1x128 block of x is quantized here
// instead, one block per thread from global memory, blocks first, first + step, ... (rows 16-byte aligned:
// the vector kernels' condition). An error path: the bits of the row-wise cast, not its speed.
template <typename T>
__device__ __noinline__ void quantize_rows_unsegmented(const QuantizeParams& p, int64_t first, int64_t step) {
  const int64_t kb_count = ceil_div(p.cols, kBlock);
  const T* x = static_cast<const T*>(p.x);
  for (int64_t u = first; u < p.rows * kb_count; u += step) {
    const int64_t r = u / kb_count, kb = u - r * kb_count;
    const int64_t col0 = kb * kBlock;
    const int n = static_cast<int>(p.cols - col0 < kBlock ? p.cols - col0 : kBlock);  // a multiple of 8
    const T* src = x + r * p.cols + col0;
    uint32_t bits = 0;
    for (int c = 0; c < n; c += kColsPerThread) {
      RawVec<T> raw;
      load8_global_raw(src + c, raw);
      bits = abs_bits_max(raw, bits);
    }
    const float scale = block_scale(amax_from_bits<T>(fold_abs_bits<T>(bits)), p.ue8m0);
    const float inv_scale = scale_reciprocal(scale);
    p.scales[kb * p.scales_ld + r] = scale;
    for (int c = 0; c < n; c += kColsPerThread) {
      RawVec<T> raw;
      load8_global_raw(src + c, raw);
      float v[kColsPerThread];
      unpack8(raw, v);
      *reinterpret_cast<uint2*>(p.q + r * p.cols + col0 + c) = quantize_eight(v, scale, inv_scale);
    }
  }
}

// ---- 3. column amax (as |bits|): 8 rows in the thread, 2 row groups in the warp, into the group's
// col_amax [warp][column] (the 8 warps are reduced by column_scales, after the group's barrier).
template <class Cfg, typename T>
__device__ __forceinline__ void column_maxima(typename Cfg::GroupStorage& gs, const ConsumerThread& thr,
                                              const TileRows<Cfg, T>& raw) {
  constexpr bool kRow = has_rowwise(Cfg::kMode);
  uint32_t amax[kColsPerThread];
  if constexpr (!kRow && sizeof(T) == 2) {
    // Two columns per word: packed 16-bit maxima over the 8 rows and the warp's other row group (4 shuffles
    // instead of 8), unpacked only at the end. (Not in Both: at its 80-register cap ptxas then spills 24-28
    // bytes.)
    uint32_t m[kColsPerThread / 2];
#pragma unroll
    for (int k = 0; k < kColsPerThread / 2; ++k) {
      m[k] = 0u;
#pragma unroll
      for (int i = 0; i < Cfg::kRowsPerThread; ++i) m[k] = __vmaxu2(m[k], raw_word(raw[i], k) & 0x7FFF7FFFu);
      m[k] = __vmaxu2(m[k], __shfl_xor_sync(0xFFFFFFFFu, m[k], Cfg::kColGroups));
      amax[2 * k] = m[k] & 0xFFFFu;
      amax[2 * k + 1] = m[k] >> 16;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kColsPerThread; ++j) {
      amax[j] = element_abs_bits(raw[0], j);
#pragma unroll
      for (int i = 1; i < Cfg::kRowsPerThread; ++i) amax[j] = max(amax[j], element_abs_bits(raw[i], j));
      amax[j] = max(amax[j], __shfl_xor_sync(0xFFFFFFFFu, amax[j], Cfg::kColGroups));
    }
  }
  if (thr.lane < Cfg::kColGroups) {
    uint4* dst = reinterpret_cast<uint4*>(&gs.col_amax[thr.warp][thr.cc * kColsPerThread]);
    dst[0] = make_uint4(amax[0], amax[1], amax[2], amax[3]);
    dst[1] = make_uint4(amax[4], amax[5], amax[6], amax[7]);
  }
}

// ---- 4. the block scales of the tile's columns, from the warps' maxima: scales_t, and (scale, 1 / scale)
// in col_scale for the staging. Packed tiles: the staging is zeroed first (the tile's rows are staged in q_t
// order, a byte at a time), and 1 / scale of each block, from the maxima of its warps, replaces them (as
// float bits) in col_amax: it is NaN exactly when the scale is (quantize_quad's NaN test takes it instead of
// the scale).
template <class Cfg, typename T>
__device__ __forceinline__ void column_scales(const QuantizeParams& p, const RowBlock* table, const QuantTile& t,
                                              int64_t tile_col, typename Cfg::GroupStorage& gs,
                                              const ConsumerThread& thr) {
  const int tid_g = thr.tid;
  if constexpr (Cfg::kPacked) {
#pragma unroll
    for (int j = 0; j < kColsPerThread; ++j) {
      const int col = thr.cc * kColsPerThread + j;
      gs.qt[col][thr.rg ^ qt_slot_swizzle(col)] = make_uint2(0u, 0u);
    }
    if (tid_g < Cfg::kTileCols) {
      int box = 0;
      for (int i = 0; i < t.blocks; ++i) {  // (block i's warps [box, box + nb): their maxima, then its scale)
        const int nb = packed_block_boxes(table[t.row_block + i].row_count);
        uint32_t m = 0u;
        for (int w = box; w < box + nb; ++w) m = max(m, gs.col_amax[w][tid_g]);
        const float scale = block_scale(amax_from_bits<T>(m), p.ue8m0);
        if (tile_col + tid_g < p.cols) p.scales_t[(t.row_block + i) * p.scales_t_ld + tile_col + tid_g] = scale;
        const uint32_t inv_bits = __float_as_uint(scale_reciprocal(scale));
        for (int w = box; w < box + nb; ++w) gs.col_amax[w][tid_g] = inv_bits;
        box += nb;
      }
    }
  } else if (tid_g < Cfg::kTileCols) {
    uint32_t bits = gs.col_amax[0][tid_g];
#pragma unroll
    for (int w = 1; w < Cfg::kConsumerWarps; ++w) bits = max(bits, gs.col_amax[w][tid_g]);
    const float scale = block_scale(amax_from_bits<T>(bits), p.ue8m0);
    gs.col_scale[tid_g % kColsPerThread][tid_g / kColsPerThread] = make_float2(scale, scale_reciprocal(scale));
    if (tile_col + tid_g < p.cols) p.scales_t[t.row_block * p.scales_t_ld + tile_col + tid_g] = scale;
  }
}

// ---- 5. quantize and stage: column j's 8 rows are one slot (rows past the block staged as 0, even in a NaN
// block: they may land in q_t's padding). Packed tiles: the valid rows' bytes at their q_t row on.
template <class Cfg, typename T>
__device__ __forceinline__ void quantize_and_stage(typename Cfg::GroupStorage& gs, const RowBlock* table,
                                                   const QuantTile& t, const ConsumerThread& thr,
                                                   const TileRows<Cfg, T>& raw, int valid_rows) {
  const int cc = thr.cc;
  if constexpr (Cfg::kPacked) {
    if (valid_rows > 0) {
      const int out_row = packed_rows<Cfg>(table, t, thr, false);
      float v[Cfg::kRowsPerThread][kColsPerThread];
#pragma unroll
      for (int i = 0; i < Cfg::kRowsPerThread; ++i) unpack8(raw[i], v[i]);
#pragma unroll
      for (int j = 0; j < kColsPerThread; ++j) {
        const int col = cc * kColsPerThread + j;
        const float inv_scale = __uint_as_float(gs.col_amax[thr.warp][col]);
        const uint32_t lo = quantize_quad(v[0][j], v[1][j], v[2][j], v[3][j], inv_scale, inv_scale);
        const uint32_t hi = quantize_quad(v[4][j], v[5][j], v[6][j], v[7][j], inv_scale, inv_scale);
        uint8_t* dst = reinterpret_cast<uint8_t*>(&gs.qt[col][0]);
#pragma unroll
        for (int r = 0; r < Cfg::kRowsPerThread; ++r) {
          if (r < valid_rows) {
            dst[qt_staged_byte_offset(col, out_row + r)] = static_cast<uint8_t>((r < 4 ? lo : hi) >> (8 * (r & 3)));
          }
        }
      }
    }
  } else {
    float v[Cfg::kRowsPerThread][kColsPerThread];
#pragma unroll
    for (int i = 0; i < Cfg::kRowsPerThread; ++i) unpack8(raw[i], v[i]);
    const uint32_t mask_lo = valid_rows >= 4 ? 0xFFFFFFFFu : (valid_rows <= 0 ? 0u : (1u << (8 * valid_rows)) - 1u);
    const int hi_rows = valid_rows - 4;
    const uint32_t mask_hi = hi_rows >= 4 ? 0xFFFFFFFFu : (hi_rows <= 0 ? 0u : (1u << (8 * hi_rows)) - 1u);
#pragma unroll
    for (int j = 0; j < kColsPerThread; ++j) {
      const int col = cc * kColsPerThread + j;
      const float2 sc = gs.col_scale[j][cc];  // (scale, 1 / scale)
      const uint32_t lo = quantize_quad(v[0][j], v[1][j], v[2][j], v[3][j], sc.x, sc.y) & mask_lo;
      const uint32_t hi = quantize_quad(v[4][j], v[5][j], v[6][j], v[7][j], sc.x, sc.y) & mask_hi;
      gs.qt[col][thr.rg ^ qt_slot_swizzle(col)] = make_uint2(lo, hi);
    }
  }
}

}  // namespace wgrad::quant
