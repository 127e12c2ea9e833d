// \brief Host-side construction of TMA descriptors (CUtensorMap) without linking libcuda: the driver's
// cuTensorMapEncodeTiled is looked up through the runtime. Torch-free.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace wgrad {

// Encodes a tiled descriptor. dims/box are innermost-first; strides_bytes has rank-1 entries (the
// strides of dims 1..rank-1; dim 0 is contiguous). Returns an empty string on success, else the reason.
inline std::string encode_tma_descriptor(CUtensorMap* desc, CUtensorMapDataType dtype, int rank,
                                         const void* base, const uint64_t* dims,
                                         const uint64_t* strides_bytes, const uint32_t* box,
                                         CUtensorMapSwizzle swizzle) {
  using EncodeFn = decltype(&cuTensorMapEncodeTiled);
  static EncodeFn encode = []() -> EncodeFn {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &status) !=
            cudaSuccess ||
        status != cudaDriverEntryPointSuccess) {
      return nullptr;
    }
    return reinterpret_cast<EncodeFn>(fn);
  }();
  if (encode == nullptr) return "cuTensorMapEncodeTiled is not available from the CUDA driver";
  uint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  auto call = [&] {
    return encode(desc, dtype, rank, const_cast<void*>(base), dims, strides_bytes, box, elem_strides,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  };
  CUresult r = call();
  if (r == CUDA_ERROR_INVALID_CONTEXT) {
    // A driver call needs a current context, and a thread that has made no runtime call yet has none
    // (autograd's backward threads, when a wgrad op is the first thing they run): cudaFree(nullptr) makes
    // the device's primary context current in this thread, then the encode is retried once.
    cudaFree(nullptr);
    r = call();
  }
  if (r != CUDA_SUCCESS) return "cuTensorMapEncodeTiled failed with CUresult " + std::to_string(static_cast<int>(r));
  return {};
}

// A descriptor of a row-major matrix [rows, cols] of elem_bytes-byte elements whose rows lie `pitch` elements
// apart, with boxes of box_cols x box_rows elements and no swizzle (encode_tma_descriptor's result).
inline std::string encode_matrix_descriptor(CUtensorMap* desc, CUtensorMapDataType dtype, int elem_bytes,
                                            const void* base, int64_t rows, int64_t cols, int64_t pitch,
                                            int box_cols, int box_rows) {
  const uint64_t dims[2] = {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)};
  const uint64_t strides[1] = {static_cast<uint64_t>(pitch) * static_cast<uint64_t>(elem_bytes)};
  const uint32_t box[2] = {static_cast<uint32_t>(box_cols), static_cast<uint32_t>(box_rows)};
  return encode_tma_descriptor(desc, dtype, 2, base, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_NONE);
}

}  // namespace wgrad
