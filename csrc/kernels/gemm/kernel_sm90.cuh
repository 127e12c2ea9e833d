// \brief The SM90 GEMM kernel shell: persistent, warp-specialized (1 TMA producer warpgroup, 2 WGMMA consumer
// warpgroups), over <Mainloop, Epilogue, Scheduler>: the weight-gradient GEMMs (fp32 reduce-add epilogue) and
// the m-grouped expert GEMM (bf16 epilogue). Torch-free.
#pragma once

#include <cute/arch/cluster_sm90.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include <cuda.h>

#include <type_traits>

#include "kernels/gemm/epilogue_bf16_sm90.cuh"
#include "kernels/gemm/epilogue_sm90.cuh"
#include "kernels/gemm/group_walker.cuh"
#include "kernels/gemm/mainloop_sm90.cuh"
#include "kernels/gemm/tile_scheduler.h"

namespace wgrad {

// Packed layout: every group's A and B are their own [rows, K_g] matrices, so each group needs its
// own pair of TMA descriptors. They travel in the kernel's parameters (__grid_constant__, at most
// kMaxPackedGroups groups per launch; the host splits larger calls): nothing is copied to device
// memory, and nothing a TMA unit may have cached can go stale.
constexpr int kMaxPackedGroups = 96;

struct PackedGroups {
  CUtensorMap a[kMaxPackedGroups];  // fp8 [M, K_g] of group g, box 128 x 128, 128B swizzle
  CUtensorMap b[kMaxPackedGroups];  // fp8 [N, K_g], box 128 x BLOCK_N
  int k[kMaxPackedGroups];          // K_g (> 0: empty groups are never launched)
  int kb_base[kMaxPackedGroups];    // first scale column of the group in sa / sb
  int out_group[kMaxPackedGroups];  // the group's index in out (and in the caller's list)
};
struct NoPackedGroups {};

// Plain parameters: pointers, shapes and TMA descriptors built on the host. kBf16Out: out is bf16 and
// written (the m-grouped GEMM; the weight gradient's bf16 form), else fp32 and accumulated into.
template <GroupMode kMode_, bool kBf16Out_ = kMode_ == GroupMode::MGrouped>
struct GemmParamsSm90 {
  static constexpr GroupMode kMode = kMode_;
  static constexpr bool kBf16Out = kBf16Out_;
  static_assert(kBf16Out_ || kMode_ != GroupMode::MGrouped, "the m-grouped GEMM writes bf16");
  CUtensorMap tma_a;    // fp8 [rows M, K] K-major, box 128 x 128, 128B swizzle (unused: Packed)
  CUtensorMap tma_b;    // fp8 [rows N, K], box 128 x BLOCK_N (unused: Packed); MGrouped: [G, N, K], box 128 x BLOCK_N x 1
  CUtensorMap tma_sa;   // fp32 [M, KB] MN-major, box 128 x 1
  CUtensorMap tma_sb;   // fp32 [N, KB] MN-major, box BLOCK_N x 1 (unused: MGrouped)
  CUtensorMap tma_out;  // fp32 [G, M, N & ~3], box BLOCK_N/2 x 64 x 1 (out loaded ahead at BLOCK_N 128: 32 x 64
                        // x 1, 128B swizzle; tile_config.h: fp32_out_box_cols) (unused when N < 4);
                        // bf16 out: [G, M, N & ~7] ([1, T, N]: MGrouped), box 64 x 64 x 1, 128B swizzle
                        // (when out_bf16.tma)
  std::conditional_t<kMode_ == GroupMode::Packed, PackedGroups, NoPackedGroups> packed;
  const int* group_k = nullptr;        // Contiguous: the user's int32 sizes; MGrouped: the rows of each group
  const uint8_t* a = nullptr;          // Contiguous: the operands and their row strides (bytes), for
  const uint8_t* b = nullptr;          // the 16 bytes past a shifted window (MainloopSm90::shift_stages)
  int64_t lda = 0, ldb = 0;
  int k = 0;                           // Dense, MGrouped: K; Contiguous: K_total
  int m_total = 0;                     // MGrouped: T, the rows of a (and of out)
  int m_groups = 0;                    // MGrouped: G (the scheduler holds only a bound on the tiles)
  PersistentTileScheduler scheduler{};
  OutView out;  // out itself, for the columns past N & ~3 that the TMA store leaves to the threads
  Bf16OutView out_bf16;  // bf16 out
  BlockScalesView sb_blocks;  // MGrouped: b's 128x128 block scales
#ifdef WGRAD_DIAG_VARIANTS
  int diag = 0;  // measurement build only: bits kDiag* of kernels/common/diag.h (WGRAD_DIAG)
#endif
  CUtensorMap tma_out_narrow;  // bf16 out at BLOCK_N 144 / 160: as tma_out, box 8 x 64 x 1, no swizzle
};

// Register budgets (setmaxnreg): 56 x 128 + 224 x 256 = 64512 <= 65536 registers of an SM. The
// producer needs more than the usual 40 to walk contiguous-K groups without spilling; the consumers
// hold BLOCK_N/2 accumulators + BLOCK_N/2 scratch + BLOCK_N/8 + 4 scales (184 at BLOCK_N = 160). The
// m-grouped GEMM's producer is one plain TMA thread, its consumers hold 128 accumulators + 64 scratch at
// BLOCK_N = 256: 40 x 128 + 232 x 256 = 64512.
template <GroupMode kMode>
constexpr uint32_t kProducerRegisters = kMode == GroupMode::MGrouped ? 40 : 56;
template <GroupMode kMode>
constexpr uint32_t kConsumerRegisters = kMode == GroupMode::MGrouped ? 232 : 224;
constexpr int kNumThreads = 384;
constexpr int kClusterSize = PersistentTileScheduler::kClusterN;

template <int kBlockN, int kStages, GroupMode kMode, bool kBf16Out, bool kLoadOut = false>
struct SharedStorageSm90 {
  typename MainloopSm90<kBlockN, kStages>::SharedStorage mainloop;
  typename EpilogueSm90<kBlockN>::SharedStorage epilogue;
};
// The fp32 epilogue with out loaded ahead (EpilogueLoadedSm90): a whole tile's buffer and its barriers.
template <int kBlockN, int kStages, GroupMode kMode>
struct SharedStorageSm90<kBlockN, kStages, kMode, false, true> {
  typename MainloopSm90<kBlockN, kStages>::SharedStorage mainloop;
  typename EpilogueLoadedSm90<kBlockN>::SharedStorage epilogue;
};
// A bf16 out: the bf16 epilogue's staging buffer (the whole tile, as many bytes as the fp32 epilogue's half
// tile), first for its 1024-byte alignment. The m-grouped GEMM's mainloop has no B scale rows
// (tile_config.h: kMGroupedStages).
template <int kBlockN, int kStages, GroupMode kMode>
struct SharedStorageSm90<kBlockN, kStages, kMode, true, false> {
  typename EpilogueBf16Sm90<kBlockN>::SharedStorage epilogue;
  typename MainloopSm90<kBlockN, kStages, kMode == GroupMode::MGrouped>::SharedStorage mainloop;
};

// Contiguous-K sizes are only on the device: every CTA validates them (each >= 0, sum at most K_total:
// the columns past the sum are not read) before touching anything, and all CTAs reach the same verdict.
// Invalid sizes leave `out` untouched.
// m-grouped sizes likewise (each >= 0, sum equal to T); the kernel's tile count follows from them:
// sum_g m_group_row_tiles(off_g, M_g) row tiles (group_walker.cuh), each tiles_n wide, which warp 0
// counts with a prefix sum over the groups, 32 at a time. Returns the tile count, or -1 for invalid sizes
// (out untouched).
template <class Params>
__device__ int64_t m_grouped_tiles(const Params& p) {
  __shared__ unsigned long long rows;
  __shared__ long long row_tiles;
  if (threadIdx.x == 0) rows = 0;
  __syncthreads();
  long long local_rows = 0;
  int bad = 0;
  for (int g = threadIdx.x; g < p.m_groups; g += blockDim.x) {
    const int mg = p.group_k[g];
    bad |= mg < 0;
    local_rows += mg;
  }
  atomicAdd(&rows, static_cast<unsigned long long>(local_rows));
  const int any_bad = __syncthreads_or(bad);
  if (any_bad || static_cast<long long>(rows) != p.m_total) return -1;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    long long base = 0, tiles = 0;  // base: the first row of the chunk's first group
    for (int g0 = 0; g0 < p.m_groups; g0 += 32) {
      const int mg = g0 + lane < p.m_groups ? p.group_k[g0 + lane] : 0;
      long long inclusive = mg;
      CUTE_UNROLL
      for (int d = 1; d < 32; d *= 2) {
        const long long v = __shfl_up_sync(0xffffffffu, inclusive, d);
        if (lane >= d) inclusive += v;
      }
      long long t = m_group_row_tiles(base + inclusive - mg, mg);
      CUTE_UNROLL
      for (int d = 16; d > 0; d /= 2) t += __shfl_xor_sync(0xffffffffu, t, d);
      tiles += t;
      base += __shfl_sync(0xffffffffu, inclusive, 31);
    }
    if (lane == 0) row_tiles = tiles;
  }
  __syncthreads();
  return row_tiles * p.scheduler.tiles_n;
}

