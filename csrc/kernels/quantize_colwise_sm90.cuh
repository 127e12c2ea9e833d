// \brief Column-wise FP8 1x128 quantization on SM90 (also "both" and the MoE segments): a persistent,
// warp-specialized kernel. One producer warp streams 128 x 128 tiles of x into a ring of shared-memory
// stages with TMA; consumer groups of eight warps (three groups for 16-bit x, one for fp32) take the
// tiles in turn, each from its own stage(s), quantize them and write q_t (and, in Both, q). Torch-free.
//
// Why this shape (the v1 tile kernel reached 49-59 % of a copy; see docs/perf-notes.md, "Quantization
// kernels v2"):
//   - a column block needs all 128 rows before its first q: the tile has to be complete on chip. v1 held
//     it in registers of one CTA, so nothing was in flight while the CTA reduced, synchronised and stored.
//     Here the TMA ring keeps up to kStages tiles (96 KB of bf16, 192 KB of fp32) in flight per SM while
//     the consumers work on the current one; a stage is released once its tile is in registers (and used).
//   - TMA zero-fills rows past R and columns past C: missing elements never change an amax, and no
//     thread checks bounds on loads. (Segments: rows past the segment are real data and are masked;
//     16-row boxes past the segment are not read at all, see kBoxRows.)
//   - q_t is staged transposed in shared memory (8-byte slots, XOR-swizzled so that neither the staging
//     stores nor the 16-byte reads conflict) and written as full 128-byte lines: 8 lanes per column.
//
// Thread layout of a consumer (tid = its index in its group, < 256): column group cc = tid % 16 (tile
// columns [8 cc, 8 cc + 8)), row group rg = tid / 16 (tile rows [8 rg, 8 rg + 8)); so a warp holds 16
// rows x 128 columns, a tile row is a half-warp (row amax for Both: 4 xor-shuffles) and a thread's 8
// rows of one column are 8 bytes of q_t (one staging slot).
#pragma once

#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include <cuda.h>

#include <cstdint>

#include "layout.h"
#include "quantize.cuh"
#include "quantize_numerics.cuh"

namespace wgrad::quant {

template <typename T, QuantMode kMode>
struct ColwiseSm90Config {
  static constexpr int kTileRows = kBlock;  // one column block
  static constexpr int kTileCols = kBlock;  // one row block (Both)
  static constexpr int kConsumerThreads = 256;  // one consumer group: 8 warps
  static constexpr int kConsumerWarps = kConsumerThreads / 32;
  // Consumer groups work on different tiles at once (tiles go round-robin between them), so that one
  // group's barriers and stores overlap the others' arithmetic: one group of 8 warps alone reached
  // 62 % of a copy, two 73-82 % (docs/perf-notes.md). Three groups of 16-bit x use at most 80
  // registers per thread (800 threads); fp32 keeps one group: its registers (up to 150 per thread)
  // would not fit twice.
  static constexpr int kGroups = sizeof(T) == 4 ? 1 : 3;
  // 3 x 32 KB (bf16/fp16) or 3 x 64 KB (fp32) of stages. The stage count must be a multiple of the
  // group count, so that every stage is only ever consumed by one group. Why: a group steps its pipeline
  // state over the other groups' tiles without waiting on them, and an mbarrier wait only compares phase
  // parity. With 4 stages and 3 groups, group B could wait for the next fill of a stage whose previous
  // fill (group A's tile, issued earlier) had not landed yet: the barrier, one phase behind, has the
  // other parity, so the wait returned at once; B read the old tile and its 256 arrivals released
  // A's stage (on the H200: wrong data, "unspecified launch failure" and hangs under repeated calls,
  // most often with segment blocks whose 16-row boxes are mostly past the segment, which land first).
  // With a stage per group, each group waits on its stage's barrier for every fill, in order.
  static constexpr int kStages = 3;
  static_assert(kStages % kGroups == 0, "each stage must belong to one consumer group (see above)");
  static constexpr int kThreads = kGroups * kConsumerThreads + 32;  // + the producer warp
  static constexpr int kColGroups = kTileCols / kColsPerThread;  // 16
  static constexpr int kRowGroups = kConsumerThreads / kColGroups;  // 16
  static constexpr int kRowsPerThread = kTileRows / kRowGroups;  // 8: one 8-byte slot of q_t
  static constexpr int kQtSlots = kTileRows / 8;                 // 8-byte slots per staged column
  static constexpr uint32_t kTileBytes = kTileRows * kTileCols * sizeof(T);
  // ColwiseSegments: every CTA builds the segment table in shared memory (SegmentStart per segment +
  // RowBlock per scale column, 8 bytes each) when it fits in this many entries; larger tables are built
  // in global memory by build_segment_table_kernel first (one more launch).
  static constexpr bool kSegments = kMode == QuantMode::ColwiseSegments;
  static constexpr int kTableEntries = !kSegments ? 1 : (sizeof(T) == 4 ? 1536 : 4096);
  // A tile is loaded as 8 boxes of 16 rows. A box wholly past the block's rows is aimed past R instead:
  // TMA zero-fills it without reading memory, and still counts its bytes. So a segment's last, partial
  // block reads at most 15 rows of the next segment, not up to 127.
  static constexpr int kBoxRows = 16;
  static constexpr int kBoxesPerTile = kTileRows / kBoxRows;

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = cutlass::PipelineState<kStages>;

