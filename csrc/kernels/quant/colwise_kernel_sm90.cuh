// \brief Column-wise FP8 1x128 quantization on SM90 (also "both", the MoE segments, and both over segments): a persistent,
// warp-specialized kernel over the stages of colwise_*_sm90.cuh. One producer thread streams 128 x 128 tiles
// of x into shared-memory stages with TMA (colwise_producer_sm90.cuh); consumer groups of eight warps (three
// groups for 16-bit x, one for fp32) take the tiles in the order of colwise_tile_order.cuh, each group
// through its own pipeline stage(s), quantize them (colwise_quantize_sm90.cuh) and write q_t (and, in Both,
// q; colwise_store_sm90.cuh). Configuration and parameters: colwise_config_sm90.cuh. Torch-free.
//
// Why this shape (a tile kernel that held a tile in one CTA's registers reached 49-59 % of a copy):
//   - a column block needs all 128 rows before its first q: the tile has to be complete on chip. Held in
//     registers of one CTA, nothing was in flight while the CTA reduced, synchronised and stored. Here the
//     TMA stages keep up to kStages tiles (96 KB of bf16, 192 KB of fp32) in flight per SM while the
//     consumers work on the current one; a stage is released once its tile is in registers (and used).
//   - TMA zero-fills rows past R and columns past C: missing elements never change an amax, and no thread
//     checks bounds on loads. (Segments: rows past the segment are real data and are masked; 16-row boxes
//     past the segment are not read at all, see kBoxRows.)
//   - q_t is staged transposed in shared memory (8-byte slots, XOR-swizzled so that neither the staging
//     stores nor the 16-byte reads conflict) and written as full 128-byte lines: 8 lanes per column.
#pragma once

#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include <cstdint>

#include "kernels/common/named_barriers.h"
#include "kernels/quant/colwise_config_sm90.cuh"
#include "kernels/quant/colwise_producer_sm90.cuh"
#include "kernels/quant/colwise_quantize_sm90.cuh"
#include "kernels/quant/colwise_store_sm90.cuh"
#include "kernels/quant/colwise_tile_order.cuh"
#include "kernels/quant/segment_table.cuh"

namespace wgrad::quant {

template <typename T, QuantMode kMode, SegmentTiles kTiles = SegmentTiles::kBlocks>
__global__ void __launch_bounds__(ColwiseSm90Config<T, kMode, kTiles>::kThreads, 1)
    quantize_fp8_1x128_colwise_sm90_kernel(const __grid_constant__ ColwiseSm90Params params) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Cfg = ColwiseSm90Config<T, kMode, kTiles>;
  using Pipeline = typename Cfg::Pipeline;
  using Handoff = typename Cfg::HandoffPipeline;
  static_assert(has_colwise(kMode), "row-wise alone: rowwise.cuh");
  // BothSegments holds the row-wise work at the 80-register cap of three consumer groups: it takes the
  // segments in row-major order only (no carries or handoffs; what padding to 32 gives).
  static_assert(kMode != QuantMode::BothSegments || kTiles == SegmentTiles::kRowMajorBlocks,
                "BothSegments: row-major block tiles only");

  extern __shared__ __align__(128) uint8_t smem_raw[];
  auto& smem = *reinterpret_cast<typename Cfg::SharedStorage*>(smem_raw);
  const QuantizeParams& p = params.q;
  const int tid = threadIdx.x;
  constexpr int kProducerTid = Cfg::kGroups * Cfg::kConsumerThreads;
  const bool producer = tid >= kProducerTid;

