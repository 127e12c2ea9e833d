// \brief The column-wise cast's tile order ("scheduler"): which tiles each consumer group of the persistent
// kernel takes, in which order (row-major, strips, ranges; shared by a CTA's groups or not), the segment table
// a CTA reads, the tile a cursor points at, and packed tiles. The same in every CTA of a launch. Torch-free.
#pragma once

#include <cstdint>

#include "kernels/common/layout.h"
#include "kernels/quant/colwise_config_sm90.cuh"
#include "kernels/quant/segment_order.h"
#include "kernels/quant/segment_table.cuh"

namespace wgrad::quant {

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

// 32-bit counts: the host checks that the tiles of a launch fit (colwise_sm90_params).
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

// ColwiseSegments: the order the host's plan does not force (TileOrder::strip), for segments that start
// inside a sector (the others are row-major). The rule is auto_segment_strip (segment_order.h): the longest
// strip S, a multiple of the groups per CTA, that leaves no consumer group more tiles than row-major does
// (so that S - 1 of every S block boundaries write whole sectors), shared by the CTA's groups; failing that,
// shared ranges or row-major (the measurements behind each threshold are there). Measured (bf16, % of a copy,
// the benchmark's unaligned split, H200), row-major / shared strips of 18: 4096 x 7168 68.6 / 76.0-78.5,
// 8192 x 4096 62.4-63.0 / 66.7-72.1, 4096 x 24576 59.3-60.4 / 76.6-77.2; long shared strips lose wherever
// they leave CTAs idle or give some a unit more (strips of 12 at 4096 x 7168: 63 %, of 24: 67 %). The host
// tabulates the rule per shape for up to kMaxWarpSegments segments (ColwiseSm90Params::auto_strips); this
// applies the same rule (segment_strip_rule) in the kernel for the other launches (more segments, or sizes
// that do not sum to R). Every thread of the CTA calls it with the same arguments (whole warps: lane l tries
// S = l + 1, l + 33).
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
  if (has_segments(kMode)) {
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
// boundary is a tile of its own (packed_block_starts_tile in segment_order.h, tested on the host). Tiles in
// block order: tile k = blocks [tile_first[k], tile_first[k + 1]);
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

// ---- the stages: the segment table, the order, the tile at a cursor --------------------------------------

// The row-block table the CTA reads (its own copy in shared memory, or the one in global memory) and what its
// build found. Colwise and Both: no table.
struct ColwiseTable {
  const RowBlock* rows;
  SegmentSummary summary;  // (warp_table only)
  bool warp_table;         // built by build_segment_table_warps (at most kMaxWarpSegments segments)
};

// Segments: the row-block table, built by every CTA for itself (the CTA-wide build synchronises the CTA), or
// the one in global memory. At most kMaxWarpSegments segments: every warp scans the sizes itself and fills
// its share of the table, no barrier but the CTA's before the table is read (build_segment_table_warps).
// Every thread of the CTA calls it, before that barrier.
template <class Cfg>
__device__ __forceinline__ ColwiseTable build_colwise_table(const ColwiseSm90Params& params,
                                                            typename Cfg::SharedStorage& smem, int tid) {
  ColwiseTable t{params.q.row_blocks, SegmentSummary{0, false, false}, false};
  const bool own_table = Cfg::kSegments && params.segments.sizes != nullptr;  // else q.row_blocks
  t.warp_table = own_table && params.segments.num_segments <= kMaxWarpSegments;
  if constexpr (Cfg::kSegments) {
    if (own_table) {
      const SegmentTableArgs& a = params.segments;
      if (t.warp_table) {
        t.summary = build_segment_table_warps(a, smem.table, tid / 32, Cfg::kThreads / 32);
      } else {
        build_segment_table<Cfg::kThreads>(a, reinterpret_cast<SegmentStart*>(smem.table + a.num_row_blocks),
                                           smem.table, smem.scan);
      }
      t.rows = smem.table;
    }
  }
  return t;
}

// The launch's tile order, and the used row blocks of every column tile (ColwiseSegments quantizes those
// only: table entries [0, used_blocks); packed tiles: before packing).
struct ColwiseSchedule {
  TileOrder order;
  int32_t used_blocks;
};

// The tile order (TileOrder): Colwise and Both row-major; ColwiseSegments the plan's order or, in units of
// several blocks when a segment starts inside a sector, the automatic one (the host's table, else
// choose_segment_order); packed tiles row-major over the tiles build_packed_tiles makes. Every thread of the
// CTA calls it, after the CTA's barrier (the table is complete).
template <class Cfg>
__device__ __forceinline__ ColwiseSchedule make_colwise_schedule(const ColwiseSm90Params& params,
                                                                 typename Cfg::SharedStorage& smem,
                                                                 const ColwiseTable& table, int tid) {
  const int32_t workers = static_cast<int32_t>(gridDim.x) * Cfg::kGroups;  // consumer groups of the launch
  int32_t blocks_per_col = static_cast<int32_t>(params.num_row_blocks);
  int32_t strip = 1;
  bool shared = false;
  if constexpr (Cfg::kSegments) {
    bool inside_sector = table.summary.inside_sector, inside_chunk = table.summary.inside_chunk;
    blocks_per_col = table.summary.used_blocks;
    if (!table.warp_table) {  // (the same in every thread of the CTA)
      blocks_per_col = static_cast<int32_t>(used_row_blocks(table.rows, params.num_row_blocks));
      if constexpr (Cfg::kAnyOrder) {
        for (int32_t b = tid; b < blocks_per_col; b += Cfg::kThreads) {
          inside_sector |= (table.rows[b].out_start & 31) != 0;
          inside_chunk |= (table.rows[b].out_start & 15) != 0;
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
  const int32_t used_blocks = blocks_per_col;
  if constexpr (Cfg::kPacked) {  // row-major over the packed tiles (no sector is carried between tiles)
    blocks_per_col = build_packed_tiles<Cfg::kThreads>(table.rows, blocks_per_col, smem.tile_first, smem.box_prefix,
                                                       smem.warp_sums);
    strip = 1;
    shared = false;
  }
  return {make_tile_order(blocks_per_col, static_cast<int32_t>(params.num_col_tiles), strip, workers, Cfg::kGroups,
                          shared),
          used_blocks};
}

// The tile at `cursor`.
template <class Cfg, QuantMode kMode>
__device__ __forceinline__ QuantTile colwise_tile(const ColwiseSm90Params& params, const RowBlock* table,
                                                  const typename Cfg::SharedStorage& smem, const TileCursor& cursor) {
  if constexpr (Cfg::kPacked) {
    return packed_quant_tile(table, smem.tile_first, cursor);
  } else {
    return quant_tile<kMode>(params, table, cursor);
  }
}

}  // namespace wgrad::quant
