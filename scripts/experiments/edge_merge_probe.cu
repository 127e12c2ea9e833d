// Probe (H200): can the sector two blocks share be written whole, by whichever of the two gets to it last?
// Store-only kernels in q_t's 8192 x 4096 geometry, 128-byte column runs [a, a + 128) in row-major tile order,
// every block boundary shared by two blocks (the unaligned MoE segments cast's row-major kernel), the three
// whole middle sectors of a run stored by lanes, the two edge sectors by mode:
//   2: this block's bytes only, a byte per lane (the kernel's edge stores; session 16);
//   3: not at all (the middle alone: what the edges cost);
//   4: publish or merge: each block writes its half of both edge sectors, whole, into a side slot of the
//      boundary, then (one thread, after a fence) counts itself in at the boundary's counter; the block that
//      counts second reads the other slot, stores the merged sector whole, discards both slots from the L2
//      (no write-back) and resets the counter (so every launch leaves the counters zero);
//   5: 4 without the fence (wrong in general: what the fence costs);
//   6: 4 without the discards (what the slots' write-back costs).
// Modes 2 and 4-6 write the same q_t; the host checks 4 against 2. No torch or CUTLASS:
// nvcc -std=c++17 -arch=sm_90a -O3 -o p edge_merge_probe.cu
#include <cuda_runtime.h>

#include "probe_common.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

__host__ __device__ __forceinline__ uint8_t value(int col, int64_t r) {
  return static_cast<uint8_t>(col * 131 + r * 7 + (r >> 7));
}
// Bytes r0 .. r0 + 15 of column col: value() where lo <= r < hi, `other` elsewhere.
__device__ __forceinline__ uint4 chunk(int col, int64_t r0, int64_t lo, int64_t hi, uint8_t other) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w[i] = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t r = r0 + 4 * i + j;
      w[i] |= static_cast<uint32_t>(r >= lo && r < hi ? value(col, r) : other) << (8 * j);
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}
// Bytes [from, to) of a 16-byte chunk from `x`, the rest from `y`.
__device__ __forceinline__ uint4 select_bytes(const uint4& x, const uint4& y, int from, int to) {
  uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w}, out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t m = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (4 * i + j >= from && 4 * i + j < to) m |= 0xFFu << (8 * j);
    }
    out[i] = (xs[i] & m) | (ys[i] & ~m);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}
__device__ __forceinline__ void st16(uint8_t* p, const uint4& v) { *reinterpret_cast<uint4*>(p) = v; }

template <int kMode>
__global__ void __launch_bounds__(256) store_kernel(uint8_t* q, int64_t ld, int nb, int nc, int off, uint4* side,
                                                    int* counter) {
  __shared__ int arrived[2];
  const int tid = threadIdx.x, col0 = tid / 8, k = tid % 8, warp = tid / 32, lane = tid % 32;
  for (int t = blockIdx.x; t < nb * nc; t += gridDim.x) {
    const int b = t / nc, c = t % nc;
    const int64_t a = off + 128 * int64_t{b};
    const int64_t base = a & ~int64_t{31};
    const int o = static_cast<int>(a - base);
    if (k >= 2) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int col = 128 * c + col0 + 32 * i;
        st16(q + col * ld + base + 16 * k, chunk(col, base + 16 * k, a, a + 128, 0));
      }
    }
    if (kMode == 2) {
      const int i = lane < 32 - o ? lane : lane + 96;  // block-relative byte
#pragma unroll 4
      for (int j = 0; j < 16; ++j) {
        const int col = 128 * c + 16 * warp + j;
        q[col * ld + a + i] = value(col, a + i);
      }
    }
    if (kMode >= 4) {
      // Thread pair (2 l, 2 l + 1): line l's sectors, one 16-byte half each. Slot (boundary, c, side):
      // side 0 = the block above the boundary (its tail), 1 = the block below (its head); 128 x 32 bytes.
      const int line = tid >> 1, h = tid & 1, col = 128 * c + line;
      auto slot = [&](int boundary, int s) { return side + ((int64_t{boundary} * nc + c) * 2 + s) * 256; };
      const uint4 head = chunk(col, base + 16 * h, a, a + 128, 0xEE);
      const uint4 tail = chunk(col, base + 128 + 16 * h, a, a + 128, 0xEE);
      const bool head_shared = b > 0, tail_shared = b + 1 < nb;  // the column's outer edges: not written
      if (head_shared) slot(b, 1)[tid] = head;
      if (tail_shared) slot(b + 1, 0)[tid] = tail;
      __syncthreads();
      if (tid == 0) {
        if (kMode != 5) __threadfence();
        arrived[0] = head_shared ? atomicAdd(&counter[b * nc + c], 1) : 0;
        arrived[1] = tail_shared ? atomicAdd(&counter[(b + 1) * nc + c], 1) : 0;
        __threadfence();
      }
      __syncthreads();
      const bool merge_head = arrived[0] == 1, merge_tail = arrived[1] == 1;
      if (merge_head) {  // ours: sector bytes [o, 32)
        const uint4 other = __ldcg(slot(b, 0) + tid);
        st16(q + col * ld + base + 16 * h, select_bytes(head, other, o - 16 * h, 16));
      }
      if (merge_tail) {  // ours: sector bytes [0, o)
        const uint4 other = __ldcg(slot(b + 1, 1) + tid);
        st16(q + col * ld + base + 128 + 16 * h, select_bytes(tail, other, 0, o - 16 * h));
      }
      if (merge_head || merge_tail) {
        __syncthreads();  // every read of the slots done
        const int boundary = tid < 64 ? b : b + 1;
        if ((tid < 64 && merge_head) || (tid >= 64 && tid < 128 && merge_tail)) {
          if (kMode != 6) {
            const uint4* line128 = slot(boundary, 0) + 8 * (tid & 63);  // 2 slots = 64 lines of 128 bytes
            asm volatile("discard.global.L2 [%0], 128;" ::"l"(line128) : "memory");
          }
          if ((tid & 63) == 0) counter[boundary * nc + c] = 0;
        }
      }
    }
  }
}

