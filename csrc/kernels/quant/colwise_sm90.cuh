// \brief Column-wise FP8 1x128 quantization on SM90 (also "both" and the MoE segments): a persistent,
// warp-specialized kernel. One producer warp streams 128 x 128 tiles of x into a ring of shared-memory
// stages with TMA; consumer groups of eight warps (three groups for 16-bit x, one for fp32) take the
// tiles (in turn, or in strips of consecutive blocks for some MoE segments: TileOrder), each group through
// its own pipeline stage(s), quantize them and write q_t (and, in Both, q). Torch-free.
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

#include "kernels/common/layout.h"
#include "kernels/quant/params.h"
#include "kernels/quant/segment_table.cuh"
#include "kernels/quant/numerics.cuh"
#include "kernels/quant/qt_store.cuh"
#include "kernels/quant/segment_order.h"

namespace wgrad::quant {

// ColwiseSegments: the tiles and their order, a template argument so that each kernel holds only its own paths.
//   kBlocks: a tile per used row block, in any order (strips, shared strips, ranges; TileOrder), with the
//     sectors carried and handed over between consecutive blocks;
//   kRowMajorBlocks: a tile per used row block in row-major order only (no carries, no handoffs), for any
//     sizes: what the host launches when the shape's automatic order is row-major (row_major_segments in
//     quant/segments.cu; on the same walk it ran 2-4.5 points of a copy faster than kBlocks, H200 session 23);
//   kPacked: packed tiles (build_packed_tiles), row-major.
// (Colwise and Both ignore it.)
enum class SegmentTiles : int { kBlocks, kRowMajorBlocks, kPacked };

template <typename T, QuantMode kMode, SegmentTiles kTiles = SegmentTiles::kBlocks>
struct ColwiseSm90Config {
  static constexpr int kTileRows = kBlock;  // one column block
  static constexpr int kTileCols = kBlock;  // one row block (Both)
  static constexpr int kConsumerThreads = 256;  // one consumer group: 8 warps
  static constexpr int kConsumerWarps = kConsumerThreads / 32;
  // Consumer groups work on different tiles at once (tiles go round-robin between them), so that one
  // group's barriers and stores overlap the others' arithmetic: one group of 8 warps alone reached
  // 62 % of a copy, two 73-82 % (docs/perf-notes.md). Three groups of 16-bit x use at most 80
  // registers per thread (800 threads); fp32 keeps one group: its registers (up to 150 per thread)
  // would not fit twice. (2 groups of 2 stages each measured no faster: Colwise within noise, Both
  // -2 to -3 points, H200 session 6.)
  static constexpr int kGroups = sizeof(T) == 4 ? 1 : 3;
  // 3 x 32 KB (bf16/fp16) or 3 x 64 KB (fp32) of stages. Every consumer group has a pipeline of its own
  // (16-bit: one stage per group; fp32: the one group has three): a stage is waited on and released by
  // one group only, for every fill, in order, as CUTLASS's pipeline assumes. (Session 4 shared one ring
  // of 4 stages between 3 groups that stepped over each other's tiles without waiting; an mbarrier wait
  // compares phase parity only, so a group could return from the wait for a stage whose previous fill,
  // another group's tile, had not landed yet: wrong data, launch failures and hangs on the H200.)
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
  static constexpr bool kSegments = kMode == QuantMode::ColwiseSegments;
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
    // when the group's next block continues the column (its bytes past the block are 0); see the q_t
    // stores in the kernel for why.
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
  // ColwiseSegments tile order (TileOrder::strip): -1 the kernel chooses (choose_segment_order), 0 ranges,
  // S >= 1 strips of S blocks (1: row-major); segment_shared: strips or ranges shared by the CTA's groups
  // (TileOrder::shared; not with row-major).
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

// Named barriers of the consumer groups (offset past CUTLASS's reserved ids by NamedBarrier): group g
// uses Consumers + g.
enum class QuantBarrierId : uint32_t { Consumers = 0 };

struct QuantTile {
  int64_t row_block;
  int64_t col_tile;
  int64_t row_start;
  int64_t out_start;  // its first q_t column (row_start but for padded segments)
  int row_count;  // <= 0: no rows (ColwiseSegments: unused scale column, or invalid sizes)
  int blocks;     // packed tiles: blocks (scale columns row_block, row_block + 1, ...) in the tile; else 1
};

// The order of the tiles, the same in every CTA of a launch. Tiles are dealt out as units of consecutive
// row blocks of one column tile; a group ("worker") quantizes a unit's blocks one after the other.
//   Strips of S blocks (TileOrder::strip = S >= 1; S = 1 is plain row-major, what Colwise and Both use):
//     the units in row-major order (strips of rows outer, column tiles inner) go round-robin to the CTAs,
//     and a CTA's units in turn to its groups, so that the CTAs work on neighbouring column tiles of the
//     same rows at the same time.
//   Shared strips (TileOrder::shared, S >= 2, several groups per CTA): the units go round-robin to the
//     CTAs, and the blocks of a CTA's units, in order, to its groups in turn: block j of a unit is
//     quantized by one group while j + 1 and j + 2 are by the other two, so the CTA walks down a strip as
//     fast as a group walks across a row-major round.
//   Ranges (strip = 0): column-major, every worker one contiguous range (ranges differ by at most one
//     tile); shared ranges: every CTA one, its groups taking its blocks in turn as in shared strips.
// Within a unit, consecutive blocks of a column let a group (shared strips: the next group, through
// shared memory) write q_t in whole 32-byte sectors across the block boundary (see the q_t stores); that
// is why ColwiseSegments whose segments start inside a sector use units longer than one block
// (choose_segment_order). With 32-aligned starts no sector is shared and
// row-major is ahead at every size (4096 x 7168: 81 % of a copy row-major, 75 % strips of 4).
// ColwiseSegments tiles are the used row blocks (table entries [0, blocks_per_col)) of every column
// tile; the unused scale columns are filled separately. (Ranges that also counted them left some workers
// a tile more than others: -11 points of a copy at 8192 x 2112.)

// 32-bit counts: the host checks that the tiles of a launch fit (launch_colwise_sm90).
struct TileOrder {
  int32_t blocks_per_col;  // row blocks per column tile
  int32_t num_col_tiles;
  int32_t strip;           // row blocks per unit; 0: one contiguous range per worker (column-major)
  int32_t strips_per_col;  // ceil(blocks_per_col / strip)
  int32_t workers;         // gridDim.x * groups
  int32_t groups;          // consumer groups per CTA
  // false: unit u goes to worker (CTA u % gridDim.x, group (u / gridDim.x) % groups), which quantizes its
  // blocks one after the other (ranges: range u to worker u). true ("shared strips", "shared ranges"):
  // unit u goes to CTA u % gridDim.x (ranges: range u, one per CTA), and the CTA's tiles (its units'
  // blocks, in order) go to its groups in turn, so that neighbouring blocks are quantized by neighbouring
  // groups at about the same time and a group hands the sector its block ends inside to the next group
  // through shared memory (see the q_t stores). Not row-major (strip 1).
  bool shared;
  __host__ __device__ int32_t num_tiles() const { return blocks_per_col * num_col_tiles; }
  // Ranges: one per worker, or with `shared` one per CTA. Strips: ceil(B / S) per column tile.
  __host__ __device__ int32_t num_units() const {
    return strip == 0 ? (shared ? workers / groups : workers) : strips_per_col * num_col_tiles;
  }
  // Units between two of a cursor's units, and tiles of the sequence between two of a group's tiles.
  __host__ __device__ int32_t unit_step() const { return shared ? workers / groups : workers; }
  __host__ __device__ int32_t tile_step() const { return shared ? groups : 1; }
};

__device__ __forceinline__ TileOrder make_tile_order(int32_t blocks_per_col, int32_t num_col_tiles, int32_t strip,
                                                     int32_t workers, int32_t groups, bool shared) {
  TileOrder o;
  o.blocks_per_col = blocks_per_col;
  o.num_col_tiles = num_col_tiles;
  o.strip = strip;
  o.strips_per_col = strip == 0 ? 0 : (blocks_per_col + strip - 1) / strip;
  o.workers = workers;
  o.groups = groups;
  o.shared = shared && strip != 1 && groups > 1;  // one group: its own strips or ranges
  return o;
}

// segment_strip_rule's combine for the 32 lanes of a warp that share the search: the longest strip found.
struct WarpSearchers {
  WGRAD_HOST_DEVICE int32_t operator()(int32_t best) const {
#ifdef __CUDA_ARCH__
#pragma unroll
    for (int off = 16; off > 0; off /= 2) best = max(best, __shfl_xor_sync(0xFFFFFFFFu, best, off));
#endif
    return best;
  }
};

// ColwiseSegments: the order when not forced by the tuning knob (TileOrder::strip). Segments that start inside a
// sector: the longest strip S, a multiple of the groups per CTA, that leaves no consumer group more tiles than
// row-major does (ceil(T / W) for T tiles and W groups), so that S - 1 of every S block boundaries write whole sectors;
// failing that, ranges (0: shared by the CTA's groups, from kMinTilesForSharedRanges tiles per group; one group per
// CTA: on shapes of kMinTilesForOneMore or more tiles per group, a strip with one more). With several groups per CTA
// the strips are shared (TileOrder::shared): the units go to the CTAs and a CTA's tiles to its groups in turn; one
// group per CTA (fp32): its own strips. The busiest group's tiles are counted exactly (strip_busiest_worker). Strips
// shorter than kMinAutoStrip stay row-major, and beyond kMaxAutoStrip tiles per group the order is ranges (balanced to
// one tile, shared by a CTA's groups, a sector shared with another worker only where a range ends). Measured
// (`scripts/profile_quant.py order-sweep`, bf16, % of a copy, the benchmark's unaligned split; docs/perf-notes.md):
// session 12, row-major / strips of 6 of one group (session 10's rule) / shared strips of 18: 4096 x 7168 68.6 / 72.1 /
// 76.0-76.5, 8192 x 4096 62.4-63.0 / 65.8-66.3 / 66.7-68.7, 4096 x 24576 59.3-60.4 / 74.1 (18) / 76.6-77.0; session 13
// (run 5, the lean store path), shared strips of 3 / 6 / 9 / 12 / 17 / 18 / 19 / 24: 4096 x 7168 73.0 / 73.2 / 75.2 /
// 62.9 / 70.0 / 78.5 / 76.0 / 66.7, 8192 x 4096 64.0 / 67.6 / 63.2 / 62.8 / 69.8 / 72.1 / 70.0 / 65.3, 16384 x 7168
// 73.1 / 73.5 / 74.5 / 74.1 / 70.9 / 77.3 / 75.2 / 70.4, 4096 x 24576 71.9 / 73.0 / 76.8 / 70.1 / 72.2 / 77.2 / 76.4 /
// 71.1. 8192 x 2112 (3 tiles per group) stays row-major (70.7; shared strips of 3 72.1 unaligned but 2-4 points under
// row-major on the 16-aligned split, sessions 12 and 13; of 12, a tile per group more than row-major, 75.2 in the one
// run that measured them, not taken). Long shared strips lose wherever they leave CTAs idle or give some a unit more
// (strips of 12 at 4096 x 7168: 63 %, of 24: 67 %). The rule itself is auto_segment_strip (segment_order.h), which the
// host tabulates per shape for up to kMaxWarpSegments segments (ColwiseSm90Params::auto_strips); this applies the same
// rule (segment_strip_rule) in the kernel for the other launches (more segments, or sizes that do not sum to R), for
// segments that start inside a sector (the others are row-major). Every thread of the CTA calls it with the same
// arguments (whole warps: lane l tries S = l + 1, l + 33).
__device__ __forceinline__ int32_t choose_segment_order(int32_t blocks_per_col, int32_t num_col_tiles, int32_t workers,
                                                        int32_t groups, bool starts16) {
  return segment_strip_rule(blocks_per_col, num_col_tiles, workers, groups, starts16,
                            static_cast<int32_t>(threadIdx.x % 32) + 1, 32, WarpSearchers{});
}

// A worker's walk over its units: tiles counted as column-major linear indices (col_tile *
// blocks_per_col + row_block); [tile, end) is what is left of the current unit, (row_block, col_tile) the
// tile at `tile`. Shared strips: the walk of the CTA's tile sequence, of which
// the group takes every TileOrder::groups-th tile.
struct TileCursor {
  int32_t tile;
  int32_t end;
  int32_t row_block;
  int32_t col_tile;
  int32_t unit;  // the next unit is unit + unit_step()

