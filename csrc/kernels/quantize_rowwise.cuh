// \brief Row-wise FP8 1x128 quantization kernel: registers only, no shared memory. Torch-free.
//
// A half-warp owns one 128-element block (row r, block kb) at a time: 16 lanes x 8 consecutive elements
// (one 16-byte load of bf16/fp16, two of fp32), block amax = 4 xor-shuffles inside the half-warp, one
// 8-byte store of q per lane (a half-warp writes the block's 128 bytes of q: one full line), one lane
// writes the scale. Why this shape:
//   - bandwidth needs bytes in flight (Little's law: ~4 TB/s x ~1 us of loaded DRAM latency = ~30 KB per
//     SM). Each half-warp first issues the loads of kUnroll blocks, then reduces: with 4 CTAs of 256
//     threads per SM (<= 64 registers), that is 1024 x 4 x 16 B = 64 KB of bf16 loads in flight per SM
//     (128 KB for fp32), where the v1 tile kernel had 0 while it reduced, synchronised and stored.
//   - a persistent grid-stride loop over the blocks in memory order (kb fastest): each warp-wide load
//     instruction reads 512 contiguous bytes (two blocks), the whole grid sweeps x front to back, and the
//     (row, kb) of each slot is advanced by a precomputed stride instead of a 64-bit division per block.
//   - no shared memory and no __syncthreads: warps never wait for each other.
#pragma once

#include <cstdint>

#include "layout.h"
#include "quantize.cuh"
#include "quantize_numerics.cuh"

