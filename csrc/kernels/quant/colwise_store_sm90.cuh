// \brief The column-wise cast's q_t stores: the staged block (GroupStorage::qt) to q_t rows [a, e) of every
// column of the tile, with the sectors it shares with its neighbours' blocks carried from block to block or
// handed between a CTA's consumer groups. Torch-free.
//
// The block that ends at row R also writes q_t's padding [R, q_t_ld) (zeros: staged past the block), so q_t
// never holds uninitialised bytes. (Padded segments: every block also writes its segment's zero columns up
// to the next multiple of seg_pad; the zero columns after the last segment are written after the tile loop,
// zero_padded_tail.)
// NOTES: write whole 32-byte sectors. A store that covers only part of an L2 sector costs the L2 a
// read-modify-write: segments starting 16 bytes into a sector ran at 55 % of a copy where 32-, 64- and
// 128-aligned starts ran at 81-83 % (H200, 16384 x 7168 bf16; same DRAM traffic, +21 % L2 write sectors).
// A block starting or ending inside a sector shares it with its neighbour, so:
//   - ColwiseSegments in strips (TileOrder): consecutive blocks of a column tile are quantized by one group,
//     or with shared strips by the CTA's groups in turn; the sector a block ends inside is kept in gs.carry
//     instead of stored, and the next block, which starts inside it, stores it whole (both halves, from two
//     lanes of one store instruction), reading the carry from its own group or from the previous group
//     (carry_in; handed over behind the handoff barriers);
//   - where the neighbour is another worker's block, only this block's bytes of the shared sector are stored:
//     by a whole warp, one byte per lane, so that the sector is one store request (store_edge_bytes; the
//     widest aligned stores that fit, up to five requests per 16-byte half, cost 1.5x-2x the stores' time in
//     an L2 left dirty by the benchmark's flush: unaligned segments in row-major order at 8192 x 2112 ran
//     69-70 % of a copy with them, 76-82 % with the warp's bytes; H200). 16-aligned starts store their halves
//     of a shared sector whole.
// The staged block holds rows [a, a + 128) as 16-byte chunks from first_row = a - a % 16 (shifted by a % 16
// when a is not 16-aligned; chunks outside the staging read as zeros).
#pragma once

#include <cutlass/pipeline/sm90_pipeline.hpp>

#include <cstdint>

#include "kernels/common/layout.h"
#include "kernels/quant/colwise_config_sm90.cuh"
#include "kernels/quant/colwise_quantize_sm90.cuh"
#include "kernels/quant/colwise_tile_order.cuh"
#include "kernels/quant/segment_table.cuh"