  __device__ __forceinline__ bool valid() const { return tile < end; }
  // Does the next tile of the sequence continue the unit (ranges: and the column tile)?
  __device__ __forceinline__ bool unit_continues(const TileOrder& o) const {
    return tile + 1 < end && row_block + 1 < o.blocks_per_col;
  }
  // Shared strips: is the tile before this one in the CTA's sequence the block above it (another group's)?
  // (Strips start at multiples of the strip length; no register for the unit's start.)
  __device__ __forceinline__ bool follows_in_unit(const TileOrder& o) const {
    // (Shared ranges: the range of CTA `unit` starts at tile floor(T unit / ctas), and tile - 1 >= that
    // start iff tile ctas > T unit.)
    if (!o.shared || row_block == 0) return false;
    return o.strip != 0 ? row_block % o.strip != 0
                        : int64_t{tile} * o.num_units() > int64_t{o.num_tiles()} * unit;
  }

  __device__ __forceinline__ void enter_units(const TileOrder& o) {  // from `unit` on, the first non-empty
    const int32_t units = o.num_units();
    for (; unit < units; unit += o.unit_step()) {
      if (o.strip == 0) {
        tile = static_cast<int32_t>(static_cast<int64_t>(o.num_tiles()) * unit / units);
        end = static_cast<int32_t>(static_cast<int64_t>(o.num_tiles()) * (unit + 1) / units);
        col_tile = tile / o.blocks_per_col;
        row_block = tile - col_tile * o.blocks_per_col;
      } else {
        const int32_t s = unit / o.num_col_tiles;  // row-major units
        col_tile = unit - s * o.num_col_tiles;
        row_block = s * o.strip;
        const int32_t b1 = row_block + o.strip < o.blocks_per_col ? row_block + o.strip : o.blocks_per_col;
        tile = col_tile * o.blocks_per_col + row_block;
        end = tile + (b1 - row_block);
      }
      if (tile < end) return;
    }
    tile = end = 0;
  }
  __device__ __forceinline__ void step(const TileOrder& o) {  // the next tile of the sequence
    if (!valid()) return;
    if (++tile == end) {
      unit += o.unit_step();
      enter_units(o);
    } else if (++row_block == o.blocks_per_col) {  // ranges only: into the next column tile
      row_block = 0;
      ++col_tile;
    }
  }
  __device__ __forceinline__ void advance(const TileOrder& o) {  // the group's next tile
#pragma unroll 1
    for (int32_t i = 0; i < o.tile_step(); ++i) step(o);
  }
};

// The launch-wide index of this CTA's consumer group `group` (a "worker"; order.workers of them).
template <int kGroups>
__device__ __forceinline__ int32_t worker_index(int group) {
  return static_cast<int32_t>(blockIdx.x) * kGroups + group;
}

// Group `group`'s cursor at its first tile. Strips: unit u goes to CTA u % gridDim.x, group
// (u / gridDim.x) % groups. Ranges: CTA b's groups take neighbouring ranges. Shared strips and ranges:
// the CTA's tile `group` of its sequence.
template <int kGroups>
__device__ __forceinline__ TileCursor first_tile(const TileOrder& o, int group) {
  TileCursor c;
  c.unit = o.shared ? static_cast<int32_t>(blockIdx.x)
           : o.strip == 0 ? worker_index<kGroups>(group)
                          : static_cast<int32_t>(blockIdx.x + group * gridDim.x);
  c.tile = c.end = 0;
  c.enter_units(o);
  if (o.shared) {
    for (int i = 0; i < group; ++i) c.step(o);
  }
  return c;
}

// ColwiseSegments: the used entries of the row-block table form a prefix (build_segment_table); their
// count, by binary search for the first entry without rows (0 when the sizes are invalid).
__device__ __forceinline__ int32_t used_row_blocks(const RowBlock* table, int32_t num_row_blocks) {
  int32_t lo = 0, hi = num_row_blocks;  // the answer lies in [lo, hi]
  while (lo < hi) {
    const int32_t mid = (lo + hi) / 2;
    if (table[mid].row_count > 0) lo = mid + 1; else hi = mid;
  }
  return lo;
}

template <QuantMode kMode>
__device__ __forceinline__ QuantTile quant_tile(const ColwiseSm90Params& params, const RowBlock* table,
                                                const TileCursor& cursor) {
  QuantTile t;
  t.row_block = cursor.row_block;
  t.col_tile = cursor.col_tile;
  t.blocks = 1;
  if (kMode == QuantMode::ColwiseSegments) {
    const RowBlock rb = table[t.row_block];
    t.row_start = rb.row_start;
    t.out_start = rb.out_start;
    t.row_count = rb.row_count;
  } else {
    t.row_start = t.row_block * kBlock;
    t.out_start = t.row_start;
    const int64_t left = params.q.rows - t.row_start;
    t.row_count = static_cast<int>(left < kBlock ? left : kBlock);
  }
  return t;
}

// Packed tiles: tile cursor.row_block of the column tile, blocks [tile_first[k], tile_first[k + 1]) of the
// table, consecutive rows of x (and, unpadded, of q_t) from the first block's on.
__device__ __forceinline__ QuantTile packed_quant_tile(const RowBlock* table, const int32_t* tile_first,
                                                       const TileCursor& cursor) {
  const int32_t b0 = tile_first[cursor.row_block], b1 = tile_first[cursor.row_block + 1];
  const RowBlock first = table[b0], last = table[b1 - 1];
  QuantTile t;
  t.row_block = b0;
  t.col_tile = cursor.col_tile;
  t.row_start = first.row_start;
  t.out_start = first.out_start;
  t.row_count = last.row_start + last.row_count - first.row_start;
  t.blocks = b1 - b0;
  return t;
}

// Packed tiles (ColwiseSegments, kPacked): used block b takes n_b = ceil(rows_b / 16) boxes of a stage; with
// P_b the boxes of the blocks before it, the blocks that lie inside one window of 8 boxes [8 w, 8 w + 8)
// share a tile (at most 8 boxes: the tile starts at its first block's box), and a block across a window
// boundary is a tile of its own (packed_block_starts_tile in segment_order.h, tested on the host). Tiles in block order: tile k = blocks [tile_first[k], tile_first[k + 1]);
// returns the tile count (per column tile). Many short segments then cost a tile per ~128 rows instead of
// one per block. Every thread of the CTA calls it (it synchronises them); table holds `blocks` used entries.
template <int kThreads>
__device__ int32_t build_packed_tiles(const RowBlock* table, int32_t blocks, int32_t* tile_first, int32_t* box_prefix,
                                      int32_t* warp_sums) {
  constexpr int kWarps = kThreads / 32;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int32_t per = (blocks + kThreads - 1) / kThreads;  // consecutive blocks per thread
  const int32_t b_lo = min(tid * per, blocks), b_hi = min(b_lo + per, blocks);
  auto boxes = [&](int32_t b) { return packed_block_boxes(table[b].row_count); };
  // The exclusive prefix over the CTA of the threads' sums: (before, total).
  auto cta_scan = [&](int32_t local, int32_t& before, int32_t& total) {
    int32_t incl = local;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int32_t y = __shfl_up_sync(0xFFFFFFFFu, incl, off);
      if (lane >= off) incl += y;
    }
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    before = incl - local;
    total = 0;
    for (int w = 0; w < kWarps; ++w) {
      const int32_t v = warp_sums[w];
      before += w < warp ? v : 0;
      total += v;
    }
  };
  int32_t local = 0, before = 0, total = 0;
  for (int32_t b = b_lo; b < b_hi; ++b) local += boxes(b);
  cta_scan(local, before, total);
  for (int32_t b = b_lo; b < b_hi; ++b) {
    box_prefix[b] = before;
    before += boxes(b);
  }
  __syncthreads();  // box_prefix complete, warp_sums read
  auto starts_tile = [&](int32_t b) {  // (packed_block_starts_tile, segment_order.h)
    const int32_t pb = box_prefix[b];
    if (b == 0 || packed_block_crosses_window(pb, boxes(b))) return true;
    const int32_t pa = box_prefix[b - 1];
    return packed_block_crosses_window(pa, boxes(b - 1)) || packed_window_changes(pa, pb);
  };
  local = 0;
  for (int32_t b = b_lo; b < b_hi; ++b) local += starts_tile(b) ? 1 : 0;
  cta_scan(local, before, total);
  for (int32_t b = b_lo; b < b_hi; ++b) {
    if (starts_tile(b)) tile_first[before++] = b;
  }
  if (tid == 0) tile_first[total] = blocks;
  __syncthreads();  // the tiles complete, warp_sums read
  return total;
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

template <typename T, QuantMode kMode, SegmentTiles kTiles = SegmentTiles::kBlocks>
__global__ void __launch_bounds__(ColwiseSm90Config<T, kMode, kTiles>::kThreads, 1)
    quantize_fp8_1x128_colwise_sm90_kernel(const __grid_constant__ ColwiseSm90Params params) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Cfg = ColwiseSm90Config<T, kMode, kTiles>;
  using Pipeline = typename Cfg::Pipeline;
  constexpr bool kRow = has_rowwise(kMode);
  static_assert(has_colwise(kMode), "row-wise alone: rowwise.cuh");

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
  // barrier; a group's stages are read by that group only.
  pipeline_params.num_consumers = Cfg::kConsumerThreads;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
#pragma unroll
  for (int g = 0; g < Cfg::kGroups; ++g) {
    Pipeline init(smem.pipeline[g], pipeline_params, ClusterShape{});  // warp 0 initialises the barriers
  }
  // Shared strips' handoffs (segments with several groups): warp 0 initialises their barriers.
  using Handoff = typename Cfg::HandoffPipeline;
  typename Handoff::Params handoff_params;
  handoff_params.producer_arv_count = Cfg::kConsumerThreads;
  handoff_params.consumer_arv_count = Cfg::kConsumerThreads;
  if constexpr (Cfg::kAnyOrder && Cfg::kGroups > 1) {
#pragma unroll
    for (int g = 0; g < Cfg::kGroups; ++g) Handoff::init_barriers(smem.handoff[g], handoff_params);
  }
  // A handle on group g's pipeline (its barriers are initialised above, once).
  auto group_pipeline = [&](int g) {
    return Pipeline(smem.pipeline[g], pipeline_params, ClusterShape{}, cute::false_type{});
  };

