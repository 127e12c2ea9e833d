// \brief Row-wise FP8 1x128 quantization kernel: registers only, no shared memory. Torch-free.
//
// Eight lanes own one 128-element block (row r, block kb) at a time; lane `sub` holds the two runs of 8
// consecutive elements at block columns [8 sub, 8 sub + 8) and [64 + 8 sub, 64 + 8 sub + 8). Why this
// shape:
//   - bandwidth needs bytes in flight (Little's law: ~4 TB/s x ~1 us of loaded DRAM latency = ~30 KB per
//     SM). Each lane first issues the loads of kUnroll blocks (kept raw in registers), then reduces.
//     One block per lane (32 B of bf16/fp16) at 32 registers: 8 CTAs of 256 threads per SM, 2048 x 32 B =
//     64 KB of loads in flight per SM, and 64 warps to hide each one's reduce-and-store phase. Measured
//     on an H200: 2 blocks per lane at 48 registers (5 CTAs per SM) ran 1-3 points of a copy slower on
//     every benchmark shape, 4 blocks (4 CTAs) 6-14 points slower.
//   - per-block work (amax shuffles, scale, reciprocal, addresses) is paid per lane: 16 elements per
//     lane halve it per element against 8, which keeps the kernel well below the SM's issue rate
//     (~10 instructions per element, against ~24 available at the bandwidth bar).
//   - each warp-wide load instruction reads 4 x 128 contiguous bytes (one run of 4 blocks), each 8-byte
//     q store writes 4 x 64 bytes; the amax is an unsigned max of raw bits (numerics.cuh).
//   - a grid-stride loop over the blocks in memory order (kb fastest): the grid sweeps x front to back,
//     and the (row, kb) of each slot is advanced by a precomputed stride instead of a 64-bit division
//     per block. The launch (quant/rowwise.cu) gives every CTA one pass and lets the CTA scheduler even
//     out the last wave: 1-5 % faster than a persistent grid of 4 CTAs per SM on the small benchmark
//     shapes.
//   - no shared memory and no __syncthreads: warps never wait for each other.
#pragma once

#include <cstdint>

#include "kernels/common/layout.h"
#include "kernels/quant/numerics.cuh"
#include "kernels/quant/params.h"

