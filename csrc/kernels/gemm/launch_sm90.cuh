// \brief Host side of the SM90 wgrad GEMM, torch-free: TMA descriptors of the operands and the launch
// of the persistent kernel for a chosen BLOCK_N. Included by the host entries gemm/dense.cu and
// gemm/grouped_*.cu, which instantiate it for their modes.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/gemm/kernel_sm90.cuh"
#include "kernels/common/layout.h"
#include "kernels/gemm/tile_config.h"
#include "kernels/common/dynamic_smem.h"
#include "kernels/common/tma_descriptor.h"

namespace wgrad {

// fp8 [rows, k] K-major operand with row stride `ld` elements; box 128 (K) x box_rows, 128B swizzle.
inline std::string make_operand_desc(CUtensorMap* desc, const void* ptr, int64_t rows, int64_t k, int64_t ld,
                                     int box_rows) {
  const uint64_t dims[2] = {static_cast<uint64_t>(k), static_cast<uint64_t>(rows)};
  // A single row's stride is never followed; any legal (16-byte multiple) value describes it.
  const uint64_t strides[1] = {static_cast<uint64_t>(rows > 1 ? ld : align_up(k, 16))};
  const uint32_t box[2] = {static_cast<uint32_t>(kBlockK), static_cast<uint32_t>(box_rows)};
  return encode_tma_descriptor(desc, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, ptr, dims, strides, box,
                               CU_TENSOR_MAP_SWIZZLE_128B);
}

// fp32 [mn, kb] MN-major scales, element (i, j) at j * ld + i; box box_mn x 1 (one K block).
inline std::string make_scale_desc(CUtensorMap* desc, const float* ptr, int64_t mn, int64_t kb, int64_t ld,
                                   int box_mn) {
  const uint64_t dims[2] = {static_cast<uint64_t>(mn), static_cast<uint64_t>(kb)};
  const uint64_t strides[1] = {static_cast<uint64_t>((kb > 1 ? ld : scale_ld(mn)) * 4)};
  const uint32_t box[2] = {static_cast<uint32_t>(box_mn), 1};
  return encode_tma_descriptor(desc, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, ptr, dims, strides, box,
                               CU_TENSOR_MAP_SWIZZLE_NONE);
}

// out [g, m, n] of `elem_bytes`-byte elements, row stride ld and group stride g_stride (elements: multiples of
// 16 bytes where followed; a single row's or group's are never followed, any legal value describes them);
// box box_cols x 64 x 1 (one m64 block).
inline std::string make_out_desc_3d(CUtensorMap* desc, CUtensorMapDataType dtype, int64_t elem_bytes, void* ptr,
                                    int64_t g, int64_t m, int64_t n, int64_t ld, int64_t g_stride, int box_cols,
                                    CUtensorMapSwizzle swizzle) {
  const int64_t row_stride = m > 1 ? ld : align_up(n, kTmaAlignBytes / elem_bytes);
  const int64_t group_stride = g > 1 ? g_stride : row_stride * m;
  const uint64_t dims[3] = {static_cast<uint64_t>(n), static_cast<uint64_t>(m), static_cast<uint64_t>(g)};
  const uint64_t strides[2] = {static_cast<uint64_t>(row_stride * elem_bytes),
                               static_cast<uint64_t>(group_stride * elem_bytes)};
  const uint32_t box[3] = {static_cast<uint32_t>(box_cols), static_cast<uint32_t>(kEpilogueSliceRows), 1};
  return encode_tma_descriptor(desc, dtype, 3, ptr, dims, strides, box, swizzle);
}

// fp32 out [g, m, n]; box fp32_out_box_cols x 64 x 1: one epilogue slice (a consumer warpgroup's columns, one
// m64 block), or for out loaded ahead at BLOCK_N 128 a 32-column part of it in the 128B swizzle
// (epilogue_sm90.cuh: Fp32SliceLayout).
inline std::string make_out_desc(CUtensorMap* desc, float* ptr, int64_t g, int64_t m, int64_t n, int64_t ld,
                                 int64_t g_stride, int block_n, bool load_out) {
  return make_out_desc_3d(desc, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, ptr, g, m, n, ld, g_stride,
                          fp32_out_box_cols(block_n, load_out),
                          fp32_out_swizzled(block_n, load_out) ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE);
}

// fp8 [g, rows, k] K-major operand, row stride `ld` and group stride `g_stride` elements (any order of the
// two: a transposed weight's groups may interleave); box 128 (K) x box_rows x 1, 128B swizzle.
inline std::string make_grouped_operand_desc(CUtensorMap* desc, const void* ptr, int64_t g, int64_t rows, int64_t k,
                                             int64_t ld, int64_t g_stride, int box_rows) {
  const uint64_t dims[3] = {static_cast<uint64_t>(k), static_cast<uint64_t>(rows), static_cast<uint64_t>(g)};
  const uint64_t strides[2] = {static_cast<uint64_t>(rows > 1 ? ld : align_up(k, 16)),
                               static_cast<uint64_t>(g > 1 ? g_stride : align_up(k, 16) * rows)};
  const uint32_t box[3] = {static_cast<uint32_t>(kBlockK), static_cast<uint32_t>(box_rows), 1};
  return encode_tma_descriptor(desc, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, ptr, dims, strides, box,
                               CU_TENSOR_MAP_SWIZZLE_128B);
}

// bf16 out [g, rows, n]; box box_cols x 64 x 1: 64 columns in the 128B swizzle, or 8 columns without
// (epilogue_bf16_sm90.cuh).
inline std::string make_bf16_out_desc(CUtensorMap* desc, void* ptr, int64_t g, int64_t rows, int64_t n, int64_t ld,
                                      int64_t g_stride, int box_cols) {
  return make_out_desc_3d(desc, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, ptr, g, rows, n, ld, g_stride, box_cols,
                          box_cols * 2 == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE);
}

// Rows of A one CTA loads per stage: half the tile, multicast to both CTAs of its cluster.
constexpr int kTmaBoxRowsA = kBlockM / kClusterN;

// CUDA 12.1+ passes up to 32764 bytes of kernel parameters; the packed layout's per-group descriptors
// (PackedGroups) are sized to fit.
static_assert(sizeof(GemmParamsSm90<GroupMode::Packed>) <= 32764, "kernel parameters exceed CUDA's 32764-byte limit");

template <int kBlockN, bool kLoadOut, class Params>
cudaError_t launch_gemm_sm90_bn(const Params& p, int num_sms, cudaStream_t stream) {
  constexpr GroupMode kMode = Params::kMode;
  constexpr int kStages = kMode == GroupMode::MGrouped ? kMGroupedStages : stages_for(kBlockN, kLoadOut);
  static_assert(kStages >= 3, "a config must fit at least 3 pipeline stages in shared memory");
  auto kernel = &wgrad_gemm_kernel_sm90<kBlockN, kStages, kLoadOut, Params>;
  constexpr int smem_bytes =
      static_cast<int>(sizeof(SharedStorageSm90<kBlockN, kStages, kMode, Params::kBf16Out, kLoadOut>));
  static_assert(smem_bytes <= kSmemBudgetBytes, "shared storage exceeds the budget of tile_config.h");
  cudaError_t err = allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem_bytes);
  if (err != cudaSuccess) return err;

  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kClusterSize;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = kClusterSize > 1 ? 1 : 0;  // no cluster launch for a cluster of one
  config.blockDim = dim3(kNumThreads, 1, 1);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;