  // Segments: the row-block table, built by every CTA for itself (it synchronises the CTA, so the
  // pipeline barriers above are initialised too), or the one in global memory.
  // (At most kMaxWarpSegments segments: every warp scans the sizes itself and fills its share of the
  // table, no barrier but the one below. The CTA-wide scan kept the producer's first load ~3 us behind
  // Colwise's, this ~1.2 us; H200 session 11, `scripts/profile_quant.py startup`.)
  const RowBlock* table = p.row_blocks;
  const bool own_table = Cfg::kSegments && params.segments.sizes != nullptr;  // else q.row_blocks
  const bool warp_table = own_table && params.segments.num_segments <= kMaxWarpSegments;
  SegmentSummary summary{0, false, false};
  if constexpr (Cfg::kSegments) {
    if (own_table) {
      const SegmentTableArgs& a = params.segments;
      if (warp_table) {
        summary = build_segment_table_warps(a, smem.table, tid / 32, Cfg::kThreads / 32);
      } else {
        build_segment_table<Cfg::kThreads>(a, reinterpret_cast<SegmentStart*>(smem.table + a.num_row_blocks),
                                           smem.table, smem.scan);
      }
      table = smem.table;
    }
  }
  __syncthreads();  // barriers initialised (and the table built) before anyone reads them

