// \brief The persistent TMA kernel of the column casts (column-wise, both, segments) from the host: x's
// descriptor, the kernel's parameters, its grid and launch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "common/device.h"
#include "common/tma.h"
#include "kernels/common/layout.h"
#include "kernels/common/dynamic_smem.h"
#include "kernels/common/tma_descriptor.h"
#include "kernels/gemm/tile_config.h"
#include "kernels/quant/colwise_kernel_sm90.cuh"

namespace wgrad {

// ---- x's TMA descriptor ----------------------------------------------------------------------------------

template <typename T>
constexpr CUtensorMapDataType tma_dtype() {
  if constexpr (std::is_same_v<T, float>) return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  else if constexpr (std::is_same_v<T, __half>) return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  else return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
}

// x [rows, cols] (16-byte aligned rows) with boxes of box_cols x box_rows elements, no swizzle, into *map.
template <typename T>
void encode_x_descriptor(const char* op, CUtensorMap* map, const void* x, int64_t rows, int64_t cols, int box_cols,
                         int box_rows) {
  const std::string err =
      encode_matrix_descriptor(map, tma_dtype<T>(), sizeof(T), x, rows, cols, cols, box_cols, box_rows);
  check_tma_descriptor(op, "x", err);
}

// The persistent column kernel's parameters for kernel configuration Cfg: the cast, its tiles (row_blocks
// 128-row blocks, or the segment table's scale columns) and x's descriptor. The tile order is row-major
// until the segments cast says otherwise.
template <class Cfg, typename T>
quant::ColwiseSm90Params colwise_sm90_params(const char* op, const quant::QuantizeParams& p, int64_t row_blocks) {
  quant::ColwiseSm90Params params{};
  params.q = p;
  params.num_row_blocks = row_blocks;
  params.num_col_tiles = ceil_div(p.cols, kScaleBlockK);
  params.segment_order = 1;
  params.segment_shared = false;
  encode_x_descriptor<T>(op, &params.tma_x, p.x, p.rows, p.cols, Cfg::kTileCols, Cfg::kBoxRows);
  // The kernel counts tiles in 32 bits (TileOrder). (x would need 2^45 elements to exceed it.)
  const int64_t tiles = row_blocks * params.num_col_tiles;
  WGRAD_CHECK(tiles < (int64_t{1} << 31), op, ": x has ", tiles, " tiles of 128 x 128, more than 2^31 - 1");
  return params;
}

// One CTA per SM, at most one per tile.
inline int64_t colwise_sm90_grid(const quant::ColwiseSm90Params& params, int num_sms) {
  return std::min<int64_t>(params.num_row_blocks * params.num_col_tiles, num_sms);
}

// Launches the instance of quantize_fp8_1x128_colwise_sm90_kernel of configuration Cfg.
template <class Cfg, class Kernel>
void launch_colwise_sm90(Kernel kernel, int64_t grid, const quant::ColwiseSm90Params& params, cudaStream_t stream) {
  static_assert(sizeof(typename Cfg::SharedStorage) <= kSmemBudgetBytes,
                "shared storage exceeds the budget of tile_config.h");
  constexpr int kSmemBytes = static_cast<int>(sizeof(typename Cfg::SharedStorage));
  WGRAD_CUDA_CHECK(allow_dynamic_smem(reinterpret_cast<const void*>(kernel), kSmemBytes));
  kernel<<<static_cast<unsigned>(grid), Cfg::kThreads, kSmemBytes, stream>>>(params);
  WGRAD_KERNEL_LAUNCH_CHECK();
}

}  // namespace wgrad
