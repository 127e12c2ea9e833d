// \brief Host-side facts about the device a call runs on (see device.h).
#include "common/device.h"

#include <array>
#include <mutex>

namespace wgrad {

namespace {

// What the host entries ask of a device, read once per device from the CUDA runtime (every call asks for
// the SM count: cudaGetDeviceProperties is far too slow for that).
struct DeviceFacts {
  int major = 0;
  int minor = 0;
  int sms = 0;
};

constexpr int kMaxDevices = 64;

const DeviceFacts& facts_of(int device) {
  WGRAD_CHECK(device >= 0 && device < kMaxDevices, "wgrad: CUDA device index ", device, " is out of range [0, ",
              kMaxDevices, ")");
  static std::mutex mutex;
  static std::array<DeviceFacts, kMaxDevices> facts;  // sms == 0: not read yet
  std::lock_guard<std::mutex> lock(mutex);
  DeviceFacts& f = facts[device];
  if (f.sms == 0) {
    DeviceFacts read;
    WGRAD_CUDA_CHECK(cudaDeviceGetAttribute(&read.major, cudaDevAttrComputeCapabilityMajor, device));
    WGRAD_CUDA_CHECK(cudaDeviceGetAttribute(&read.minor, cudaDevAttrComputeCapabilityMinor, device));
    WGRAD_CUDA_CHECK(cudaDeviceGetAttribute(&read.sms, cudaDevAttrMultiProcessorCount, device));
    f = read;
  }
  return f;
}

}  // namespace

void check_sm90(const char* op, const torch::stable::Tensor& t) {
  const int device = t.get_device_index();
  const DeviceFacts& f = facts_of(device);
  if (f.major == 9 && f.minor == 0) return;
  cudaDeviceProp prop{};  // (only for the message: the name)
  WGRAD_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  WGRAD_CHECK(false, op, ": needs an SM90 GPU (H100/H200/H800, compute capability 9.0); ", t.device(), " is ",
              prop.name, " with compute capability ", f.major, ".", f.minor);
}

int num_sms_of(const torch::stable::Tensor& t) { return facts_of(t.get_device_index()).sms; }

cudaStream_t current_stream(const torch::stable::Tensor& t) {
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(t.get_device_index(), &stream));
  return static_cast<cudaStream_t>(stream);
}

}  // namespace wgrad