template <class Params>
__device__ bool group_sizes_valid(const Params& p) {
  if constexpr (Params::kMode != GroupMode::Contiguous) {
    return true;
  } else {
    __shared__ unsigned long long total;
    if (threadIdx.x == 0) total = 0;
    __syncthreads();
    long long local = 0;
    int bad = 0;
    for (int g = threadIdx.x; g < p.scheduler.num_groups; g += blockDim.x) {
      const int kg = p.group_k[g];
      bad |= kg < 0;
      local += kg;
    }
    atomicAdd(&total, static_cast<unsigned long long>(local));
    const int any_bad = __syncthreads_or(bad);
    return !any_bad && static_cast<long long>(total) <= p.k;
  }
}

__device__ inline void cluster_or_cta_sync() {
  if constexpr (kClusterSize > 1) {
    cute::cluster_arrive_relaxed();
    cute::cluster_wait();
  } else {
    __syncthreads();
  }
}

template <class Params>
__device__ auto make_walker(const Params& p) {
  if constexpr (Params::kMode == GroupMode::MGrouped) {
    return MGroupWalker{p.group_k, p.scheduler.tiles_n, p.k};
  } else if constexpr (Params::kMode == GroupMode::Packed) {
    return GroupKWalker<Params::kMode>{p.packed.k, p.packed.kb_base, 0};
  } else {
    return GroupKWalker<Params::kMode>{p.group_k, nullptr, p.k, p.scheduler.num_groups};
  }
}

