// \brief Host entries of the dense SM90 wgrad GEMM (fp32 out accumulated into, or bf16 out written): checks,
// TMA descriptors, config choice, launch.
#include "checks.h"
#include "gemm/launch.h"
#include "ops.h"

namespace wgrad {

namespace {

template <bool kBf16Out>
void dense_gemm(const char* op, const torch::stable::Tensor& a, const torch::stable::Tensor& sa,
                const torch::stable::Tensor& b, const torch::stable::Tensor& sb, const torch::stable::Tensor& out) {
  check_sm90(op, out);
  const int64_t m = a.size(0), n = b.size(0), k = a.size(1);
  // K == 0: out += 0 leaves an fp32 out as it is; a bf16 out is written with zeros, by the kernel's tiles
  // of no K block (no operand is read).
  if (m == 0 || n == 0 || (k == 0 && !kBf16Out)) return;
  WGRAD_CHECK(k <= INT32_MAX, op, ": K must fit TMA's 32-bit coordinates, got ", k);
  const DeviceGuard guard(out.get_device_index());

  const GemmConfig cfg = choose_config<kBf16Out>(m, n, 1, k, out);
  const int block_n = cfg.block_n;
  GemmParamsSm90<GroupMode::Dense, kBf16Out> p;
  if (k > 0) {
    check_tma_descriptor(op, "a", make_operand_desc(&p.tma_a, a.const_data_ptr(), m, k, a.stride(0), kTmaBoxRowsA));
    check_tma_descriptor(op, "b", make_operand_desc(&p.tma_b, b.const_data_ptr(), n, k, b.stride(0), block_n));
  }
  set_scale_and_out_descs(op, p, sa, sb, out, cfg);
  p.k = static_cast<int>(k);
  p.scheduler = {static_cast<int>(ceil_div(m, kBlockM)), static_cast<int>(ceil_div(n, block_n)), 1};
  launch(op, p, cfg, out);
}

}  // namespace

void wgrad_gemm_fp8_fp8_fp32_nt_cuda(const torch::stable::Tensor& a, const torch::stable::Tensor& sa,
                                     const torch::stable::Tensor& b, const torch::stable::Tensor& sb,
                                     const torch::stable::Tensor& out) {
  check_wgrad_gemm_fp8_fp8_fp32_nt(a, sa, b, sb, out);
  dense_gemm<false>("wgrad_gemm_fp8_fp8_fp32_nt", a, sa, b, sb, out);
}

void wgrad_gemm_fp8_fp8_bf16_nt_cuda(const torch::stable::Tensor& a, const torch::stable::Tensor& sa,
                                     const torch::stable::Tensor& b, const torch::stable::Tensor& sb,
                                     const torch::stable::Tensor& out) {
  check_wgrad_gemm_fp8_fp8_bf16_nt(a, sa, b, sb, out);
  dense_gemm<true>("wgrad_gemm_fp8_fp8_bf16_nt", a, sa, b, sb, out);
}

}  // namespace wgrad
