// \brief Host entry of quantize_fp8_128x128: the weight cast of the FP8 layers (checks in checks.cpp,
// device code in kernels/quant/blockwise_128x128.cuh).
#include "ops.h"

#include "checks.h"
#include "kernels/quant/blockwise_128x128.cuh"
#include "quant/launch.h"

namespace wgrad {

namespace {

template <typename T>
void launch_128x128(const quant::Blockwise128Params& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(ceil_div(p.cols, quant::kBlock)),
                  static_cast<unsigned>(ceil_div(p.rows, quant::kBlock)));
  const bool vec = p.rows % quant::kColsPerThread == 0 && p.cols % quant::kColsPerThread == 0 &&
                   reinterpret_cast<uintptr_t>(p.w) % kTmaAlignBytes == 0;
  if (vec) {
    quant::quantize_fp8_128x128_kernel<T, true><<<grid, quant::Blockwise128Config::kThreads, 0, stream>>>(p);
  } else {
    quant::quantize_fp8_128x128_kernel<T, false><<<grid, quant::Blockwise128Config::kThreads, 0, stream>>>(p);
  }
  WGRAD_KERNEL_LAUNCH_CHECK();
}

}  // namespace

std::tuple<torch::stable::Tensor, torch::stable::Tensor, torch::stable::Tensor, torch::stable::Tensor>
quantize_fp8_128x128_cuda(const torch::stable::Tensor& w, bool ue8m0) {
  constexpr const char* op = "quantize_fp8_128x128";
  check_quantize_fp8_128x128(w);
  check_sm90(op, w);
  const DeviceGuard guard(w.get_device_index());
  const int64_t rows = w.size(0), cols = w.size(1);
  const int64_t n_blocks = ceil_div(rows, kScaleBlockK), k_blocks = ceil_div(cols, kScaleBlockK);
  torch::stable::Tensor q = empty_2d(w, rows, cols, ScalarType::Float8_e4m3fn);
  torch::stable::Tensor q_t = empty_2d(w, cols, rows, ScalarType::Float8_e4m3fn);
  torch::stable::Tensor scales = empty_2d(w, n_blocks, k_blocks, ScalarType::Float);
  torch::stable::Tensor scales_t = empty_2d(w, k_blocks, n_blocks, ScalarType::Float);
  if (rows == 0 || cols == 0) return {q, scales, q_t, scales_t};

  quant::Blockwise128Params p{};
  p.w = w.const_data_ptr();
  p.rows = rows;
  p.cols = cols;
  p.q = static_cast<uint8_t*>(q.mutable_data_ptr());
  p.q_t = static_cast<uint8_t*>(q_t.mutable_data_ptr());
  p.scales = scales.mutable_data_ptr<float>();
  p.scales_t = scales_t.mutable_data_ptr<float>();
  p.ue8m0 = ue8m0;
  const cudaStream_t stream = current_stream(w);
  dispatch_x_type(w, [&](auto tag) { launch_128x128<decltype(tag)>(p, stream); });
  return {q, scales, q_t, scales_t};
}

}  // namespace wgrad
