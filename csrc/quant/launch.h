// \brief Shared pieces of the quantization host entries (ATen side): the outputs in the layouts the GEMMs
// take (see the contract in registration.cpp), the kernels' parameters, the generic kernel's launch. The
// column casts' persistent kernel: colwise_launch.h.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>

#include "common/device.h"
#include "kernels/common/layout.h"
#include "kernels/quant/generic.cuh"
#include "kernels/quant/params.h"

namespace wgrad {

constexpr int64_t kQtRowAlign = 16;  // q_t rows are TMA-ready: 16-byte row stride
constexpr int64_t kVecElems = 8;     // one thread's columns: one aligned vector access

// ---- outputs ---------------------------------------------------------------------------------------------

// [mn, kb] float32 in the TMA-aligned MN-major layout: (m, kb) at kb * scale_ld(mn) + m.
inline at::Tensor empty_mn_major_scales(const at::Tensor& like, int64_t mn, int64_t kb) {
  return at::empty({kb, scale_ld(mn)}, like.options().dtype(at::kFloat)).narrow(1, 0, mn).t();
}

// [C, R] float8_e4m3fn with row stride align_up(R, 16) (R.. are padding, written as 0 by the kernels).
inline at::Tensor empty_q_t(const at::Tensor& x) {
  const int64_t r = x.size(0), c = x.size(1);
  return at::empty({c, align_up(r > 0 ? r : 1, kQtRowAlign)}, x.options().dtype(at::kFloat8_e4m3fn))
      .narrow(1, 0, r);
}

inline at::Tensor empty_q(const at::Tensor& x) { return at::empty(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn)); }

// ---- parameters ------------------------------------------------------------------------------------------

inline quant::QuantizeParams base_params(const at::Tensor& x, bool ue8m0) {
  quant::QuantizeParams p{};
  p.x = x.const_data_ptr();
  p.rows = x.size(0);
  p.cols = x.size(1);
  p.ue8m0 = ue8m0;
  return p;
}

inline void set_rowwise(quant::QuantizeParams& p, const at::Tensor& q, const at::Tensor& scales) {
  p.q = reinterpret_cast<uint8_t*>(q.data_ptr());
  p.scales = scales.data_ptr<float>();
  p.scales_ld = scale_ld(p.rows);
}

inline void set_colwise(quant::QuantizeParams& p, const at::Tensor& q_t, const at::Tensor& scales_t) {
  p.q_t = reinterpret_cast<uint8_t*>(q_t.data_ptr());
  p.q_t_ld = q_t.stride(0);
  p.scales_t = scales_t.data_ptr<float>();
  p.scales_t_ld = scale_ld(p.cols);
}

// Every row of x 16-byte aligned (C % 8 == 0 and an aligned base): the vector kernels' loads.
inline bool vector_rows(const quant::QuantizeParams& p) {
  return p.cols % kVecElems == 0 && reinterpret_cast<uintptr_t>(p.x) % kTmaAlignBytes == 0;
}

// f(T{}) for x's element type T (float, __half, __nv_bfloat16).
template <class F>
void dispatch_x_type(const at::Tensor& x, F&& f) {
  AT_DISPATCH_SWITCH(x.scalar_type(), "quantize_fp8_1x128",
                     AT_DISPATCH_CASE(at::kFloat, [&] { f(float{}); })
                     AT_DISPATCH_CASE(at::kHalf, [&] { f(__half{}); })
                     AT_DISPATCH_CASE(at::kBFloat16, [&] { f(__nv_bfloat16{}); }));
}

// ---- launches --------------------------------------------------------------------------------------------

// The generic tile kernel: one CTA per (row block, 128-column tile), element-wise accesses.
template <quant::QuantMode kMode, typename T>
void launch_generic(const quant::QuantizeParams& p, int64_t row_blocks, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(ceil_div(p.cols, kScaleBlockK)));
  quant::quantize_fp8_1x128_kernel<T, kMode><<<grid, quant::kThreads, 0, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace wgrad
