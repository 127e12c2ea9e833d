// \brief Host-side facts about the CUDA device a call runs on, shared by the GEMM and quantization host
// entries: the SM90 check, the SM count, the current stream, and the CUDA runtime's errors as checks.
#pragma once

#include <cuda_runtime_api.h>

#include "common/stable.h"

namespace wgrad {

// t's CUDA device is an SM90 part (the kernels use wgmma, setmaxnreg and TMA).
void check_sm90(const char* op, const torch::stable::Tensor& t);

// SMs of t's CUDA device: the persistent kernels size their grids by it.
int num_sms_of(const torch::stable::Tensor& t);

// torch's current CUDA stream on t's device: every launch goes there.
cudaStream_t current_stream(const torch::stable::Tensor& t);

}  // namespace wgrad

// A CUDA runtime call that must succeed (C10_CUDA_CHECK's job).
#define WGRAD_CUDA_CHECK(call)                                                                            \
  do {                                                                                                    \
    const cudaError_t wgrad_cuda_error_ = (call);                                                         \
    WGRAD_CHECK(wgrad_cuda_error_ == cudaSuccess, "CUDA error: ", cudaGetErrorString(wgrad_cuda_error_)); \
  } while (0)

// After a <<<...>>> launch: a bad configuration shows up here, not at some later call.
#define WGRAD_KERNEL_LAUNCH_CHECK() WGRAD_CUDA_CHECK(cudaGetLastError())
