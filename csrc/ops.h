// \brief Host entry points of every torch.ops.wgrad op (declared once, registered in registration.cpp). Their
// argument checks: checks.h.
#pragma once

#include <cstdint>
#include <string_view>
#include <tuple>

#include "common/stable.h"

namespace wgrad {

// ---- SM90 GEMMs (gemm/dense.cu, gemm/grouped_packed.cu, gemm/grouped_contiguous.cu, gemm/m_grouped.cu) ---
void wgrad_gemm_fp8_fp8_fp32_nt_cuda(const torch::stable::Tensor& a, const torch::stable::Tensor& sa,
                                     const torch::stable::Tensor& b, const torch::stable::Tensor& sb,
                                     const torch::stable::Tensor& out);
void k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_cuda(const torch::stable::Tensor& a, const torch::stable::Tensor& sa,
                                               const torch::stable::Tensor& b, const torch::stable::Tensor& sb,
                                               const torch::stable::Tensor& out, IntArrayRef ks);
void k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous_cuda(
    const torch::stable::Tensor& a, const torch::stable::Tensor& sa, const torch::stable::Tensor& b,
    const torch::stable::Tensor& sb, const torch::stable::Tensor& out, const torch::stable::Tensor& ks);
// The weight gradient in bf16, written (out = bf16(a b^T), empty groups zeros): for a gradient with no fp32
// accumulation buffer.
void wgrad_gemm_fp8_fp8_bf16_nt_cuda(const torch::stable::Tensor& a, const torch::stable::Tensor& sa,
                                     const torch::stable::Tensor& b, const torch::stable::Tensor& sb,
                                     const torch::stable::Tensor& out);
void k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous_cuda(
    const torch::stable::Tensor& a, const torch::stable::Tensor& sa, const torch::stable::Tensor& b,
    const torch::stable::Tensor& sb, const torch::stable::Tensor& out, const torch::stable::Tensor& ks);
void m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_cuda(const torch::stable::Tensor& a, const torch::stable::Tensor& sa,
                                                    const torch::stable::Tensor& b, const torch::stable::Tensor& sb,
                                                    const torch::stable::Tensor& out,
                                                    const torch::stable::Tensor& group_sizes);

// ---- quantization (quant/rowwise.cu, quant/colwise.cu, quant/segments.cu, quant/blockwise.cu) ----------
std::tuple<torch::stable::Tensor, torch::stable::Tensor> quantize_fp8_1x128_rowwise_cuda(const torch::stable::Tensor& x,
                                                                                         bool ue8m0);
std::tuple<torch::stable::Tensor, torch::stable::Tensor> quantize_fp8_1x128_colwise_cuda(const torch::stable::Tensor& x,
                                                                                         bool ue8m0);
std::tuple<torch::stable::Tensor, torch::stable::Tensor, torch::stable::Tensor, torch::stable::Tensor>
quantize_fp8_1x128_both_cuda(const torch::stable::Tensor& x, bool ue8m0);
std::tuple<torch::stable::Tensor, torch::stable::Tensor> quantize_fp8_1x128_colwise_segments_cuda(
    const torch::stable::Tensor& x, const torch::stable::Tensor& sizes, bool ue8m0);
std::tuple<torch::stable::Tensor, torch::stable::Tensor, torch::stable::Tensor>
quantize_fp8_1x128_colwise_segments_padded_cuda(const torch::stable::Tensor& x, const torch::stable::Tensor& sizes,
                                                int64_t pad, bool ue8m0);
// The row-wise cast and the padded segments cast from one read of x: q, scales, q_t, scales_t, padded_sizes.
std::tuple<torch::stable::Tensor, torch::stable::Tensor, torch::stable::Tensor, torch::stable::Tensor,
           torch::stable::Tensor>
quantize_fp8_1x128_both_segments_padded_cuda(const torch::stable::Tensor& x, const torch::stable::Tensor& sizes,
                                             int64_t pad, bool ue8m0);
// The segments casts with an explicit plan (quant/plan.h): pad 0 the unpadded cast (padded_sizes: a copy of
// sizes), else the padded one.
std::tuple<torch::stable::Tensor, torch::stable::Tensor, torch::stable::Tensor>
quantize_fp8_1x128_colwise_segments_with_plan_cuda(const torch::stable::Tensor& x, const torch::stable::Tensor& sizes,
                                                   int64_t pad, bool ue8m0, std::string_view plan);
// The 128x128 weight cast: q, scales, q_t, scales_t.
std::tuple<torch::stable::Tensor, torch::stable::Tensor, torch::stable::Tensor, torch::stable::Tensor>
quantize_fp8_128x128_cuda(const torch::stable::Tensor& w, bool ue8m0);

}  // namespace wgrad
