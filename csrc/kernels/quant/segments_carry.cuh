// \brief The MoE segments cast with carried sectors: every 32-byte sector of q_t that two blocks share is
// written once, whole, by the worker that holds both parts. Unpadded casts of 16-bit x. Torch-free.
//
// Why: a sector written in two parts by two workers costs the L2 more than a whole sector does. A kernel
// that only moves the cast's bytes (no arithmetic) ran at 50-69 % of a copy when every block writes its own
// bytes of its two edge sectors, at 80-87 % when every shared sector is written once and whole, in this
// kernel's order; the TMA kernel's unaligned segments cast ran at 64-74 %.
// Status: the automatic choice for two or more segments, R >= 4096, >= 256 rows per segment, C >= 2048 and
// R x C >= 2^24 (carry_kernel_by_default). There it beats or ties the TMA kernel on every split cast
// measured, 4096-16384 rows x 2112-24576 features (H200, 8 unaligned segments: 70-84 % of a copy against the
// TMA kernel's 63-74).
// Structure: a plain (not warp-specialized) persistent kernel, kCtasPerSm = 3 CTAs of 256 threads per SM,
// each CTA one contiguous range of the tiles in column-major order (tile = one block of <= 128 rows of one
// segment x 128 columns of x; the tiles of one column tile follow each other along R). With the dynamic
// tail (CarryDynamic; by default when tiles % CTAs is at most half the CTAs) every range holds tiles / CTAs
// tiles and the remainder goes one tile at a time to the CTAs that ask first, from a counter in global
// memory: the CTAs that would have held an extra tile were placed by the block scheduler wherever it liked,
// up to three on one SM (+1.5 to +3.5 points of a copy where taken; with more tiles from the counter, the
// single tiles' partial sectors cost more than the balance gains). Per tile:
//   1. 16-byte loads into registers: thread (m, pg) = (tid % kColGroups, tid / kColGroups) holds columns
//      8 m .. 8 m + 7 of 8 rows of the block, chosen so that their bytes make one aligned 8-byte group of
//      q_t (carry_block_row; issued during the tile before);
//   2. column maxima: in registers over the thread's rows, shuffles, then the warps through shared memory;
//      kTileCols threads turn them into the block's scales (the numerics of numerics.cuh);
//   3. quantize, transpose 4 x 4 bytes in registers (each column's rows become bytes of a q_t row) and
//      write them into a ring of 256 bytes per q_t row, indexed by the absolute q_t column mod 256;
//   4. store what is complete: every sector of q_t in [S, E) whole from the ring, where [S, E) runs from
//      what the range has written so far to the last sector the tile completes. The bytes of a sector the
//      next tile of the range shares stay in the ring and are stored whole with it.
// A range's first and last tiles share a sector with another CTA's range: those bytes are stored in aligned
// pieces of 1-16 bytes, a thread per row (the only partial sectors). Even CTAs walk their range up, odd ones
// down, so the two parts of such a sector are written at about the same time (both at the start or both at
// the end of the launch): parts written far apart cost much more.
// The row mapping, the walk and the store plan are segments_carry_plan.h's, which
// tests/cpp/test_segments_carry_plan.cpp replays.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/common/layout.h"
#include "kernels/quant/numerics.cuh"
#include "kernels/quant/params.h"
#include "kernels/quant/segment_table.cuh"
#include "kernels/quant/segments_carry_plan.h"

