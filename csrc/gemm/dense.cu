// \brief Host entry of the dense SM90 wgrad GEMM: checks, TMA descriptors, config choice, launch.
#include "checks.h"
#include "gemm/launch.h"
#include "ops.h"

namespace wgrad {

void wgrad_gemm_fp8_fp8_fp32_nt_cuda(const torch::stable::Tensor& a, const torch::stable::Tensor& sa,
                                     const torch::stable::Tensor& b, const torch::stable::Tensor& sb,
                                     const torch::stable::Tensor& out) {
  constexpr const char* op = "wgrad_gemm_fp8_fp8_fp32_nt";
  check_wgrad_gemm_fp8_fp8_fp32_nt(a, sa, b, sb, out);
  check_sm90(op, out);
  const int64_t m = a.size(0), n = b.size(0), k = a.size(1);
  if (m == 0 || n == 0 || k == 0) return;  // out += 0: nothing to write
  WGRAD_CHECK(k <= INT32_MAX, op, ": K must fit TMA's 32-bit coordinates, got ", k);
  const DeviceGuard guard(out.get_device_index());

  const int block_n = choose_block_n(m, n, 1, out);
  GemmParamsSm90<GroupMode::Dense> p;
  check_tma_descriptor(op, "a", make_operand_desc(&p.tma_a, a.const_data_ptr(), m, k, a.stride(0), kTmaBoxRowsA));
  check_tma_descriptor(op, "b", make_operand_desc(&p.tma_b, b.const_data_ptr(), n, k, b.stride(0), block_n));
  set_scale_and_out_descs(op, p, sa, sb, out, block_n);
  p.k = static_cast<int>(k);
  p.scheduler = {static_cast<int>(ceil_div(m, kBlockM)), static_cast<int>(ceil_div(n, block_n)), 1};
  launch(op, p, block_n, out);
}

}  // namespace wgrad
