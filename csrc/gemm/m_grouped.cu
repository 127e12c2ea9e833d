// \brief Host entry of the m-grouped SM90 GEMM (MoE fprop and dgrad): out[rows of group g] = a b_g^T in bf16.
//
// The rows of a come grouped by expert, with int32 sizes on the device that only the kernel reads (it
// validates them first: no host synchronisation, capturable in a CUDA graph). b's 128x128 block scales are
// read by the kernel where they lie (any strides): one per consumer warpgroup and K block.
#include "checks.h"
#include "gemm/launch.h"
#include "ops.h"

namespace wgrad {

void m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_cuda(const torch::stable::Tensor& a, const torch::stable::Tensor& sa,
                                                    const torch::stable::Tensor& b, const torch::stable::Tensor& sb,
                                                    const torch::stable::Tensor& out,
                                                    const torch::stable::Tensor& group_sizes) {
  constexpr const char* op = "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous";
  check_m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(a, sa, b, sb, out, group_sizes);
  check_sm90(op, out);
  const int64_t t = a.size(0), k = a.size(1), groups = b.size(0), n = b.size(1);
  if (t == 0 || n == 0) return;  // no element of out (valid sizes are all zero when T == 0)
  const DeviceGuard guard(out.get_device_index());

  const int64_t k_blocks = ceil_div(k, kScaleBlockK);
  constexpr int block_n = kMGroupedBlockN;
  GemmParamsSm90<GroupMode::MGrouped> p;
  check_tma_descriptor(op, "a", make_operand_desc(&p.tma_a, a.const_data_ptr(), t, k, a.stride(0), kTmaBoxRowsA));
  check_tma_descriptor(op, "b",
                       make_grouped_operand_desc(&p.tma_b, b.const_data_ptr(), groups, n, k, b.stride(1), b.stride(0),
                                                 block_n));
  check_tma_descriptor(op, "sa", make_scale_desc(&p.tma_sa, sa.const_data_ptr<float>(), t, k_blocks, sa.stride(1), kBlockM));
  p.sb_blocks = BlockScalesView{sb.const_data_ptr<float>(), sb.stride(0), sb.stride(1), sb.stride(2),
                                static_cast<int>(sb.size(1))};
  p.group_k = group_sizes.const_data_ptr<int>();
  p.k = static_cast<int>(k);
  p.m_total = static_cast<int>(t);
  p.m_groups = static_cast<int>(groups);
  p.out_bf16.ptr = static_cast<__nv_bfloat16*>(out.mutable_data_ptr());
  p.out_bf16.ld = out.stride(0);
  p.out_bf16.n = p.out_bf16.tma_cols = static_cast<int>(n);
  // Whole tiles go out by TMA where out can be a tensor map (16-byte aligned start and row stride); the
  // kernel's threads store everything otherwise.
  const bool aligned = reinterpret_cast<uintptr_t>(out.mutable_data_ptr()) % kTmaAlignBytes == 0;
  if (aligned && (t == 1 || out.stride(0) % 8 == 0)) {
    check_tma_descriptor(op, "out",
                         make_bf16_out_desc(&p.tma_out, out.mutable_data_ptr(), 1, t, n, out.stride(0), 0, 64));
    p.out_bf16.tma = 1;
  }
  // The grid's size: about the row tiles there can be (each group adds at most two partial ones to
  // ceil(T / 128)); the kernel counts the real ones from the sizes and its CTAs loop over them.
  p.scheduler = {static_cast<int>(ceil_div(t, kBlockM) + 2 * groups), static_cast<int>(ceil_div(n, block_n)), 1};
  launch(op, p, GemmConfig{block_n, false}, out);
}

}  // namespace wgrad
