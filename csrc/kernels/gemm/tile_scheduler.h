// \brief Persistent tile scheduler: maps a linear tile index to (group, m block, n block).
// Torch-free, host and device: the C++ tests enumerate it on the host.
#pragma once

#include <cstdint>

#include "kernels/common/layout.h"
#include "kernels/gemm/tile_config.h"

namespace wgrad {

struct TileCoord {
  int group;
  int m_block;
  int n_block;
};

// The unit of scheduling is a cluster tile: kClusterN output tiles side by side along N that share
// one m block (with kClusterN > 1 each CTA of a cluster loads a slice of the A tile and multicasts it
// to the others; with 1, a cluster tile is one output tile). Cluster tiles are numbered group-major
// (every group of a k-grouped GEMM has the same M x N tiles, only K differs); inside a group they are
// rasterised in bands of kBandM row blocks: consecutive cluster tiles walk the band's row blocks
// first, then move right, so the tiles in flight at once share few A and B panels in L2. When the
// number of n blocks is not a multiple of kClusterN, the last cluster tile's trailing CTAs lie past N:
// they compute on zero-filled B and their stores are clipped away.
struct PersistentTileScheduler {
  static constexpr int kBandM = 8;
  static constexpr int kClusterN = ::wgrad::kClusterN;

  int tiles_m = 0;
  int tiles_n = 0;
  int num_groups = 0;
  // Every tile starts with coord(): its divisors are fixed at launch, so they are prepared on the host.
  Divisor per_group_div;    // cluster tiles per group
  Divisor band_tiles_div;   // cluster tiles in one full band
  Divisor last_height_div;  // row blocks of a group's last band (kBandM when tiles_m is a multiple)

  PersistentTileScheduler() = default;
  // (With no tiles, coord() is never called: its divisors are then 1.)
  PersistentTileScheduler(int tiles_m_, int tiles_n_, int num_groups_)
      : tiles_m(tiles_m_),
        tiles_n(tiles_n_),
        num_groups(num_groups_),
        per_group_div(at_least_one(cluster_tiles_per_group())),
        band_tiles_div(at_least_one(kBandM * cluster_tiles_n())),
        last_height_div(tiles_m_ % kBandM > 0 ? tiles_m_ % kBandM : kBandM) {}

  WGRAD_HOST_DEVICE int cluster_tiles_n() const { return (tiles_n + kClusterN - 1) / kClusterN; }
  WGRAD_HOST_DEVICE int cluster_tiles_per_group() const { return tiles_m * cluster_tiles_n(); }
  WGRAD_HOST_DEVICE int64_t total_cluster_tiles() const { return int64_t{cluster_tiles_per_group()} * num_groups; }

  // Output tile of the CTA with `rank` in its cluster, for cluster tile 0 <= `tile` < total_cluster_tiles()
  // (< 2^31: the host checks it).
  WGRAD_HOST_DEVICE TileCoord coord(int tile, int rank) const {
    const int group = per_group_div.div(tile);
    const int local = per_group_div.mod(tile, group);
    const int band = band_tiles_div.div(local);
    const int in_band = band_tiles_div.mod(local, band);
    const int band_m0 = band * kBandM;
    // Only a group's last band can be shorter than kBandM (a power of two: a shift and a mask).
    const bool last_band = band_m0 + kBandM > tiles_m;
    const int column = last_band ? last_height_div.div(in_band) : in_band / kBandM;
    const int row = last_band ? last_height_div.mod(in_band, column) : in_band % kBandM;
    return TileCoord{group, band_m0 + row, column * kClusterN + rank};
  }

 private:
  static int at_least_one(int v) { return v > 0 ? v : 1; }
};

}  // namespace wgrad
