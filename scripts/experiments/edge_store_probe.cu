// Probe (H200): the cost of the q_t stores of 128-byte column runs [a, a + 128) whose start a is not
// 32-aligned, by how the edge sectors are written. Every block boundary is shared by two blocks (the
// unaligned MoE segments cast in row-major order). No torch or CUTLASS: nvcc -arch=sm_90a -o p edge_store_probe.cu
#include <cuda_runtime.h>

#include "../../csrc/kernels/qt_store.cuh"
#include "probe_common.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

// The kernel's byte-exact chunk stores (its edge stores before session 16: store_chunk_bytes).
using wgrad::quant::store_chunk_bytes;

// mode 0: lanes k of a column store chunk k of [a, a + 128) when a is 16-aligned (whole 16-byte stores).
// mode 1: a not 16-aligned, the kernel's row-major path: lanes k < 7 chunk k + 1 of [a - shift, ...), lane
//         7 chunk 0's bytes [shift, 16) and chunk 8's [0, shift) byte-exact (store_chunk_bytes).
// mode 2: a not 16-aligned: lanes 2-7 of a column the three whole sectors inside [a, a + 128) (base =
//         a & ~31, chunks 2..7 of [base, base + 128)), then every warp writes its columns' two edge
//         sectors with one byte store per lane and column (32 lanes: the 32 - o head bytes and o tail bytes).
// mode 3: mode 2 without the edge sectors (the middle alone: what the edges cost).
// mode 4: mode 1 without lane 7's stores.
// kPrefetch: before a tile's stores, the CTA prefetches into the L2 the edge sectors of its next tile
// (thread c < 128: column c's head sector, c >= 128: its tail sector); kPrefetch 2: the next-but-one tile.
template <int kMode, int kPrefetch = 0>
__global__ void __launch_bounds__(256) store_kernel(uint8_t* q, int64_t ld, int nb, int nc, int off) {
  const int tid = threadIdx.x, col0 = tid / 8, k = tid % 8, warp = tid / 32, lane = tid % 32;
  auto prefetch = [&](int t) {
    if (t >= nb * nc) return;
    const int b = t / nc, c = t % nc;
    const int64_t a = off + 128 * int64_t{b};
    const int col = 128 * c + tid % 128;
    const int64_t s = tid < 128 ? (a & ~int64_t{31}) : ((a + 128) & ~int64_t{31});
    asm volatile("prefetch.global.L2 [%0];" ::"l"(q + col * ld + s));
  };
  if (kPrefetch) {
    for (int j = 1; j < kPrefetch; ++j) prefetch(blockIdx.x + j * gridDim.x);
  }
  for (int t = blockIdx.x; t < nb * nc; t += gridDim.x) {
    if (kPrefetch) prefetch(t + kPrefetch * gridDim.x);
    const int b = t / nc, c = t % nc;
    const int64_t a = off + 128 * int64_t{b};
    const int shift = static_cast<int>(a & 15);
    const uint4 v = make_uint4(0x01020304u * (t + 1), 0x05060708u ^ t, 0x090A0B0Cu + t, 0x0D0E0F10u * k);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int col = 128 * c + col0 + 32 * i;
      uint8_t* cb = q + col * ld;
      if (kMode == 0) {
        *reinterpret_cast<uint4*>(cb + a + 16 * k) = v;
      } else if (kMode == 1 || kMode == 4) {
        uint8_t* d = cb + (a - shift);
        if (k < 7) {
          *reinterpret_cast<uint4*>(d + 16 * (k + 1)) = v;
        } else if (kMode == 1) {
          store_chunk_bytes(d + 128, v, 0, shift);
          store_chunk_bytes(d, v, shift, 16);
        }
      } else {
        const int64_t base = a & ~int64_t{31};
        if (k >= 2) *reinterpret_cast<uint4*>(cb + base + 16 * k) = v;
      }
    }
    if (kMode == 2) {
      const int64_t base = a & ~int64_t{31};
      const int o = static_cast<int>(a - base);
      const int i = lane < 32 - o ? lane : lane + 96;  // block-relative byte
#pragma unroll 4
      for (int j = 0; j < 16; ++j) {
        const int col = 128 * c + 16 * warp + j;
        q[col * ld + a + i] = static_cast<uint8_t>(t + j + i);
      }
    }
  }
}

int main() {
  QtStoreSetup setup;
  const int R = QtStoreSetup::kRows, C = QtStoreSetup::kCols, sms = setup.sms;
  uint8_t* q = setup.q;
  auto time = [&](auto launch, bool flushed) { return setup.time_us(launch, flushed); };
  const int nc = C / 128;
  for (int flushed = 0; flushed < 2; ++flushed) {
    for (int off : {0, 16, 32, 5, 8, 21, 27}) {
      const int nb = (R - off) / 128 - (off ? 1 : 0);
      float t0 = 0, t1 = 0, t2 = 0, t3 = 0, t4 = 0, p0 = 0, p2 = 0, p0b = 0, p2b = 0;
      if (off % 16 == 0) {
        t0 = time([&] { store_kernel<0><<<sms, 256>>>(q, R, nb, nc, off); }, flushed);
        p0 = time([&] { store_kernel<0, 1><<<sms, 256>>>(q, R, nb, nc, off); }, flushed);
        p0b = time([&] { store_kernel<0, 2><<<sms, 256>>>(q, R, nb, nc, off); }, flushed);
      } else {
        t1 = time([&] { store_kernel<1><<<sms, 256>>>(q, R, nb, nc, off); }, flushed);
        t4 = time([&] { store_kernel<4><<<sms, 256>>>(q, R, nb, nc, off); }, flushed);
      }
      if (off % 32 != 0) {
        t2 = time([&] { store_kernel<2><<<sms, 256>>>(q, R, nb, nc, off); }, flushed);
        t3 = time([&] { store_kernel<3><<<sms, 256>>>(q, R, nb, nc, off); }, flushed);
        p2 = time([&] { store_kernel<2, 1><<<sms, 256>>>(q, R, nb, nc, off); }, flushed);
        p2b = time([&] { store_kernel<2, 2><<<sms, 256>>>(q, R, nb, nc, off); }, flushed);
      }
      std::printf("%s off=%2d blocks=%d: whole chunks %.1f us | kernel's lane-7 edges %.1f (no edges %.1f) | "
                  "warp byte edges %.1f (middle only %.1f) | prefetched edges: whole chunks %.1f / %.1f, "
                  "warp bytes %.1f / %.1f\n",
                  flushed ? "flushed" : "warm   ", off, nb, t0, t1, t4, t2, t3, p0, p0b, p2, p2b);
    }
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
