// \brief Reusable argument checks of the host entries. Every message names the op, the argument, the
// expected and the actual value.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "kernels/common/layout.h"

namespace wgrad {

// fp8 e4m3 operand [rows, k], K-contiguous, TMA-ready (16-byte row stride and base).
void check_fp8_operand(const char* op, const char* name, const at::Tensor& t, int64_t rows, int64_t k);

// fp32 scales [mn, kb], TMA-aligned MN-major (stride(0) == 1, stride(1) % 4 == 0, stride(1) >= mn).
void check_mn_major_scales(const char* op, const char* name, const at::Tensor& s, int64_t mn, int64_t kb);

// fp32 out whose last two dims are [m, n]: stride(-1) == 1, other strides multiples of 4, 16-byte base.
void check_fp32_out(const char* op, const at::Tensor& out, int64_t m, int64_t n);

// Every tensor on `ref`'s device.
void check_same_device(const char* op, const at::Tensor& ref, const char* name, const at::Tensor& t);

// t's CUDA device is an SM90 part (the kernels use wgmma, setmaxnreg and TMA).
void check_sm90(const char* op, const at::Tensor& t);

// SMs of t's CUDA device: the persistent kernels size their grids by it.
int num_sms_of(const at::Tensor& t);

// A tuning knob's value as a whole decimal integer: false for "", "2x", "yes".
bool parse_knob_int(const char* v, long* n);

}  // namespace wgrad