namespace wgrad::quant {

struct RowwiseConfig {
  static constexpr int kThreads = 256;
  static constexpr int kMinCtasPerSm = 6;                           // <= 40 registers (bf16/fp16 use 32: 8 CTAs)
  static constexpr int kMinCtasPerSmScalar = 4;                     // element-wise path: <= 64 (fp16 spills at 40)
  static constexpr int kLanesPerBlock = 8;                          // 8 lanes per 1x128 block
  static constexpr int kRuns = kBlock / (kLanesPerBlock * kColsPerThread);  // 2 runs of 8 per lane
  static constexpr int kRunCols = kLanesPerBlock * kColsPerThread;  // 64: columns between a lane's runs
  static constexpr int kBlocksPerCta = kThreads / kLanesPerBlock;   // 32 blocks per CTA per slot
  static constexpr int kBytesInFlightPerLane = 32;                  // 64 KB per SM at 2048 threads
  // Blocks in flight per lane: 1 (bf16/fp16: 8 raw registers, fp32: 16). Element-wise (unaligned)
  // loads: one block too (16 scalar loads in flight need as many registers; not the path to tune).
  template <typename T, bool kVec>
  static constexpr int kUnroll =
      kVec && kBytesInFlightPerLane > kRuns * kColsPerThread * static_cast<int>(sizeof(T))
          ? kBytesInFlightPerLane / (kRuns * kColsPerThread * static_cast<int>(sizeof(T)))
          : 1;
};
static_assert(RowwiseConfig::kRuns == 2 && RowwiseConfig::kUnroll<__nv_bfloat16, true> == 1, "see above");

// Blocks are numbered u = r * kb_count + kb (memory order). Slot i of lane group g (8 lanes) handles, in
// iteration k, block g + (k * kUnroll + i) * num_groups.
// kVec: cols % 8 == 0 and x 16-byte aligned: each run of 8 columns is one aligned vector access (or
// entirely past C); otherwise element-wise accesses with bounds checks.
template <typename T, bool kVec>
__global__ void __launch_bounds__(RowwiseConfig::kThreads,
                                  kVec ? RowwiseConfig::kMinCtasPerSm : RowwiseConfig::kMinCtasPerSmScalar)
    quantize_fp8_1x128_rowwise_kernel(const QuantizeParams p) {
  using Cfg = RowwiseConfig;
  constexpr int kUnroll = Cfg::kUnroll<T, kVec>;
  const int sub = threadIdx.x % Cfg::kLanesPerBlock;
  const int64_t kb_count = ceil_div(p.cols, kBlock);
  const int64_t num_groups = static_cast<int64_t>(gridDim.x) * Cfg::kBlocksPerCta;
  const int64_t group = static_cast<int64_t>(blockIdx.x) * Cfg::kBlocksPerCta + threadIdx.x / Cfg::kLanesPerBlock;
  const int64_t step = num_groups * kUnroll;  // blocks between two iterations of one slot
  const uint32_t step_rows = static_cast<uint32_t>(step / kb_count);  // < 2^17
  const int step_kb = static_cast<int>(step % kb_count);
  const T* x = static_cast<const T*>(p.x);

  // Rows in 32 bits: rows < 2^31, and a row never exceeds rows + step_rows + 1 < 2^32 (see the end).
  const uint32_t rows = static_cast<uint32_t>(p.rows);
  uint32_t row[kUnroll];
  int kb[kUnroll];
#pragma unroll
  for (int i = 0; i < kUnroll; ++i) {
    const int64_t u = group + i * num_groups;
    const int64_t r = u / kb_count;
    row[i] = static_cast<uint32_t>(r < p.rows ? r : p.rows);
    kb[i] = static_cast<int>(u % kb_count);
  }

  // Slot 0 holds the group's lowest block: once it is past the end, so are the others. All four groups
  // of a warp run every iteration together (the shuffles need all 32 lanes).
  while (__any_sync(0xFFFFFFFFu, row[0] < rows)) {
    // ---- all loads first, kept raw until used; missing elements are 0, which never changes an amax.
    RawVec<T> raw[kUnroll][Cfg::kRuns];
#pragma unroll
    for (int i = 0; i < kUnroll; ++i) {
      const bool row_ok = row[i] < rows;
#pragma unroll
      for (int h = 0; h < Cfg::kRuns; ++h) {
        const int64_t col = static_cast<int64_t>(kb[i]) * kBlock + h * Cfg::kRunCols + sub * kColsPerThread;
        const T* src = x + static_cast<int64_t>(row[i]) * p.cols + col;
        if constexpr (kVec) {
          if (row_ok && col < p.cols) {
            load8_global_raw(src, raw[i][h]);
          } else {
#pragma unroll
            for (int k = 0; k < RawVec<T>::kLoads; ++k) raw[i][h].raw[k] = make_uint4(0u, 0u, 0u, 0u);
          }
        } else {
          T e[kColsPerThread];
#pragma unroll
          for (int j = 0; j < kColsPerThread; ++j) e[j] = (row_ok && col + j < p.cols) ? src[j] : T(0.0f);
          pack8_raw(e, raw[i][h]);
        }
      }
    }
    // ---- per block: amax over the 8 lanes, scale, q
#pragma unroll
    for (int i = 0; i < kUnroll; ++i) {
      uint32_t bits = 0;
#pragma unroll
      for (int h = 0; h < Cfg::kRuns; ++h) bits = abs_bits_max(raw[i][h], bits);
      bits = fold_abs_bits<T>(bits);
#pragma unroll
      for (int offset = Cfg::kLanesPerBlock / 2; offset > 0; offset >>= 1) {
        bits = max(bits, __shfl_xor_sync(0xFFFFFFFFu, bits, offset));
      }
      if (row[i] >= rows) continue;
      const float scale = block_scale(amax_from_bits<T>(bits), p.ue8m0);
      const float inv_scale = scale_reciprocal(scale);
      if (sub == 0) p.scales[static_cast<int64_t>(kb[i]) * p.scales_ld + row[i]] = scale;
#pragma unroll
      for (int h = 0; h < Cfg::kRuns; ++h) {
        float v[kColsPerThread];
        unpack8(raw[i][h], v);
        const uint2 packed = quantize_eight(v, scale, inv_scale);
        const int64_t col = static_cast<int64_t>(kb[i]) * kBlock + h * Cfg::kRunCols + sub * kColsPerThread;
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