  // The tile order (TileOrder): ColwiseSegments quantizes the used row blocks only, in units of several
  // blocks when a segment starts inside a sector (see choose_segment_order).
  const int32_t workers = static_cast<int32_t>(gridDim.x) * Cfg::kGroups;  // consumer groups of the launch
  int32_t blocks_per_col = static_cast<int32_t>(params.num_row_blocks);
  int32_t strip = 1;
  bool shared = false;
  if constexpr (Cfg::kSegments) {
    {
      bool inside_sector = summary.inside_sector, inside_chunk = summary.inside_chunk;
      blocks_per_col = summary.used_blocks;
      if (!warp_table) {  // (the same in every thread of the CTA)
        blocks_per_col = static_cast<int32_t>(used_row_blocks(table, params.num_row_blocks));
        if constexpr (Cfg::kAnyOrder) {
          for (int32_t b = tid; b < blocks_per_col; b += Cfg::kThreads) {
            inside_sector |= (table[b].out_start & 31) != 0;
            inside_chunk |= (table[b].out_start & 15) != 0;
          }
          inside_sector = __syncthreads_or(inside_sector);
          inside_chunk = __syncthreads_or(inside_chunk);
        }
      }
      if constexpr (Cfg::kAnyOrder) {  // (packed tiles and kRowMajorBlocks: row-major)
        const int32_t table_index = blocks_per_col - params.auto_strip_first;  // the host's table, if it has B
        strip = params.segment_order >= 0 ? params.segment_order
                : !inside_sector          ? 1
                : table_index >= 0 && table_index < params.auto_strip_count
                    ? static_cast<int32_t>(params.auto_strips[inside_chunk ? 0 : 1][table_index])
                    : choose_segment_order(blocks_per_col, static_cast<int32_t>(params.num_col_tiles), workers,
                                           Cfg::kGroups, !inside_chunk);
        // auto: strips and ranges shared by the CTA's groups (make_tile_order: when there are several)
        shared = params.segment_order >= 0 ? params.segment_shared : true;
      }
    }
  }
  [[maybe_unused]] int32_t used_blocks = blocks_per_col;
  if constexpr (Cfg::kPacked) {  // row-major over the packed tiles (no sector is carried between tiles)
    blocks_per_col = build_packed_tiles<Cfg::kThreads>(table, blocks_per_col, smem.tile_first, smem.box_prefix,
                                                       smem.warp_sums);
    strip = 1;
    shared = false;
  }
  const TileOrder order = make_tile_order(blocks_per_col, static_cast<int32_t>(params.num_col_tiles), strip, workers,
                                          Cfg::kGroups, shared);
  auto tile_of = [&](const TileCursor& cursor) {
    if constexpr (Cfg::kPacked) {
      return packed_quant_tile(table, smem.tile_first, cursor);
    } else {
      return quant_tile<kMode>(params, table, cursor);
    }
  };