namespace wgrad::quant {

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

// Bytes [lo, hi) of q_t column row range [r0, r0 + 16) (r0 16-aligned), taken from the 16-byte chunk d
// that belongs there: one 16-byte store when the range covers it, byte-exact stores when only a part.
__device__ __forceinline__ void store_chunk_range(uint8_t* col_base, int64_t r0, const uint4& d, int64_t lo,
                                                  int64_t hi) {
  const int b0 = lo > r0 ? static_cast<int>(lo - r0) : 0;
  const int b1 = hi < r0 + 16 ? static_cast<int>(hi - r0) : 16;
  if (b0 == 0 && b1 == 16) {
    *reinterpret_cast<uint4*>(col_base + r0) = d;
  } else if (b0 < b1) {
    store_chunk_bytes(col_base + r0, d, b0, b1);
  }
}

// The q_t rows [a, e) block tile t stores, and where its staging starts.
struct BlockSpan {
  int64_t a;          // the block's first q_t row (its out_start)
  int64_t e;          // past its rows; padded: past its segment's padding; the block ending at R: q_t_ld
  int shift;          // a % 16
  int64_t first_row;  // a - shift: staged chunk m holds q_t rows [first_row + 16 m, first_row + 16 m + 16)
};

__device__ __forceinline__ BlockSpan block_span(const QuantizeParams& p, const QuantTile& t) {
  BlockSpan s;
  s.a = t.out_start;
  const bool last_block = t.row_start + t.row_count == p.rows;
  // (seg_pad is a power of two: its padding without a division)
  s.e = p.seg_pad > 0 ? (s.a + t.row_count + p.seg_pad - 1) & ~(p.seg_pad - 1)
                      : (last_block ? p.q_t_ld : s.a + t.row_count);
  s.shift = static_cast<int>(s.a & 15);
  s.first_row = s.a - s.shift;
  return s;
}

// 16-byte chunk m (q_t rows first_row + 16 m ...) of staged column col.
template <class Storage>
__device__ __forceinline__ uint4 staged_chunk(const Storage& gs, const BlockSpan& s, int col, int m) {
  return s.shift == 0 ? qt_chunk(gs, col, m) : qt_shifted_chunk(gs, col, m, s.shift);
}

// A consumer group's carried sector and its places in the handoffs (shared strips), block to block.
template <class Cfg>
struct CarryState {
  bool head_carry = false;  // ColwiseSegments: carry_in holds the sector the current block starts inside
  // Shared strips: this group's place in its handoff to the next group and in the previous group's.
  typename Cfg::HandoffState handoff_out = cutlass::make_producer_start_state<typename Cfg::HandoffPipeline>();
  typename Cfg::HandoffState handoff_in;
};

// The block's bytes of the edge sectors it shares with another worker's block: block rows [0, head) and
// [tail_lo, tail_lo + tail), stored by store_edge_bytes.
struct EdgeBytes {
  int head = 0;
  int tail_lo = 0;
  int tail = 0;
};

// Whole blocks (128 rows, all 128 columns inside C): thread tid_g takes 16-byte chunk k of columns
// col0 + kColStep i (8 lanes per column, 4 columns a warp).
template <class Cfg>
struct WholeBlockLanes {
  static constexpr int kColStep = Cfg::kConsumerThreads / (Cfg::kTileRows / 16);  // 32
  int col0;
  int k;
  int64_t dst_step;  // q_t bytes between a thread's columns
  __device__ __forceinline__ WholeBlockLanes(const QuantizeParams& p, int tid_g)
      : col0(tid_g / (Cfg::kTileRows / 16)), k(tid_g % (Cfg::kTileRows / 16)), dst_step(kColStep * p.q_t_ld) {}
};

// 128 rows starting 16-aligned (every Colwise/Both block but the last), all 128 columns inside C, not
// handing a sector on: thread tid_g stores chunk tid_g % 8 of columns tid_g / 8 + 32 i; no division, no
// bounds checks, one address computation. (Outside runs, a block 16 bytes into a sector shares its edge
// sectors with other groups' blocks whatever it does.)
template <class Cfg>
__device__ __forceinline__ void store_whole_aligned(const QuantizeParams& p, const typename Cfg::GroupStorage& gs,
                                                    int64_t tile_col, const BlockSpan& s, const ConsumerThread& thr) {
  const WholeBlockLanes<Cfg> w(p, thr.tid);
  uint8_t* dst = p.q_t + (tile_col + w.col0) * p.q_t_ld + s.first_row + 16 * w.k;
#pragma unroll
  for (int i = 0; i < Cfg::kTileCols / w.kColStep; ++i) {
    *reinterpret_cast<uint4*>(dst + i * w.dst_step) = qt_chunk_unchecked(gs, w.col0 + i * w.kColStep, w.k);
  }
}

// The same, 16 bytes into a sector (e.g. segment sizes that are multiples of 16, what the k-grouped GEMM
// takes): lane k of a column stores chunk k - 1, lane 0 the carried chunk before the block, so that the 8
// lanes cover 4 whole sectors in one instruction; lane 0 then carries chunk 7 (or stores it, half a sector,
// when the next block is another worker's). Without a carried sector (head_carry false) lane 0 stores
// nothing: the previous block's worker stored its half.
template <class Cfg>
__device__ __forceinline__ void store_whole_mid_sector(const QuantizeParams& p, typename Cfg::GroupStorage& gs,
                                                       const decltype(Cfg::GroupStorage::carry)& carry_in,
                                                       int64_t tile_col, const BlockSpan& s, bool head_carry,
                                                       bool next_continues, bool handed_early,
                                                       const ConsumerThread& thr) {
  auto& carry_out = gs.carry;
  const WholeBlockLanes<Cfg> w(p, thr.tid);
  const int k = w.k;
  uint8_t* dst = p.q_t + (tile_col + w.col0) * p.q_t_ld + s.first_row - 16 + 16 * k;
#pragma unroll
  for (int i = 0; i < Cfg::kTileCols / w.kColStep; ++i) {
    const int col = w.col0 + i * w.kColStep;
    // Both halves from 8-byte slots, the carry's or the staged chunk's, without a branch, so that one store
    // instruction serves all 8 lanes.
    const int swz = qt_slot_swizzle(col);
    // (Without a carried sector lane 0 stores nothing: it reads its own staging, not carry_in.)
    const uint2* lo = k != 0 ? &gs.qt[col][(2 * k - 2) ^ swz]
                             : (head_carry ? reinterpret_cast<const uint2*>(&carry_in[col][0]) : &gs.qt[col][0]);
    const uint2* hi = k == 0 ? lo + 1 : &gs.qt[col][(2 * k - 1) ^ swz];
    const uint2 lv = *lo, hv = *hi;
    if (k != 0 || head_carry) *reinterpret_cast<uint4*>(dst + i * w.dst_step) = make_uint4(lv.x, lv.y, hv.x, hv.y);
    if (k == 0) {
      const uint4 last = qt_chunk_unchecked(gs, col, Cfg::kTileRows / 16 - 1);
      if (next_continues) {
        if (!handed_early) {  // (shared strips: handed on before the stores)
          carry_out[col][0] = last;
          carry_out[col][1] = make_uint4(0u, 0u, 0u, 0u);
        }
      } else {
        *reinterpret_cast<uint4*>(dst + i * w.dst_step + Cfg::kTileRows) = last;
      }
    }
  }
}

// 128 rows starting inside a 16-byte chunk (e.g. unaligned segments): the block covers [base, base + 160)
// with base = a & ~31, its head sector [base, base + 32) from offset o = a - base and its tail sector
// [base + 128, base + 160) up to o. Lane k of a column takes chunk k of [base, base + 128): lanes 2-7 store
// the three whole middle sectors, lanes 0-1 the head sector when the previous block's bytes were carried in
// (head_carry: whole). The tail sector is carried on when the next block continues the column (shared
// strips: handed on before the stores). The edge sectors shared with another worker's block get this block's
// bytes only, one request each (store_edge_bytes). One branch-free chunk per lane and pass: the general
// path's per-sector task loop (store_partial) cost ~2x the instructions (H200).
template <class Cfg>
__device__ __forceinline__ EdgeBytes store_whole_shifted(const QuantizeParams& p, typename Cfg::GroupStorage& gs,
                                                         const decltype(Cfg::GroupStorage::carry)& carry_in,
                                                         int64_t tile_col, const BlockSpan& s, bool head_carry,
                                                         bool next_continues, bool shared_units,
                                                         const ConsumerThread& thr) {
  auto& carry_out = gs.carry;
  const WholeBlockLanes<Cfg> w(p, thr.tid);
  const int k = w.k;
  const int64_t base = s.a & ~int64_t{31};
  const int o = static_cast<int>(s.a - base);          // in [1, 31], not 16
  const int m_off = static_cast<int>((s.a >> 4) & 1);  // staged chunk m holds q_t bytes base + 16 (m + m_off)
  uint8_t* dst = p.q_t + (tile_col + w.col0) * p.q_t_ld + base + 16 * k;
#pragma unroll
  for (int i = 0; i < Cfg::kTileCols / w.kColStep; ++i) {
    const int col = w.col0 + i * w.kColStep;
    uint8_t* d = dst + i * w.dst_step;
    const uint4 v = qt_shifted_chunk_any(gs, col, k - m_off, s.shift);
    if (k >= 2) {
      *reinterpret_cast<uint4*>(d) = v;
    } else {
      if (head_carry) *reinterpret_cast<uint4*>(d) = or4(v, carry_in[col][k]);  // + the previous block's bytes
      if (next_continues && !shared_units) {
        // own strips: this group's next block stores the tail sector whole (its half k: this block's bytes
        // [0, o - 16 k) of it)
        carry_out[col][k] = qt_shifted_chunk_any(gs, col, 8 + k - m_off, s.shift);
      }
    }
  }
  EdgeBytes edges;
  edges.head = head_carry ? 0 : 32 - o;
  edges.tail_lo = Cfg::kTileRows - o;
  edges.tail = next_continues ? 0 : o;
  return edges;
}

// Any other block (fewer rows, or columns past C): sectors [base, base + 32 ns) hold it; the first is an edge
// when a is inside it, the last when e is. Sector i, half h is staged chunk m = 2 i + h - (bit 4 of a).
// head_carry: in, whether carry_in holds the head sector's other bytes; out, whether this block carried its
// tail sector on.
template <class Cfg>
__device__ __forceinline__ EdgeBytes store_partial(const QuantizeParams& p, typename Cfg::GroupStorage& gs,
                                                   const decltype(Cfg::GroupStorage::carry)& carry_in, int64_t tile_col,
                                                   const BlockSpan& s, bool& head_carry, bool next_continues,
                                                   bool handed_early, const ConsumerThread& thr) {
  auto& carry_out = gs.carry;
  const int tid_g = thr.tid;
  const int64_t a = s.a, e = s.e;
  const int64_t base = a & ~int64_t{31};
  const int ns = static_cast<int>((e - base + 31) / 32);  // <= 6
  const int m_off = static_cast<int>((a >> 4) & 1);
  const bool head_edge = (a & 31) != 0;
  const bool tail_edge = (e & 31) != 0;
  const bool one_sector = head_edge && tail_edge && ns == 1;
  // Carry the last sector when the next block continues the column and every byte of the sector from its
  // start is known here.
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
        staged_chunk(gs, s, col, 2 * i + h - m_off);
  }
  // Edge sectors whose other bytes are carried in or out: thread pair (2 c, 2 c + 1) takes both edges of
  // column c, so that the thread that reads gs.carry[c][h] for the first sector is the one that refills it
  // from the last. The bytes of edge sectors shared with another worker's block go out in store_edge_bytes,
  // one request per sector.
  const bool head_alone = head_edge && !head_carry && !(one_sector && tail_carry);
  const bool tail_alone = tail_edge && !one_sector && !tail_carry;
  if ((head_edge && !head_alone) || (tail_edge && !one_sector && tail_carry && !handed_early)) {
    const int col = tid_g >> 1;
    const int h = tid_g & 1;
    if (tile_col + col < p.cols) {
      if (head_edge && !head_alone) {
        uint4 d = staged_chunk(gs, s, col, h - m_off);
        if (head_carry) d = or4(d, carry_in[col][h]);  // the previous block's bytes, zeros past it
        if (one_sector && tail_carry) {
          carry_out[col][h] = d;
        } else {  // head_carry: every byte of the sector from its start is known here
          store_chunk_range(p.q_t + (tile_col + col) * p.q_t_ld, base + 16 * h, d, base, one_sector ? e : base + 32);
        }
      }
      if (tail_edge && !one_sector && tail_carry && !handed_early) {  // (shared strips: handed on already)
        const int64_t r0 = (e & ~int64_t{31}) + 16 * h;
        carry_out[col][h] = staged_chunk(gs, s, col, static_cast<int>((r0 - s.first_row) >> 4));  // zeros past e
      }
    }
  }
  const int64_t tail_sector = e & ~int64_t{31};
  EdgeBytes edges;
  edges.head = head_alone ? static_cast<int>((one_sector ? e : base + 32) - a) : 0;
  edges.tail_lo = static_cast<int>(tail_sector - a);
  edges.tail = tail_alone ? static_cast<int>(e - tail_sector) : 0;
  head_carry = tail_carry;
  return edges;
}

