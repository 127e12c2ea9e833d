// \brief Shared pieces of the quantization host entries (torch side, stable ABI): the outputs in the layouts the GEMMs
// take (see the contract in registration.cpp), the kernels' parameters, the generic kernel's launch. The
// column casts' persistent kernel: colwise_launch.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/device.h"
#include "kernels/common/layout.h"
#include "kernels/quant/generic.cuh"
#include "kernels/quant/params.h"

namespace wgrad {

constexpr int64_t kQtRowAlign = 16;  // q_t rows are TMA-ready: 16-byte row stride
constexpr int64_t kVecElems = 8;     // one thread's columns: one aligned vector access

// ---- outputs ---------------------------------------------------------------------------------------------

// [mn, kb] float32 in the TMA-aligned MN-major layout: (m, kb) at kb * scale_ld(mn) + m, in a storage of kb
// whole columns of scale_ld(mn) (the rows past mn included).
inline torch::stable::Tensor empty_mn_major_scales(const torch::stable::Tensor& like, int64_t mn, int64_t kb) {
  const int64_t ld = scale_ld(mn);
  return as_strided(empty_2d(like, kb, ld, ScalarType::Float), {mn, kb}, {1, ld});
}

// [C, R] float8_e4m3fn with row stride align_up(R, 16) (R.. are padding, written as 0 by the kernels).
inline torch::stable::Tensor empty_q_t(const torch::stable::Tensor& x) {
  const int64_t r = x.size(0), c = x.size(1);
  const int64_t ld = align_up(r > 0 ? r : 1, kQtRowAlign);
  return as_strided(empty_2d(x, c, ld, ScalarType::Float8_e4m3fn), {c, r}, {ld, 1});
}

inline torch::stable::Tensor empty_q(const torch::stable::Tensor& x) {
  return empty_2d(x, x.size(0), x.size(1), ScalarType::Float8_e4m3fn);
}

// ---- parameters ------------------------------------------------------------------------------------------

inline quant::QuantizeParams base_params(const torch::stable::Tensor& x, bool ue8m0) {
  quant::QuantizeParams p{};
  p.x = x.const_data_ptr();
  p.rows = x.size(0);
  p.cols = x.size(1);
  p.ue8m0 = ue8m0;
  return p;
}

inline void set_rowwise(quant::QuantizeParams& p, const torch::stable::Tensor& q, const torch::stable::Tensor& scales) {
  p.q = static_cast<uint8_t*>(q.mutable_data_ptr());
  p.scales = scales.mutable_data_ptr<float>();
  p.scales_ld = scale_ld(p.rows);
}

inline void set_colwise(quant::QuantizeParams& p, const torch::stable::Tensor& q_t,
                        const torch::stable::Tensor& scales_t) {
  p.q_t = static_cast<uint8_t*>(q_t.mutable_data_ptr());
  p.q_t_ld = q_t.stride(0);
  p.scales_t = scales_t.mutable_data_ptr<float>();
  p.scales_t_ld = scale_ld(p.cols);
}

// Every row of x 16-byte aligned (C % 8 == 0 and an aligned base): the vector kernels' loads.
inline bool vector_rows(const quant::QuantizeParams& p) {
  return p.cols % kVecElems == 0 && reinterpret_cast<uintptr_t>(p.x) % kTmaAlignBytes == 0;
}

// f(T{}) for x's element type T (float, __half, __nv_bfloat16); the checks admit no other.
template <class F>
void dispatch_x_type(const torch::stable::Tensor& x, F&& f) {
  switch (x.scalar_type()) {
    case ScalarType::Float:
      f(float{});
      return;
    case ScalarType::Half:
      f(__half{});
      return;
    case ScalarType::BFloat16:
      f(__nv_bfloat16{});
      return;
    default:
      WGRAD_CHECK(false, "quantize_fp8_1x128: no kernel for dtype ", x.scalar_type());
  }
}

// ---- launches --------------------------------------------------------------------------------------------

// The generic tile kernel: one CTA per (row block, 128-column tile), element-wise accesses.
template <quant::QuantMode kMode, typename T>
void launch_generic(const quant::QuantizeParams& p, int64_t row_blocks, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(ceil_div(p.cols, kScaleBlockK)));
  quant::quantize_fp8_1x128_kernel<T, kMode><<<grid, quant::kThreads, 0, stream>>>(p);
  WGRAD_KERNEL_LAUNCH_CHECK();
}

// The row-wise kernel (quant/rowwise.cu) on x's outputs in p (q, scales); nothing for an empty x.
void launch_rowwise_cast(const torch::stable::Tensor& x, const quant::QuantizeParams& p, cudaStream_t stream);

}  // namespace wgrad
