// \brief The dynamic shared memory a kernel may use, raised once per kernel and device. Torch-free.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <utility>

namespace wgrad {

// cudaFuncSetAttribute(kernel, MaxDynamicSharedMemorySize, bytes) where the kernel does not already allow
// `bytes` on the current device: the attribute stays set in the device's context, so a launch needs no driver
// call for it after the first (a GEMM's whole host path is ~9 us).
inline cudaError_t allow_dynamic_smem(const void* kernel, int bytes) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  static std::mutex mutex;
  // (Never freed: nothing in it outlives its use, and no destructor runs after the CUDA runtime's at exit.)
  static auto* allowed = new std::map<std::pair<const void*, int>, int>();
  std::lock_guard<std::mutex> lock(mutex);
  int& current = (*allowed)[{kernel, device}];
  if (bytes <= current) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess) current = bytes;
  return err;
}

}  // namespace wgrad