  // ---- the pipelines of the consumer groups (warp 0 initialises their barriers), and with shared strips
  // the handoffs between the groups.
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
    Pipeline init(smem.pipeline[g], pipeline_params, ClusterShape{});
  }
  typename Handoff::Params handoff_params;
  handoff_params.producer_arv_count = Cfg::kConsumerThreads;
  handoff_params.consumer_arv_count = Cfg::kConsumerThreads;
  if constexpr (Cfg::kAnyOrder && Cfg::kGroups > 1) {
#pragma unroll
    for (int g = 0; g < Cfg::kGroups; ++g) Handoff::init_barriers(smem.handoff[g], handoff_params);
  }

  // ---- the segment table and the tile order
  const ColwiseTable table = build_colwise_table<Cfg>(params, smem, tid);
  __syncthreads();  // barriers initialised (and the table built) before anyone reads them
  const ColwiseSchedule schedule = make_colwise_schedule<Cfg>(params, smem, table, tid);
  const TileOrder& order = schedule.order;

  if (producer) {
    // ---------------------------------------------------------------- producer: one thread
    if (tid == kProducerTid) produce_tiles<Cfg, T, kMode>(params, smem, pipeline_params, table.rows, order);
  } else {
    // ---------------------------------------------------------------- consumer groups
    const ConsumerThread thr = consumer_thread<Cfg>();
    auto& gs = smem.group[thr.group];
    Pipeline pipeline = group_pipeline<Cfg>(smem, pipeline_params, thr.group);
    typename Cfg::PipelineState state;
    CarryState<Cfg> carry;
    auto consumers_sync = [&thr] {
      cutlass::arch::NamedBarrier::sync(Cfg::kConsumerThreads, static_cast<uint32_t>(QuantBarrierId::Consumers) +
                                                                   static_cast<uint32_t>(thr.group));
    };
    if constexpr (Cfg::kSegments) {
      // The unused scale columns [used, num_row_blocks) of every column tile (all of them when the sizes are
      // invalid), dealt out to the workers in turn. (32-bit: they are tiles of the launch, fewer than 2^31.)
      const int32_t used = Cfg::kPacked ? schedule.used_blocks : order.blocks_per_col;
      const int32_t unused = static_cast<int32_t>(params.num_row_blocks) - used;
      for (int32_t v = worker_index<Cfg::kGroups>(thr.group); v < unused * order.num_col_tiles; v += order.workers) {
        const int32_t col_tile = v / unused;
        const int32_t row_block = used + (v - col_tile * unused);
        if (thr.tid < Cfg::kTileCols) {
          fill_empty_scale_column(p, row_block, int64_t{col_tile} * Cfg::kTileCols, table.rows[row_block].row_count,
                                  thr.tid);
        }
      }
    }

    if constexpr (Cfg::kSegments && has_rowwise(kMode)) {
      // Invalid sizes (the table's first entry says so): no tiles below, the row-wise outputs all the same.
      if (params.num_row_blocks > 0 && table.rows[0].row_count < 0) {
        quantize_rows_unsegmented<T>(p, int64_t{blockIdx.x} * Cfg::kGroups * Cfg::kConsumerThreads + threadIdx.x,
                                     int64_t{gridDim.x} * Cfg::kGroups * Cfg::kConsumerThreads);
      }
    }
    for (TileCursor cursor = first_tile<Cfg::kGroups>(order, thr.group); cursor.valid(); cursor.advance(order)) {
      const QuantTile t = colwise_tile<Cfg, kMode>(params, table.rows, smem, cursor);
      const int64_t tile_col = t.col_tile * Cfg::kTileCols;

      TileRows<Cfg, T> raw;
      pipeline.consumer_wait(state);
      const int valid_rows = load_tile_rows<Cfg>(smem.x[thr.group * Cfg::kStagesPerGroup + state.index()],
                                                 table.rows, t, thr, raw);
      if constexpr (has_rowwise(kMode)) quantize_rows<Cfg>(p, t, tile_col, thr, raw, valid_rows);
      column_maxima<Cfg>(gs, thr, raw);
      // The stage goes back to the producer only now: the column maxima have used every register loaded from
      // it, so every shared-memory load of this thread has completed. (Released right after issuing the
      // loads, a TMA write of the next tile could overtake loads still queued in the shared-memory pipe:
      // fp32 "both" read a few wrong elements on the H200, 36 of 12.3M, in one run of the tests.)
      pipeline.consumer_release(state);
      ++state;
      consumers_sync();  // (1) partial maxima written
      column_scales<Cfg, T>(p, table.rows, t, tile_col, gs, thr);
      consumers_sync();  // (2) scales ready
      quantize_and_stage<Cfg>(gs, table.rows, t, thr, raw, valid_rows);
      consumers_sync();  // (3) q_t staged

      store_tile<Cfg>(p, order, cursor, t, tile_col, smem, handoff_params, carry, thr);
    }
    zero_padded_tail<Cfg>(p, table.rows, smem, order, thr);
  }
#endif
}

}  // namespace wgrad::quant
