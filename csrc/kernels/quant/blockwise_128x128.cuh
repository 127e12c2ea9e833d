// \brief FP8 128x128 block quantization of a weight: one scale per 128 x 128 block, written in both
// orientations from one read (q [N, K] for fprop, q_t [K, N] for dgrad). Torch-free.
//
// Numerics: those of the 1x128 casts (numerics.cuh, python/wgrad/reference.py) with the amax taken over a
// 128 x 128 block instead of 128 elements. The bytes of q_t are the bytes of q transposed, and scales_t is
// scales transposed: a 128 x 128 block of W is a 128 x 128 block of W^T with the same amax.
//
// One CTA per block, 256 threads, registers only (the block's amax goes through 8 words of shared memory).
// Thread t holds an 8 x 8 sub-block: rows 8 rg .. 8 rg + 7, columns 8 cg .. 8 cg + 7 of the block, with
// lane l of warp w at cg = 8 (w % 2) + l % 8 and rg = 4 (w / 2) + l / 8. Why this shape:
//   - loads: per instruction a warp reads 4 rows x 128 contiguous bytes of bf16 (16 bytes a lane), and
//     every thread issues its 8 rows' loads before it reduces: 32 KB of a block in flight per CTA.
//   - q: each thread's row of 8 codes is one 8-byte store (a warp writes 4 x 64 contiguous bytes).
//   - q_t: column j of the sub-block is 8 codes of q_t's row 8 cg + j, one 8-byte store; the four row
//     groups of a warp (l / 8) are adjacent there, so a warp writes 8 rows x 32 contiguous bytes: whole
//     32-byte sectors, with no staging in shared memory (the transposition is byte permutes in registers).
#pragma once

#include <cstdint>

#include "kernels/common/layout.h"
#include "kernels/quant/numerics.cuh"