  // Persistent: as many clusters as can be resident at once (a GPC may leave an SM unpaired), and
  // never more than there are cluster tiles.
  int max_clusters = num_sms;
  if constexpr (kClusterSize > 1) {
    static int resident = -1;  // per kernel instance; one device kind per process is assumed
    if (resident < 0) {
      config.gridDim = dim3(kClusterSize * (num_sms / kClusterSize), 1, 1);
      err = cudaOccupancyMaxActiveClusters(&resident, kernel, &config);
      if (err != cudaSuccess || resident <= 0) resident = num_sms / kClusterSize;
    }
    max_clusters = resident;
  }
  // (m-grouped: the tile count depends on the sizes on the device; total_cluster_tiles() is the estimate
  // the host entry sets, and the persistent CTAs loop over however many there are.)
  const int64_t tiles = p.scheduler.total_cluster_tiles();
  const int clusters = static_cast<int>(tiles < max_clusters ? tiles : max_clusters);
  config.gridDim = dim3(kClusterSize * clusters, 1, 1);
  err = cudaLaunchKernelEx(&config, kernel, p);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

// The instance of `block_n` (one of kBlockNCandidates) with the epilogue kLoadOut.
template <bool kLoadOut, class Params>
cudaError_t launch_gemm_sm90_width(const Params& p, int block_n, int num_sms, cudaStream_t stream) {
  switch (block_n) {
    case 128: return launch_gemm_sm90_bn<128, kLoadOut>(p, num_sms, stream);
    case 144: return launch_gemm_sm90_bn<144, kLoadOut>(p, num_sms, stream);
    case 160: return launch_gemm_sm90_bn<160, kLoadOut>(p, num_sms, stream);
    default: return cudaErrorInvalidValue;
  }
}

// Launches the kernel instance of `block_n` (one of kBlockNCandidates; kMGroupedBlockN for the m-grouped GEMM).
// load_out: an fp32 out is loaded ahead (EpilogueLoadedSm90) rather than reduce-added into.
template <class Params>
cudaError_t launch_gemm_sm90(const Params& p, int block_n, bool load_out, int num_sms, cudaStream_t stream) {
  if constexpr (Params::kMode == GroupMode::MGrouped) {
    return block_n == kMGroupedBlockN && !load_out ? launch_gemm_sm90_bn<kMGroupedBlockN, false>(p, num_sms, stream)
                                                   : cudaErrorInvalidValue;
  } else {
    if (!load_out) return launch_gemm_sm90_width<false>(p, block_n, num_sms, stream);
    if constexpr (Params::kBf16Out) {
      return cudaErrorInvalidValue;  // a bf16 out is written, never loaded
    } else {
      return launch_gemm_sm90_width<true>(p, block_n, num_sms, stream);
    }
  }
}

}  // namespace wgrad
