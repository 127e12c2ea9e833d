// \brief Torch-free numerics of the FP8 1x128 quantization kernels: block scales, the multiplication by
// a scale's reciprocal, e4m3 packing, and the element loads they share.
//
// Numerics (python/wgrad/reference.py is the definition; every kernel matches it bit for bit):
//   a      = |x| in fp32, with NaN and +-Inf mapped to +Inf
//   amax   = max of a over the 128-element block
//   block with amax == +Inf (any NaN or Inf in it): scale = NaN (0x7FC00000), every q = NaN (0x7F)
//   else   scale = max(amax, 1e-4f) / 448            (IEEE fp32 division)
//          ue8m0: scale = 2^ceil(log2(scale))        (exact, from the fp32 bits)
//          r = 1 / scale                             (IEEE fp32 division, once per block)
//          q = e4m3_rne(clamp(x * r, -448, 448))      (fp32 product; ue8m0: exactly x / scale)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>
#include <type_traits>

namespace wgrad::quant {

constexpr int kBlock = 128;        // 1x128 scaling block
constexpr int kColsPerThread = 8;  // one 16-byte load of bf16/fp16 (two of fp32)

constexpr float kE4m3Max = 448.0f;
constexpr float kAmaxFloor = 1e-4f;
constexpr uint32_t kScaleNanBits = 0x7FC00000u;  // scale of a block holding NaN or Inf
constexpr uint8_t kQNan = 0x7F;                  // e4m3fn NaN: every q of such a block
constexpr uint32_t kQNanWord = 0x7F7F7F7Fu;      // four of them

// |v| with NaN and Inf mapped to +Inf, so that one max-reduction also detects non-finite blocks
// (fmaxf would silently drop a NaN).
__device__ __forceinline__ float abs_or_inf(float v) {
  const float a = fabsf(v);
  return a <= FLT_MAX ? a : __int_as_float(0x7F800000);
}

__device__ __forceinline__ float block_scale(float amax, bool ue8m0) {
  if (!(amax <= FLT_MAX)) return __uint_as_float(kScaleNanBits);
  const float s = __fdiv_rn(fmaxf(amax, kAmaxFloor), kE4m3Max);
  if (!ue8m0) return s;
  // s is a positive normal number (>= 1e-4 / 448), so rounding up to a power of two is: keep it if the
  // mantissa is zero, else bump the exponent and clear the mantissa. Never overflows (s < 2^120).
  uint32_t bits = __float_as_uint(s);
  if (bits & 0x007FFFFFu) bits = (bits & 0x7F800000u) + 0x00800000u;
  return __uint_as_float(bits);
}

// ------------------------------------------------------------------ x * (1 / scale) -----------------
// Every element is multiplied by its block's r = RN(1 / s) (IEEE fp32 division, once per block) and the
// product, rounded to fp32, is converted to e4m3 with round-to-nearest-even and saturation: one FMUL per
// element. This is the rule of DeepGEMM's per_token_cast_to_fp8 (`x * (1.0 / sf)`, sf = amax / 448, and
// its ue8m0 mode with the scale rounded up to a power of two from the fp32 bits), so our casts match it
// bit for bit (tests/test_quant.py). With ue8m0 scales r is exact and x r == x / s exactly.
// (The IEEE quotient x / s, an earlier rule, needs a three-instruction fma sequence per element: two more
// FFMAs per element, ~130 of ~790 instructions per warp and tile of the column kernel. Both-at-once, which
// is issue-bound, was faster without them; Colwise, bound by the memory system, was not.)
// Clamp: cvt.rn.satfinite maps every finite value beyond +-448 to +-448, exactly what the reference's
// clamp does before rounding, and the clamp is the identity elsewhere.
// r must be RN(1/s) exactly (torch's `1.0 / scale`). __frcp_rn would give it, plus a slow-path call for
// subnormal and huge inputs (that scales never are): a stack frame and spills in every kernel. Instead, in
// fp64 (full rate on SM90), two Newton steps from rcp.approx (relative error <= 2^-22): e0 = 1 - s y0 is
// exact (a 24 x 24-bit product), y1 is within 2^-44 + 2^-53 of 1/s, and y2 within 2^-52; then rounding y2
// to fp32 gives RN(1/s), because 1/s is at least 2^-49 (relative) away from every fp32 midpoint m:
// 1 - s m is a non-zero multiple of 2^-48 for s in [1, 2) (s m = S (2k + 1) 2^-48 with S the 24-bit
// significand of s, and 2^48 = S (2k + 1) is impossible).
// Once per block; NaN scales give NaN (never used: quantize_quad then writes NaN codes).
__device__ __forceinline__ float scale_reciprocal(float scale) {
  float approx;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(approx) : "f"(scale));
  const double s = scale;
  double y = approx;
  y = __fma_rn(y, __fma_rn(-s, y, 1.0), y);
  y = __fma_rn(y, __fma_rn(-s, y, 1.0), y);
  return __double2float_rn(y);
}