namespace wgrad::quant {

struct Blockwise128Params {
  const void* w;      // [rows, cols] row-major, bf16 / fp16 / fp32
  int64_t rows;       // N (out features of a weight)
  int64_t cols;       // K (in features)
  uint8_t* q;         // [rows, cols] e4m3, contiguous
  uint8_t* q_t;       // [cols, rows] e4m3, contiguous
  float* scales;      // [ceil(rows/128), ceil(cols/128)], contiguous
  float* scales_t;    // [ceil(cols/128), ceil(rows/128)], contiguous
  bool ue8m0;
};

struct Blockwise128Config {
  static constexpr int kThreads = 256;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kSub = 8;                            // an 8 x 8 sub-block per thread
  static constexpr int kSubPerRow = kBlock / kSub;          // 16 column groups
  static_assert(kSubPerRow * kSubPerRow == kThreads, "one sub-block per thread");
  static constexpr int kMinCtasPerSm16 = 4;                 // bf16/fp16: <= 64 registers (a raw sub-block is 32)
  static constexpr int kMinCtasPerSm32 = 2;                 // fp32 holds twice the raw bytes
  static constexpr int kMinCtasPerSmScalar = 2;             // element-wise path: not the one to tune
};

// Byte `b` (0-3) of the words of rows i..i+3 as one word (row i in the low byte).
__device__ __forceinline__ uint32_t gather_byte(uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3, int b) {
  const uint32_t sel = static_cast<uint32_t>(b) | (static_cast<uint32_t>(4 + b) << 4);
  return __byte_perm(__byte_perm(r0, r1, sel), __byte_perm(r2, r3, sel), 0x5410);
}

// kVec: rows and cols multiples of 8 and w 16-byte aligned, so that every 8-element run of a row, and
// every 8-code run of q and q_t, is one aligned vector access or entirely outside the matrix.
template <typename T, bool kVec>
__global__ void __launch_bounds__(Blockwise128Config::kThreads,
                                  !kVec           ? Blockwise128Config::kMinCtasPerSmScalar
                                  : sizeof(T) == 2 ? Blockwise128Config::kMinCtasPerSm16
                                                   : Blockwise128Config::kMinCtasPerSm32)
    quantize_fp8_128x128_kernel(const Blockwise128Params p) {
  using Cfg = Blockwise128Config;
  __shared__ uint32_t warp_amax[Cfg::kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int cg = (warp % 2) * 8 + lane % 8;
  const int rg = (warp / 2) * 4 + lane / 8;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kBlock + rg * Cfg::kSub;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kBlock + cg * Cfg::kSub;
  const T* w = static_cast<const T*>(p.w);

  // ---- loads first (missing elements are 0, which never changes an amax)
  RawVec<T> raw[Cfg::kSub];
#pragma unroll
  for (int i = 0; i < Cfg::kSub; ++i) {
    const int64_t row = row0 + i;
    const T* src = w + row * p.cols + col0;
    if constexpr (kVec) {
      if (row < p.rows && col0 < p.cols) {
        load8_global_raw(src, raw[i]);
      } else {
#pragma unroll
        for (int k = 0; k < RawVec<T>::kLoads; ++k) raw[i].raw[k] = make_uint4(0u, 0u, 0u, 0u);
      }
    } else {
      T e[kColsPerThread];
#pragma unroll
      for (int j = 0; j < kColsPerThread; ++j) e[j] = (row < p.rows && col0 + j < p.cols) ? src[j] : T(0.0f);
      pack8_raw(e, raw[i]);
    }
  }

  // ---- the block's amax: threads, warps (redux), then the 8 warps through shared memory
  uint32_t bits = 0;
#pragma unroll
  for (int i = 0; i < Cfg::kSub; ++i) bits = abs_bits_max(raw[i], bits);
  bits = __reduce_max_sync(0xFFFFFFFFu, fold_abs_bits<T>(bits));
  if (lane == 0) warp_amax[warp] = bits;
  __syncthreads();
#pragma unroll
  for (int k = 0; k < Cfg::kWarps; ++k) bits = max(bits, warp_amax[k]);
  const float scale = block_scale(amax_from_bits<T>(bits), p.ue8m0);
  const float inv_scale = scale_reciprocal(scale);
  if (threadIdx.x == 0) {
    const int64_t n_blocks = ceil_div(p.rows, kBlock), k_blocks = ceil_div(p.cols, kBlock);
    p.scales[static_cast<int64_t>(blockIdx.y) * k_blocks + blockIdx.x] = scale;
    p.scales_t[static_cast<int64_t>(blockIdx.x) * n_blocks + blockIdx.y] = scale;
  }

  // ---- q: one row of 8 codes per store
  uint2 codes[Cfg::kSub];
#pragma unroll
  for (int i = 0; i < Cfg::kSub; ++i) {
    float v[kColsPerThread];
    unpack8(raw[i], v);
    codes[i] = quantize_eight(v, scale, inv_scale);
    const int64_t row = row0 + i;
    if (row >= p.rows || col0 >= p.cols) continue;
    uint8_t* dst = p.q + row * p.cols + col0;
    if constexpr (kVec) {
      *reinterpret_cast<uint2*>(dst) = codes[i];
    } else {
#pragma unroll
      for (int j = 0; j < kColsPerThread; ++j) {
        if (col0 + j < p.cols) dst[j] = static_cast<uint8_t>((j < 4 ? codes[i].x : codes[i].y) >> (8 * (j % 4)));
      }
    }
  }

  // ---- q_t: column j of the sub-block is 8 codes of q_t's row col0 + j
  if (row0 >= p.rows) return;
#pragma unroll
  for (int j = 0; j < Cfg::kSub; ++j) {
    const int64_t col = col0 + j;
    if (col >= p.cols) break;
    const int b = j % 4;
    uint32_t r[Cfg::kSub];
#pragma unroll
    for (int i = 0; i < Cfg::kSub; ++i) r[i] = j < 4 ? codes[i].x : codes[i].y;
    const uint2 t = make_uint2(gather_byte(r[0], r[1], r[2], r[3], b), gather_byte(r[4], r[5], r[6], r[7], b));
    uint8_t* dst = p.q_t + col * p.rows + row0;
    if constexpr (kVec) {
      *reinterpret_cast<uint2*>(dst) = t;
    } else {
#pragma unroll
      for (int i = 0; i < Cfg::kSub; ++i) {
        if (row0 + i < p.rows) dst[i] = static_cast<uint8_t>((i < 4 ? t.x : t.y) >> (8 * (i % 4)));
      }
    }
  }
}

}  // namespace wgrad::quant
