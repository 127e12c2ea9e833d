// Shared by the standalone probes of this folder: the error check and a median timer.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                \
  do {                                                                                       \
    cudaError_t e_ = (x);                                                                    \
    if (e_ != cudaSuccess) {                                                                 \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

// Median in us of `reps` CUDA-event intervals around launch() (after one untimed call), before() run
// ahead of each outside the interval (e.g. an L2 flush).
template <class Launch, class Before>
float median_us(Launch launch, int reps, Before before) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ts;
  for (int rep = 0; rep <= reps; ++rep) {
    before(rep);
    CK(cudaEventRecord(e0));
    launch();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (rep) ts.push_back(ms);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2] * 1e3f;
}

// The q_t store probes' setting: q_t's 8192 x 4096 geometry (R x C bytes) and a 256 MB buffer whose memset
// before a call is the benchmark's L2 flush. time_us: median of 30 calls, flushed or not.
struct QtStoreSetup {
  static constexpr int kRows = 8192, kCols = 4096;
  static constexpr size_t kFlushBytes = size_t{256} << 20;
  uint8_t* q = nullptr;
  uint8_t* flush = nullptr;
  int sms = 0;
  QtStoreSetup() {
    CK(cudaMalloc(&q, size_t{kRows} * kCols));
    CK(cudaMalloc(&flush, kFlushBytes));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  }
  template <class Launch>
  float time_us(Launch launch, bool flushed) {
    return median_us(launch, 30, [&](int rep) {
      if (flushed) CK(cudaMemsetAsync(flush, rep, kFlushBytes));
    });
  }
};
