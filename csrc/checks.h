// \brief Every op's argument checks: the source of truth of the contract written beside the schemas in
// registration.cpp. Each throws std::runtime_error (WGRAD_CHECK) naming the op, the argument, the expected and the
// actual value, and writes nothing. The host entries call them before any launch; the `_check_*` ops expose them to the
// Python CPU kernels (python/wgrad/_ops.py, quant.py, _plans.py), whose fake kernels mirror them.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/stable.h"

namespace wgrad {

// ---- GEMMs ---------------------------------------------------------------------------------------------
void check_wgrad_gemm_fp8_fp8_fp32_nt(const torch::stable::Tensor& a, const torch::stable::Tensor& sa,
                                      const torch::stable::Tensor& b, const torch::stable::Tensor& sb,
                                      const torch::stable::Tensor& out);
// The bf16 forms: the same operands, out bfloat16 (strides multiples of 8 elements).
void check_wgrad_gemm_fp8_fp8_bf16_nt(const torch::stable::Tensor& a, const torch::stable::Tensor& sa,
                                      const torch::stable::Tensor& b, const torch::stable::Tensor& sb,
                                      const torch::stable::Tensor& out);
void check_k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous(
    const torch::stable::Tensor& a, const torch::stable::Tensor& sa, const torch::stable::Tensor& b,
    const torch::stable::Tensor& sb, const torch::stable::Tensor& out, const torch::stable::Tensor& ks);
void check_k_grouped_wgrad_gemm_fp8_fp8_fp32_nt(const torch::stable::Tensor& a, const torch::stable::Tensor& sa,
                                                const torch::stable::Tensor& b, const torch::stable::Tensor& sb,
                                                const torch::stable::Tensor& out, IntArrayRef ks);
void check_k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous(
    const torch::stable::Tensor& a, const torch::stable::Tensor& sa, const torch::stable::Tensor& b,
    const torch::stable::Tensor& sb, const torch::stable::Tensor& out, const torch::stable::Tensor& ks);
void check_m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(const torch::stable::Tensor& a, const torch::stable::Tensor& sa,
                                                     const torch::stable::Tensor& b, const torch::stable::Tensor& sb,
                                                     const torch::stable::Tensor& out,
                                                     const torch::stable::Tensor& group_sizes);

// ---- quantization: the pieces, for the messages of the op `op` ---------------------------------------
// x of every cast: 2-D, bfloat16 / float16 / float32, contiguous, at most 2^31 - 1 rows and 65535 column
// tiles.
void check_quantize_input(const char* op, const torch::stable::Tensor& x);
// sizes of the segments casts: int32 [G >= 1], contiguous, on x's device; on the CPU also each >= 0 and
// summing to R (on CUDA the kernels validate them, without a host synchronisation).
void check_segment_sizes(const char* op, const torch::stable::Tensor& x, const torch::stable::Tensor& sizes);
// pad of the padded segments cast: 16, 32, 64 or 128.
void check_segment_pad(const char* op, int64_t pad);

// ---- quantization: the `_check_*` ops -----------------------------------------------------------------
void check_quantize_fp8_1x128(const torch::stable::Tensor& x);
void check_quantize_fp8_1x128_segments(const torch::stable::Tensor& x, const torch::stable::Tensor& sizes);
void check_quantize_fp8_1x128_segments_padded(const torch::stable::Tensor& x, const torch::stable::Tensor& sizes,
                                              int64_t pad);
// The same rules for the row-wise cast and the padded segments cast from one read of x.
void check_quantize_fp8_1x128_both_segments_padded(const torch::stable::Tensor& x, const torch::stable::Tensor& sizes,
                                                   int64_t pad);
// The weight of the 128x128 cast: 2-D, bf16/fp16/fp32, contiguous.
void check_quantize_fp8_128x128(const torch::stable::Tensor& w);
// The plan string of _quantize_fp8_1x128_colwise_segments_with_plan (quant/plan.h).
void check_quantize_fp8_1x128_segments_plan(std::string_view plan);

}  // namespace wgrad
