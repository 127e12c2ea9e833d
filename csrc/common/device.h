// \brief Host-side (ATen) facts about the device a call runs on, shared by the GEMM and quantization
// host entries.
#pragma once

#include <ATen/core/Tensor.h>

namespace wgrad {

// t's CUDA device is an SM90 part (the kernels use wgmma, setmaxnreg and TMA).
void check_sm90(const char* op, const at::Tensor& t);

// SMs of t's CUDA device: the persistent kernels size their grids by it.
int num_sms_of(const at::Tensor& t);

}  // namespace wgrad