  struct GroupStorage {  // one consumer group's scratch
    alignas(16) uint2 qt[kTileCols][kQtSlots];          // staged q_t: slot s of column c at s ^ swz(c)
    alignas(16) uint32_t col_amax[kConsumerWarps][kTileCols];  // |bits| maxima, see quantize_numerics.cuh
    // (scale, 1 / scale) of column c = 8 cc + j at [j][cc]: the 16 column groups of a warp read 16
    // consecutive pairs, one wavefront (a [c] layout would be a 4-way bank conflict per read).
    alignas(16) float2 col_scale[kColsPerThread][kColGroups];
  };
  struct SharedStorage {
    alignas(128) T x[kStages][kTileRows * kTileCols];   // (TILE_R,TILE_C,PIPE) row-major tiles
    GroupStorage group[kGroups];
    alignas(16) RowBlock table[kTableEntries];          // ColwiseSegments: [row blocks] + [segments]
    SegmentScanScratch<kThreads / 32> scan;
    typename Pipeline::SharedStorage pipeline;
  };

  static_assert(kColGroups == 16 && kRowGroups == 16, "a half-warp is one tile row; a warp two row groups");
  static_assert(kRowsPerThread == 8, "a thread's rows of one column are one 8-byte staging slot");
};

struct ColwiseSm90Params {
  CUtensorMap tma_x;  // x [R, C], box 128 x 16 (columns x rows), zero fill out of bounds
  QuantizeParams q;
  int64_t num_row_blocks;  // 128-row blocks, or the scale columns of the segment table (ColwiseSegments)
  int64_t num_col_tiles;   // ceil(C / 128)
  // ColwiseSegments: with segments.sizes set, every CTA builds the table in shared memory (segments +
  // row blocks <= kTableEntries); without, q.row_blocks is a table in global memory.
  SegmentTableArgs segments;
};

// Named barriers of the consumer groups (offset past CUTLASS's reserved ids by NamedBarrier): group g
// uses Consumers + g.
enum class QuantBarrierId : uint32_t { Consumers = 0 };

struct QuantTile {
  int64_t row_block;
  int64_t col_tile;
  int64_t row_start;
  int row_count;  // <= 0: no rows (ColwiseSegments: unused scale column, or invalid sizes)
};

template <QuantMode kMode>
__device__ __forceinline__ QuantTile quant_tile(const ColwiseSm90Params& params, const RowBlock* table,
                                                int64_t tile) {
  QuantTile t;
  t.row_block = tile / params.num_col_tiles;
  t.col_tile = tile - t.row_block * params.num_col_tiles;
  if constexpr (kMode == QuantMode::ColwiseSegments) {
    const RowBlock rb = table[t.row_block];
    t.row_start = rb.row_start;
    t.row_count = rb.row_count;
  } else {
    t.row_start = t.row_block * kBlock;
    const int64_t left = params.q.rows - t.row_start;
    t.row_count = static_cast<int>(left < kBlock ? left : kBlock);
  }
  return t;
}

// Staging slot of a column's 8-byte slot s: XOR with bits 3..6 of the column. A consumer's staging
// store (16 lanes: 16 column groups, one slot each) then hits 16 different slot positions = all 32
// banks; a 16-byte chunk (slots 2m, 2m+1) stays one aligned physical chunk, halves swapped when bit 0
// of the swizzle is set.
__device__ __forceinline__ int qt_slot_swizzle(int col) { return (col >> 3) & 15; }

// Logical 16-byte chunk m (rows 16 m .. 16 m + 15, m in [0, 8)) of staged column col: its two 8-byte
// slots, each from where the swizzle put it (two 8-byte loads instead of a 16-byte load and a swap of
// its halves when bit 0 of the swizzle is set: fewer instructions, and the shared-memory pipe has room).
template <class Storage>
__device__ __forceinline__ uint4 qt_chunk_unchecked(const Storage& smem, int col, int m) {
  const int swz = qt_slot_swizzle(col);
  const uint2 lo = smem.qt[col][(2 * m) ^ swz];
  const uint2 hi = smem.qt[col][(2 * m + 1) ^ swz];
  return make_uint4(lo.x, lo.y, hi.x, hi.y);
}

// The same, zeros for m outside [0, 8).
template <class Storage>
__device__ __forceinline__ uint4 qt_chunk(const Storage& smem, int col, int m) {
  if (m < 0 || m >= 8) return make_uint4(0u, 0u, 0u, 0u);
  return qt_chunk_unchecked(smem, col, m);
}

// Staged bytes [16 k - shift, 16 k - shift + 16) of column col (shift in [1, 15]): the last `shift`
// bytes of chunk k - 1 followed by the first 16 - shift bytes of chunk k. shift is uniform across the
// CTA, so the word selection below is uniform branches, never dynamic register indexing.
template <class Storage>
__device__ __forceinline__ uint4 qt_shifted_chunk(const Storage& smem, int col, int k, int shift) {
  const uint4 a = qt_chunk(smem, col, k - 1);
  const uint4 b = qt_chunk(smem, col, k);
  uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  const int start = 16 - shift;  // first byte, in [1, 15]
  if (start & 8) {
#pragma unroll
    for (int i = 0; i < 6; ++i) w[i] = w[i + 2];
  }
  if (start & 4) {
#pragma unroll
    for (int i = 0; i < 5; ++i) w[i] = w[i + 1];
  }
  const int bits = 8 * (start & 3);
  return make_uint4(__funnelshift_r(w[0], w[1], bits), __funnelshift_r(w[1], w[2], bits),
                    __funnelshift_r(w[2], w[3], bits), __funnelshift_r(w[3], w[4], bits));
}

// Bytes [lo, hi) of a 16-byte chunk to its 16-byte aligned destination, with the widest aligned stores
// that fit (at most 1 + 1 + 3 + 1 + 1 stores), leaving the other bytes of the destination alone.
__device__ __forceinline__ void store_chunk_bytes(uint8_t* dst, const uint4& d, int lo, int hi) {
  auto word = [&](int b) { return b < 8 ? (b < 4 ? d.x : d.y) : (b < 12 ? d.z : d.w); };
  int b = lo;
  if ((b & 1) && b < hi) {
    dst[b] = static_cast<uint8_t>(word(b) >> (8 * (b & 3)));
    ++b;
  }
  if ((b & 2) && b + 2 <= hi) {
    *reinterpret_cast<uint16_t*>(dst + b) = static_cast<uint16_t>(word(b) >> 16);
    b += 2;
  }
  for (; b + 4 <= hi; b += 4) *reinterpret_cast<uint32_t*>(dst + b) = word(b);
  if (b + 2 <= hi) {
    *reinterpret_cast<uint16_t*>(dst + b) = static_cast<uint16_t>(word(b));
    b += 2;
  }
  if (b < hi) dst[b] = static_cast<uint8_t>(word(b) >> (8 * (b & 3)));
}

template <typename T, QuantMode kMode>
__global__ void __launch_bounds__(ColwiseSm90Config<T, kMode>::kThreads, 1)
    quantize_fp8_1x128_colwise_sm90_kernel(const __grid_constant__ ColwiseSm90Params params) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Cfg = ColwiseSm90Config<T, kMode>;
  using Pipeline = typename Cfg::Pipeline;
  constexpr bool kRow = has_rowwise(kMode);
  static_assert(has_colwise(kMode), "row-wise alone: quantize_rowwise.cuh");