// Quantizes v0..v3 with one block's scale into four e4m3 bytes (v0 in the low byte). A NaN scale (the
// block holds NaN or Inf) gives four NaN codes.
__device__ __forceinline__ uint32_t quantize_quad(float v0, float v1, float v2, float v3, float scale,
                                                  float inv_scale) {
  const float t0 = __fmul_rn(v0, inv_scale);
  const float t1 = __fmul_rn(v1, inv_scale);
  const float t2 = __fmul_rn(v2, inv_scale);
  const float t3 = __fmul_rn(v3, inv_scale);
  // satfinite: the clamp (see above).
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(t0, t1), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(t2, t3), __NV_SATFINITE, __NV_E4M3);
  return isnan(scale) ? kQNanWord : (lo | (hi << 16));
}

// Eight consecutive values of one block as two words of q.
__device__ __forceinline__ uint2 quantize_eight(const float (&v)[kColsPerThread], float scale, float inv_scale) {
  return make_uint2(quantize_quad(v[0], v[1], v[2], v[3], scale, inv_scale),
                    quantize_quad(v[4], v[5], v[6], v[7], scale, inv_scale));
}

// ------------------------------------------------------------------ loads -----------------------------

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// 16 bytes of x as 8 elements (bf16/fp16) or 4 (fp32): the raw form a load is kept in until it is used.
template <typename T>
struct RawVec {
  static constexpr int kLoads = sizeof(T) * kColsPerThread / 16;  // 16-byte loads per 8 elements
  uint4 raw[kLoads];
};

template <typename T>
__device__ __forceinline__ void load8_global_raw(const T* p, RawVec<T>& r) {
#pragma unroll
  for (int k = 0; k < RawVec<T>::kLoads; ++k) r.raw[k] = __ldg(reinterpret_cast<const uint4*>(p) + k);
}

// Bits of one element, and 8 elements packed into the raw form (for element-wise loads).
__device__ __forceinline__ uint32_t element_bits(float v) { return __float_as_uint(v); }
__device__ __forceinline__ uint32_t element_bits(__half v) { return __half_as_ushort(v); }
__device__ __forceinline__ uint32_t element_bits(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }

template <typename T>
__device__ __forceinline__ void pack8_raw(const T (&e)[kColsPerThread], RawVec<T>& r) {
  uint32_t w[kColsPerThread];
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int j = 0; j < kColsPerThread; ++j) w[j] = element_bits(e[j]);
  } else {
#pragma unroll
    for (int j = 0; j < kColsPerThread / 2; ++j) w[j] = element_bits(e[2 * j]) | (element_bits(e[2 * j + 1]) << 16);
  }
#pragma unroll
  for (int k = 0; k < RawVec<T>::kLoads; ++k) r.raw[k] = make_uint4(w[4 * k], w[4 * k + 1], w[4 * k + 2], w[4 * k + 3]);
}

template <typename T>
__device__ __forceinline__ void unpack8(const RawVec<T>& r, float (&v)[kColsPerThread]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    // A bf16 is the high half of the fp32 it widens to: one shift or mask per element (the conversion
    // intrinsic costs a byte permute plus a multiply for the high halfword).
    const uint32_t w[4] = {r.raw[0].x, r.raw[0].y, r.raw[0].z, r.raw[0].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = __uint_as_float(w[i] << 16);
      v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
  } else {
    const T* e = reinterpret_cast<const T*>(r.raw);
#pragma unroll
    for (int j = 0; j < kColsPerThread; ++j) v[j] = to_float(e[j]);
  }
}

