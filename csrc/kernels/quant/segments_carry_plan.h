// \brief Torch-free, CUDA-free plan of the carried-sectors segments kernel (segments_carry.cuh):
// which rows of a block a thread holds, the walk of a CTA's range, and which q_t bytes each tile stores,
// whole sectors or bytes. Shared by the kernel and the C++ tests, which replay every CTA's walk and check
// that each byte of q_t is stored once and that only sectors two ranges share are stored in parts.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/common/layout.h"

namespace wgrad::quant {

constexpr int32_t kCarryBlockRows = 128;  // rows of a block, bytes of a tile's q_t row
constexpr int32_t kCarrySector = 32;      // bytes of a sector
constexpr int32_t kCarryRingBytes = 256;  // bytes of the ring per q_t row

// The rows of a block a thread holds, so that their bytes fill whole `group`-byte groups of q_t (aligned
// ring stores; group 8 or 4, the rows a thread holds): with the block starting `shift` = out_start % group
// bytes into a group, row group pg >= 1 holds rows group pg - shift + i (i < group: group pg of the block's
// groups), row group 0 the block's first group - shift rows (bytes [shift, group) of group 0) and its last
// `shift` rows (bytes [0, shift) of group 128 / group). Byte i of a thread's group is row
// carry_block_row(pg, i, shift, group).
// (One expression: group pg - shift + i is in [1, 127] for pg >= 1 and in [-group + 1, group - 1] for
// pg = 0, where the negative values wrap to the block's last rows.)
WGRAD_HOST_DEVICE inline int carry_block_row(int pg, int i, int shift, int group = 8) {
  return (group * pg - shift + i) & (kCarryBlockRows - 1);
}

// Whether the automatic choice (WGRAD_SEGMENT_KERNEL unset or auto) takes this kernel for an unpadded cast of
// `segments` segments over `rows` rows of `cols` features that it can take: two or more segments, R >= 4096,
// at least 256 rows per segment on average, C >= 2048 and R x C >= 2^24. Measured on an H200 (132 SMs;
// docs/perf-notes.md, sessions 29-31): since session 30's fewer instructions per tile the carry kernel beats
// or ties the TMA kernel on every such split cast measured (4096-16384 rows x 2112-24576 features, 8 and 16
// segments, unaligned and 16-aligned: -0.1 to +10 points of a copy) and loses at 4096 x 2112 (-3.5 to -10:
// 1.7 tiles per CTA). Not taken: one segment (ties), fewer features (not measured), shorter segments or
// smaller casts (session 29: lost or tied).
WGRAD_HOST_DEVICE constexpr bool carry_kernel_by_default(int64_t rows, int64_t cols, int64_t segments) {
  return segments >= 2 && rows >= 4096 && rows >= 256 * segments && cols >= 2048 && rows * cols >= (int64_t{1} << 24);
}

// A CTA's range of the tiles [first, last) in column-major order (tile t: row block t % used of column tile
// t / used) and the direction of its walk: even CTAs up, odd ones down, so that the two parts of a sector
// two neighbouring ranges share are stored at about the same time (both at the start or both at the end).
// (The block scheduler's placement of CTAs on SMs is not blockIdx-regular: an H200 put blocks 8, 148 and
// 272 on SM 0 in one launch, 8, 140 and 272 in the next (scripts/experiments/sm_placement_probe.cu), so a
// split per SM by blockIdx is not one.)
struct CarryRange {
  int64_t first;
  int64_t last;
  bool up;
};
// (In 32 bits whenever tiles x ctas fits, as at every shape measured: a 64-bit division is a subroutine of
// about 80 instructions, which every thread of the kernel would run before its first load.)
WGRAD_HOST_DEVICE inline CarryRange carry_range(int64_t tiles, int64_t cta, int64_t ctas) {
  const bool up = (cta & 1) == 0;
  if (tiles * ctas < (int64_t{1} << 32)) {
    const auto t = static_cast<uint32_t>(tiles), b = static_cast<uint32_t>(cta), n = static_cast<uint32_t>(ctas);
    return {t * b / n, t * (b + 1) / n, up};
  }
  return {tiles * cta / ctas, tiles * (cta + 1) / ctas, up};
}

// The split with a dynamic tail (a tile counter in global memory): every CTA first walks a static range of
// `per_cta` tiles (CTA b: [b per_cta, (b + 1) per_cta), even CTAs up, odd ones down, as carry_range's), then
// takes runs of `chunk` tiles of the rest [static_tiles, tiles) one at a time from the counter, in order,
// until it hands out an index >= runs; a CTA that finishes early so takes more. per_cta = tiles / ctas -
// `back` (at least 0): back = 0 leaves only the remainder tiles % ctas to the counter. Every CTA takes
// exactly one index >= runs (when runs > 0), so a launch hands out runs + ctas indices: the CTA given the
// last one sets the counter back to 0 for the next launch.
struct CarrySplit {
  int64_t per_cta;       // tiles of every CTA's static range
  int64_t static_tiles;  // per_cta x ctas: the counter's runs start here
  int64_t runs;          // runs of `chunk` tiles the counter hands out (the last one may be shorter)
  int64_t remainder;     // tiles % ctas (the kernel takes the counter only when this is small enough)
  int32_t chunk;
};
WGRAD_HOST_DEVICE inline CarrySplit carry_split(int64_t tiles, int64_t ctas, int32_t back, int32_t chunk) {
  CarrySplit s;
  s.chunk = chunk;
  if (tiles < (int64_t{1} << 31)) {  // (32-bit divisions while the tiles fit, as in carry_range)
    const auto t = static_cast<uint32_t>(tiles), n = static_cast<uint32_t>(ctas), k = static_cast<uint32_t>(chunk);
    const uint32_t even = t / n, per_cta = even > static_cast<uint32_t>(back) ? even - back : 0u;
    s.remainder = t - even * n;
    s.per_cta = per_cta;
    s.static_tiles = int64_t{per_cta} * ctas;
    s.runs = (t - static_cast<uint32_t>(s.static_tiles) + k - 1u) / k;
    return s;
  }
  const int64_t even = tiles / ctas;
  s.remainder = tiles - even * ctas;
  s.per_cta = even > back ? even - back : 0;
  s.static_tiles = s.per_cta * ctas;
  s.runs = (tiles - s.static_tiles + chunk - 1) / chunk;
  return s;
}
WGRAD_HOST_DEVICE inline CarryRange carry_static_range(const CarrySplit& s, int64_t cta) {
  return {s.per_cta * cta, s.per_cta * (cta + 1), (cta & 1) == 0};
}
// Run `i` (< s.runs) of the counter: neighbouring runs walk in opposite directions (run i up when i is even),
// so the sector two of them share is stored in parts at about the same time (both at their ends), as the
// static ranges' are.
WGRAD_HOST_DEVICE inline CarryRange carry_dynamic_run(const CarrySplit& s, int64_t tiles, int64_t i) {
  const int64_t first = s.static_tiles + i * s.chunk;
  return {first, first + s.chunk < tiles ? first + s.chunk : tiles, (i & 1) == 0};
}

struct CarryTile {
  int32_t b;  // row block (scale column), < used blocks
  int32_t c;  // column tile
};
// The tile at step idx of the walk (idx < last - first).
WGRAD_HOST_DEVICE inline CarryTile carry_walk_tile(const CarryRange& r, int64_t idx, int32_t used) {
  const int64_t t = r.up ? r.first + idx : r.last - 1 - idx;
  if (t < (int64_t{1} << 32)) {  // (32-bit division, as in carry_range)
    const auto u = static_cast<uint32_t>(t), n = static_cast<uint32_t>(used);
    return CarryTile{static_cast<int32_t>(u % n), static_cast<int32_t>(u / n)};
  }
  return CarryTile{static_cast<int32_t>(t % used), static_cast<int32_t>(t / used)};
}

// The tile after `t` in the walk (the same as carry_walk_tile at the next step, without its 64-bit
// divisions): one block on, into the next (up) or previous (down) column tile at the ends.
WGRAD_HOST_DEVICE inline CarryTile carry_step(const CarryRange& r, CarryTile t, int32_t used) {
  if (r.up) return t.b + 1 < used ? CarryTile{t.b + 1, t.c} : CarryTile{0, t.c + 1};
  return t.b > 0 ? CarryTile{t.b - 1, t.c} : CarryTile{used - 1, t.c - 1};
}

// Whether the tile `other` (block bytes [other_start, other_start + other_count)), which the walk takes
// just before (`before`) or just after the tile holding bytes [a, e) of column tile `c`, is its neighbouring
// block: the block before it in R when walking up and coming before, or down and coming after.
// (The q_t column type I: int64_t in the C++ replay, int32_t in the kernel, where a launch's columns are
// fewer than its table's 2048 blocks of 128.)
template <typename I>
WGRAD_HOST_DEVICE inline bool carry_contiguous(bool up, bool before, int32_t c, I a, I e, CarryTile other,
                                               std::type_identity_t<I> other_start,
                                               std::type_identity_t<I> other_count) {
  if (other.c != c) return false;
  return up == before ? other_start + other_count == a : e == other_start;
}

// The q_t bytes [from, to) a tile stores, and what its range has stored of the current run of contiguous
// tiles: up, every column before `done`; down, every column from `done` on. The tile holds the block's
// bytes [a, e); `end` is e, or q_t's row pitch for the last block (which stores the zero columns after R
// too). carried_in: the tile before in the walk is the neighbouring block (its bytes of the sector they
// share wait in the ring); carry_out: the tile after is, so the sector the two share is left to it.
template <typename I = int64_t>
struct CarryStoreRange {
  I from;
  I to;  // from >= to: nothing to store
};
template <typename I>
WGRAD_HOST_DEVICE inline CarryStoreRange<I> carry_store_range(bool up, bool carried_in, bool carry_out, I a, I e,
                                                              std::type_identity_t<I> end, I& done) {
  constexpr I kMask = ~I{kCarrySector - 1};
  CarryStoreRange<I> r;
  if (up) {
    if (!carried_in) done = a;
    r.from = done;
    r.to = carry_out ? (e & kMask) : end;
    if (r.to > done) done = r.to;
  } else {
    if (!carried_in) done = end;
    r.from = carry_out ? ((a + kCarrySector - 1) & kMask) : a;
    r.to = done;
    if (r.from < done) done = r.from;
  }
  return r;
}

// How far a tile of block b (q_t bytes [a, e)) stores (`end`, carry_store_range's) and the first byte of that
// it stores as a zero (`data_end`). Unpadded: the last block (e == R) also stores the zero columns [R, pitch).
// Padded (kPadded): a block stores up to the next block's start (a segment's last block: its padding) and the
// last one up to the pitch (the columns after the last segment); the zeros start at its data's end, or,
// walking down with bytes carried in (the head sector of block b + 1, which holds fewer rows than that sector
// when it is short), at block b + 1's data's end when padding follows it. start_of(j) / data_end_of(j): block
// j's first q_t column / one past its last row's. (One definition for the kernel and the C++ replay.)
template <typename I = int64_t>
struct CarryStoreBounds {
  I end;
  I data_end;
};
template <bool kPadded, typename I, typename StartOf, typename DataEndOf>
WGRAD_HOST_DEVICE inline CarryStoreBounds<I> carry_store_bounds(int32_t b, int32_t used, I e,
                                                                std::type_identity_t<I> rows,
                                                                std::type_identity_t<I> pitch, bool up,
                                                                bool carried_in, StartOf start_of,
                                                                DataEndOf data_end_of) {
  CarryStoreBounds<I> s;
  if constexpr (kPadded) {
    s.end = b + 1 == used ? pitch : start_of(b + 1);
    s.data_end = pitch;  // (no zeros)
    if (s.end > e) {
      s.data_end = e;
    } else if (carried_in && !up) {
      const I next_data_end = data_end_of(b + 1);
      if ((b + 2 < used ? start_of(b + 2) : pitch) > next_data_end) s.data_end = next_data_end;
    }
  } else {
    s.end = e == rows ? pitch : e;  // (the last block has no next one: never carry_out)
    s.data_end = rows;
  }
  return s;
}

// [from, to) as whole sectors [whole_from, whole_to) (none when whole_from >= whole_to) and the bytes of
// the sectors it covers only in part: head bytes from `from`, tail bytes from tail_from.
template <typename I = int64_t>
struct CarrySectors {
  I whole_from;
  I whole_to;
  int32_t head;
  I tail_from;
  int32_t tail;
};
template <typename I>
WGRAD_HOST_DEVICE inline CarrySectors<I> carry_sectors(I from, std::type_identity_t<I> to) {
  constexpr I kMask = ~I{kCarrySector - 1};
  CarrySectors<I> s;
  s.whole_from = (from + kCarrySector - 1) & kMask;
  s.whole_to = to & kMask;
  const I head_end = s.whole_from < to ? s.whole_from : to;
  s.head = (from & (kCarrySector - 1)) ? static_cast<int32_t>(head_end - from) : 0;
  s.tail_from = s.whole_to > s.whole_from ? s.whole_to : s.whole_from;
  s.tail = (to & (kCarrySector - 1)) && s.tail_from < to ? static_cast<int32_t>(to - s.tail_from) : 0;
  return s;
}

// Before the table exists: the rows of x [row_start, row_start + row_count) and the column tile `c` that step
// `k` of CTA `cta`'s walk most likely reads, guessed from R, the count of segments and the column tiles alone,
// so that the CTA can ask the L2 for them while the sizes are read (an L2 prefetch: a wrong guess costs no
// traffic, as every row of x is read once by some CTA; it only arrives late or early). The guess: random
// unaligned sizes give about ceil(R / 128) + G / 2 row blocks (each segment's last block is partial, half of
// 128 rows on average), spread evenly over R (block b from row b R / blocks, 128 rows), and the ranges of
// carry_range over their tiles (tile t: block t % blocks of column tile t / blocks; even CTAs walk up, odd
// ones down). row_count 0: the guessed range has no step k. (In 32 bits and a float: a guess needs no 64-bit
// division.)
struct CarryGuess {
  int32_t row_start;
  int32_t row_count;
  int32_t c;
};
WGRAD_HOST_DEVICE inline CarryGuess carry_prefetch_guess(int64_t rows, int64_t segments, int32_t col_tiles, int64_t cta,
                                                         int64_t ctas, int64_t k) {
  const int64_t used = ceil_div(rows, kCarryBlockRows) + segments / 2;
  const int64_t tiles = used * col_tiles;
  // (No guess where 32 bits do not hold the range's products: the kernel then prefetches nothing. The range
  // and the walk's step k are carry_range's and carry_walk_tile's 32-bit paths, written out: called here,
  // their 64-bit paths stay in the kernel behind this guard and it spilled 120 bytes; the C++ test checks
  // the two against each other.)
  if (rows <= 0 || tiles * ctas >= (int64_t{1} << 32)) return {0, 0, 0};
  const auto t32 = static_cast<uint32_t>(tiles), b = static_cast<uint32_t>(cta), n = static_cast<uint32_t>(ctas);
  const uint32_t first = t32 * b / n, last = t32 * (b + 1) / n;
  if (k >= last - first) return {0, 0, 0};
  const uint32_t t = (b & 1) == 0 ? first + static_cast<uint32_t>(k) : last - 1 - static_cast<uint32_t>(k);
  const auto u = static_cast<uint32_t>(used);
  const float rows_per_block = static_cast<float>(rows) / static_cast<float>(used);
  int64_t start = static_cast<int64_t>(static_cast<float>(t % u) * rows_per_block);
  start = start < rows ? start : rows - 1;
  const int64_t count = rows - start < kCarryBlockRows ? rows - start : kCarryBlockRows;
  return {static_cast<int32_t>(start), static_cast<int32_t>(count), static_cast<int32_t>(t / u)};
}

// The bytes [from, end) of a part (inside one sector) stored in aligned pieces: step k = 0 .. 8 stores
// carry_piece_size(k) bytes at the cursor when carry_piece_taken says so and then moves the cursor on. Steps
// 0-3 (1, 2, 4, 8) align the cursor to 16 while bytes are left, step 4 stores a whole 16-byte chunk, steps
// 5-8 (8, 4, 2, 1) the rest; every piece is aligned to its size, so none crosses a 16-byte chunk.
WGRAD_HOST_DEVICE constexpr int carry_piece_size(int k) { return k < 4 ? 1 << k : 16 >> (k - 4); }
WGRAD_HOST_DEVICE constexpr bool carry_piece_taken(int k, int64_t cur, int64_t end) {
  return (k >= 4 || (cur & carry_piece_size(k)) != 0) && cur + carry_piece_size(k) <= end;
}

}  // namespace wgrad::quant
