// \brief Host entries of the column-wise FP8 1x128 cast and of "both" (row-wise and column-wise outputs
// from one read of x): the persistent TMA kernel (kernels/quant/colwise_kernel_sm90.cuh) for 16-byte aligned rows,
// else the generic kernel.
#include "ops.h"

#include "checks.h"
#include "quant/colwise_launch.h"
#include "quant/launch.h"

namespace wgrad {

namespace {

template <quant::QuantMode kMode>
void launch_column_cast(const char* op, const torch::stable::Tensor& x, const quant::QuantizeParams& p) {
  const int64_t row_blocks = ceil_div(p.rows, quant::kBlock);
  if (row_blocks == 0 || p.cols == 0) return;
  const cudaStream_t stream = current_stream(x);
  const bool vec = vector_rows(p);
  dispatch_x_type(x, [&](auto tag) {
    using T = decltype(tag);
    if (!vec) {
      launch_generic<kMode, T>(p, row_blocks, stream);
      return;
    }
    using Cfg = quant::ColwiseSm90Config<T, kMode>;
    const quant::ColwiseSm90Params params = colwise_sm90_params<Cfg, T>(op, p, row_blocks);
    launch_colwise_sm90<Cfg>(&quant::quantize_fp8_1x128_colwise_sm90_kernel<T, kMode>,
                             colwise_sm90_grid(params, num_sms_of(x)), params, stream);
  });
}

}  // namespace

std::tuple<torch::stable::Tensor, torch::stable::Tensor> quantize_fp8_1x128_colwise_cuda(const torch::stable::Tensor& x,
                                                                                         bool ue8m0) {
  constexpr const char* op = "quantize_fp8_1x128_colwise";
  check_quantize_input(op, x);
  check_sm90(op, x);
  const DeviceGuard guard(x.get_device_index());
  torch::stable::Tensor q_t = empty_q_t(x);
  torch::stable::Tensor scales_t = empty_mn_major_scales(x, x.size(1), ceil_div(x.size(0), kScaleBlockK));
  quant::QuantizeParams p = base_params(x, ue8m0);
  set_colwise(p, q_t, scales_t);
  launch_column_cast<quant::QuantMode::Colwise>(op, x, p);
  return {q_t, scales_t};
}

std::tuple<torch::stable::Tensor, torch::stable::Tensor, torch::stable::Tensor, torch::stable::Tensor>
quantize_fp8_1x128_both_cuda(const torch::stable::Tensor& x, bool ue8m0) {
  constexpr const char* op = "quantize_fp8_1x128_both";
  check_quantize_input(op, x);
  check_sm90(op, x);
  const DeviceGuard guard(x.get_device_index());
  torch::stable::Tensor q = empty_q(x);
  torch::stable::Tensor scales = empty_mn_major_scales(x, x.size(0), ceil_div(x.size(1), kScaleBlockK));
  torch::stable::Tensor q_t = empty_q_t(x);
  torch::stable::Tensor scales_t = empty_mn_major_scales(x, x.size(1), ceil_div(x.size(0), kScaleBlockK));
  quant::QuantizeParams p = base_params(x, ue8m0);
  set_rowwise(p, q, scales);
  set_colwise(p, q_t, scales_t);
  launch_column_cast<quant::QuantMode::Both>(op, x, p);
  return {q, scales, q_t, scales_t};
}

}  // namespace wgrad
