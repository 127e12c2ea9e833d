// \brief Host-side (ATen) facts about the device a call runs on (see device.h).
#include "common/device.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/util/Exception.h>

namespace wgrad {

void check_sm90(const char* op, const at::Tensor& t) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(t.device().index());
  TORCH_CHECK(prop->major == 9 && prop->minor == 0, op,
              ": needs an SM90 GPU (H100/H200/H800, compute capability 9.0); ", t.device(), " is ", prop->name,
              " with compute capability ", prop->major, ".", prop->minor);
}

int num_sms_of(const at::Tensor& t) { return at::cuda::getDeviceProperties(t.device().index())->multiProcessorCount; }

}  // namespace wgrad
