// \brief Torch-free numerics of the FP8 1x128 quantization kernels: block scales, the division by a
// scale, e4m3 packing, and the element loads they share.
//
// Numerics (python/wgrad/reference.py is the definition; every kernel matches it bit for bit):
//   a      = |x| in fp32, with NaN and +-Inf mapped to +Inf
//   amax   = max of a over the 128-element block
//   block with amax == +Inf (any NaN or Inf in it): scale = NaN (0x7FC00000), every q = NaN (0x7F)
//   else   scale = max(amax, 1e-4f) / 448            (IEEE fp32 division)
//          ue8m0: scale = 2^ceil(log2(scale))        (exact, from the fp32 bits)
//          q = e4m3_rne(clamp(x / scale, -448, 448)) (IEEE fp32 division)
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

// ------------------------------------------------------------------ x / scale -------------------------
// The kernels divide every element by its block's scale s. IEEE division (__fdiv_rn) is a ~8-instruction
// sequence per element plus a range check and a branch to a slow path; instead, once per block,
//     r = RN(1/s)                                     (exactly: see scale_reciprocal below)
// and per element three FMA-pipe instructions:
//     q0 = RN(x r);   e = RN(q0 s - x) (one fma);   q = RN(q0 - e r) (one fma).
// Claim: e4m3_satfinite(q) == e4m3_rne(clamp(RN(x / s), -448, 448)) for every finite x and every scale
// the kernels produce (s a positive normal in [2^-23, 2^120), |x| <= 448 s (1 + 2^-23): x is in the block
// whose amax defined s), in both the plain and the ue8m0 mode. Why:
//   (0) Clamp: cvt.rn.satfinite maps every finite value beyond +-448 to +-448, exactly what the clamp
//       does before rounding, and the clamp is the identity elsewhere; so the clamp is dropped.
//   (1) Normal range, |x / s| >= 2^-12. Then x (>= 2^-35), r, q0 and any non-zero residual q0 s - x
//       (a multiple of 2^(e(q0) + e(s) - 46) >= 2^-82) are normal and below overflow, so each step rounds
//       with relative error <= u = 2^-24. Write z = x / s. r = (1/s)(1 + d1), |d1| < u, hence
//       |q0 - z| < 2 ulp(z); and the fma argument is exactly
//           q0 - e r = z + (q0 - z)(1 - s r) - d2 (q0 s - x) r,        |d2| <= u,
//       so it lies within 4u ulp(z) = 2^-22 ulp(z) of z: q = RN(z) unless z is that close to a
//       midpoint of two fp32 neighbours, and then q is the other neighbour. The e4m3 codes of RN(z) and q
//       differ only if one of those two neighbours is itself an e4m3 rounding boundary M (a value with at
//       most 5 significant bits: (2k+1)/16 * 2^E, or (2k+1) * 2^-10 below 2^-6). Everything above scales
//       exactly with powers of two in the normal range, so checking every fp32 significand of s against
//       every such M (and the x whose quotient lies within a few ulps of M) covers all cases:
//       scripts/check_quant_division.c does that exhaustively (2^23 significands of s x 16 boundaries x
//       13 x around M s x 2 signs) and finds no e4m3 difference. (Such near-ties do exist: with r one ulp
//       off RN(1/s) the same check finds differences. So r must be exactly RN(1/s).)
//   (2) Tiny quotients, |x / s| < 2^-12: RN(z) rounds to a signed e4m3 zero. |q| < 2^-11 by the same
//       bounds (plus at most 2^-150 r <= 2^-127 from a subnormal residual), so q does too; what remains is
//       its sign. Writing e = RN(q0 s - x) and q = RN(q0 - e r) (rather than e = x - q0 s, q = q0 + e r)
//       keeps it: for x = +-0, q0 = +-0, q0 s - x is an exact zero (+0), and q0 - (+0) r = q0 keeps the
//       sign of x; for x > 0, q0 - e r > 0 exactly (|e r| < q0 when q0 > 0, and e = -x when q0 = +0),
//       so RN never yields -0 or a negative; x < 0 is the mirror image.
//   ue8m0 scales are powers of two: r is exact, q0 = RN(z) already and the correction keeps it.
// tests/test_quant.py (test_gpu_division_edge_cases) feeds the GPU e4m3 ties, values next to ties, tiny
// and subnormal values, signed zeros and values next to 448 s.
// r must be RN(1/s) exactly: with a neighbour of it the check of (1) does find e4m3 differences. __frcp_rn
// would give it, plus a slow-path call for subnormal and huge inputs (that scales never are): a stack
// frame and spills in every kernel. Instead, in fp64 (full rate on SM90), two Newton steps from
// rcp.approx (relative error <= 2^-22): e0 = 1 - s y0 is exact (a 24 x 24-bit product), y1 is within
// 2^-44 + 2^-53 of 1/s, and y2 within 2^-52; then rounding y2 to fp32 gives RN(1/s), because 1/s is at
// least 2^-49 (relative) away from every fp32 midpoint m: 1 - s m is a non-zero multiple of 2^-48 for s in
// [1, 2) (s m = S (2k + 1) 2^-48 with S the 24-bit significand of s, and 2^48 = S (2k + 1) is impossible).
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

__device__ __forceinline__ float divide_by_scale(float x, float scale, float inv_scale) {
  const float q0 = __fmul_rn(x, inv_scale);
  const float e = __fmaf_rn(q0, scale, -x);
  return __fmaf_rn(-e, inv_scale, q0);
}

// Quantizes v0..v3 with one block's scale into four e4m3 bytes (v0 in the low byte). A NaN scale (the
// block holds NaN or Inf) gives four NaN codes.
__device__ __forceinline__ uint32_t quantize_quad(float v0, float v1, float v2, float v3, float scale,
                                                  float inv_scale) {
  const float t0 = divide_by_scale(v0, scale, inv_scale);
  const float t1 = divide_by_scale(v1, scale, inv_scale);
  const float t2 = divide_by_scale(v2, scale, inv_scale);
  const float t3 = divide_by_scale(v3, scale, inv_scale);
  // satfinite: see (0) above.
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
