// \brief The column-wise cast's persistent SM90 kernel (colwise_kernel_sm90.cuh): its configuration (tile,
// consumer groups, pipeline stages, shared storage), its parameters, the tile a stage holds, and the layout
// of q_t staged in shared memory. Torch-free.
#pragma once

#include <cutlass/pipeline/sm90_pipeline.hpp>

#include <cuda.h>

#include <cstdint>

#include "kernels/quant/numerics.cuh"
#include "kernels/quant/params.h"
#include "kernels/quant/segment_order.h"
#include "kernels/quant/segment_table.cuh"

namespace wgrad::quant {

// ColwiseSegments: the tiles and their order, a template argument so that each kernel holds only its own paths.
//   kBlocks: a tile per used row block, in any order (strips, shared strips, ranges; TileOrder), with the
//     sectors carried and handed over between consecutive blocks;
//   kRowMajorBlocks: a tile per used row block in row-major order only (no carries, no handoffs), for any
//     sizes: what the host launches when the shape's automatic order is row-major (row_major_segments in
//     quant/segments.cu; on the same walk it ran 2-4.5 points of a copy faster than kBlocks, H200);
//   kPacked: packed tiles (build_packed_tiles), row-major.
// (Colwise and Both ignore it; BothSegments takes kRowMajorBlocks only.)
enum class SegmentTiles : int { kBlocks, kRowMajorBlocks, kPacked };

template <typename T, QuantMode kModeV, SegmentTiles kTiles = SegmentTiles::kBlocks>
struct ColwiseSm90Config {
  using Element = T;  // of x
  static constexpr QuantMode kMode = kModeV;
  static constexpr int kTileRows = kBlock;  // one column block
  static constexpr int kTileCols = kBlock;  // one row block (Both)
  static constexpr int kConsumerThreads = 256;  // one consumer group: 8 warps
  static constexpr int kConsumerWarps = kConsumerThreads / 32;
  // Consumer groups work on different tiles at once (tiles go round-robin between them), so that one
  // group's barriers and stores overlap the others' arithmetic: one group of 8 warps alone reached
  // 62 % of a copy, two 73-82 % (H200). Three groups of 16-bit x use at most 80 registers per thread
  // (800 threads); fp32 keeps one group: its registers (up to 150 per thread) would not fit twice.
  // (2 groups of 2 stages each measured no faster: Colwise within noise, Both -2 to -3 points.)
  static constexpr int kGroups = sizeof(T) == 4 ? 1 : 3;
  // 3 x 32 KB (bf16/fp16) or 3 x 64 KB (fp32) of stages. Every consumer group has a pipeline of its own
  // (16-bit: one stage per group; fp32: the one group has three): a stage is waited on and released by
  // one group only, for every fill, in order, as CUTLASS's pipeline assumes. (One ring of 4 stages shared
  // by 3 groups that stepped over each other's tiles without waiting failed: an mbarrier wait compares
  // phase parity only, so a group could return from the wait for a stage whose previous fill, another
  // group's tile, had not landed yet: wrong data, launch failures and hangs on the H200.)
  static constexpr int kStages = 3;
  static_assert(kStages % kGroups == 0, "the groups share the stages out evenly");
  static constexpr int kStagesPerGroup = kStages / kGroups;
  static constexpr int kThreads = kGroups * kConsumerThreads + 32;  // + the producer warp
  static constexpr int kColGroups = kTileCols / kColsPerThread;  // 16
  static constexpr int kRowGroups = kConsumerThreads / kColGroups;  // 16
  static constexpr int kRowsPerThread = kTileRows / kRowGroups;  // 8: one 8-byte slot of q_t
  static constexpr int kQtSlots = kTileRows / 8;                 // 8-byte slots per staged column
  static constexpr uint32_t kTileBytes = kTileRows * kTileCols * sizeof(T);
  // ColwiseSegments: every CTA builds the segment table in shared memory (SegmentStart per segment +
  // RowBlock per scale column, 12 bytes each) when it fits in this many entries; larger tables are built
  // in global memory by build_segment_table_kernel first (one more launch).
  static constexpr bool kSegments = has_segments(kMode);
  // ColwiseSegments with packed tiles (kPacked): consecutive short blocks share a tile (see
  // build_packed_tiles); the table then holds at most 2048 entries (fp32: 256), beside the tiles' first
  // blocks and the blocks' box offsets.
  static constexpr bool kPacked = kSegments && kTiles == SegmentTiles::kPacked;
  // Block tiles in any order: the carries between consecutive blocks and, with several groups, the handoffs
  // (kRowMajorBlocks and kPacked have neither: no strips).
  static constexpr bool kAnyOrder = kSegments && kTiles == SegmentTiles::kBlocks;
  static constexpr int kTableEntries =
      !kSegments ? 1 : (sizeof(T) == 4 ? (kPacked ? 256 : 768) : (kPacked ? 2048 : 3072));
  // A tile is loaded as 8 boxes of 16 rows. A box wholly past the block's rows is aimed past R instead:
  // TMA zero-fills it without reading memory, and still counts its bytes. So a segment's last, partial
  // block reads at most 15 rows of the next segment, not up to 127.
  static constexpr int kBoxRows = 16;
  static_assert(kBoxRows == kPackedBoxRows, "packed tiles count the column kernel's boxes");
  static constexpr int kBoxesPerTile = kTileRows / kBoxRows;

