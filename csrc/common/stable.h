// \brief The torch side of the host layer, through torch's stable ABI alone: the tensor type, the checks'
// error and its messages, output allocation, the device guard.
//
// Nothing in csrc/ includes ATen or c10: the host layer calls torch only through the stable C shim
// (aoti_torch_* and torch_* functions, whose signatures torch keeps), so one build loads in every torch from
// TORCH_TARGET_VERSION (setup.py: 2.11) on. The headers of a newer torch compile it as long as the target
// is defined: they hide whatever the target does not have. Device code (csrc/kernels/) never includes this
// file.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/device.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/HeaderOnlyArrayRef.h>
#include <torch/headeronly/util/shim_utils.h>

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

#ifndef TORCH_TARGET_VERSION
#error "setup.py defines TORCH_TARGET_VERSION: without it the headers offer what the torch at hand has"
#endif

namespace wgrad {

// (The tensor type is spelled torch::stable::Tensor everywhere: no alias named Tensor in namespace wgrad, where
// the kernels' CuTe code means cute::Tensor by it.)
using torch::headeronly::ScalarType;
// Sizes, strides and the schemas' int[] arguments (a borrowed view, like c10::IntArrayRef).
using IntArrayRef = torch::headeronly::IntHeaderOnlyArrayRef;
// Sets the current CUDA device for its scope (c10::cuda::CUDAGuard's job).
using DeviceGuard = torch::stable::accelerator::DeviceGuard;

// ---- the checks' error ------------------------------------------------------------------------------------

namespace detail {

// Message pieces, printed as ATen printed them: shapes and strides as [2, 3], devices as cuda:0 or cpu,
// dtypes by name (Float8_e4m3fn). The tests match these texts.
template <typename T>
void append(std::ostringstream& os, const T& v) {
  os << v;
}

inline void append(std::ostringstream& os, IntArrayRef v) {
  os << '[';
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << ']';
}

inline void append(std::ostringstream& os, const torch::stable::Device& d) {
  using torch::headeronly::DeviceType;
  switch (d.type()) {
    case DeviceType::CPU:
      os << "cpu";
      break;
    case DeviceType::CUDA:
      os << "cuda";
      break;
    case DeviceType::Meta:
      os << "meta";
      break;
    default:
      os << "device type " << static_cast<int>(d.type());
      break;
  }
  if (d.index() >= 0) os << ':' << d.index();
}

template <typename... Args>
std::string message(const Args&... args) {
  std::ostringstream os;
  (append(os, args), ...);
  return os.str();
}

}  // namespace detail

// The check of every op: std::runtime_error, which torch hands to Python as RuntimeError (as it did
// TORCH_CHECK's c10::Error), carrying the message alone: op, argument, expected and actual value.
#define WGRAD_CHECK(cond, ...)                                         \
  do {                                                                 \
    if (!(cond)) [[unlikely]] {                                        \
      throw std::runtime_error(::wgrad::detail::message(__VA_ARGS__)); \
    }                                                                  \
  } while (0)

// ---- outputs -----------------------------------------------------------------------------------------------
// Straight C shim calls (empty_strided, as_strided), not the dispatcher's boxed path: the casts allocate up to
// four outputs per call and small calls are bound by host time.

namespace detail {

inline int32_t shim_dtype(ScalarType t) {
  switch (t) {
    case ScalarType::Float:
      return aoti_torch_dtype_float32();
    case ScalarType::Int:
      return aoti_torch_dtype_int32();
    case ScalarType::Float8_e4m3fn:
      return aoti_torch_dtype_float8_e4m3fn();
    default:
      break;
  }
  throw std::runtime_error(message("wgrad: no output of dtype ", t, " is ever allocated"));
}

}  // namespace detail

// An uninitialised tensor of `sizes` with `strides` and `dtype` on like's device.
inline torch::stable::Tensor empty_strided(const torch::stable::Tensor& like, IntArrayRef sizes, IntArrayRef strides,
                                           ScalarType dtype) {
  int32_t device_type = 0;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(like.get(), &device_type));
  AtenTensorHandle out = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(static_cast<int64_t>(sizes.size()), sizes.data(), strides.data(),
                                                  detail::shim_dtype(dtype), device_type, like.get_device_index(),
                                                  &out));
  return torch::stable::Tensor(out);
}

// An uninitialised row-major [rows, cols] tensor of `dtype` on like's device.
inline torch::stable::Tensor empty_2d(const torch::stable::Tensor& like, int64_t rows, int64_t cols, ScalarType dtype) {
  return empty_strided(like, {rows, cols}, {cols, 1}, dtype);
}

// An uninitialised contiguous [n] tensor of `dtype` on like's device.
inline torch::stable::Tensor empty_1d(const torch::stable::Tensor& like, int64_t n, ScalarType dtype) {
  return empty_strided(like, {n}, {1}, dtype);
}

// A view of t's storage with `sizes` and `strides`, from t's first element.
inline torch::stable::Tensor as_strided(const torch::stable::Tensor& t, IntArrayRef sizes, IntArrayRef strides) {
  AtenTensorHandle out = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_as_strided(t.get(), sizes.data(), strides.data(), &out));
  return torch::stable::Tensor(out);
}

// A contiguous copy of t.
inline torch::stable::Tensor clone(const torch::stable::Tensor& t) {
  AtenTensorHandle out = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_clone(t.get(), &out));
  return torch::stable::Tensor(out);
}

}  // namespace wgrad
