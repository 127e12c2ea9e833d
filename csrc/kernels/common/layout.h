// \brief Torch-free index math of the operand contract (shared by host entries, kernels and C++ tests).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define WGRAD_HOST_DEVICE __host__ __device__
#else
#define WGRAD_HOST_DEVICE
#endif

namespace wgrad {

constexpr int64_t kScaleBlockK = 128;   // 1x128 scaling granularity along K
constexpr int64_t kTmaAlignBytes = 16;  // TMA: base addresses and global strides

WGRAD_HOST_DEVICE constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
WGRAD_HOST_DEVICE constexpr int64_t align_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// Leading dimension of a TMA-aligned MN-major scale tensor: element (mn, kb) sits at kb * ld + mn.
WGRAD_HOST_DEVICE constexpr int64_t scale_ld(int64_t mn) { return align_up(mn > 0 ? mn : 1, 4); }

// Most 1x128 blocks a split of k_total columns into `groups` segments can need (blocks restart at
// every segment): at most one extra partial block per segment boundary.
WGRAD_HOST_DEVICE constexpr int64_t k_block_capacity(int64_t k_total, int64_t groups) {
  return ceil_div(k_total, kScaleBlockK) + groups - 1 > 0 ? ceil_div(k_total, kScaleBlockK) + groups - 1 : 0;
}

// q_t columns of the padded segments cast: the most sum_g align_up(size_g, pad) can be for sizes summing
// to `rows` (a multiple of pad, so of 16: TMA-ready). The last segment takes the columns left over.
WGRAD_HOST_DEVICE constexpr int64_t padded_segment_columns(int64_t rows, int64_t groups, int64_t pad) {
  return (rows + groups * (pad - 1)) / pad * pad;
}

}  // namespace wgrad
