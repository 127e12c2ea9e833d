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

// Division of non-negative 31-bit integers by a divisor fixed at launch, without a divide instruction
// (a GPU has none: a run-time `/` is a ~20-instruction sequence through a float reciprocal). With
// s = ceil(log2 d) and m = floor(2^32 (2^s - d) / d) + 1, n / d = (umulhi(n, m) + n) >> s for every
// 0 <= n < 2^31 (the sum cannot overflow 32 bits there); the C++ tests check it against `/`.
struct Divisor {
  uint32_t d = 1;
  uint32_t magic = 1;  // m (d = 1: the quotient is n itself, umulhi(n, 1) = 0)
  uint32_t shift = 0;  // s

  Divisor() = default;
  // 1 <= divisor < 2^31 (host only).
  explicit Divisor(int divisor) : d(static_cast<uint32_t>(divisor)) {
    while ((uint64_t{1} << shift) < d) ++shift;
    magic = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }

  WGRAD_HOST_DEVICE int div(int n) const {
    const uint32_t u = static_cast<uint32_t>(n);
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(u, magic);
#else
    const uint32_t hi = static_cast<uint32_t>((uint64_t{u} * magic) >> 32);
#endif
    return static_cast<int>((hi + u) >> shift);
  }
  WGRAD_HOST_DEVICE int mod(int n, int quotient) const { return n - quotient * static_cast<int>(d); }
};

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
