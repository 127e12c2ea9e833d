// \brief Host entry of the row-wise FP8 1x128 cast (kernels/quant/rowwise.cuh).
#include "ops.h"

#include "checks.h"
#include "kernels/quant/rowwise.cuh"
#include "quant/launch.h"

namespace wgrad {

namespace {

// One pass of every slot per CTA (8 CTAs of 256 threads resident per SM for 16-bit x): the CTA scheduler
// hands out the rest as CTAs finish, which evens out the last wave (rowwise.cuh says why).
template <typename T, bool kVec>
void launch_rowwise(const quant::QuantizeParams& p, cudaStream_t stream) {
  using Cfg = quant::RowwiseConfig;
  const int64_t blocks = p.rows * ceil_div(p.cols, kScaleBlockK);
  const int64_t grid = ceil_div(blocks, int64_t{Cfg::kBlocksPerCta} * Cfg::kUnroll<T, kVec>);
  quant::quantize_fp8_1x128_rowwise_kernel<T, kVec><<<static_cast<unsigned>(grid), Cfg::kThreads, 0, stream>>>(p);
  WGRAD_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void launch_rowwise_cast(const torch::stable::Tensor& x, const quant::QuantizeParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return;
  const bool vec = vector_rows(p);
  dispatch_x_type(x, [&](auto tag) {
    using T = decltype(tag);
    vec ? launch_rowwise<T, true>(p, stream) : launch_rowwise<T, false>(p, stream);
  });
}

std::tuple<torch::stable::Tensor, torch::stable::Tensor> quantize_fp8_1x128_rowwise_cuda(const torch::stable::Tensor& x,
                                                                                         bool ue8m0) {
  constexpr const char* op = "quantize_fp8_1x128_rowwise";
  check_quantize_input(op, x);
  check_sm90(op, x);
  const DeviceGuard guard(x.get_device_index());
  torch::stable::Tensor q = empty_q(x);
  torch::stable::Tensor scales = empty_mn_major_scales(x, x.size(0), ceil_div(x.size(1), kScaleBlockK));
  quant::QuantizeParams p = base_params(x, ue8m0);
  set_rowwise(p, q, scales);
  launch_rowwise_cast(x, p, current_stream(x));
  return {q, scales};
}

}  // namespace wgrad