  // ---------------------------------------------------------------- producer: one thread
  // It serves the groups in turn, each from its own tile list and into its own stages. (A producer warp
  // per group, each waiting only for its group's stage, measured slower: Both -2 to -9 points of a copy,
  // Colwise -1 to -5, H200 session 6.)
  if (producer) {
    if (tid == kProducerTid) {
      constexpr uint64_t kEvictFirst = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_FIRST);
      typename Cfg::PipelineState states[Cfg::kGroups];
      TileCursor tiles[Cfg::kGroups];
#pragma unroll
      for (int g = 0; g < Cfg::kGroups; ++g) {
        states[g] = cutlass::make_producer_start_state<Pipeline>();
        tiles[g] = first_tile<Cfg::kGroups>(order, g);
      }
      for (bool more = true; more;) {
        more = false;
#pragma unroll
        for (int g = 0; g < Cfg::kGroups; ++g) {
          if (!tiles[g].valid()) continue;  // the group has no tiles left
          const QuantTile t = tile_of(tiles[g]);
          tiles[g].advance(order);
          more = true;
          Pipeline pipeline = group_pipeline(g);
          pipeline.producer_acquire(states[g]);
          uint64_t* bar = reinterpret_cast<uint64_t*>(pipeline.producer_get_barrier(states[g]));
          T* stage = smem.x[g * Cfg::kStagesPerGroup + states[g].index()];
          const int32_t col = static_cast<int32_t>(t.col_tile * Cfg::kTileCols);
          if constexpr (Cfg::kPacked) {
            // Each block's boxes one after the other from box 0 (a block starts on a box), the rest aimed past R.
            int box = 0;
            for (int i = 0; i < t.blocks; ++i) {
              const RowBlock rb = table[t.row_block + i];
              for (int r = 0; r < rb.row_count; r += Cfg::kBoxRows, ++box) {
                cute::SM90_TMA_LOAD_2D::copy(&params.tma_x, bar, kEvictFirst, stage + box * Cfg::kBoxRows * Cfg::kTileCols,
                                             col, static_cast<int32_t>(rb.row_start + r));
              }
            }
            for (; box < Cfg::kBoxesPerTile; ++box) {
              cute::SM90_TMA_LOAD_2D::copy(&params.tma_x, bar, kEvictFirst, stage + box * Cfg::kBoxRows * Cfg::kTileCols,
                                           col, static_cast<int32_t>(p.rows));
            }
          } else {
#pragma unroll
            for (int b = 0; b < Cfg::kBoxesPerTile; ++b) {
              const int r = b * Cfg::kBoxRows;
              const int32_t row = r < t.row_count ? static_cast<int32_t>(t.row_start + r) : static_cast<int32_t>(p.rows);
              cute::SM90_TMA_LOAD_2D::copy(&params.tma_x, bar, kEvictFirst, stage + r * Cfg::kTileCols, col, row);
            }
          }
          ++states[g];
        }
      }
#pragma unroll
      for (int g = 0; g < Cfg::kGroups; ++g) group_pipeline(g).producer_tail(states[g]);
    }
    return;
  }

  // ---------------------------------------------------------------- consumers
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
  Pipeline pipeline = group_pipeline(group);
  typename Cfg::PipelineState state;
  bool head_carry = false;  // ColwiseSegments: carry_in (below) holds the sector this block starts inside
  // Shared strips: this group's place in its handoff to the next group and in the previous group's.
  typename Cfg::HandoffState handoff_out = cutlass::make_producer_start_state<typename Cfg::HandoffPipeline>();
  typename Cfg::HandoffState handoff_in;

  if constexpr (Cfg::kSegments) {
    // The unused scale columns [blocks_per_col, num_row_blocks) of every column tile (all of them when
    // the sizes are invalid), dealt out to the workers in turn.
    // (32-bit: they are tiles of the launch, fewer than 2^31.)
    const int32_t used = Cfg::kPacked ? used_blocks : order.blocks_per_col;
    const int32_t unused = static_cast<int32_t>(params.num_row_blocks) - used;
    for (int32_t v = worker_index<Cfg::kGroups>(group); v < unused * order.num_col_tiles; v += order.workers) {
      const int32_t col_tile = v / unused;
      const int32_t row_block = used + (v - col_tile * unused);
      if (tid_g < Cfg::kTileCols) {
        fill_empty_scale_column(p, row_block, int64_t{col_tile} * Cfg::kTileCols, table[row_block].row_count, tid_g);
      }
    }
  }


