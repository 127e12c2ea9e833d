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

  int tiles_m;
  int tiles_n;
  int num_groups;

  WGRAD_HOST_DEVICE int cluster_tiles_n() const { return (tiles_n + kClusterN - 1) / kClusterN; }
  WGRAD_HOST_DEVICE int cluster_tiles_per_group() const { return tiles_m * cluster_tiles_n(); }
  WGRAD_HOST_DEVICE int64_t total_cluster_tiles() const { return int64_t{cluster_tiles_per_group()} * num_groups; }

  // Output tile of the CTA with `rank` in its cluster, for cluster tile `tile`.
  WGRAD_HOST_DEVICE TileCoord coord(int64_t tile, int rank) const {
    const int per_group = cluster_tiles_per_group();
    const int group = static_cast<int>(tile / per_group);
    const int local = static_cast<int>(tile % per_group);
    const int band_tiles = kBandM * cluster_tiles_n();  // cluster tiles in one full band
    const int band = local / band_tiles;
    const int in_band = local % band_tiles;
    const int band_m0 = band * kBandM;
    const int band_height = (tiles_m - band_m0) < kBandM ? (tiles_m - band_m0) : kBandM;
    return TileCoord{group, band_m0 + in_band % band_height, (in_band / band_height) * kClusterN + rank};
  }
};

}  // namespace wgrad
