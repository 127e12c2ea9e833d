// \brief Host entry points of every torch.ops.wgrad op (declared once, registered in registration.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <tuple>

namespace wgrad {

// ---- argument checks (checks.cpp): the source of truth for every op's contract ----------------------
// Each throws c10::Error naming the argument, the expected and the actual value, and writes nothing.
void check_wgrad_gemm_fp8_fp8_fp32_nt(const at::Tensor& a, const at::Tensor& sa, const at::Tensor& b,
                                      const at::Tensor& sb, const at::Tensor& out);
void check_k_grouped_wgrad_gemm_fp8_fp8_fp32_nt(const at::Tensor& a, const at::Tensor& sa,
                                                const at::Tensor& b, const at::Tensor& sb,
                                                const at::Tensor& out, c10::IntArrayRef ks);
void check_k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous(const at::Tensor& a, const at::Tensor& sa,
                                                           const at::Tensor& b, const at::Tensor& sb,
                                                           const at::Tensor& out, const at::Tensor& ks);

// ---- SM90 GEMMs (gemm/dense.cu, gemm/grouped_*.cu) -------------------------------------------------------
void wgrad_gemm_fp8_fp8_fp32_nt_cuda(const at::Tensor& a, const at::Tensor& sa, const at::Tensor& b,
                                     const at::Tensor& sb, const at::Tensor& out);
void k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_cuda(const at::Tensor& a, const at::Tensor& sa,
                                               const at::Tensor& b, const at::Tensor& sb,
                                               const at::Tensor& out, c10::IntArrayRef ks);
void k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous_cuda(const at::Tensor& a, const at::Tensor& sa,
                                                          const at::Tensor& b, const at::Tensor& sb,
                                                          const at::Tensor& out, const at::Tensor& ks);

// ---- quantization (quant/quantize.cu) ---------------------------------------------------------------------
void check_quantize_fp8_1x128(const at::Tensor& x);
void check_quantize_fp8_1x128_segments(const at::Tensor& x, const at::Tensor& sizes);
void check_quantize_fp8_1x128_segments_padded(const at::Tensor& x, const at::Tensor& sizes, int64_t pad);

std::tuple<at::Tensor, at::Tensor> quantize_fp8_1x128_rowwise_cuda(const at::Tensor& x, bool ue8m0);
std::tuple<at::Tensor, at::Tensor> quantize_fp8_1x128_colwise_cuda(const at::Tensor& x, bool ue8m0);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_fp8_1x128_both_cuda(
    const at::Tensor& x, bool ue8m0);
std::tuple<at::Tensor, at::Tensor> quantize_fp8_1x128_colwise_segments_cuda(const at::Tensor& x,
                                                                            const at::Tensor& sizes,
                                                                            bool ue8m0);
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_fp8_1x128_colwise_segments_padded_cuda(
    const at::Tensor& x, const at::Tensor& sizes, int64_t pad, bool ue8m0);

}  // namespace wgrad
