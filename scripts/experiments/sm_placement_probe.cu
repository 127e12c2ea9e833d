// Where the block scheduler puts the carry kernel's CTAs: a kernel with its launch bounds, threads and
// shared memory records each block's SM; the probe counts the SMs whose blocks are {b, b + SMs, b + 2 SMs}
// (what a split of the tiles per SM by blockIdx would need; session 33: none of 20 launches, placements
// that differ from launch to launch) and prints the whole placement of the first two launches.
// Build: nvcc -std=c++20 -arch=sm_90a -O2 -I csrc -I scripts/experiments sm_placement_probe.cu
#include "kernels/quantize_segments_carry.cuh"
#include "probe_common.h"

using Cfg = wgrad::quant::SegmentsCarryConfig<128, 8>;

__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kCtasPerSm) where_kernel(int* sm, long long* t0) {
  extern __shared__ uint8_t smem[];
  if (threadIdx.x == 0) {
    int id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    sm[blockIdx.x] = id;
    t0[blockIdx.x] = t;
    smem[0] = static_cast<uint8_t>(id);
  }
  // Stay resident a while, as the real kernel does, so that all blocks are placed before any ends.
  long long start = clock64();
  while (clock64() - start < 200000) {
  }
  if (smem[0] == 255 && threadIdx.x == 1) sm[0] = -1;
}

int main() {
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int ctas = sms * Cfg::kCtasPerSm, smem = Cfg::smem_bytes(Cfg::kMaxTableEntries);
  CK(cudaFuncSetAttribute(where_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int *d_sm;
  long long* d_t;
  CK(cudaMalloc(&d_sm, ctas * sizeof(int)));
  CK(cudaMalloc(&d_t, ctas * sizeof(long long)));
  std::vector<int> sm(ctas);
  int good_launches = 0;
  const int launches = 20;
  for (int l = 0; l < launches; ++l) {
    where_kernel<<<ctas, Cfg::kThreads, smem>>>(d_sm, d_t);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(sm.data(), d_sm, ctas * sizeof(int), cudaMemcpyDeviceToHost));
    int good = 0;
    for (int b = 0; b < sms; ++b) {
      bool same = true;
      for (int j = 1; j < Cfg::kCtasPerSm; ++j) same = same && sm[b + j * sms] == sm[b];
      good += same;
    }
    std::vector<int> per(1024, 0);
    for (int b = 0; b < ctas; ++b) per[sm[b]]++;
    const int maxper = *std::max_element(per.begin(), per.end());
    if (l < 3 || good != sms) {
      std::printf("launch %d: %d of %d slots {b, b+%d, b+%d} on one SM; max CTAs on an SM %d; first SMs %d %d %d %d\n",
                  l, good, sms, sms, 2 * sms, maxper, sm[0], sm[1], sm[2], sm[3]);
    }
    good_launches += good == sms;
    if (l < 2) {  // the whole placement: each SM's blocks
      std::vector<std::vector<int>> blocks(1024);
      for (int b = 0; b < ctas; ++b) blocks[sm[b]].push_back(b);
      std::printf("launch %d placement (SM: blocks):", l);
      for (int s = 0; s < 1024; ++s) {
        if (blocks[s].empty()) continue;
        std::printf(" %d:", s);
        for (size_t i = 0; i < blocks[s].size(); ++i) std::printf("%s%d", i ? "," : "", blocks[s][i]);
      }
      std::printf("\n");
    }
  }
  std::printf("threads %d, ctas/SM %d, smem %d: %d of %d launches placed as assumed\n", Cfg::kThreads, Cfg::kCtasPerSm,
              smem, good_launches, launches);
  return 0;
}