  extern __shared__ __align__(128) uint8_t smem_raw[];
  auto& smem = *reinterpret_cast<typename Cfg::SharedStorage*>(smem_raw);
  const QuantizeParams& p = params.q;
  const int tid = threadIdx.x;
  constexpr int kProducerTid = Cfg::kGroups * Cfg::kConsumerThreads;
  const bool producer = tid >= kProducerTid;

  if (tid == kProducerTid) cute::prefetch_tma_descriptor(&params.tma_x);
  typename Pipeline::Params pipeline_params;
  pipeline_params.transaction_bytes = Cfg::kTileBytes;  // TMA counts the zero-filled bytes too
  pipeline_params.role = producer ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pipeline_params.is_leader = tid == kProducerTid;
  // One CTA (no cluster): every thread of the consumer group that read a stage arrives on its empty
  // barrier; a stage is read by one group.
  pipeline_params.num_consumers = Cfg::kConsumerThreads;
  Pipeline pipeline(smem.pipeline, pipeline_params, cute::Shape<cute::_1, cute::_1, cute::_1>{});

  // Segments: the row-block table, built by every CTA for itself (it synchronises the CTA, so the
  // pipeline barriers above are initialised too), or the one in global memory.
  const RowBlock* table = p.row_blocks;
  if constexpr (Cfg::kSegments) {
    if (params.segments.sizes != nullptr) {
      const SegmentTableArgs& a = params.segments;
      build_segment_table<Cfg::kThreads>(a, reinterpret_cast<SegmentStart*>(smem.table + a.num_row_blocks),
                                         smem.table, smem.scan);
      table = smem.table;
    }
  }
  __syncthreads();  // barriers initialised before anyone waits on them