// The work of cluster tile `tile` for the CTA of `rank`.
template <class Params, class Walker>
__device__ WorkTile next_work(const Params& p, Walker& walker, int tile, int rank) {
  if constexpr (Params::kMode == GroupMode::MGrouped) {
    return walker.work(tile);
  } else {
    return walker.work(p.scheduler.coord(tile, rank));
  }
}

// The group coordinate of out for a tile: a packed launch numbers only its own (non-empty) groups.
template <class Params>
__device__ TileCoord out_coord(const Params& p, TileCoord c) {
  if constexpr (Params::kMode == GroupMode::Packed) c.group = p.packed.out_group[c.group];
  return c;
}

// kLoadOut: the fp32 epilogue loads out ahead (EpilogueLoadedSm90) instead of reduce-adding into it.
template <int kBlockN, int kStages, bool kLoadOut, class Params>
__global__ void __launch_bounds__(kNumThreads, 1) wgrad_gemm_kernel_sm90(const __grid_constant__ Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Mainloop = MainloopSm90<kBlockN, kStages, Params::kMode == GroupMode::MGrouped>;
  using Epilogue = EpilogueSm90<kBlockN>;
  using EpilogueLoaded = EpilogueLoadedSm90<kBlockN>;
  using Pipeline = typename Mainloop::Pipeline;
  using namespace cute;
  static_assert(!kLoadOut || !Params::kBf16Out, "out is loaded ahead only to be accumulated into (fp32)");

  extern __shared__ __align__(1024) uint8_t smem_raw[];
  auto& smem =
      *reinterpret_cast<SharedStorageSm90<kBlockN, kStages, Params::kMode, Params::kBf16Out, kLoadOut>*>(smem_raw);

  if (!group_sizes_valid(p)) return;
  int total_tiles = 0;
  __shared__ int m_grouped_tile_count;
  if constexpr (Params::kMode == GroupMode::MGrouped) {
    const int64_t tiles = m_grouped_tiles(p);  // < 2^31: the host bounds it
    if (tiles < 0) return;
    total_tiles = static_cast<int>(tiles);
    if (threadIdx.x == 0) m_grouped_tile_count = total_tiles;  // read after cluster_or_cta_sync below
  }

  const int warp_group = threadIdx.x / 128;
  const bool producer = warp_group == 0;

  if (threadIdx.x == 0) {
    prefetch_tma_descriptor(&p.tma_sa);
    if constexpr (Params::kMode != GroupMode::MGrouped) prefetch_tma_descriptor(&p.tma_sb);
    if constexpr (!Params::kBf16Out) {
      prefetch_tma_descriptor(&p.tma_out);
    } else if (p.out_bf16.tma) {
      prefetch_tma_descriptor(&p.tma_out);
      if (EpilogueBf16Sm90<kBlockN>::kNarrowBoxes > 0) prefetch_tma_descriptor(&p.tma_out_narrow);
    }
    if constexpr (Params::kMode != GroupMode::Packed) {
      prefetch_tma_descriptor(&p.tma_a);
      prefetch_tma_descriptor(&p.tma_b);
    }
  }

  typename Pipeline::Params pipeline_params;
  pipeline_params.transaction_bytes = Mainloop::kTransactionBytes;
  pipeline_params.role = producer ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  // No leader: the producer thread posts each stage's expected bytes itself (MainloopSm90::load_tile),
  // because a shifted stage's full barrier must wait for the shifters' arrival.
  pipeline_params.is_leader = 0;
  pipeline_params.num_consumers = Mainloop::template kEmptyArrivals<Params::kMode>;
  // The CTAs of a cluster consume each other's multicast A slices: every consumer warpgroup releases
  // a stage to every producer of the cluster (CUTLASS's PipelineTmaAsync does this for an N x 1 cluster).
  Pipeline pipeline(smem.mainloop.pipeline, pipeline_params, Shape<Int<kClusterSize>, _1, _1>{});
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) cutlass::arch::ClusterBarrier::init(&smem.mainloop.staging[s], 1);
    if constexpr (kLoadOut) EpilogueLoaded::init(smem.epilogue);
    cutlass::arch::fence_barrier_init();
  }
  // Every CTA's barriers are initialised before any multicasts into it.
  cluster_or_cta_sync();
  const int rank = static_cast<int>(cute::block_rank_in_cluster());
  int cluster_id = blockIdx.x / kClusterSize;
  // Held in registers across the warpgroups' register reconfiguration (setmaxnreg), the tile count and
  // the first tile went to local memory (the m-grouped kernel; the contiguous-K one with a bf16 out): each
  // role reads them afresh after it, and the walker loads its first group sizes only then.
  auto walker = make_walker(p);
  auto refresh = [&] {
    if constexpr (Params::kMode == GroupMode::MGrouped) {
      total_tiles = *static_cast<volatile int*>(&m_grouped_tile_count);
    } else {
      total_tiles = static_cast<int>(p.scheduler.total_cluster_tiles());  // < 2^31: host-checked
      walker.start();
    }
    if constexpr (Params::kBf16Out) cluster_id = static_cast<int>(blockIdx.x) / kClusterSize;
  };
  const int num_clusters = gridDim.x / kClusterSize;

  if (producer) {
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegisters<Params::kMode>>();
    refresh();
    if (threadIdx.x == 0) {  // the pipeline's leader: it posts each stage's expected bytes
      typename Mainloop::PipelineState state = cutlass::make_producer_start_state<Pipeline>();
      for (int tile = cluster_id; tile < total_tiles; tile += num_clusters) {
        const WorkTile w = next_work(p, walker, tile, rank);
        if (w.num_k_blocks > 0) Mainloop::load_tile(p, pipeline, state, smem.mainloop, w, rank);
      }
      Mainloop::template producer_finish<Params>(pipeline, state, smem.mainloop);
    } else if constexpr (Params::kMode == GroupMode::Contiguous) {
      // Warps 1-3 shift the windows of groups that start inside a 16-byte chunk.
      if (threadIdx.x >= 32) Mainloop::shift_stages(p, smem.mainloop, threadIdx.x - 32);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<kConsumerRegisters<Params::kMode>>();
    refresh();
    const int consumer_tid = threadIdx.x - 128;
    typename Mainloop::TiledMma tiled_mma;
    Tensor acc = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});  // (MMA,MMA_M=2,MMA_N)
    typename Mainloop::PipelineState state;
    if constexpr (Params::kMode == GroupMode::MGrouped) {
      // One m64 half's WGMMA accumulators, reused by both halves (mma_tile_block_scaled).
      Tensor scratch = partition_fragment_C(tiled_mma, Shape<Int<kBlockM / 2>, Int<kBlockN>>{});  // (MMA,1,1)
      const int wg = consumer_tid / 128;
      for (int tile = cluster_id; tile < total_tiles; tile += num_clusters) {
        const WorkTile w = next_work(p, walker, tile, rank);
        const float* sb_col = p.sb_blocks.column(w.coord.group, w.coord.n_block * (kBlockN / kScaleBlockK) + wg);
        Mainloop::mma_tile_block_scaled(pipeline, state, smem.mainloop, w, sb_col, __ldg(sb_col), p.sb_blocks.stride_k,
                                        acc, scratch, consumer_tid);
        using EpilogueBf16 = EpilogueBf16Sm90<kBlockN>;
        if (EpilogueBf16::whole_tile(p.out_bf16, w)) {  // the same for the whole CTA
          EpilogueBf16::store_staged(Bf16OutMaps{&p.tma_out, &p.tma_out_narrow}, p.out_bf16, smem.epilogue, acc, w.m0,
                                     w.coord.n_block, 0, consumer_tid);
        } else {
          EpilogueBf16::store(p.out_bf16, acc, w, consumer_tid);
        }
      }
      EpilogueBf16Sm90<kBlockN>::drain(consumer_tid);
    } else {
      // One m64 half of the tile each: the WGMMA accumulators of the two halves of a K block.
      Tensor scratch0 = partition_fragment_C(tiled_mma, Shape<Int<kBlockM / 2>, Int<kBlockN>>{});  // (MMA,1,1)
      Tensor scratch1 = partition_fragment_C(tiled_mma, Shape<Int<kBlockM / 2>, Int<kBlockN>>{});  // (MMA,1,1)
      const int diag = diag_of(p);
      if (diag != 0) diag_stagger(diag, consumer_tid / 128);
      if constexpr (kLoadOut) {
        // The CTA's tiles with K blocks, one ahead: each tile's out window is loaded as soon as the previous
        // tile's stores have read the buffer (EpilogueLoadedSm90). Tiles of empty groups are skipped (out[g]
        // stays as it is), as by the producer.
        int tile = cluster_id;
        auto advance = [&](WorkTile& w) {
          for (; tile < total_tiles; tile += num_clusters) {
            w = next_work(p, walker, tile, rank);
            if (w.num_k_blocks > 0) {
              tile += num_clusters;
              return true;
            }
          }
          return false;
        };
        WorkTile w;
        bool have = advance(w);
        if (have && consumer_tid % 128 == 0) {
          EpilogueLoaded::load(&p.tma_out, p.out, smem.epilogue, out_coord(p, w.coord), consumer_tid / 128);
        }
        for (int index = 0; have; ++index) {
          Mainloop::template mma_tile<Params::kMode>(pipeline, state, smem.mainloop, w, acc, scratch0, scratch1,
                                                    consumer_tid, diag);
          WorkTile next{};  // (group 0 when there is none: out_coord reads a valid entry)
          const bool more = advance(next);
          EpilogueLoaded::store(&p.tma_out, p.out, smem.epilogue, acc, out_coord(p, w.coord), more,
                                out_coord(p, next.coord), consumer_tid, index);
          w = next;
          have = more;
        }
      } else {
        for (int tile = cluster_id; tile < total_tiles; tile += num_clusters) {
          const WorkTile w = next_work(p, walker, tile, rank);
          // An empty group: an fp32 out[g] stays as it is, a bf16 one is written with zeros (mma_tile clears acc
          // and waits for no stage).
          if (!Params::kBf16Out && w.num_k_blocks == 0) continue;
          Mainloop::template mma_tile<Params::kMode>(pipeline, state, smem.mainloop, w, acc, scratch0, scratch1,
                                                    consumer_tid, diag);
          if (diag & kDiagNoEpilogue) continue;
          if constexpr (Params::kBf16Out) {
            using EpilogueBf16 = EpilogueBf16Sm90<kBlockN>;
            const TileCoord c = out_coord(p, w.coord);
            EpilogueBf16::store_staged(Bf16OutMaps{&p.tma_out, &p.tma_out_narrow}, p.out_bf16, smem.epilogue, acc,
                                       c.m_block * kBlockM, c.n_block, c.group, consumer_tid);
            EpilogueBf16::store_ragged_edge(p.out_bf16, acc, c.m_block * kBlockM, c.n_block, c.group, consumer_tid);
          } else {
            Epilogue::store(&p.tma_out, p.out, smem.epilogue, acc, out_coord(p, w.coord), consumer_tid, diag);
          }
        }
      }
      if constexpr (Params::kBf16Out) {
        EpilogueBf16Sm90<kBlockN>::drain(consumer_tid);
      } else {
        Epilogue::drain(consumer_tid);  // (the loaded epilogue's last stores, too)
      }
    }
  }
  // No CTA leaves while a peer may still multicast into its smem or signal its barriers.
  if constexpr (kClusterSize > 1) cluster_or_cta_sync();
#endif
}

}  // namespace wgrad