  using Pipeline = cutlass::PipelineTmaAsync<kStagesPerGroup>;  // one per consumer group
  using PipelineState = cutlass::PipelineState<kStagesPerGroup>;
  // Shared strips (TileOrder::shared): group g hands the sector its block ends inside to group g + 1 (mod
  // groups) in its gs.carry, one block at a time: g is the producer of handoff[g] (acquire before writing
  // gs.carry, commit once it and gs.carry_handed are written), g + 1 its consumer (wait before reading
  // them, release once read). Every thread of both groups arrives.
  using HandoffPipeline = cutlass::PipelineAsync<1>;
  using HandoffState = typename HandoffPipeline::PipelineState;

  struct GroupStorage {  // one consumer group's scratch
    alignas(16) uint2 qt[kTileCols][kQtSlots];          // staged q_t: slot s of column c at s ^ swz(c)
    alignas(16) uint32_t col_amax[kConsumerWarps][kTileCols];  // |bits| maxima, see numerics.cuh
    // (scale, 1 / scale) of column c = 8 cc + j at [j][cc]: the 16 column groups of a warp read 16
    // consecutive pairs, one wavefront (a [c] layout would be a 4-way bank conflict per read).
    alignas(16) float2 col_scale[kColsPerThread][kColGroups];
    // ColwiseSegments: the last, incomplete 32-byte sector of every column of the group's previous block,
    // when the group's next block continues the column (its bytes past the block are 0); see
    // colwise_store_sm90.cuh for why.
    alignas(16) uint4 carry[kSegments ? kTileCols : 1][2];
    int carry_handed;  // shared strips: whether carry holds a sector for the next group's block
  };
  struct SharedStorage {
    alignas(128) T x[kStages][kTileRows * kTileCols];   // (TILE_R,TILE_C,PIPE) row-major tiles
    GroupStorage group[kGroups];
    alignas(16) RowBlock table[kTableEntries];          // ColwiseSegments: [row blocks] + [segments]
    SegmentScanScratch<kThreads / 32> scan;
    typename Pipeline::SharedStorage pipeline[kGroups];
    typename HandoffPipeline::SharedStorage handoff[kAnyOrder && kGroups > 1 ? kGroups : 1];
    // (last: the other members keep their offsets in the kernels without packed tiles)
    int32_t tile_first[kPacked ? kTableEntries + 1 : 1];  // packed: tile k = blocks [first[k], first[k + 1])
    int32_t box_prefix[kPacked ? kTableEntries : 1];      // packed: boxes of the blocks before block b
    int32_t warp_sums[kPacked ? kThreads / 32 : 1];       // packed: build_packed_tiles' scans
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
  // ColwiseSegments tile order (TileOrder::strip; the host's plan, csrc/quant/plan.h): -1 the kernel
  // chooses (choose_segment_order), 0 ranges, S >= 1 strips of S blocks (1: row-major); segment_shared:
  // strips or ranges shared by the CTA's groups (TileOrder::shared; not with row-major). Colwise and Both:
  // row-major.
  int segment_order;
  bool segment_shared;
  // ColwiseSegments, auto order, at most kMaxWarpSegments segments: the rule's strip (auto_segment_strip;
  // 0: ranges, shared by the CTA's groups) for every count of used row blocks B the sizes can give, B =
  // auto_strip_first + i, i < auto_strip_count, computed by the host once per shape, so that no CTA spends
  // its start on the rule.
  // auto_strip_count 0 (or B outside, e.g. invalid sizes): the kernel chooses (choose_segment_order).
  // [0]: some segment starts inside a 16-byte chunk of q_t; [1]: all start on multiples of 16 bytes.
  int32_t auto_strip_first;
  int32_t auto_strip_count;
  int8_t auto_strips[2][kMaxWarpSegments + 1];
};

// The tile a stage holds: one 128-row block (packed tiles: consecutive blocks of one 8-box window) of one
// 128-column tile of x.
struct QuantTile {
  int64_t row_block;
  int64_t col_tile;
  int64_t row_start;
  int64_t out_start;  // its first q_t column (row_start but for padded segments)
  int row_count;  // <= 0: no rows (ColwiseSegments: unused scale column, or invalid sizes)
  int blocks;     // packed tiles: blocks (scale columns row_block, row_block + 1, ...) in the tile; else 1
};

// ---- q_t staged in shared memory (GroupStorage::qt) ---------------------------------------------------

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

// Bytes [16 - shift, 32 - shift) of the 32 bytes (a, b), shift in [1, 15]. shift is uniform across the
// CTA, so the word selection below is uniform branches, never dynamic register indexing.
__device__ __forceinline__ uint4 join_shifted(const uint4& a, const uint4& b, int shift) {
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

// Staged bytes [16 k - shift, 16 k - shift + 16) of column col (shift in [1, 15]): the last `shift`
// bytes of chunk k - 1 followed by the first 16 - shift bytes of chunk k.
// kInner: k in [1, 8) (both chunks staged), no bounds checks.
template <bool kInner = false, class Storage>
__device__ __forceinline__ uint4 qt_shifted_chunk(const Storage& smem, int col, int k, int shift) {
  const uint4 a = kInner ? qt_chunk_unchecked(smem, col, k - 1) : qt_chunk(smem, col, k - 1);
  const uint4 b = kInner ? qt_chunk_unchecked(smem, col, k) : qt_chunk(smem, col, k);
  return join_shifted(a, b, shift);
}

// The same for any k, without branches on k (the 8 lanes of a column ask for different k): both chunks
// are read at clamped indices and zeroed by selects when outside [0, 8).
template <class Storage>
__device__ __forceinline__ uint4 qt_shifted_chunk_any(const Storage& smem, int col, int k, int shift) {
  const bool a_in = static_cast<unsigned>(k - 1) < 8u;
  const bool b_in = static_cast<unsigned>(k) < 8u;
  // (Word by word: a select of whole uint4 lvalues made the compiler put both in local memory.)
  const uint4 a = qt_chunk_unchecked(smem, col, a_in ? k - 1 : 0);
  const uint4 b = qt_chunk_unchecked(smem, col, b_in ? k : 0);
  return join_shifted(make_uint4(a_in ? a.x : 0u, a_in ? a.y : 0u, a_in ? a.z : 0u, a_in ? a.w : 0u),
                      make_uint4(b_in ? b.x : 0u, b_in ? b.y : 0u, b_in ? b.z : 0u, b_in ? b.w : 0u), shift);
}

// Where staged byte i (block row i < 128) of column col lies among the column's 128 bytes.
__device__ __forceinline__ int qt_staged_byte_offset(int col, int i) {
  return 8 * (((i >> 3) & 15) ^ qt_slot_swizzle(col)) + (i & 7);
}

__device__ __forceinline__ uint4 or4(const uint4& a, const uint4& b) {
  return make_uint4(a.x | b.x, a.y | b.y, a.z | b.z, a.w | b.w);
}

}  // namespace wgrad::quant
