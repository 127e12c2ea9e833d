// \brief The work of each output tile: its K range (dense, k-grouped packed, k-grouped contiguous-K) or its
// rows (m-grouped).
#pragma once

#include <cstdint>

#include "kernels/common/layout.h"
#include "kernels/gemm/tile_scheduler.h"

namespace wgrad {

// Dense, Packed and Contiguous: the weight-gradient GEMMs (fp32 out += a b^T, groups along K).
// MGrouped: the expert GEMM of MoE fprop and dgrad (bf16 out = a b_g^T, groups of rows of a, one b per group).
enum class GroupMode : int { Dense = 0, Packed = 1, Contiguous = 2, MGrouped = 3 };

// One unit of work of a CTA: an output tile and the 128-wide K blocks that reduce into it.
struct WorkTile {
  TileCoord coord;
  int num_k_blocks;  // 0: nothing to do (an empty group), the tile is skipped entirely
  int k_block_base;  // first column of this group's blocks in the scale tensors
  int k_col;         // first K column of the group inside the A/B descriptors (contiguous-K)
  int tail_valid;    // contiguous-K only: valid columns of the last block when the group ends inside
                     // it and the next group's columns follow (the consumers zero those of the last k32
                     // step they issue); 0 otherwise
  int k_shift;       // contiguous-K only: k_col % 16. Non-zero: TMA cannot start a box there, so the
                     // producer loads the 16-aligned window k_col + 128 kb - k_shift and shifts it
                     // into place in shared memory (MainloopSm90::shift_stages), zeroing past the group
  int last_valid;    // contiguous-K only: valid columns of the last block (1 to 128); the consumers issue
                     // only the k32 steps that hold them (MainloopSm90::mma_tile)
  int m0;            // first row of the tile in a (and in out)
  int m_begin;       // m-grouped only: the rows [m_begin, m_end) of the tile are its group's; the others
  int m_end;         // belong to the neighbouring groups and are not written
};

// Walks groups in increasing order (the tile order of PersistentTileScheduler is group-major and
// every CTA visits its tiles in increasing order), so a contiguous-K prefix sum is computed once.
// Contiguous-K holds the K of its current group and of the next one in registers: a tile's start reads no
// memory, and the load for the group after the next is issued at a group change, long before its use.
template <GroupMode kMode>
struct GroupKWalker {
  const int* group_k;        // packed: K_g (host-built); contiguous: the user's sizes
  const int* group_kb_base;  // packed: first block column of each group (host-built)
  int k;                     // dense K, or K_total
  int num_groups = 0;        // contiguous: G
  int group = 0;             // contiguous: the group whose offsets are below
  int k_offset = 0;          // sum of K of the groups before `group` (K_total < 2^31: host-checked)
  int kb_offset = 0;         // sum of their block counts
  int kg = 0;                // contiguous: K of `group`
  int kg_next = 0;           // contiguous: K of `group` + 1 (0 past the last group)

  // Before the first work(): the first two groups' K (contiguous-K; nothing otherwise).
  __device__ void start() {
    if constexpr (kMode == GroupMode::Contiguous) {
      kg = num_groups > 0 ? group_k[0] : 0;
      kg_next = num_groups > 1 ? group_k[1] : 0;
    }
  }

  __device__ WorkTile work(const TileCoord& c) {
    WorkTile w{c, 0, 0, 0, 0, 0, 0, c.m_block * static_cast<int>(kBlockM), 0, 0};
    if constexpr (kMode == GroupMode::Dense) {
      w.num_k_blocks = static_cast<int>(ceil_div(k, kScaleBlockK));
    } else if constexpr (kMode == GroupMode::Packed) {
      w.num_k_blocks = static_cast<int>(ceil_div(group_k[c.group], kScaleBlockK));
      w.k_block_base = group_kb_base[c.group];
    } else {
      for (; group < c.group; ++group) {
        k_offset += kg;
        kb_offset += static_cast<int>(ceil_div(kg, kScaleBlockK));
        kg = kg_next;
        kg_next = group + 2 < num_groups ? group_k[group + 2] : 0;
      }
      w.num_k_blocks = static_cast<int>(ceil_div(kg, kScaleBlockK));
      w.k_block_base = kb_offset;
      w.k_col = k_offset;
      const int rem = kg % static_cast<int>(kScaleBlockK);
      w.k_shift = k_offset % 16;
      w.last_valid = rem != 0 ? rem : static_cast<int>(kScaleBlockK);
      // Past K_total TMA fills zeros by itself; a following group's columns, or the unread ones past the
      // sizes' sum, need masking (by the consumers after an aligned load; a shifted load is masked by the
      // producer as it shifts).
      w.tail_valid = (rem != 0 && k_offset + kg < k && w.k_shift == 0) ? rem : 0;
    }
    return w;
  }
};

// m-grouped: the rows of a come in groups (int32 sizes on the device, validated by the kernel first) and
// every group multiplies its own b. A group's row tiles start at its first row rounded down to a multiple
// of 4: the MN-major scales of a are loaded by TMA with the row as their innermost coordinate, which must
// be 16-byte aligned. So group g (first row off_g) has ceil(((off_g & 3) + M_g) / 128) row tiles (none when
// M_g == 0), each tiles_n wide. Tiles are numbered group by group and inside a group rasterised like
// PersistentTileScheduler's (bands of kBandM row blocks) so that the tiles in flight share the group's B
// panels in L2. Every CTA visits its tiles in increasing order, so the walker passes through the groups
// once.
__device__ __forceinline__ int m_group_row_tiles(int64_t first_row, int rows) {
  return rows > 0 ? static_cast<int>(ceil_div((first_row & 3) + rows, kBlockM)) : 0;
}

struct MGroupWalker {
  const int* group_m;  // the user's sizes (valid: checked before any walk)
  int tiles_n;
  int k;               // K of every group
  int group = 0;
  int64_t tile_base = 0;  // first tile of `group`
  int row_base = 0;       // first row of `group` (T < 2^31: host-checked)

  // `tile` < the total tile count (so some group holds it).
  __device__ WorkTile work(int64_t tile) {
    int rows = group_m[group];
    int tiles_m = m_group_row_tiles(row_base, rows);
    while (tile >= tile_base + int64_t{tiles_m} * tiles_n) {
      tile_base += int64_t{tiles_m} * tiles_n;
      row_base += rows;
      rows = group_m[++group];
      tiles_m = m_group_row_tiles(row_base, rows);
    }
    const int local = static_cast<int>(tile - tile_base);
    constexpr int kBandM = PersistentTileScheduler::kBandM;
    const int band_tiles = kBandM * tiles_n;
    const int band_m0 = (local / band_tiles) * kBandM;
    const int in_band = local % band_tiles;
    const int band_height = tiles_m - band_m0 < kBandM ? tiles_m - band_m0 : kBandM;
    const TileCoord c{group, band_m0 + in_band % band_height, in_band / band_height};
    return WorkTile{c, static_cast<int>(ceil_div(k, kScaleBlockK)), 0, 0, 0, 0, 0,
                    (row_base & ~3) + c.m_block * static_cast<int>(kBlockM), row_base, row_base + rows};
  }
};

}  // namespace wgrad
