// \brief The column-wise cast's producer: one thread streams every consumer group's tiles of x into that
// group's pipeline stages with TMA, 8 boxes of 16 rows x 128 columns per tile. Torch-free.
#pragma once

#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include <cstdint>

#include "kernels/quant/colwise_config_sm90.cuh"
#include "kernels/quant/colwise_tile_order.cuh"

namespace wgrad::quant {

// A handle on consumer group g's pipeline (its barriers are initialised once, by the kernel shell).
template <class Cfg>
__device__ __forceinline__ typename Cfg::Pipeline group_pipeline(typename Cfg::SharedStorage& smem,
                                                                 const typename Cfg::Pipeline::Params& params, int g) {
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  return typename Cfg::Pipeline(smem.pipeline[g], params, ClusterShape{}, cute::false_type{});
}

// Tile t's boxes into `stage`, all on the stage's transaction barrier `bar` (TMA counts the bytes of every
// box, zero-filled ones too). Block tiles: box b holds rows [16 b, 16 b + 16) of the block, a box wholly past
// the block's rows aimed past R (zero-filled without reading memory: a segment's last block reads at most 15
// rows of the next segment). Packed tiles: each block's boxes one after the other from box 0 (a block starts
// on a box), the rest aimed past R.
template <class Cfg, typename T>
__device__ __forceinline__ void load_tile_boxes(const ColwiseSm90Params& params, const RowBlock* table,
                                                const QuantTile& t, T* stage, uint64_t* bar) {
  constexpr uint64_t kEvictFirst = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_FIRST);
  const QuantizeParams& p = params.q;
  const int32_t col = static_cast<int32_t>(t.col_tile * Cfg::kTileCols);
  if constexpr (Cfg::kPacked) {
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
}

// The producer thread: it serves the groups in turn, each from its own tile sequence (first_tile, advance)
// and into its own stages, until every group's tiles are loaded, then waits for the consumers to release
// the last stages. (A producer warp per group, each waiting only for its group's stage, measured slower:
// Both -2 to -9 points of a copy, Colwise -1 to -5, H200.)
template <class Cfg, typename T, QuantMode kMode>
__device__ __forceinline__ void produce_tiles(const ColwiseSm90Params& params, typename Cfg::SharedStorage& smem,
                                              const typename Cfg::Pipeline::Params& pipeline_params,
                                              const RowBlock* table, const TileOrder& order) {
  using Pipeline = typename Cfg::Pipeline;
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
      const QuantTile t = colwise_tile<Cfg, kMode>(params, table, smem, tiles[g]);
      tiles[g].advance(order);
      more = true;
      Pipeline pipeline = group_pipeline<Cfg>(smem, pipeline_params, g);
      pipeline.producer_acquire(states[g]);
      uint64_t* bar = reinterpret_cast<uint64_t*>(pipeline.producer_get_barrier(states[g]));
      T* stage = smem.x[g * Cfg::kStagesPerGroup + states[g].index()];
      load_tile_boxes<Cfg>(params, table, t, stage, bar);
      ++states[g];
    }
  }
#pragma unroll
  for (int g = 0; g < Cfg::kGroups; ++g) group_pipeline<Cfg>(smem, pipeline_params, g).producer_tail(states[g]);
}

}  // namespace wgrad::quant
