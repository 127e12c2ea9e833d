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
  const CUresult r = encode(desc, dtype, rank, const_cast<void*>(base), dims, strides_bytes, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return "cuTensorMapEncodeTiled failed with CUresult " + std::to_string(static_cast<int>(r));
  return {};
}

}  // namespace wgrad