  const int64_t num_tiles = params.num_row_blocks * params.num_col_tiles;

  // ---------------------------------------------------------------- producer: one thread
  if (producer) {
    if (tid == kProducerTid) {
      constexpr uint64_t kEvictFirst = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_FIRST);
      auto state = cutlass::make_producer_start_state<Pipeline>();
      for (int64_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
        const QuantTile t = quant_tile<kMode>(params, table, tile);
        if (t.row_count <= 0) continue;  // the consumers skip it too
        pipeline.producer_acquire(state);
        uint64_t* bar = reinterpret_cast<uint64_t*>(pipeline.producer_get_barrier(state));
        const int32_t col = static_cast<int32_t>(t.col_tile * Cfg::kTileCols);
#pragma unroll
        for (int b = 0; b < Cfg::kBoxesPerTile; ++b) {
          const int r = b * Cfg::kBoxRows;
          const int32_t row = r < t.row_count ? static_cast<int32_t>(t.row_start + r) : static_cast<int32_t>(p.rows);
          cute::SM90_TMA_LOAD_2D::copy(&params.tma_x, bar, kEvictFirst, smem.x[state.index()] + r * Cfg::kTileCols,
                                       col, row);
        }
        ++state;
      }
      pipeline.producer_tail(state);
    }
    return;
  }

  // ---------------------------------------------------------------- consumers
  // Group g takes the CTA's non-empty tiles number g, g + kGroups, ... (in the producer's order); its
  // pipeline state steps over the other groups' tiles, whose stages are never its own (kStages is a
  // multiple of kGroups: see the config for why that matters).
  const int group = threadIdx.x / Cfg::kConsumerThreads;
  const int tid_g = threadIdx.x % Cfg::kConsumerThreads;
  auto& gs = smem.group[group];
  const int cc = tid_g % Cfg::kColGroups;
  const int rg = tid_g / Cfg::kColGroups;
  const int warp = tid_g / 32;
  const int lane = tid_g % 32;
  auto consumers_sync = [group] {
    cutlass::arch::NamedBarrier::sync(Cfg::kConsumerThreads,
                                      static_cast<uint32_t>(QuantBarrierId::Consumers) + static_cast<uint32_t>(group));
  };
  typename Cfg::PipelineState state;
  int64_t seen = 0;  // non-empty tiles of this CTA so far

  for (int64_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const QuantTile t = quant_tile<kMode>(params, table, tile);
    const int64_t tile_col = t.col_tile * Cfg::kTileCols;
    if constexpr (kMode == QuantMode::ColwiseSegments) {
      if (t.row_count <= 0) {
        if (group == 0 && tid_g < Cfg::kTileCols) fill_empty_scale_column(p, t.row_block, tile_col, t.row_count, tid_g);
        continue;
      }
    }
    if (seen++ % Cfg::kGroups != group) {  // another group's tile: skip its stage
      ++state;
      continue;
    }

    // ---- tile rows [8 rg, 8 rg + 8), columns [8 cc, 8 cc + 8) into registers (raw); release the stage.
    RawVec<T> raw[Cfg::kRowsPerThread];
    pipeline.consumer_wait(state);
    const T* s_x = smem.x[state.index()];
#pragma unroll
    for (int i = 0; i < Cfg::kRowsPerThread; ++i) {
      load8_shared_raw(s_x + (rg * Cfg::kRowsPerThread + i) * Cfg::kTileCols + cc * kColsPerThread, raw[i]);
    }
    // Rows past the block: zero-filled by TMA past R, but a segment's neighbour rows are data.
    const int valid_rows = t.row_count - rg * Cfg::kRowsPerThread;
    if (valid_rows < Cfg::kRowsPerThread) {
#pragma unroll
      for (int i = 0; i < Cfg::kRowsPerThread; ++i) {
#pragma unroll
        for (int k = 0; k < RawVec<T>::kLoads; ++k) {
          if (i >= valid_rows) raw[i].raw[k] = make_uint4(0u, 0u, 0u, 0u);
        }
      }
    }

    // ---- Both: the row-wise outputs (a tile row is one half-warp; columns past C are zero-filled)
    if constexpr (kRow) {
      // Row amaxes: each of the thread's 8 rows reduced over its half-warp (4 xor-shuffles). Then lane
      // cc < 8 of the half-warp computes row cc's scale and reciprocal once, and every lane fetches the
      // 8 pairs by shuffle (instead of 16 lanes each dividing 8 times).
      uint32_t row_bits = 0;
#pragma unroll
      for (int i = 0; i < Cfg::kRowsPerThread; ++i) {
        uint32_t bits = fold_abs_bits<T>(abs_bits_max(raw[i], 0u));
#pragma unroll
        for (int offset = Cfg::kColGroups / 2; offset > 0; offset >>= 1) {
          bits = max(bits, __shfl_xor_sync(0xFFFFFFFFu, bits, offset));
        }
        row_bits = cc == i ? bits : row_bits;
      }
      const float my_scale = block_scale(amax_from_bits<T>(row_bits), p.ue8m0);
      const float my_inv_scale = scale_reciprocal(my_scale);
      const int64_t col = tile_col + cc * kColsPerThread;
      const int half_warp = lane & ~(Cfg::kColGroups - 1);
#pragma unroll
      // Rows past R (zero-filled) are quantized too and only their stores are skipped: no branch
      // around the arithmetic.
      const int64_t row0 = t.row_start + rg * Cfg::kRowsPerThread;
      uint8_t* q_row = p.q + row0 * p.cols + col;
      float* scale_row = p.scales + t.col_tile * p.scales_ld + row0;
      const bool col_ok = col < p.cols;
#pragma unroll
      for (int i = 0; i < Cfg::kRowsPerThread; ++i) {
        const float scale = __shfl_sync(0xFFFFFFFFu, my_scale, half_warp + i);
        const float inv_scale = __shfl_sync(0xFFFFFFFFu, my_inv_scale, half_warp + i);
        float v[kColsPerThread];
        unpack8(raw[i], v);
        const uint2 packed = quantize_eight(v, scale, inv_scale);
        if (i < valid_rows) {
          if (cc == 0) scale_row[i] = scale;
          if (col_ok) *reinterpret_cast<uint2*>(q_row + i * p.cols) = packed;
        }
      }
    }

    // ---- column amax (as |bits|): 8 rows in the thread, 2 row groups in the warp, 8 warps through
    // shared memory
    {
      uint32_t amax[kColsPerThread];
#pragma unroll
      for (int j = 0; j < kColsPerThread; ++j) {
        amax[j] = element_abs_bits(raw[0], j);
#pragma unroll
        for (int i = 1; i < Cfg::kRowsPerThread; ++i) amax[j] = max(amax[j], element_abs_bits(raw[i], j));
        amax[j] = max(amax[j], __shfl_xor_sync(0xFFFFFFFFu, amax[j], Cfg::kColGroups));
      }
      if (lane < Cfg::kColGroups) {
        uint4* dst = reinterpret_cast<uint4*>(&gs.col_amax[warp][cc * kColsPerThread]);
        dst[0] = make_uint4(amax[0], amax[1], amax[2], amax[3]);
        dst[1] = make_uint4(amax[4], amax[5], amax[6], amax[7]);
      }
    }
    // The stage goes back to the producer only now: the column amaxes above have used every register
    // loaded from it, so every shared-memory load of this thread has completed. (Released right after
    // issuing the loads, a TMA write of the next tile could overtake loads still queued in the
    // shared-memory pipe: fp32 "both" read a few wrong elements on the H200, 36 of 12.3M, in one run.)
    pipeline.consumer_release(state);
    ++state;  // this tile's stage; the other groups' stages are stepped over as their tiles come
    consumers_sync();  // (1) partial amaxes written
    if (tid_g < Cfg::kTileCols) {
      uint32_t bits = gs.col_amax[0][tid_g];
#pragma unroll
      for (int w = 1; w < Cfg::kConsumerWarps; ++w) bits = max(bits, gs.col_amax[w][tid_g]);
      const float scale = block_scale(amax_from_bits<T>(bits), p.ue8m0);
      gs.col_scale[tid_g % kColsPerThread][tid_g / kColsPerThread] = make_float2(scale, scale_reciprocal(scale));
      if (tile_col + tid_g < p.cols) p.scales_t[t.row_block * p.scales_t_ld + tile_col + tid_g] = scale;
    }
    consumers_sync();  // (2) scales ready

    // ---- quantize and stage: column j's 8 rows are one slot (rows past the block staged as 0, even in a
    // NaN block: they may land in q_t's padding).
    {
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
        gs.qt[col][rg ^ qt_slot_swizzle(col)] = make_uint2(lo, hi);
      }
    }
    consumers_sync();  // (3) q_t staged

    // ---- store q_t rows [row_start, end) of every column of the tile, as 16-byte chunks aligned in q_t
    // (its row stride is a multiple of 16). The block that ends at row R also writes q_t's padding
    // [R, q_t_ld) (zeros: staged past the block), so q_t never holds uninitialised bytes. A segment may
    // start (and end) inside a chunk: such an edge chunk is shared with a neighbouring block that another
    // CTA may be writing, so only this block's bytes of it are stored, with the widest aligned stores
    // that fit. Whole chunks first (uniform 16-byte stores), then at most two edge chunks per column,
    // one per thread, so that no warp waits on a lane's byte stores for every chunk.
    {
      const int64_t end = t.row_start + t.row_count == p.rows ? p.q_t_ld : t.row_start + t.row_count;
      const int shift = static_cast<int>(t.row_start & 15);
      const int64_t first_row = t.row_start - shift;  // 16-aligned
      const int num_chunks = static_cast<int>((end - first_row + 15) / 16);  // <= 9
      const int tail = static_cast<int>(end & 15);   // bytes of the last chunk in this block (0: whole)
      const int k_begin = shift != 0 ? 1 : 0;          // whole chunks [k_begin, k_end)
      const int k_end = tail != 0 ? num_chunks - 1 : num_chunks;
      const int whole = k_end > k_begin ? k_end - k_begin : 0;
      auto chunk_data = [&](int col, int k) {
        return shift == 0 ? qt_chunk(gs, col, k) : qt_shifted_chunk(gs, col, k, shift);
      };
      if (shift == 0 && whole == Cfg::kTileRows / 16 && tile_col + Cfg::kTileCols <= p.cols) {
        // A block of 128 rows starting 16-aligned (every Colwise/Both block but the last), all 128 columns
        // inside C: 8 whole chunks per column, thread tid_g stores chunk tid_g % 8 of columns
        // tid_g / 8 + 32 i; no division, no bounds checks, one address computation.
        constexpr int kColStep = Cfg::kConsumerThreads / (Cfg::kTileRows / 16);  // 32
        const int col0 = tid_g / (Cfg::kTileRows / 16);
        const int k = tid_g % (Cfg::kTileRows / 16);
        uint8_t* dst = p.q_t + (tile_col + col0) * p.q_t_ld + first_row + 16 * k;
        const int64_t dst_step = kColStep * p.q_t_ld;
#pragma unroll
        for (int i = 0; i < Cfg::kTileCols / kColStep; ++i) {
          *reinterpret_cast<uint4*>(dst + i * dst_step) = qt_chunk_unchecked(gs, col0 + i * kColStep, k);
        }
      } else {
        // task / whole without a division per store: whole <= 9 and task < 128 * 9, where
        // floor(task * ceil(2^16 / whole) / 2^16) is exact (the error task * (ceil - 2^16 / whole) / 2^16
        // < 0.02 stays below the 1 / whole gap to the next integer).
        const uint32_t magic = whole > 0 ? (65536u + whole - 1) / whole : 0u;
        for (int task = tid_g; task < Cfg::kTileCols * whole; task += Cfg::kConsumerThreads) {
          const int col = static_cast<int>((static_cast<uint32_t>(task) * magic) >> 16);
          const int k = k_begin + (task - col * whole);
          if (tile_col + col >= p.cols) continue;
          *reinterpret_cast<uint4*>(p.q_t + (tile_col + col) * p.q_t_ld + first_row + 16 * k) = chunk_data(col, k);
        }
        // Edge chunks: k = 0 when the block starts inside it, k = num_chunks - 1 when it ends inside it
        // (the same chunk when the block lies within one).
        const int edges = (shift != 0 ? 1 : 0) + (tail != 0 && (shift == 0 || num_chunks > 1) ? 1 : 0);
        if (tid_g < Cfg::kTileCols * edges) {
          const int col = tid_g / edges;
          const int k = (tid_g % edges == 0 && shift != 0) ? 0 : num_chunks - 1;
          if (tile_col + col < p.cols) {
            const int64_t chunk_row = first_row + 16 * k;
            const int lo = chunk_row < t.row_start ? shift : 0;
            const int hi = chunk_row + 16 > end ? static_cast<int>(end - chunk_row) : 16;
            store_chunk_bytes(p.q_t + (tile_col + col) * p.q_t_ld + chunk_row, chunk_data(col, k), lo, hi);
          }
        }
      }
    }
  }
#endif
}

}  // namespace wgrad::quant
