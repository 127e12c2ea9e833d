// \brief Host entry points of every torch.ops.wgrad op (declared once, registered in registration.cpp). Their
// argument checks: checks.h.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <tuple>

namespace wgrad {

// ---- SM90 GEMMs (gemm/dense.cu, gemm/grouped_packed.cu, gemm/grouped_contiguous.cu) --------------------
void wgrad_gemm_fp8_fp8_fp32_nt_cuda(const at::Tensor& a, const at::Tensor& sa, const at::Tensor& b,
                                     const at::Tensor& sb, const at::Tensor& out);
void k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_cuda(const at::Tensor& a, const at::Tensor& sa,
                                               const at::Tensor& b, const at::Tensor& sb,
                                               const at::Tensor& out, c10::IntArrayRef ks);
void k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous_cuda(const at::Tensor& a, const at::Tensor& sa,
                                                          const at::Tensor& b, const at::Tensor& sb,
                                                          const at::Tensor& out, const at::Tensor& ks);

// ---- quantization (quant/rowwise.cu, quant/colwise.cu, quant/segments.cu, quant/blockwise.cu) ----------
std::tuple<at::Tensor, at::Tensor> quantize_fp8_1x128_rowwise_cuda(const at::Tensor& x, bool ue8m0);
std::tuple<at::Tensor, at::Tensor> quantize_fp8_1x128_colwise_cuda(const at::Tensor& x, bool ue8m0);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_fp8_1x128_both_cuda(
    const at::Tensor& x, bool ue8m0);
std::tuple<at::Tensor, at::Tensor> quantize_fp8_1x128_colwise_segments_cuda(const at::Tensor& x,
                                                                            const at::Tensor& sizes,
                                                                            bool ue8m0);
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_fp8_1x128_colwise_segments_padded_cuda(
    const at::Tensor& x, const at::Tensor& sizes, int64_t pad, bool ue8m0);
// The segments casts with an explicit plan (quant/plan.h): pad 0 the unpadded cast (padded_sizes: a copy of
// sizes), else the padded one.
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_fp8_1x128_colwise_segments_with_plan_cuda(
    const at::Tensor& x, const at::Tensor& sizes, int64_t pad, bool ue8m0, c10::string_view plan);
// The 128x128 weight cast: q, scales, q_t, scales_t.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_fp8_128x128_cuda(const at::Tensor& w,
                                                                                     bool ue8m0);

}  // namespace wgrad