namespace wgrad::quant {

struct RowwiseConfig {
  static constexpr int kThreads = 256;
  static constexpr int kMinCtasPerSm = 4;                        // <= 64 registers: 1024 threads per SM
  static constexpr int kLanesPerBlock = kBlock / kColsPerThread;  // 16: a half-warp per 1x128 block
  static constexpr int kBlocksPerCta = kThreads / kLanesPerBlock; // 16 blocks per CTA per slot
  static constexpr int kBytesInFlightPerLane = 64;                // 64 KB per SM at 1024 threads
  // Blocks in flight per half-warp: 4 of bf16/fp16, 2 of fp32 (16 raw registers either way).
  // Element-wise (unaligned) loads: one block per half-warp (8 scalar loads in flight already need as
  // many registers as 4 vector loads, and this path is not the one to tune).
  template <typename T, bool kVec>
  static constexpr int kUnroll = kVec ? kBytesInFlightPerLane / (kColsPerThread * static_cast<int>(sizeof(T))) : 1;
};
static_assert(RowwiseConfig::kLanesPerBlock == 16, "block amax reduces over the 16 lanes of a half-warp");

// Blocks are numbered u = r * kb_count + kb (memory order). Slot i of half-warp h handles, in iteration k,
// block h + (k * kUnroll + i) * num_half_warps.
// kVec: cols % 8 == 0 and x 16-byte aligned: every lane's 8 columns are one aligned vector access;
// otherwise element-wise accesses with bounds checks.
template <typename T, bool kVec>
__global__ void __launch_bounds__(RowwiseConfig::kThreads, RowwiseConfig::kMinCtasPerSm)
    quantize_fp8_1x128_rowwise_kernel(const QuantizeParams p) {
  using Cfg = RowwiseConfig;
  constexpr int kUnroll = Cfg::kUnroll<T, kVec>;
  const int sub = threadIdx.x % Cfg::kLanesPerBlock;  // the lane's 8 columns within the block
  const int64_t kb_count = ceil_div(p.cols, kBlock);
  const int64_t num_half_warps = static_cast<int64_t>(gridDim.x) * Cfg::kBlocksPerCta;
  const int64_t half_warp = static_cast<int64_t>(blockIdx.x) * Cfg::kBlocksPerCta + threadIdx.x / Cfg::kLanesPerBlock;
  const int64_t step = num_half_warps * kUnroll;  // blocks between two iterations of one slot
  const uint32_t step_rows = static_cast<uint32_t>(step / kb_count);  // < 2^16
  const int step_kb = static_cast<int>(step % kb_count);
  const T* x = static_cast<const T*>(p.x);

  // Rows in 32 bits: rows < 2^31, and a row never exceeds rows + step_rows + 1 < 2^32 (see the end).
  const uint32_t rows = static_cast<uint32_t>(p.rows);
  uint32_t row[kUnroll];
  int kb[kUnroll];
#pragma unroll
  for (int i = 0; i < kUnroll; ++i) {
    const int64_t u = half_warp + i * num_half_warps;
    const int64_t r = u / kb_count;
    row[i] = static_cast<uint32_t>(r < p.rows ? r : p.rows);
    kb[i] = static_cast<int>(u % kb_count);
  }

  // Slot 0 holds the half-warp's lowest block: once it is past the end, so are the others. Both halves
  // of a warp run every iteration together (the shuffles need all 32 lanes).
  while (__any_sync(0xFFFFFFFFu, row[0] < rows)) {
    // ---- all loads first, kept raw until used; missing elements are 0, which never changes an amax.
    RawVec<T> raw[kUnroll];
#pragma unroll
    for (int i = 0; i < kUnroll; ++i) {
      const int64_t col = static_cast<int64_t>(kb[i]) * kBlock + sub * kColsPerThread;
      const bool row_ok = row[i] < rows;
      const T* src = x + static_cast<int64_t>(row[i]) * p.cols + col;
      if constexpr (kVec) {
        if (row_ok && col < p.cols) {
          load8_global_raw(src, raw[i]);
        } else {
#pragma unroll
          for (int k = 0; k < RawVec<T>::kLoads; ++k) raw[i].raw[k] = make_uint4(0u, 0u, 0u, 0u);
        }
      } else {
        // Element-wise, packed into the same raw registers.
        T e[kColsPerThread];
#pragma unroll
        for (int j = 0; j < kColsPerThread; ++j) e[j] = (row_ok && col + j < p.cols) ? src[j] : T(0.0f);
        pack8_raw(e, raw[i]);
      }
    }
    // ---- per block: amax over the half-warp, scale, q
#pragma unroll
    for (int i = 0; i < kUnroll; ++i) {
      float v[kColsPerThread];
      unpack8(raw[i], v);
      float amax = amax8(v);
#pragma unroll
      for (int offset = Cfg::kLanesPerBlock / 2; offset > 0; offset >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
      }
      if (row[i] >= rows) continue;
      const float scale = block_scale(amax, p.ue8m0);
      const uint2 packed = quantize_eight(v, scale, scale_reciprocal(scale));
      if (sub == 0) p.scales[static_cast<int64_t>(kb[i]) * p.scales_ld + row[i]] = scale;
      const int64_t col = static_cast<int64_t>(kb[i]) * kBlock + sub * kColsPerThread;
      uint8_t* dst = p.q + static_cast<int64_t>(row[i]) * p.cols + col;
      if constexpr (kVec) {
        if (col < p.cols) *reinterpret_cast<uint2*>(dst) = packed;
      } else {
#pragma unroll
        for (int j = 0; j < kColsPerThread; ++j) {
          if (col + j < p.cols) dst[j] = static_cast<uint8_t>((j < 4 ? packed.x : packed.y) >> (8 * (j % 4)));
        }
      }
    }
    // ---- next blocks of every slot: + step in (row, kb) coordinates; a slot past the end is parked at
    // row `rows`, so that its row never wraps around 2^32.
#pragma unroll
    for (int i = 0; i < kUnroll; ++i) {
      kb[i] += step_kb;
      uint32_t next = row[i] + step_rows;
      if (kb[i] >= kb_count) {
        kb[i] -= static_cast<int>(kb_count);
        ++next;
      }
      row[i] = next < rows ? next : rows;
    }
  }
}

}  // namespace wgrad::quant
