// \brief Host entries of the k-grouped SM90 wgrad GEMM, contiguous-K layout (one persistent launch; fp32 out
// accumulated into, or bf16 out written).
//
// One descriptor covers [rows, K_total]; the kernel reads the int32 group sizes from device memory,
// validates them and walks (group, tile) pairs: no host synchronisation, capturable in a CUDA graph.
#include "checks.h"
#include "gemm/launch.h"
#include "ops.h"

namespace wgrad {

namespace {

template <bool kBf16Out>
void contiguous_gemm(const char* op, const torch::stable::Tensor& a, const torch::stable::Tensor& sa,
                     const torch::stable::Tensor& b, const torch::stable::Tensor& sb, const torch::stable::Tensor& out,
                     const torch::stable::Tensor& ks) {
  check_sm90(op, out);
  const int64_t groups = ks.size(0);
  const int64_t m = out.size(1), n = out.size(2), k_total = a.size(1);
  // K_total == 0: valid sizes are all zero and leave an fp32 out untouched; invalid ones do too. A bf16 out
  // is written with zeros by the kernel (which validates the sizes first) without reading any operand.
  if (m == 0 || n == 0 || (k_total == 0 && !kBf16Out)) return;
  WGRAD_CHECK(k_total <= INT32_MAX, op, ": K_total must fit TMA's 32-bit coordinates, got ", k_total);
  WGRAD_CHECK(groups <= INT32_MAX, op, ": too many groups: ", groups);
  const DeviceGuard guard(out.get_device_index());
  const GemmConfig cfg = choose_config<kBf16Out>(m, n, groups, groups > 0 ? k_total / groups : 0, out);
  const int block_n = cfg.block_n;

  GemmParamsSm90<GroupMode::Contiguous, kBf16Out> p;
  if (k_total > 0) {
    check_tma_descriptor(op, "a",
                         make_operand_desc(&p.tma_a, a.const_data_ptr(), m, k_total, a.stride(0), kTmaBoxRowsA));
    check_tma_descriptor(op, "b", make_operand_desc(&p.tma_b, b.const_data_ptr(), n, k_total, b.stride(0), block_n));
  }
  set_scale_and_out_descs(op, p, sa, sb, out, cfg);
  p.group_k = ks.const_data_ptr<int>();
  p.a = static_cast<const uint8_t*>(a.const_data_ptr());
  p.b = static_cast<const uint8_t*>(b.const_data_ptr());
  p.lda = a.stride(0);
  p.ldb = b.stride(0);
  p.k = static_cast<int>(k_total);
  p.scheduler = {static_cast<int>(ceil_div(m, kBlockM)), static_cast<int>(ceil_div(n, block_n)),
                 static_cast<int>(groups)};
  launch(op, p, cfg, out);
}

}  // namespace

void k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous_cuda(
    const torch::stable::Tensor& a, const torch::stable::Tensor& sa, const torch::stable::Tensor& b,
    const torch::stable::Tensor& sb, const torch::stable::Tensor& out, const torch::stable::Tensor& ks) {
  check_k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous(a, sa, b, sb, out, ks);
  contiguous_gemm<false>("k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous", a, sa, b, sb, out, ks);
}

void k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous_cuda(
    const torch::stable::Tensor& a, const torch::stable::Tensor& sa, const torch::stable::Tensor& b,
    const torch::stable::Tensor& sb, const torch::stable::Tensor& out, const torch::stable::Tensor& ks) {
  check_k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous(a, sa, b, sb, out, ks);
  contiguous_gemm<true>("k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous", a, sa, b, sb, out, ks);
}

}  // namespace wgrad