// ------------------------------------------------------------------ amax on raw bits ------------------
// |v| of a bf16/fp16/fp32 value is its bit pattern with the sign cleared, and for non-negative values
// (including subnormals) unsigned integer order is numeric order, with +Inf above every finite value and
// NaNs above +Inf. So max |x| over a block is an unsigned max of the masked bits: exact, NaN-propagating
// (a NaN or Inf shows up as bits >= the +Inf pattern), and two 16-bit elements per instruction
// (max.u16x2 with the mask 0x7FFF7FFF) instead of fabs + compare + select + fmax per element.
template <typename T>
constexpr uint32_t kInfBits = sizeof(T) == 4 ? 0x7F800000u : (std::is_same_v<T, __half> ? 0x7C00u : 0x7F80u);

// Running max of |element| bits; for 16-bit types both halfwords of m hold a running max.
template <typename T>
__device__ __forceinline__ uint32_t abs_bits_max(const RawVec<T>& r, uint32_t m) {
#pragma unroll
  for (int k = 0; k < RawVec<T>::kLoads; ++k) {
    const uint32_t w[4] = {r.raw[k].x, r.raw[k].y, r.raw[k].z, r.raw[k].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (sizeof(T) == 4) {
        m = max(m, w[i] & 0x7FFFFFFFu);
      } else {
        m = __vmaxu2(m, w[i] & 0x7FFF7FFFu);
      }
    }
  }
  return m;
}

// The max of both halfwords (16-bit types): one element's bits.
template <typename T>
__device__ __forceinline__ uint32_t fold_abs_bits(uint32_t m) {
  if constexpr (sizeof(T) == 4) {
    return m;
  } else {
    return max(m & 0xFFFFu, m >> 16);
  }
}

// The block amax as a float: +Inf for a block holding NaN or Inf (then block_scale gives NaN).
template <typename T>
__device__ __forceinline__ float amax_from_bits(uint32_t bits) {
  if (bits >= kInfBits<T>) return __int_as_float(0x7F800000);
  if constexpr (sizeof(T) == 4) {
    return __uint_as_float(bits);
  } else if constexpr (std::is_same_v<T, __half>) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  } else {
    return __uint_as_float(bits << 16);
  }
}

// 8 consecutive elements from shared memory (16-byte aligned), raw.
template <typename T>
__device__ __forceinline__ void load8_shared_raw(const T* p, RawVec<T>& r) {
#pragma unroll
  for (int k = 0; k < RawVec<T>::kLoads; ++k) r.raw[k] = reinterpret_cast<const uint4*>(p)[k];
}

// Word k of the raw form (16-bit types: elements 2 k and 2 k + 1, the first in the low half).
template <typename T>
__device__ __forceinline__ uint32_t raw_word(const RawVec<T>& r, int k) {
  const uint4& q = r.raw[k / 4 % RawVec<T>::kLoads];
  return (k % 4) < 2 ? ((k % 4) == 0 ? q.x : q.y) : ((k % 4) == 2 ? q.z : q.w);
}

// Per-element |bits| of column j of 8 (the running max of abs_bits_max without the fold).
template <typename T>
__device__ __forceinline__ uint32_t element_abs_bits(const RawVec<T>& r, int j) {
  const uint4& q = r.raw[j / 4 % RawVec<T>::kLoads];
  if constexpr (sizeof(T) == 4) {
    const uint32_t w = (j % 4) < 2 ? ((j % 4) == 0 ? q.x : q.y) : ((j % 4) == 2 ? q.z : q.w);
    return w & 0x7FFFFFFFu;
  } else {
    const uint32_t w = (j / 2) < 2 ? ((j / 2) == 0 ? q.x : q.y) : ((j / 2) == 2 ? q.z : q.w);
    return (j % 2 == 0 ? w : w >> 16) & 0x7FFFu;
  }
}

}  // namespace wgrad::quant
