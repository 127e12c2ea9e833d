// \brief Byte-exact stores of a 16-byte chunk into global memory, for q_t's edge sectors in the column
// quantization kernel (colwise_sm90.cuh) and for the store probes in scripts/experiments/, which
// compile without CUTLASS or torch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace wgrad::quant {

// Bytes [lo, hi) of a 16-byte chunk to its 16-byte aligned destination, with the widest aligned stores
// that fit (at most 1 + 1 + 3 + 1 + 1 stores), leaving the other bytes of the destination alone.
__device__ __forceinline__ void store_chunk_bytes(uint8_t* dst, const uint4& d, int lo, int hi) {
  auto word = [&](int b) { return b < 8 ? (b < 4 ? d.x : d.y) : (b < 12 ? d.z : d.w); };
  int b = lo;
  if ((b & 1) && b < hi) {
    dst[b] = static_cast<uint8_t>(word(b) >> (8 * (b & 3)));
    ++b;
  }
  if ((b & 2) && b + 2 <= hi) {
    *reinterpret_cast<uint16_t*>(dst + b) = static_cast<uint16_t>(word(b) >> 16);
    b += 2;
  }
  for (; b + 4 <= hi; b += 4) *reinterpret_cast<uint32_t*>(dst + b) = word(b);
  if (b + 2 <= hi) {
    *reinterpret_cast<uint16_t*>(dst + b) = static_cast<uint16_t>(word(b));
    b += 2;
  }
  if (b < hi) dst[b] = static_cast<uint8_t>(word(b) >> (8 * (b & 3)));
}

// Bytes [lo, hi) of q_t column row range [r0, r0 + 16) (r0 16-aligned), taken from the 16-byte chunk d
// that belongs there: one 16-byte store when the range covers it, byte-exact stores when only a part.
__device__ __forceinline__ void store_chunk_range(uint8_t* col_base, int64_t r0, const uint4& d, int64_t lo,
                                                  int64_t hi) {
  const int b0 = lo > r0 ? static_cast<int>(lo - r0) : 0;
  const int b1 = hi < r0 + 16 ? static_cast<int>(hi - r0) : 16;
  if (b0 == 0 && b1 == 16) {
    *reinterpret_cast<uint4*>(col_base + r0) = d;
  } else if (b0 < b1) {
    store_chunk_bytes(col_base + r0, d, b0, b1);
  }
}

}  // namespace wgrad::quant