// The edge bytes: block bytes [0, head) (q_t rows [a, a + head)) and [tail_lo, tail_lo + tail) of every
// column of the tile, one byte per lane, a warp per column at a time (warp w: columns [16 w, 16 w + 16)), so
// that each edge sector is one store request of one instruction. Byte-exact stores of the widest aligned
// pieces instead (up to 5 per 16-byte half, each a request) cost 1.5-2x the stores' time in an L2 left dirty
// by other writes, as the benchmark's flush leaves it (H200: 32 MB of q_t runs starting 5-27 bytes into a
// sector 41-46 us, with these edge stores 29 us, the same as runs starting 16 bytes in).
template <class Cfg>
__device__ __forceinline__ void store_edge_bytes(const QuantizeParams& p, const typename Cfg::GroupStorage& gs,
                                                 int64_t tile_col, int64_t a, const EdgeBytes& edges,
                                                 const ConsumerThread& thr) {
  const int warp = thr.warp;
  for (int j0 = 0; j0 < edges.head + edges.tail; j0 += 32) {
    const int jl = j0 + thr.lane;
    const int i = jl < edges.head ? jl : edges.tail_lo + (jl - edges.head);
    if (jl < edges.head + edges.tail) {
      constexpr int kEdgeCols = Cfg::kTileCols / Cfg::kConsumerWarps;
      const int64_t cols_left = p.cols - tile_col - warp * kEdgeCols;
      const int ncols = cols_left < kEdgeCols ? static_cast<int>(cols_left) : kEdgeCols;
      uint8_t* dst = p.q_t + (tile_col + warp * kEdgeCols) * p.q_t_ld + a + i;
      // Byte i of the warp's staged columns c0 + jj: 128 bytes apart, at offset off0 (jj < 8) or off1 (the
      // slot swizzle changes once, at c0 + 8), 0 past the staging (i >= 128). Four loads in flight per pass
      // (one column at a time, each store waiting for its load, ran 1.5-2 points of a copy slower on the
      // unaligned row-major splits at 8192 x 2112 and 4096 x 7168, H200).
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
}

// The stage: block tile t's q_t rows [a, e) from the group's staging, every column of the tile. With
// shared strips, the sector the block ends inside is handed on to the next group (gs.carry) before the
// previous group's sector is awaited (carry_in) and before the stores, so that the groups' store phases
// overlap: handing on after the stores chained them, group after group (13 % of the unaligned split's stall
// samples in that wait, ncu, H200). It comes from this block's staging alone unless the block lies inside
// the sector it starts in (then it also holds the carried bytes: handed on after the stores). Then the path
// of the block's shape (whole blocks 16-aligned, 16 bytes into a sector in a run, starting inside a chunk;
// any other block), the edge bytes, and the handoffs released. carry.head_carry leaves saying whether the
// next block of the walk finds this block's tail sector in gs.carry.
template <class Cfg>
__device__ __forceinline__ void store_tile(const QuantizeParams& p, const TileOrder& order, const TileCursor& cursor,
                                           const QuantTile& t, int64_t tile_col, typename Cfg::SharedStorage& smem,
                                           typename Cfg::HandoffPipeline::Params& handoff_params,
                                           CarryState<Cfg>& carry, const ConsumerThread& thr) {
  using Handoff = typename Cfg::HandoffPipeline;
  const int group = thr.group, tid_g = thr.tid;
  auto& gs = smem.group[group];
  const BlockSpan s = block_span(p, t);
  // ColwiseSegments: the group's next tile continues this column tile with the next block (rows from e).
  bool next_continues = false;
  // The sector carried into this block: the group's own gs.carry from its previous block, or with shared
  // strips the previous group's, handed over through handoff[prev_group]. (Packed tiles and the row-major
  // kernel: nothing carried between tiles; known here, so that their kernels have no carry paths.)
  const bool shared_units = Cfg::kAnyOrder && order.shared;
  const bool strips = Cfg::kAnyOrder && order.strip != 1;
  const int prev_group = shared_units ? (group + Cfg::kGroups - 1) % Cfg::kGroups : group;
  const auto& carry_in = smem.group[prev_group].carry;
  [[maybe_unused]] bool link_in = false, link_out = false;
  [[maybe_unused]] bool handed_early = false;  // shared strips: the tail sector handed on before the stores
  if constexpr (Cfg::kSegments) {
    next_continues = strips && cursor.unit_continues(order) && s.e == s.a + t.row_count;
    if (shared_units) {
      link_in = cursor.follows_in_unit(order);
      link_out = cursor.unit_continues(order);
      if (link_out) {  // gs.carry free again: the next group has read what it was handed last time
        handoff_params.role = Handoff::ThreadCategory::Producer;
        Handoff handoff(smem.handoff[group], handoff_params, cute::false_type{});
        handoff.producer_acquire(carry.handoff_out);
        const bool tail_inside = next_continues && (s.e & 31) != 0;
        handed_early = !tail_inside || (s.e & ~int64_t{31}) >= s.a;
        if (handed_early) {
          if (tail_inside) {  // thread pair (2 c, 2 c + 1): the two halves of column c's last sector
            const int col = tid_g >> 1;
            const int64_t r0 = (s.e & ~int64_t{31}) + 16 * (tid_g & 1);
            if (tile_col + col < p.cols) {
              gs.carry[col][tid_g & 1] = staged_chunk(gs, s, col, static_cast<int>((r0 - s.first_row) >> 4));
            }
          }
          if (tid_g == 0) gs.carry_handed = tail_inside ? 1 : 0;
          handoff.producer_commit(carry.handoff_out);
          ++carry.handoff_out;
        }
      }
      carry.head_carry = false;
      if (link_in) {
        handoff_params.role = Handoff::ThreadCategory::Consumer;
        Handoff(smem.handoff[prev_group], handoff_params, cute::false_type{}).consumer_wait(carry.handoff_in);
        carry.head_carry = smem.group[prev_group].carry_handed != 0;
      }
    }
  }

  // The paths. (The edge bytes as plain ints, 0 on the paths without edges: the compiler folds the edge loop
  // better than with one EdgeBytes assigned on every path.)
  const bool whole_block = s.e - s.a == Cfg::kTileRows && tile_col + Cfg::kTileCols <= p.cols;
  const bool run_mid_sector = strips && (s.a & 31) == 16;
  int edge_head = 0, edge_tail_lo = 0, edge_tail = 0;
  if (whole_block && s.shift == 0 && !run_mid_sector) {
    store_whole_aligned<Cfg>(p, gs, tile_col, s, thr);
    carry.head_carry = false;
  } else if (whole_block && run_mid_sector) {
    store_whole_mid_sector<Cfg>(p, gs, carry_in, tile_col, s, carry.head_carry, next_continues, handed_early, thr);
    carry.head_carry = next_continues;
  } else if (whole_block && s.shift != 0) {
    const EdgeBytes e = store_whole_shifted<Cfg>(p, gs, carry_in, tile_col, s, carry.head_carry, next_continues,
                                                 shared_units, thr);
    edge_head = e.head;
    edge_tail_lo = e.tail_lo;
    edge_tail = e.tail;
    carry.head_carry = next_continues;
  } else {
    const EdgeBytes e =
        store_partial<Cfg>(p, gs, carry_in, tile_col, s, carry.head_carry, next_continues, handed_early, thr);
    edge_head = e.head;
    edge_tail_lo = e.tail_lo;
    edge_tail = e.tail;
  }
  store_edge_bytes<Cfg>(p, gs, tile_col, s.a, EdgeBytes{edge_head, edge_tail_lo, edge_tail}, thr);

  if constexpr (Cfg::kSegments) {
    if (shared_units) {
      if (link_in) {  // carry_in read
        handoff_params.role = Handoff::ThreadCategory::Consumer;
        Handoff(smem.handoff[prev_group], handoff_params, cute::false_type{}).consumer_release(carry.handoff_in);
        ++carry.handoff_in;
      }
      if (link_out && !handed_early) {  // carry.head_carry now says whether gs.carry holds a sector for it
        if (tid_g == 0) gs.carry_handed = carry.head_carry ? 1 : 0;
        handoff_params.role = Handoff::ThreadCategory::Producer;
        Handoff(smem.handoff[group], handoff_params, cute::false_type{}).producer_commit(carry.handoff_out);
        ++carry.handoff_out;
      }
    }
  }
}

// Padded segments, after the tile loop: q_t columns [T0, q_t_ld) after the last segment's padding are 0,
// written by every consumer thread of the launch in turn (T0 from the last used table entry; invalid sizes:
// q_t is not written). (Packed tiles: the host takes them for unpadded casts only.)
template <class Cfg>
__device__ __forceinline__ void zero_padded_tail(const QuantizeParams& p, const RowBlock* table,
                                                 const typename Cfg::SharedStorage& smem, const TileOrder& order,
                                                 const ConsumerThread& thr) {
  if constexpr (Cfg::kSegments) {
    const int32_t used = Cfg::kPacked ? smem.tile_first[order.blocks_per_col] : order.blocks_per_col;
    if (p.seg_pad > 0 && used > 0) {
      const RowBlock last = table[used - 1];
      const int64_t t0 = align_up(static_cast<int64_t>(last.out_start) + last.row_count, p.seg_pad);
      const int64_t worker = worker_index<Cfg::kGroups>(thr.group);
      q_t_zero_tail(p, 0, p.cols, t0, worker * Cfg::kConsumerThreads + thr.tid,
                    static_cast<int64_t>(order.workers) * Cfg::kConsumerThreads);
    }
  }
}

}  // namespace wgrad::quant