  for (TileCursor cursor = first_tile<Cfg::kGroups>(order, group); cursor.valid(); cursor.advance(order)) {
    const QuantTile t = tile_of(cursor);
    const int64_t tile_col = t.col_tile * Cfg::kTileCols;

    // ---- tile rows [8 rg, 8 rg + 8), columns [8 cc, 8 cc + 8) into registers (raw); release the stage.
    RawVec<T> raw[Cfg::kRowsPerThread];
    pipeline.consumer_wait(state);
    const T* s_x = smem.x[group * Cfg::kStagesPerGroup + state.index()];
#pragma unroll
    for (int i = 0; i < Cfg::kRowsPerThread; ++i) {
      load8_shared_raw(s_x + (rg * Cfg::kRowsPerThread + i) * Cfg::kTileCols + cc * kColsPerThread, raw[i]);
    }
    // Rows past the block: zero-filled by TMA past R, but a segment's neighbour rows are data.
    int valid_rows = t.row_count - rg * Cfg::kRowsPerThread;
    // Packed tiles: warp w's rows are box w, of one block (or of none, past the tile's last block).
    // packed_rows(true): the thread's valid rows; (false): its first row among the tile's q_t rows (the
    // blocks' rows one after the other). Walked twice, here and at the staging, instead of keeping the second
    // in a register through the tile (kept live, it cost the packed kernel 12 bytes of spills at 72 registers).
    [[maybe_unused]] auto packed_rows = [&](bool valid) {
      int box = 0;
      for (int i = 0; i < t.blocks; ++i) {
        const RowBlock rb = table[t.row_block + i];
        const int nb = packed_block_boxes(rb.row_count);
        if (warp >= box && warp < box + nb) {
          const int r = Cfg::kBoxRows * (warp - box) + Cfg::kRowsPerThread * (rg & 1);  // row in the block
          return valid ? rb.row_count - r : static_cast<int>(rb.row_start - t.row_start) + r;
        }
        box += nb;
      }
      return 0;  // (a warp past the tile's last block: no rows)
    };
    if constexpr (Cfg::kPacked) valid_rows = packed_rows(true);
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
      if constexpr (sizeof(T) == 2) {
        // Two rows per word (row 2 p in the low half): the fold of both halfwords and the shuffles
        // serve two rows at once.
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
      const int half_warp = lane & ~(Cfg::kColGroups - 1);
      // Rows past R (zero-filled) are quantized too and only their stores are skipped: no branch
      // around the arithmetic.
      // The q row pointer steps by C (one add per row, predicated stores): per-row 64-bit index
      // arithmetic under nested branches cost ~30 instructions a row (ncu, H200 session 7). Lane cc < 8
      // stores the scale of row cc, which it computed.
      const int64_t row0 = t.row_start + rg * Cfg::kRowsPerThread;
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

    // ---- column amax (as |bits|): 8 rows in the thread, 2 row groups in the warp, 8 warps through
    // shared memory
    {
      uint32_t amax[kColsPerThread];
      if constexpr (!kRow && sizeof(T) == 2) {
        // Two columns per word: packed 16-bit maxima over the 8 rows and the warp's other row group
        // (4 shuffles instead of 8), unpacked only at the end. (Not in Both: at its 80-register cap
        // ptxas then spills 24-28 bytes.)
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
    ++state;
    consumers_sync();  // (1) partial amaxes written
    if constexpr (Cfg::kPacked) {
      // The staging is zeroed first (the tile's rows are staged in q_t order below, a byte at a time), and
      // 1 / scale of each block, from the maxima of its warps, replaces them (as float bits) in col_amax: it
      // is NaN exactly when the scale is (quantize_quad's NaN test takes it instead of the scale).
#pragma unroll
      for (int j = 0; j < kColsPerThread; ++j) {
        const int col = cc * kColsPerThread + j;
        gs.qt[col][rg ^ qt_slot_swizzle(col)] = make_uint2(0u, 0u);
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
    consumers_sync();  // (2) scales ready

    // ---- quantize and stage: column j's 8 rows are one slot (rows past the block staged as 0, even in a
    // NaN block: they may land in q_t's padding). Packed tiles: the valid rows' bytes at out_row on.
    if constexpr (Cfg::kPacked) {
      if (valid_rows > 0) {
        const int out_row = packed_rows(false);
        float v[Cfg::kRowsPerThread][kColsPerThread];
#pragma unroll
        for (int i = 0; i < Cfg::kRowsPerThread; ++i) unpack8(raw[i], v[i]);
#pragma unroll
        for (int j = 0; j < kColsPerThread; ++j) {
          const int col = cc * kColsPerThread + j;
          const float inv_scale = __uint_as_float(gs.col_amax[warp][col]);
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
        gs.qt[col][rg ^ qt_slot_swizzle(col)] = make_uint2(lo, hi);
      }
    }
    consumers_sync();  // (3) q_t staged

    // ---- store q_t rows [a, e) of every column of the tile. The block that ends at row R also writes
    // q_t's padding [R, q_t_ld) (zeros: staged past the block), so q_t never holds uninitialised bytes.
    // (Padded segments: every block also writes its segment's zero columns up to the next multiple of
    // seg_pad; the zero columns after the last segment are written after the tile loop.)
    // NOTES: write whole 32-byte sectors. A store that covers only part of an L2 sector costs the L2 a
    // read-modify-write: segments starting 16 bytes into a sector ran at 55 % of a copy where 32-, 64- and
    // 128-aligned starts ran at 81-83 % (H200, 16384 x 7168 bf16; same DRAM traffic, +21 % L2 write
    // sectors). A block starting or ending inside a sector shares it with its neighbour, so:
    //   - ColwiseSegments in strips (TileOrder): consecutive blocks of a column tile are quantized by
    //     one group, or with shared strips by the CTA's groups in turn; the sector a block ends inside
    //     is kept in gs.carry instead of stored, and the next block, which starts inside it, stores it
    //     whole (both halves, from two lanes of one store instruction), reading the carry from its own
    //     group or from the previous group (carry_in; handed over behind the handoff barriers);
    //   - where the neighbour is another worker's block, only this block's bytes of the shared sector are
    //     stored: by a whole warp, one byte per lane, so that the sector is one store request (the edge
    //     bytes after the paths below; the widest aligned stores that fit, up to five requests per 16-byte
    //     half, cost 1.5x-2x the stores' time in an L2 left dirty by the benchmark's flush: unaligned
    //     segments in row-major order at 8192 x 2112 ran 69-70 % of a copy with them, 76-82 % with the
    //     warp's bytes; H200 session 16). 16-aligned starts store their halves of a shared sector whole.
    // The staged block holds rows [a, a + 128) as 16-byte chunks from first_row = a - a % 16 (shifted by
    // a % 16 when a is not 16-aligned; chunks outside the staging read as zeros).
    {
      const int64_t a = t.out_start;
      const bool last_block = t.row_start + t.row_count == p.rows;
      // (seg_pad is a power of two: its padding without a division)
      const int64_t e = p.seg_pad > 0 ? (a + t.row_count + p.seg_pad - 1) & ~(p.seg_pad - 1)
                                      : (last_block ? p.q_t_ld : a + t.row_count);
      const int shift = static_cast<int>(a & 15);
      const int64_t first_row = a - shift;
      auto staged = [&](int col, int m) {  // 16-byte chunk m (rows first_row + 16 m ...) of column col
        return shift == 0 ? qt_chunk(gs, col, m) : qt_shifted_chunk(gs, col, m, shift);
      };
      // ColwiseSegments: the group's next tile continues this column tile with the next block (rows from e).
      bool next_continues = false;
      // The sector carried into this block: the group's own gs.carry from its previous block, or with
      // shared strips the previous group's, handed over through handoff[prev_group].
      // (Packed tiles: row-major, nothing carried between tiles; known here, so that their kernel has no
      // carry paths.)
      const bool shared_units = Cfg::kAnyOrder && order.shared;
      const bool strips = Cfg::kAnyOrder && order.strip != 1;
      const int prev_group = shared_units ? (group + Cfg::kGroups - 1) % Cfg::kGroups : group;
      const auto& carry_in = smem.group[prev_group].carry;
      auto& carry_out = gs.carry;
      [[maybe_unused]] bool link_in = false, link_out = false;
      // Shared strips: the sector handed on comes from this block's staging alone unless the block lies
      // inside the sector it starts in (then it also holds the carried bytes: handed on after the wait).
      // Handed on before the wait for the previous group's sector and before this block's stores, so
      // that the groups' store phases overlap: handing on after the stores chained them, group after
      // group (ncu, H200 session 12: 13 % of the unaligned split's stall samples in that wait).
      [[maybe_unused]] bool handed_early = false;
      if constexpr (Cfg::kSegments) {
        next_continues = strips && cursor.unit_continues(order) && e == a + t.row_count;
        if (shared_units) {
          link_in = cursor.follows_in_unit(order);
          link_out = cursor.unit_continues(order);
          if (link_out) {  // gs.carry free again: the next group has read what it was handed last time
            handoff_params.role = Handoff::ThreadCategory::Producer;
            Handoff handoff(smem.handoff[group], handoff_params, cute::false_type{});
            handoff.producer_acquire(handoff_out);
            const bool tail_inside = next_continues && (e & 31) != 0;
            handed_early = !tail_inside || (e & ~int64_t{31}) >= a;
            if (handed_early) {
              if (tail_inside) {  // thread pair (2 c, 2 c + 1): the two halves of column c's last sector
                const int col = tid_g >> 1;
                const int64_t r0 = (e & ~int64_t{31}) + 16 * (tid_g & 1);
                if (tile_col + col < p.cols) {
                  carry_out[col][tid_g & 1] = staged(col, static_cast<int>((r0 - first_row) >> 4));
                }
              }
              if (tid_g == 0) gs.carry_handed = tail_inside ? 1 : 0;
              handoff.producer_commit(handoff_out);
              ++handoff_out;
            }
          }
          head_carry = false;
          if (link_in) {
            handoff_params.role = Handoff::ThreadCategory::Consumer;
            Handoff(smem.handoff[prev_group], handoff_params, cute::false_type{}).consumer_wait(handoff_in);
            head_carry = smem.group[prev_group].carry_handed != 0;
          }
        }
      }
      const bool whole_block = e - a == Cfg::kTileRows && tile_col + Cfg::kTileCols <= p.cols;
      const bool run_mid_sector = strips && (a & 31) == 16;
      // Whole blocks: thread tid_g takes 16-byte chunk k of columns col0 + kColStep i (8 lanes per column).
      constexpr int kColStep = Cfg::kConsumerThreads / (Cfg::kTileRows / 16);  // 32
      const int col0 = tid_g / (Cfg::kTileRows / 16);
      const int k = tid_g % (Cfg::kTileRows / 16);
      const int64_t dst_step = kColStep * p.q_t_ld;
      // The block's bytes of the edge sectors it shares with another worker's block: block rows [0,
      // edge_head) and [edge_tail_lo, edge_tail_lo + edge_tail), stored after the paths below.
      int edge_head = 0, edge_tail_lo = 0, edge_tail = 0;
      if (whole_block && shift == 0 && !run_mid_sector) {
        // 128 rows starting 16-aligned (every Colwise/Both block but the last), all 128 columns inside C,
        // not handing a sector on: thread tid_g stores chunk tid_g % 8 of columns tid_g / 8 + 32 i; no
        // division, no bounds checks, one address computation. (Outside runs, a block 16 bytes into a
        // sector shares its edge sectors with other groups' blocks whatever it does.)
        uint8_t* dst = p.q_t + (tile_col + col0) * p.q_t_ld + first_row + 16 * k;
#pragma unroll
        for (int i = 0; i < Cfg::kTileCols / kColStep; ++i) {
          *reinterpret_cast<uint4*>(dst + i * dst_step) = qt_chunk_unchecked(gs, col0 + i * kColStep, k);
        }
        head_carry = false;
      } else if (whole_block && run_mid_sector) {
        // The same, 16 bytes into a sector (e.g. segment sizes that are multiples of 16, what the k-grouped
        // GEMM takes): lane k of a column stores chunk k - 1, lane 0 the carried chunk before the block,
        // so that the 8 lanes cover 4 whole sectors in one instruction; lane 0 then carries chunk 7 (or
        // stores it, half a sector, when the next block is another worker's). head_carry false: lane 0
        // stores nothing, the previous block's worker stored its half.
        uint8_t* dst = p.q_t + (tile_col + col0) * p.q_t_ld + first_row - 16 + 16 * k;
#pragma unroll
        for (int i = 0; i < Cfg::kTileCols / kColStep; ++i) {
          const int col = col0 + i * kColStep;
          // Both halves from 8-byte slots, the carry's or the staged chunk's, without a branch, so that
          // one store instruction serves all 8 lanes.
          const int swz = qt_slot_swizzle(col);
          // (Without a carried sector lane 0 stores nothing: it reads its own staging, not carry_in.)
          const uint2* lo = k != 0 ? &gs.qt[col][(2 * k - 2) ^ swz]
                                   : (head_carry ? reinterpret_cast<const uint2*>(&carry_in[col][0]) : &gs.qt[col][0]);
          const uint2* hi = k == 0 ? lo + 1 : &gs.qt[col][(2 * k - 1) ^ swz];
          const uint2 l = *lo, h = *hi;
          if (k != 0 || head_carry) *reinterpret_cast<uint4*>(dst + i * dst_step) = make_uint4(l.x, l.y, h.x, h.y);
          if (k == 0) {
            const uint4 last = qt_chunk_unchecked(gs, col, Cfg::kTileRows / 16 - 1);
            if (next_continues) {
              if (!handed_early) {  // (shared strips: handed on above)
                carry_out[col][0] = last;
                carry_out[col][1] = make_uint4(0u, 0u, 0u, 0u);
              }
            } else {
              *reinterpret_cast<uint4*>(dst + i * dst_step + Cfg::kTileRows) = last;
            }
          }
        }
        head_carry = next_continues;
      } else if (whole_block && shift != 0) {
        // 128 rows starting inside a 16-byte chunk (e.g. unaligned segments): the block covers [base, base
        // + 160) with base = a & ~31, its head sector [base, base + 32) from offset o = a - base and its tail
        // sector [base + 128, base + 160) up to o. Lane k of a column takes chunk k of [base, base + 128):
        // lanes 2-7 store the three whole middle sectors, lanes 0-1 the head sector when the previous
        // block's bytes were carried in (head_carry: whole). The tail sector is carried on when the next
        // block continues the column (shared strips: handed on above). The edge sectors shared with another
        // worker's block get this block's bytes only, one request each (the edge bytes below). One
        // branch-free chunk per lane and pass: the general path's per-sector task loop cost ~2x the
        // instructions (H200 session 13, measurement build).
        const int64_t base = a & ~int64_t{31};
        const int o = static_cast<int>(a - base);        // in [1, 31], not 16
        const int m_off = static_cast<int>((a >> 4) & 1);  // staged chunk m holds q_t bytes base + 16 (m + m_off)
        uint8_t* dst = p.q_t + (tile_col + col0) * p.q_t_ld + base + 16 * k;
#pragma unroll
        for (int i = 0; i < Cfg::kTileCols / kColStep; ++i) {
          const int col = col0 + i * kColStep;
          uint8_t* d = dst + i * dst_step;
          const uint4 v = qt_shifted_chunk_any(gs, col, k - m_off, shift);
          if (k >= 2) {
            *reinterpret_cast<uint4*>(d) = v;
          } else {
            if (head_carry) *reinterpret_cast<uint4*>(d) = or4(v, carry_in[col][k]);  // + the previous block's bytes
            if (next_continues && !shared_units) {
              // own strips: this group's next block stores the tail sector whole (its half k: this
              // block's bytes [0, o - 16 k) of it)
              carry_out[col][k] = qt_shifted_chunk_any(gs, col, 8 + k - m_off, shift);
            }
          }
        }
        edge_head = head_carry ? 0 : 32 - o;
        edge_tail_lo = Cfg::kTileRows - o;
        edge_tail = next_continues ? 0 : o;
        head_carry = next_continues;
      } else {
        // Sectors [base, base + 32 ns) hold the block; the first is an edge when a is inside it, the last
        // when e is. Sector i, half h is staged chunk m = 2 i + h - (bit 4 of a).
        const int64_t base = a & ~int64_t{31};
        const int ns = static_cast<int>((e - base + 31) / 32);  // <= 6
        const int m_off = static_cast<int>((a >> 4) & 1);
        const bool head_edge = (a & 31) != 0;
        const bool tail_edge = (e & 31) != 0;
        const bool one_sector = head_edge && tail_edge && ns == 1;
        // Carry the last sector when the next block continues the column and every byte of the sector
        // from its start is known here.
        const bool tail_carry = next_continues && tail_edge && ((e & ~int64_t{31}) >= a || head_carry);
        // Whole sectors [i0, i1): two lanes per sector, one 16-byte half each, in one store instruction.
        // task / 2 / plain without a division: plain <= 6 and task / 2 < 128 * 6, where
        // floor(s * ceil(2^16 / plain) / 2^16) is exact (error < 768 / 2^16, below the 1 / plain gap).
        const int i0 = head_edge ? 1 : 0;
        const int i1 = tail_edge ? ns - 1 : ns;
        const int plain = i1 > i0 ? i1 - i0 : 0;
        const uint32_t magic = plain > 0 ? (65536u + plain - 1) / plain : 0u;
        for (int task = tid_g; task < 2 * Cfg::kTileCols * plain; task += Cfg::kConsumerThreads) {
          const int h = task & 1;
          const int sector = task >> 1;
          const int col = static_cast<int>((static_cast<uint32_t>(sector) * magic) >> 16);
          const int i = i0 + (sector - col * plain);
          if (tile_col + col >= p.cols) continue;
          *reinterpret_cast<uint4*>(p.q_t + (tile_col + col) * p.q_t_ld + base + 32 * i + 16 * h) =
              staged(col, 2 * i + h - m_off);
        }
        // Edge sectors whose other bytes are carried in or out: thread pair (2 c, 2 c + 1) takes both edges
        // of column c, so that the thread that reads gs.carry[c][h] for the first sector is the one that
        // refills it from the last. The bytes of edge sectors shared with another worker's block go out
        // below, one request per sector.
        const bool head_alone = head_edge && !head_carry && !(one_sector && tail_carry);
        const bool tail_alone = tail_edge && !one_sector && !tail_carry;
        if ((head_edge && !head_alone) || (tail_edge && !one_sector && tail_carry && !handed_early)) {
          const int col = tid_g >> 1;
          const int h = tid_g & 1;
          if (tile_col + col < p.cols) {
            if (head_edge && !head_alone) {
              uint4 d = staged(col, h - m_off);
              if (head_carry) d = or4(d, carry_in[col][h]);  // the previous block's bytes, zeros past it
              if (one_sector && tail_carry) {
                carry_out[col][h] = d;
              } else {  // head_carry: every byte of the sector from its start is known here
                store_chunk_range(p.q_t + (tile_col + col) * p.q_t_ld, base + 16 * h, d, base,
                                     one_sector ? e : base + 32);
              }
            }
            if (tail_edge && !one_sector && tail_carry && !handed_early) {  // (shared strips: handed on above)
              const int64_t r0 = (e & ~int64_t{31}) + 16 * h;
              carry_out[col][h] = staged(col, static_cast<int>((r0 - first_row) >> 4));  // zeros past e
            }
          }
        }
        const int64_t tail_sector = e & ~int64_t{31};
        edge_head = head_alone ? static_cast<int>((one_sector ? e : base + 32) - a) : 0;
        edge_tail_lo = static_cast<int>(tail_sector - a);
        edge_tail = tail_alone ? static_cast<int>(e - tail_sector) : 0;
        head_carry = tail_carry;
      }
      // The edge bytes: block bytes [0, edge_head) (q_t rows [a, a + edge_head)) and [edge_tail_lo,
      // edge_tail_lo + edge_tail) of every column of the tile, one byte per lane, a warp per column at a time
      // (warp w: columns [16 w, 16 w + 16)), so that each edge sector is one store request of one
      // instruction. Byte-exact stores of the widest aligned pieces instead (up to 5 per 16-byte half, each a
      // request) cost 1.5-2x the stores' time in an L2 left dirty by other writes, as the benchmark's flush
      // leaves it (scripts/experiments/edge_store_probe.cu, H200 session 16: 32 MB of q_t runs starting 5-27
      // bytes into a sector 41-46 us, with these edge stores 29 us, the same as runs starting 16 bytes in).
      for (int j0 = 0; j0 < edge_head + edge_tail; j0 += 32) {
        const int jl = j0 + lane;
        const int i = jl < edge_head ? jl : edge_tail_lo + (jl - edge_head);
        if (jl < edge_head + edge_tail) {
          constexpr int kEdgeCols = Cfg::kTileCols / Cfg::kConsumerWarps;
          const int64_t cols_left = p.cols - tile_col - warp * kEdgeCols;
          const int ncols = cols_left < kEdgeCols ? static_cast<int>(cols_left) : kEdgeCols;
          uint8_t* dst = p.q_t + (tile_col + warp * kEdgeCols) * p.q_t_ld + a + i;
          // Byte i of the warp's staged columns c0 + jj: 128 bytes apart, at offset off0 (jj < 8) or off1 (the
          // slot swizzle changes once, at c0 + 8), 0 past the staging (i >= 128). Four loads in flight per pass
          // (one column at a time, each store waiting for its load, ran 1.5-2 points of a copy slower on the
          // unaligned row-major splits at 8192 x 2112 and 4096 x 7168; docs/perf-notes.md, session 19).
          const int c0 = warp * kEdgeCols;
          const uint8_t* src = reinterpret_cast<const uint8_t*>(&gs.qt[c0][0]);
          const bool staged = i < Cfg::kTileRows;
          const int off0 = qt_staged_byte_offset(c0, i);
          const int off1 = qt_staged_byte_offset(c0 + 8, i);
          static_assert(kEdgeCols == 16 && sizeof(gs.qt[0]) == Cfg::kTileRows, "a warp's columns: two swizzles");
          const int64_t ld = p.q_t_ld;
#pragma unroll 1
          for (int j4 = 0; j4 < ncols; j4 += 4) {
            const uint8_t* s4 = src + j4 * Cfg::kTileRows + (j4 < 8 ? off0 : off1);
            uint32_t v = 0;  // (one word: all four loads are issued before the first store waits)
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              if (staged && j4 + k < ncols) v |= static_cast<uint32_t>(s4[k * Cfg::kTileRows]) << (8 * k);
            }
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              if (j4 + k < ncols) dst[k * ld] = static_cast<uint8_t>(v >> (8 * k));
            }
            dst += 4 * ld;
          }
        }
      }
      if constexpr (Cfg::kSegments) {
        if (shared_units) {
          if (link_in) {  // carry_in read
            handoff_params.role = Handoff::ThreadCategory::Consumer;
            Handoff(smem.handoff[prev_group], handoff_params, cute::false_type{}).consumer_release(handoff_in);
            ++handoff_in;
          }
          if (link_out && !handed_early) {  // head_carry now says whether carry_out holds a sector for it
            if (tid_g == 0) gs.carry_handed = head_carry ? 1 : 0;
            handoff_params.role = Handoff::ThreadCategory::Producer;
            Handoff(smem.handoff[group], handoff_params, cute::false_type{}).producer_commit(handoff_out);
            ++handoff_out;
          }
        }
      }
    }
  }

  // Padded segments: q_t columns [T0, q_t_ld) after the last segment's padding are 0, written by every
  // consumer thread of the launch in turn (T0 from the last used table entry; invalid sizes: q_t is not
  // written).
  if constexpr (Cfg::kSegments) {
    // (Packed tiles: the host takes them for unpadded casts only.)
    const int32_t used = Cfg::kPacked ? smem.tile_first[order.blocks_per_col] : order.blocks_per_col;
    if (p.seg_pad > 0 && used > 0) {
      const RowBlock last = table[used - 1];
      const int64_t t0 = align_up(static_cast<int64_t>(last.out_start) + last.row_count, p.seg_pad);
      const int64_t worker = worker_index<Cfg::kGroups>(group);
      q_t_zero_tail(p, 0, p.cols, t0, worker * Cfg::kConsumerThreads + tid_g,
                    static_cast<int64_t>(order.workers) * Cfg::kConsumerThreads);
    }
  }
#endif
}

}  // namespace wgrad::quant