int main() {
  QtStoreSetup setup;
  const int R = QtStoreSetup::kRows, C = QtStoreSetup::kCols, sms = setup.sms;
  uint8_t* q = setup.q;
  const int nc = C / 128;
  const int max_nb = R / 128;
  uint4* side;
  int* counter;
  CK(cudaMalloc(&side, size_t(max_nb + 1) * nc * 2 * 4096));
  CK(cudaMalloc(&counter, size_t(max_nb + 1) * nc * sizeof(int)));
  CK(cudaMemset(counter, 0, size_t(max_nb + 1) * nc * sizeof(int)));
  for (int off : {5, 16, 21}) {
    const int nb = (R - off) / 128 - 1;
    // q_t rows every mode writes the same way: from the first block's second sector to the last one's
    // second-to-last (the column's outer edges are written by mode 2 only).
    const int64_t lo = ((off + 31) & ~31), hi = (off + 128 * int64_t{nb}) & ~int64_t{31};
    std::vector<uint8_t> ref(size_t{R} * C), got(size_t{R} * C);
    for (int per_sm : {1, 3}) {
      const int grid = sms * per_sm;
      auto launch = [&](int mode) {
        switch (mode) {
          case 2: store_kernel<2><<<grid, 256>>>(q, R, nb, nc, off, side, counter); break;
          case 3: store_kernel<3><<<grid, 256>>>(q, R, nb, nc, off, side, counter); break;
          case 4: store_kernel<4><<<grid, 256>>>(q, R, nb, nc, off, side, counter); break;
          case 5: store_kernel<5><<<grid, 256>>>(q, R, nb, nc, off, side, counter); break;
          case 6: store_kernel<6><<<grid, 256>>>(q, R, nb, nc, off, side, counter); break;
        }
      };
      // The check: modes 4-6 write what mode 2 writes (poisoned q_t before each).
      CK(cudaMemset(q, 0x5A, size_t{R} * C));
      launch(2);
      CK(cudaMemcpy(ref.data(), q, ref.size(), cudaMemcpyDeviceToHost));
      for (int mode : {4, 5, 6}) {
        CK(cudaMemset(q, 0xA5, size_t{R} * C));
        launch(mode);
        CK(cudaMemcpy(got.data(), q, got.size(), cudaMemcpyDeviceToHost));
        int64_t bad = 0;
        for (int64_t col = 0; col < C; ++col) {
          bad += std::memcmp(ref.data() + col * R + lo, got.data() + col * R + lo, hi - lo) != 0;
        }
        std::printf("off=%2d per_sm=%d mode %d: %lld of %d columns differ from mode 2\n", off, per_sm, mode,
                    static_cast<long long>(bad), C);
      }
      for (int flushed = 1; flushed >= 0; --flushed) {
        std::printf("%s off=%2d per_sm=%d:", flushed ? "flushed" : "warm   ", off, per_sm);
        for (int mode : {2, 3, 4, 5, 6}) {
          std::printf(" mode %d %5.1f us", mode, setup.time_us([&] { launch(mode); }, flushed));
        }
        std::printf("\n");
      }
    }
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