namespace wgrad::quant {

struct SegmentsCarryConfig {
  static constexpr int kTileCols = 128;                     // columns of x = rows of q_t per tile
  static constexpr int kRowsPerThread = kCarryRowsPerThread;  // rows of x per thread: bytes of its q_t group
  static constexpr int kColGroups = kTileCols / 8;          // threads of a row group (8 columns each)
  static constexpr int kRowGroups = kCarryBlockRows / kRowsPerThread;
  static constexpr int kThreads = kRowGroups * kColGroups;  // 256
  static constexpr int kWarps = kThreads / 32;
  // 768 threads per SM, up to 85 registers each (4 CTAs of 256 at 64 registers spilled 160 bytes and ran
  // 2-25 points of a copy slower).
  static constexpr int kCtasPerSm = 768 / kThreads;
  static constexpr int kRingBytes = kCarryRingBytes;  // per q_t row: a tile's 128 bytes plus <= 31 carried
  static constexpr int kRingWords = kRingBytes / 4;
  static constexpr int64_t kMaxCols = int64_t{1} << 22;  // a block's row offsets in bytes fit in 31 bits
  // Shared memory: the ring, the per-warp column maxima, the scales and their reciprocals, the columns' NaN
  // bytes, the table.
  static constexpr int kRingSmem = kTileCols * kRingBytes;               // 32 KB
  static constexpr int kMaximaSmem = kWarps * (kTileCols / 2) * 4;       // column pairs per warp
  static constexpr int kScaleSmem = 2 * kTileCols * 4;
  static constexpr int kNanSmem = kTileCols;  // a byte per column: 0xFF where its scale is NaN
  static constexpr int kRunSmem = 16;  // the counter's answer (CarryDynamic), the table 16-byte aligned
  static constexpr int kTableOffset = kRingSmem + kMaximaSmem + kScaleSmem + kNanSmem + kRunSmem;
  static constexpr int smem_bytes(int64_t table_entries) {
    return kTableOffset + static_cast<int>(table_entries) * static_cast<int>(sizeof(RowBlock));
  }
  // Scale columns (row blocks) whose table fits in shared memory beside kCtasPerSm - 1 other CTAs (each
  // with the 1 KB the SM reserves per CTA, in an SM90 SM's 228 KB).
  static constexpr int kMaxTableEntries =
      kCtasPerSm * (kTableOffset + 2048 * static_cast<int>(sizeof(RowBlock)) + 1024) <= 228 * 1024 ? 2048 : 1024;
  static_assert(kThreads >= 2 * kTileCols, "the partial sectors: a thread per q_t row for the head, one for the tail");
};

// The dynamic tail (carry_split): a counter in global memory that is 0 when the launch starts (and that the
// launch leaves at 0), taken when the launch's tiles % CTAs is at most max_remainder. counter == nullptr, or
// a larger remainder: every CTA one range of carry_range, the counter untouched.
struct CarryDynamic {
  int32_t* counter = nullptr;
  int32_t max_remainder = 0;
};

// Word index in the ring of q_t column `pos` (absolute) of ring row `row`. Words are XOR-swizzled in
// units of 4 (a 16-byte chunk stays one aligned chunk) by the row's group of 8, so the lanes of a warp,
// which write rows 8 m + j (m < 16 column groups), spread over 8 banks instead of one.
__device__ __forceinline__ int carry_ring_word(int row, int32_t pos) {
  constexpr int kRingWords = kCarryRingBytes / 4;
  const int word = (pos >> 2) & (kRingWords - 1);
  return row * kRingWords + (word ^ (((row >> 3) & 15) << 2));
}

// The ring word of q_t column `pos` in row 8 m; row 8 m + j's is j * kRingWords words on (the swizzle is
// the same for the 8 rows of a group), so a thread's 8 rows take one address and immediate offsets.
__device__ __forceinline__ uint32_t* carry_ring_rows8(uint32_t* ring, int m, int32_t pos) {
  return ring + carry_ring_word(8 * m, pos);
}

// 4 x 4 byte transpose: byte i of out[j] = byte j of in[i].
__device__ __forceinline__ void transpose4x4_bytes(uint32_t i0, uint32_t i1, uint32_t i2, uint32_t i3, uint32_t& o0,
                                                   uint32_t& o1, uint32_t& o2, uint32_t& o3) {
  const uint32_t t0 = __byte_perm(i0, i1, 0x5140), t1 = __byte_perm(i0, i1, 0x7362);
  const uint32_t t2 = __byte_perm(i2, i3, 0x5140), t3 = __byte_perm(i2, i3, 0x7362);
  o0 = __byte_perm(t0, t2, 0x5410);
  o1 = __byte_perm(t0, t2, 0x7632);
  o2 = __byte_perm(t1, t3, 0x5410);
  o3 = __byte_perm(t1, t3, 0x7632);
}

// Bytes [from, 16) of a chunk set to zero (from < 16; from <= 0: all).
__device__ __forceinline__ uint4 zero_from(uint4 v, int from) {
  uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int keep = from - 4 * k;  // bytes of word k to keep
    w[k] = keep >= 4 ? w[k] : keep <= 0 ? 0u : w[k] & ((1u << (8 * keep)) - 1u);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Stores S bytes of q_t row `q_row` at `pos` (aligned to S, inside one 16-byte chunk) from ring row `row`;
// bytes at columns >= rows (q_t's zero columns after R) as 0.
template <int S>
__device__ __forceinline__ void carry_store_piece(uint8_t* q_row, const uint8_t* ring_bytes, int row, int32_t pos,
                                                  int32_t rows) {
  const uint8_t* src = ring_bytes + 4 * carry_ring_word(row, pos) + (pos & 3);
  const int keep = rows - pos < S ? rows - pos : S;  // bytes before column R (may be <= 0)
  if constexpr (S == 16) {
    uint4 v = *reinterpret_cast<const uint4*>(src);
    if (keep < S) v = zero_from(v, keep);
    *reinterpret_cast<uint4*>(q_row + pos) = v;
  } else if constexpr (S == 8) {
    uint2 v = *reinterpret_cast<const uint2*>(src);
    if (keep < S) {
      const uint4 t = zero_from(make_uint4(v.x, v.y, 0u, 0u), keep);
      v = make_uint2(t.x, t.y);
    }
    *reinterpret_cast<uint2*>(q_row + pos) = v;
  } else if constexpr (S == 4) {
    uint32_t v = *reinterpret_cast<const uint32_t*>(src);
    if (keep < S) v = zero_from(make_uint4(v, 0u, 0u, 0u), keep).x;
    *reinterpret_cast<uint32_t*>(q_row + pos) = v;
  } else if constexpr (S == 2) {
    uint16_t v = *reinterpret_cast<const uint16_t*>(src);
    if (keep < S) v = keep <= 0 ? uint16_t{0} : static_cast<uint16_t>(v & 0xFFu);
    *reinterpret_cast<uint16_t*>(q_row + pos) = v;
  } else {
    static_assert(S == 1, "pieces of 1, 2, 4, 8 or 16 bytes");
    q_row[pos] = keep > 0 ? *src : uint8_t{0};
  }
}

// Stores bytes [from, from + len) of q_t row `q_row` (inside one sector) from ring row `row` in the aligned
// pieces of carry_piece_taken (at most 9 stores, each contiguous in the ring too).
__device__ __forceinline__ void carry_store_part(uint8_t* q_row, const uint8_t* ring_bytes, int row, int32_t from,
                                                 int len, int32_t rows) {
  int32_t cur = from;
  const int32_t end = from + len;
  auto step = [&](auto k_tag) {
    constexpr int kStep = decltype(k_tag)::value, kSize = carry_piece_size(kStep);
    if (carry_piece_taken(kStep, cur, end)) {
      carry_store_piece<kSize>(q_row, ring_bytes, row, cur, rows);
      cur += kSize;
    }
  };
  [&]<int... kSteps>(std::integer_sequence<int, kSteps...>) {
    (step(std::integral_constant<int, kSteps>{}), ...);
  }(std::make_integer_sequence<int, 9>{});
}

template <typename T>
__global__ void __launch_bounds__(SegmentsCarryConfig::kThreads, SegmentsCarryConfig::kCtasPerSm)
    quantize_fp8_1x128_segments_carry_kernel(const QuantizeParams p, const SegmentTableArgs seg_args,
                                             const CarryDynamic dyn) {
  static_assert(sizeof(T) == 2, "16-bit x: one 16-byte load per 8 columns");
  using Cfg = SegmentsCarryConfig;
  constexpr int kR = Cfg::kRowsPerThread;
  constexpr uint32_t kAllRows = (1u << kR) - 1u;
  extern __shared__ __align__(16) uint8_t smem[];
  uint32_t* ring = reinterpret_cast<uint32_t*>(smem);
  uint32_t* maxima = reinterpret_cast<uint32_t*>(smem + Cfg::kRingSmem);  // [warp][column pair]
  float* s_scale = reinterpret_cast<float*>(smem + Cfg::kRingSmem + Cfg::kMaximaSmem);
  float* s_inv = s_scale + Cfg::kTileCols;
  uint8_t* s_nan = reinterpret_cast<uint8_t*>(s_inv + Cfg::kTileCols);
  int32_t* s_run = reinterpret_cast<int32_t*>(s_nan + Cfg::kTileCols);  // the counter's answer
  RowBlock* table = reinterpret_cast<RowBlock*>(smem + Cfg::kTableOffset);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

  const int m = tid % Cfg::kColGroups, pg = tid / Cfg::kColGroups;  // column group (8 columns), row group (kR rows)
  const SegmentSummary summary = build_segment_table_warps(seg_args, table, warp, Cfg::kWarps);
  __syncthreads();

  const int64_t cols = p.cols, ldq = p.q_t_ld;
  const int32_t cols32 = static_cast<int32_t>(cols);  // (C <= kMaxCols = 2^22)
  const int32_t used = summary.used_blocks;
  const int32_t col_tiles = static_cast<int32_t>(ceil_div(cols, Cfg::kTileCols));

  // Scale columns without rows (the table's entries from `used` on): 0 after the used blocks, NaN everywhere
  // for invalid sizes. Element i of these (scale column used + i / C, column i % C) goes to the thread i mod
  // the grid's threads: a thread's first by one 32-bit division, then steps of the grid's stride (no 64-bit
  // division per element; the grid's threads and C are below 2^31).
  {
    const int32_t entries = static_cast<int32_t>(seg_args.num_row_blocks);
    if (used < entries) {
      const uint32_t first = blockIdx.x * Cfg::kThreads + tid, stride = gridDim.x * Cfg::kThreads;
      const auto ucols = static_cast<uint32_t>(cols32);
      const auto step_blocks = static_cast<int32_t>(stride / ucols), step_cols = static_cast<int32_t>(stride % ucols);
      int32_t row_block = used + static_cast<int32_t>(first / ucols);
      int32_t c = static_cast<int32_t>(first % ucols);
      while (row_block < entries) {
        fill_empty_scale_column(p, row_block, 0, table[row_block].row_count, c);
        row_block += step_blocks;
        c += step_cols;
        if (c >= cols32) {
          c -= cols32;
          ++row_block;
        }
      }
    }
  }
  const int64_t tiles = int64_t{used} * col_tiles;
  // The static range, then (with a counter) the tiles the counter hands out, each walked as a range of its
  // own. Thread 0 asks for the next one at the start of a range's last tile and posts the answer in s_run
  // before the tile's second barrier.
  CarrySplit split{};
  int64_t handed_out = 0;  // indices the launch takes from the counter (0: none)
  CarryRange walk;
  bool tail = false;
  if (dyn.counter != nullptr) {
    const CarrySplit s = carry_split(tiles, gridDim.x);
    tail = s.remainder <= dyn.max_remainder;
    if (tail) split = s;
  }
  if (tail) {
    handed_out = split.remainder > 0 ? split.remainder + gridDim.x : 0;
    walk = carry_static_range(split, blockIdx.x);
  } else {
    walk = carry_range(tiles, blockIdx.x, gridDim.x);
  }
  // Thread 0: posts the counter's answer to s_run; the launch's last index sets the counter back to 0.
  auto post = [&](int32_t i) {
    *s_run = i;
    if (i == handed_out - 1) atomicExch(dyn.counter, 0);
  };
  auto run_of = [&](int32_t i) {
    return i < split.remainder ? carry_dynamic_run(split, i) : CarryRange{0, 0, true};
  };
  if (walk.first >= walk.last && handed_out > 0) {  // no static range: the first tile from the counter now
    if (tid == 0) post(atomicAdd(dyn.counter, 1));
    __syncthreads();
    walk = run_of(*s_run);
  }
  if (walk.first >= walk.last) return;
  bool up = walk.up;
  int64_t count = walk.last - walk.first;
  const T* x = static_cast<const T*>(p.x);

  uint4 raw[Cfg::kRowsPerThread];
  // (Address arithmetic in 32 bits from a per-tile base: r * row_bytes < 128 * 2 * kMaxCols = 2^30; the host
  // sends wider x to the TMA kernel.)
  const int32_t row_bytes = cols32 * static_cast<int32_t>(sizeof(T));
  auto issue_loads = [&](const CarryTile& tile) {
    const RowBlock blk = table[tile.b];
    const int32_t col = tile.c * Cfg::kTileCols + 8 * m;
    const int shift = blk.out_start & (kR - 1);
    const int rows_here = col < cols32 ? blk.row_count : 0;
    const char* base = reinterpret_cast<const char*>(x + (int64_t{blk.row_start} * cols + col));
    if (pg > 0) {  // rows kR pg - shift + i (carry_block_row without the wrap): one base, a row apart
      const int r0 = kR * pg - shift;
      const char* row_ptr = base + r0 * row_bytes;
      const int n = rows_here - r0;
#pragma unroll
      for (int i = 0; i < Cfg::kRowsPerThread; ++i) {
        raw[i] = i < n ? __ldg(reinterpret_cast<const uint4*>(row_ptr + i * row_bytes)) : make_uint4(0u, 0u, 0u, 0u);
      }
    } else {
#pragma unroll
      for (int i = 0; i < Cfg::kRowsPerThread; ++i) {
        const int r = carry_block_row(0, i, shift);
        raw[i] = r < rows_here ? __ldg(reinterpret_cast<const uint4*>(base + r * row_bytes))
                               : make_uint4(0u, 0u, 0u, 0u);
      }
    }
  };
  // The walk as a cursor: one division for the first tile, then carry_step (no 64-bit divisions per tile).
  CarryTile tile = carry_walk_tile(walk, 0, used), prev = tile;
  issue_loads(tile);

  // What the range has stored of q_t's columns in the current run of contiguous tiles: up, every column
  // before `done`; down, every column from `done` on.
  // (q_t columns in 32 bits: fewer than the table's kMaxTableEntries blocks of 128 rows, plus < 16.)
  static_assert(int64_t{Cfg::kMaxTableEntries} * kBlock + 16 < (int64_t{1} << 31), "q_t columns fit in 32 bits");
  const int32_t rows32 = static_cast<int32_t>(p.rows), ldq32 = static_cast<int32_t>(ldq);
  int32_t done = 0;
  for (int64_t idx = 0;;) {
    const RowBlock blk = table[tile.b];
    const int32_t a = blk.out_start, e = a + blk.row_count;
    // The last tile of the range or run: the next one comes from the counter (asked now, answered in s_run
    // after the second barrier), or there is none.
    const bool last_of_run = idx + 1 == count;
    const bool asking = last_of_run && handed_out > 0;
    int32_t answer = 0;  // (used only before the second barrier: the atomic's latency hides behind the maxima)
    if (asking && tid == 0) answer = atomicAdd(dyn.counter, 1);
    // The tiles before and after this one in the walk: contiguous in q_t when they are the neighbouring
    // blocks of the same column tile.
    CarryTile next = carry_step(walk, tile, used);
    auto contiguous = [&](bool before, const CarryTile& o) {
      const RowBlock ob = table[o.b];
      return carry_contiguous(up, before, tile.c, a, e, o, ob.out_start, ob.row_count);
    };
    const bool carried_in = idx > 0 && contiguous(true, prev);
    const bool carry_out = idx + 1 < count && contiguous(false, next);

    // A warp whose rows all lie past the block (row groups from (32 warp) / kColGroups on hold rows from
    // kR pg - shift on; a partial block's last warps) loaded zeros: it skips the maxima (zeros) and the
    // quantization (nothing of it is stored). Warp-uniform; warp 0 holds the block's first row.
    const bool warp_idle = kR * ((32 * warp) / Cfg::kColGroups) - static_cast<int>(a & (kR - 1)) >= blk.row_count;

    // 2. Column maxima of |x| as bits, two columns per word (16-bit types).
    uint32_t mx[4] = {0u, 0u, 0u, 0u};
    if (!warp_idle) {
#pragma unroll
      for (int i = 0; i < Cfg::kRowsPerThread; ++i) {
        mx[0] = __vmaxu2(mx[0], raw[i].x & 0x7FFF7FFFu);
        mx[1] = __vmaxu2(mx[1], raw[i].y & 0x7FFF7FFFu);
        mx[2] = __vmaxu2(mx[2], raw[i].z & 0x7FFF7FFFu);
        mx[3] = __vmaxu2(mx[3], raw[i].w & 0x7FFF7FFFu);
      }
      // (The lanes of a warp with the same column group: lane, lane ^ kColGroups, ...)
#pragma unroll
      for (int off = Cfg::kColGroups; off < 32; off *= 2) {
#pragma unroll
        for (int k = 0; k < 4; ++k) mx[k] = __vmaxu2(mx[k], __shfl_xor_sync(0xFFFFFFFFu, mx[k], off));
      }
    }
    if (lane < Cfg::kColGroups) {
      reinterpret_cast<uint4*>(maxima)[warp * Cfg::kColGroups + m] = make_uint4(mx[0], mx[1], mx[2], mx[3]);
    }
    __syncthreads();
    if (tid < Cfg::kTileCols) {
      uint32_t bits = 0u;
#pragma unroll
      for (int w = 0; w < Cfg::kWarps; ++w) bits = __vmaxu2(bits, maxima[w * (Cfg::kTileCols / 2) + (tid >> 1)]);
      bits = (tid & 1) ? bits >> 16 : bits & 0xFFFFu;
      const float scale = block_scale(amax_from_bits<T>(bits), p.ue8m0);
      s_scale[tid] = scale;
      s_inv[tid] = scale_reciprocal(scale);
      s_nan[tid] = isnan(scale) ? uint8_t{0xFF} : uint8_t{0};
      const int64_t col = int64_t{tile.c} * Cfg::kTileCols + tid;
      if (col < cols) p.scales_t[int64_t{tile.b} * p.scales_t_ld + col] = scale;
      if (asking && tid == 0) post(answer);
    }
    __syncthreads();
    CarryRange next_run{0, 0, true};
    if (asking) {
      next_run = run_of(*s_run);
      if (next_run.first < next_run.last) next = carry_walk_tile(next_run, 0, used);
    }
    const bool has_next = !last_of_run || next_run.first < next_run.last;

    // 3. Quantize (per column scale), transpose, into the ring.
    if (!warp_idle) {
      const float4 inv_a = reinterpret_cast<const float4*>(s_inv)[2 * m];
      const float4 inv_b = reinterpret_cast<const float4*>(s_inv)[2 * m + 1];
      const float inv[8] = {inv_a.x, inv_a.y, inv_a.z, inv_a.w, inv_b.x, inv_b.y, inv_b.z, inv_b.w};
      // 0xFF in the bytes of columns whose scale is NaN
      const uint2 nan_bytes = reinterpret_cast<const uint2*>(s_nan)[m];
      const uint32_t nan_lo = nan_bytes.x, nan_hi = nan_bytes.y;
      // Byte i of column j's group is row carry_block_row(pg, i, shift): valid below row_count. Row groups
      // pg >= 1 hold rows kR pg - shift + i (no wrap): the first n of them are valid.
      const int shift = static_cast<int>(a & (kR - 1));
      uint32_t valid = 0u;
      if (pg > 0) {
        const int n = blk.row_count - (kR * pg - shift);
        valid = n >= kR ? kAllRows : n <= 0 ? 0u : (1u << n) - 1u;
      } else {
#pragma unroll
        for (int i = 0; i < kR; ++i) valid |= (carry_block_row(0, i, shift) < blk.row_count ? 1u : 0u) << i;
      }
      const int32_t group = (a - shift) + kR * pg;  // q_t column of byte 0
      const bool whole = (pg > 0 || shift == 0) && valid == kAllRows;
      // Row group 0 of a block not starting on a group has two groups: bytes [shift, kR) of the first and
      // [0, shift) of the one after the block.
      const uint32_t head_valid = pg == 0 ? valid & (kAllRows << shift) & kAllRows : valid;
      const uint32_t tail_valid = pg == 0 ? valid & ((1u << shift) - 1u) : 0u;
      // Half h: rows 4 h .. 4 h + 3, quantized, transposed (word j: column j's 4 bytes), into the ring.
#pragma unroll
      for (int half = 0; half < kR / 4; ++half) {
        uint32_t lo[4], hi[4];  // row 4 half + i: the bytes of columns 0-3 and 4-7
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          RawVec<T> rv;
          rv.raw[0] = raw[4 * half + i];
          float v[8];
          unpack8<T>(rv, v);
          uint32_t h[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            h[k] = __nv_cvt_float2_to_fp8x2(
                make_float2(__fmul_rn(v[2 * k], inv[2 * k]), __fmul_rn(v[2 * k + 1], inv[2 * k + 1])), __NV_SATFINITE,
                __NV_E4M3);
          }
          lo[i] = ((h[0] | (h[1] << 16)) & ~nan_lo) | (kQNanWord & nan_lo);
          hi[i] = ((h[2] | (h[3] << 16)) & ~nan_hi) | (kQNanWord & nan_hi);
        }
        uint32_t col_word[8];
        transpose4x4_bytes(lo[0], lo[1], lo[2], lo[3], col_word[0], col_word[1], col_word[2], col_word[3]);
        transpose4x4_bytes(hi[0], hi[1], hi[2], hi[3], col_word[4], col_word[5], col_word[6], col_word[7]);
        if (whole) {
          uint32_t* w = carry_ring_rows8(ring, m, group + 4 * half);
#pragma unroll
          for (int j = 0; j < 8; ++j) w[j * Cfg::kRingWords] = col_word[j];
        } else if (valid != 0u) {
          // Read, merge, write: the bytes kept are the carried ones of a neighbouring block or ones no
          // thread writes in this tile, so no other thread's store can be lost.
#pragma unroll
          for (int part = 0; part < 2; ++part) {
            const uint32_t bits = ((part == 0 ? head_valid : tail_valid) >> (4 * half)) & 0xFu;
            if (bits == 0u) continue;
            uint32_t mask = 0u;
#pragma unroll
            for (int q = 0; q < 4; ++q) mask |= ((bits >> q) & 1u) ? 0xFFu << (8 * q) : 0u;
            const int32_t at = (part == 0 ? group : group + kBlock) + 4 * half;
            uint32_t* w = carry_ring_rows8(ring, m, at);
#pragma unroll
            for (int j = 0; j < 8; ++j) {
              w[j * Cfg::kRingWords] = (col_word[j] & mask) | (w[j * Cfg::kRingWords] & ~mask);
            }
          }
        }
      }
    }
    // The next tile's loads in flight while this tile is stored. (Issued right after the maxima, with the
    // tile's x kept in shared memory for the quantization, they ran 13-20 points slower: 32 KB more shared
    // memory per CTA leaves the L1 too small for three CTAs' loads in flight.)
    if (has_next) issue_loads(next);
    __syncthreads();

    // 4. Store [S, E): whole sectors from the ring, the parts of sectors shared with another range in
    // aligned pieces.
    // q_t's columns [R, ldq) (< 16 of them) are zero: the last block stores them with its own bytes (zeros
    // in place of the ring's bytes from data_end on; carry_store_bounds, which the C++ replay checks).
    const CarryStoreBounds<int32_t> bounds = carry_store_bounds<int32_t>(e, rows32, ldq32);
    const int32_t end = bounds.end, data_end = bounds.data_end;
    const CarryStoreRange range = carry_store_range(up, carried_in, carry_out, a, e, end, done);
    const int32_t S = range.from, E = range.to;
    if (S < E) {
      const CarrySectors sectors = carry_sectors(S, E);
      const int32_t whole_from = sectors.whole_from, whole_to = sectors.whole_to;
      const int64_t row0 = int64_t{tile.c} * Cfg::kTileCols;
      if (whole_from < whole_to) {
        // <= 8 chunks, up to 10 with a carried sector or the last block's zero columns: lane k of 8 takes
        // chunks k, k + 8, ... of rows tid / 8 + kRowStep i (a warp: 4 rows x 128 contiguous bytes per store).
        constexpr int kRowStep = Cfg::kThreads / 8;
        const int chunks = static_cast<int>((whole_to - whole_from) >> 4);
        const int tile_rows = static_cast<int>(cols - row0 < Cfg::kTileCols ? cols - row0 : Cfg::kTileCols);
        const int r0 = tid >> 3;
        uint8_t* const dst0 = p.q_t + (row0 + r0) * ldq;
        const int64_t row_step = kRowStep * ldq;
        auto store_chunks = [&](auto zero_tag) {
          for (int k = tid & 7; k < chunks; k += 8) {
            const int32_t pos = whole_from + 16 * k;
            uint8_t* dst = dst0 + pos;
#pragma unroll
            for (int i = 0; i < Cfg::kTileCols / kRowStep; ++i, dst += row_step) {
              const int row = r0 + kRowStep * i;
              if (row < tile_rows) {
                uint4 v = *reinterpret_cast<const uint4*>(ring + carry_ring_word(row, pos));
                if constexpr (decltype(zero_tag)::value) {
                  if (pos + 16 > data_end) v = zero_from(v, data_end - pos);
                }
                *reinterpret_cast<uint4*>(dst) = v;
              }
            }
          }
        };
        // Only the tiles that store zero columns reach data_end: a path of their own.
        if (whole_to > data_end) store_chunks(std::true_type{}); else store_chunks(std::false_type{});
      }
      // The partial sectors: [S, S + head) and [tail_from, tail_from + tail), each inside one sector. Threads
      // [0, kTileCols) store row tid's head bytes, [kTileCols, 2 kTileCols) row tid - kTileCols's tail bytes
      // (the same offsets in every row: a warp takes one path), in aligned pieces from the ring
      // (carry_store_part); the other threads (4 rows per thread) none.
      const bool tail_part = tid >= Cfg::kTileCols;
      const int row = tid & (Cfg::kTileCols - 1);
      const int len = tid >= 2 * Cfg::kTileCols ? 0 : tail_part ? sectors.tail : sectors.head;
      if (len > 0 && row0 + row < cols) {
        carry_store_part(p.q_t + (row0 + row) * ldq, reinterpret_cast<const uint8_t*>(ring), row,
                         tail_part ? sectors.tail_from : S, len, data_end);
      }
    }
    if (!has_next) break;
    prev = tile;
    tile = next;
    if (last_of_run) {  // a tile from the counter: walked as a range of its own (nothing carried in)
      walk = next_run;
      up = walk.up;
      count = walk.last - walk.first;
      idx = 0;
    } else {
      ++idx;
    }
  }
}

}  // namespace wgrad::quant
