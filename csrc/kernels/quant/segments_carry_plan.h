// \brief Torch-free, CUDA-free plan of the carried-sectors segments kernel (segments_carry.cuh):
// which rows of a block a thread holds, the walk of a CTA's range, and which q_t bytes each tile stores,
// whole sectors or bytes. Shared by the kernel and the C++ tests, which replay every CTA's walk and check
// that each byte of q_t is stored once and that only sectors two ranges share are stored in parts.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/common/layout.h"

namespace wgrad::quant {

constexpr int32_t kCarryBlockRows = 128;     // rows of a block, bytes of a tile's q_t row
constexpr int32_t kCarryRowsPerThread = 8;   // rows of a block a thread holds: one 8-byte group of q_t
constexpr int32_t kCarrySector = 32;         // bytes of a sector
constexpr int32_t kCarryRingBytes = 256;     // bytes of the ring per q_t row

// The rows of a block a thread holds, so that their bytes fill whole 8-byte groups of q_t (aligned ring
// stores): with the block starting `shift` = out_start % 8 bytes into a group, row group pg >= 1 holds rows
// 8 pg - shift + i (i < 8: group pg of the block's groups), row group 0 the block's first 8 - shift rows
// (bytes [shift, 8) of group 0) and its last `shift` rows (bytes [0, shift) of group 128 / 8). Byte i of a
// thread's group is row carry_block_row(pg, i, shift).
// (One expression: 8 pg - shift + i is in [1, 127] for pg >= 1 and in [-7, 7] for pg = 0, where the
// negative values wrap to the block's last rows.)
WGRAD_HOST_DEVICE inline int carry_block_row(int pg, int i, int shift) {
  return (kCarryRowsPerThread * pg - shift + i) & (kCarryBlockRows - 1);
}

// Whether the automatic choice takes this kernel for an unpadded cast of `segments` segments over `rows`
// rows of `cols` features that it can take: two or more segments, R >= 4096, at least 256 rows per segment
// on average, C >= 2048 and R x C >= 2^24. Measured on an H200 (132 SMs), % of a copy: the carry kernel
// beats or ties the TMA kernel on every such split cast measured (4096-16384 rows x 2112-24576 features, 8
// and 16 segments, unaligned and 16-aligned: -0.1 to +10 points) and loses at 4096 x 2112 (-3.5 to -10:
// 1.7 tiles per CTA). Not taken: one segment (ties), fewer features (not measured), shorter segments or
// smaller casts (lost or tied).
WGRAD_HOST_DEVICE constexpr bool carry_kernel_by_default(int64_t rows, int64_t cols, int64_t segments) {
  return segments >= 2 && rows >= 4096 && rows >= 256 * segments && cols >= 2048 && rows * cols >= (int64_t{1} << 24);
}

// A CTA's range of the tiles [first, last) in column-major order (tile t: row block t % used of column tile
// t / used) and the direction of its walk: even CTAs up, odd ones down, so that the two parts of a sector
// two neighbouring ranges share are stored at about the same time (both at the start or both at the end).
// (The block scheduler's placement of CTAs on SMs is not blockIdx-regular: an H200 put blocks 8, 148 and
// 272 on SM 0 in one launch, 8, 140 and 272 in the next, so a split per SM by blockIdx is not one.)
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
// per_cta = tiles / ctas tiles (CTA b: [b per_cta, (b + 1) per_cta), even CTAs up, odd ones down, as
// carry_range's), then takes the remainder tiles % ctas one at a time from the counter, in order, until it
// is handed an index >= remainder; a CTA that finishes early so takes more. Every CTA takes exactly one
// index >= remainder (when remainder > 0), so a launch hands out remainder + ctas indices: the CTA given the
// last one sets the counter back to 0 for the next launch.
struct CarrySplit {
  int64_t per_cta;       // tiles of every CTA's static range
  int64_t static_tiles;  // per_cta x ctas: the counter's tiles start here
  int64_t remainder;     // tiles % ctas: the tiles the counter hands out, one at a time
};
WGRAD_HOST_DEVICE inline CarrySplit carry_split(int64_t tiles, int64_t ctas) {
  CarrySplit s;
  if (tiles < (int64_t{1} << 31)) {  // (32-bit divisions while the tiles fit, as in carry_range)
    const auto t = static_cast<uint32_t>(tiles), n = static_cast<uint32_t>(ctas);
    const uint32_t per_cta = t / n;
    s.per_cta = per_cta;
    s.remainder = t - per_cta * n;
  } else {
    s.per_cta = tiles / ctas;
    s.remainder = tiles - s.per_cta * ctas;
  }
  s.static_tiles = s.per_cta * ctas;
  return s;
}
WGRAD_HOST_DEVICE inline CarryRange carry_static_range(const CarrySplit& s, int64_t cta) {
  return {s.per_cta * cta, s.per_cta * (cta + 1), (cta & 1) == 0};
}
// The counter's tile `i` (< s.remainder), walked as a range of its own: neighbouring ones in opposite
// directions (i up when i is even), as the static ranges.
WGRAD_HOST_DEVICE inline CarryRange carry_dynamic_run(const CarrySplit& s, int64_t i) {
  const int64_t first = s.static_tiles + i;
  return {first, first + 1, (i & 1) == 0};
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

// How far a tile of a block holding q_t bytes [a, e) stores (`end`, carry_store_range's) and the first byte
// of that it stores as a zero (`data_end`): the last block (e == R) also stores the zero columns [R, pitch).
template <typename I = int64_t>
struct CarryStoreBounds {
  I end;
  I data_end;
};
template <typename I>
WGRAD_HOST_DEVICE inline CarryStoreBounds<I> carry_store_bounds(I e, std::type_identity_t<I> rows,
                                                                std::type_identity_t<I> pitch) {
  // (the last block has no next one: never carry_out)
  return {e == rows ? pitch : e, rows};
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

// The bytes [from, end) of a part (inside one sector) stored in aligned pieces: step k = 0 .. 8 stores
// carry_piece_size(k) bytes at the cursor when carry_piece_taken says so and then moves the cursor on. Steps
// 0-3 (1, 2, 4, 8) align the cursor to 16 while bytes are left, step 4 stores a whole 16-byte chunk, steps
// 5-8 (8, 4, 2, 1) the rest; every piece is aligned to its size, so none crosses a 16-byte chunk.
WGRAD_HOST_DEVICE constexpr int carry_piece_size(int k) { return k < 4 ? 1 << k : 16 >> (k - 4); }
WGRAD_HOST_DEVICE constexpr bool carry_piece_taken(int k, int64_t cur, int64_t end) {
  return (k >= 4 || (cur & carry_piece_size(k)) != 0) && cur + carry_piece_size(k) <= end;
}

}  // namespace wgrad::quant
