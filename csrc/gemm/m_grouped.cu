// \brief Host entry of the m-grouped SM90 GEMM (MoE fprop and dgrad): out[rows of group g] = a b_g^T in bf16.
//
// The rows of a come grouped by expert, with int32 sizes on the device that only the kernel reads (it
// validates them first: no host synchronisation, capturable in a CUDA graph). b's 128x128 block scales are
// spread to one scale per row and K block ([G, KB, N], a small tensor: 4 bytes per 128 codes of b) so that
// the mainloop loads them exactly as it loads the weight gradient's per-row scales.
#include "checks.h"
#include "gemm/launch.h"
#include "ops.h"

namespace wgrad {

namespace {

// rows[g][kb][n] = sb[g][n / 128][kb] for n < N, 0 in the padding up to ld.
__global__ void spread_block_scales(const float* sb, int64_t sg, int64_t sn, int64_t sk, int64_t groups,
                                    int64_t k_blocks, int64_t n, int64_t ld, float* rows) {
  const int64_t total = groups * k_blocks * ld;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t col = i % ld;
    const int64_t kb = (i / ld) % k_blocks;
    const int64_t g = i / (ld * k_blocks);
    rows[i] = col < n ? sb[g * sg + (col / kScaleBlockK) * sn + kb * sk] : 0.0f;
  }
}

}  // namespace

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
  const cudaStream_t stream = current_stream(out);

  const int64_t k_blocks = ceil_div(k, kScaleBlockK);
  const int64_t ld = align_up(n, 4);
  torch::stable::Tensor sb_rows = empty_strided(out, {groups, k_blocks, ld}, {k_blocks * ld, ld, 1}, ScalarType::Float);
  {
    const int64_t total = groups * k_blocks * ld;
    const int threads = 256;
    const int blocks = static_cast<int>(std::min<int64_t>(ceil_div(total, threads), 4 * int64_t{num_sms_of(out)}));
    spread_block_scales<<<blocks, threads, 0, stream>>>(sb.const_data_ptr<float>(), sb.stride(0), sb.stride(1),
                                                        sb.stride(2), groups, k_blocks, n, ld,
                                                        sb_rows.mutable_data_ptr<float>());
    WGRAD_KERNEL_LAUNCH_CHECK();
  }

  const int block_n = choose_block_n(t, n, 1, out);
  GemmParamsSm90<GroupMode::MGrouped> p;
  check_tma_descriptor(op, "a", make_operand_desc(&p.tma_a, a.const_data_ptr(), t, k, a.stride(0), kTmaBoxRowsA));
  check_tma_descriptor(op, "b",
                       make_grouped_operand_desc(&p.tma_b, b.const_data_ptr(), groups, n, k, b.stride(1), b.stride(0),
                                                 block_n));
  check_tma_descriptor(op, "sa", make_scale_desc(&p.tma_sa, sa.const_data_ptr<float>(), t, k_blocks, sa.stride(1), kBlockM));
  check_tma_descriptor(op, "sb",
                       make_grouped_scale_desc(&p.tma_sb, sb_rows.const_data_ptr<float>(), groups, n, k_blocks, ld,
                                               block_n));
  p.group_k = group_sizes.const_data_ptr<int>();
  p.k = static_cast<int>(k);
  p.m_total = static_cast<int>(t);
  p.m_groups = static_cast<int>(groups);
  p.out_bf16 = Bf16OutView{static_cast<__nv_bfloat16*>(out.mutable_data_ptr()), out.stride(0), static_cast<int>(n)};
  // The grid's size: about the row tiles there can be (each group adds at most two partial ones to
  // ceil(T / 128)); the kernel counts the real ones from the sizes and its CTAs loop over them.
  p.scheduler = {static_cast<int>(ceil_div(t, kBlockM) + 2 * groups), static_cast<int>(ceil_div(n, block_n)), 1};
  launch(op, p, block_n, out);
}

}  // namespace wgrad
