// Probe (H200): what a TMA tensor store writes and how fast, for q_t's 128 x 128-byte boxes at several
// inner offsets. Standalone: nvcc -arch=sm_90a -o p tma_store_probe.cu
// Found (session 16, docs/perf-notes.md): a box whose inner start is not a multiple of 16 bytes is an illegal
// instruction (the launch fails), so TMA stores cannot write unaligned segments; at the inner extent's end a
// box writes whole 16-byte pieces (bytes past an extent that is not a multiple of 16 are overwritten); and
// aligned boxes ran no faster than 16-byte st.global (32 MB: 15.7-17.5 us against 14.9 us).
#include <cuda.h>
#include <cuda_runtime.h>

#include "probe_common.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>


using EncodeFn = decltype(&cuTensorMapEncodeTiled);
static EncodeFn encode_fn() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult st;
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &st));
  return reinterpret_cast<EncodeFn>(fn);
}

static CUtensorMap make_map(void* base, uint64_t inner, uint64_t rows, uint64_t ld, uint32_t box_inner,
                            uint32_t box_rows,
                            CUtensorMapSwizzle swz) {
  CUtensorMap m;
  uint64_t dims[2] = {inner, rows};
  uint64_t strides[1] = {ld};
  uint32_t box[2] = {box_inner, box_rows};
  uint32_t es[2] = {1, 1};
  CUresult r = encode_fn()(&m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, base, dims, strides, box, es,
                           CU_TENSOR_MAP_INTERLEAVE_NONE,
                           swz, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::printf("encode failed %d\n", (int)r);
    std::exit(1);
  }
  return m;
}

__device__ __forceinline__ void tma_store_2d(const CUtensorMap* m, const void* smem, int c0, int c1) {
  uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(m), "r"(s), "r"(c0),
               "r"(c1)
               : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// smem [rows][128] with byte (r, i) = 1 + (r * 7 + i) % 200 (never 0xAA), logical; stored swizzled if swz128.
__global__ void semantics_kernel(const __grid_constant__ CUtensorMap m, int c0, int c1, int rows, bool swz128) {
  __shared__ __align__(1024) uint8_t box[8 * 128];
  for (int t = threadIdx.x; t < rows * 128; t += blockDim.x) {
    int r = t / 128, i = t % 128;
    int phys = swz128 ? r * 128 + (((i >> 4) ^ (r & 7)) << 4) + (i & 15) : t;
    box[phys] = static_cast<uint8_t>(1 + (r * 7 + i) % 200);
  }
  fence_async_shared();
  __syncthreads();
  if (threadIdx.x == 0) {
    tma_store_2d(&m, box, c0, c1);
    commit();
    wait_all();
  }
}

static void semantics(const char* name, uint64_t inner, int c0, bool swz128) {
  const int rows = 8, ld = 512, R = 8;
  uint8_t* d;
  CK(cudaMalloc(&d, ld * R));
  CK(cudaMemset(d, 0xAA, ld * R));
  CUtensorMap m =
      make_map(d, inner, R, ld, 128, rows, swz128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE);
  semantics_kernel<<<1, 128>>>(m, c0, 0, rows, swz128);
  CK(cudaDeviceSynchronize());
  std::vector<uint8_t> h(ld * R);
  CK(cudaMemcpy(h.data(), d, ld * R, cudaMemcpyDeviceToHost));
  int wrong_inside = 0, clobbered = 0, first_clob = -1, last_clob = -1;
  for (int r = 0; r < R; ++r) {
    for (int b = 0; b < ld; ++b) {
      const bool inside = b >= c0 && b < c0 + 128 && b < (int)inner;
      const uint8_t v = h[r * ld + b];
      if (inside) {
        if (v != static_cast<uint8_t>(1 + (r * 7 + (b - c0)) % 200)) ++wrong_inside;
      } else if (v != 0xAA) {
        ++clobbered;
        if (r == 0) {
          if (first_clob < 0) first_clob = b;
          last_clob = b;
        }
      }
    }
  }
  std::printf("semantics %-28s inner=%4llu c0=%3d swz128=%d: wrong inside=%d, bytes outside written=%d "
              "(row 0: %d..%d)\n",
              name, (unsigned long long)inner, c0, (int)swz128, wrong_inside, clobbered, first_clob, last_clob);
  CK(cudaFree(d));
}

// Throughput: every CTA stores 128 x 128-byte boxes (rows = q_t rows, 128 columns of x; inner = q_t bytes)
// at (off + 128 b, 128 c), tiles in row-major order of (b, c) dealt round-robin; kInflight boxes of smem
// per CTA (a box is reused once its previous store has read it).
template <int kInflight>
__global__ void __launch_bounds__(32) bw_kernel(const __grid_constant__ CUtensorMap m, int nb, int nc, int off) {
  extern __shared__ __align__(1024) uint8_t sm[];
  uint8_t* box = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(sm) + 1023) & ~uintptr_t{1023});
  for (int t = threadIdx.x; t < kInflight * 16384 / 16; t += blockDim.x) {
    reinterpret_cast<uint4*>(box)[t] = make_uint4(t, 1, 2, 3);
  }
  fence_async_shared();
  __syncwarp();
  if (threadIdx.x != 0) return;
  int k = 0;
  for (int t = blockIdx.x; t < nb * nc; t += gridDim.x) {
    const int b = t / nc, c = t % nc;
    wait_read<kInflight - 1>();
    tma_store_2d(&m, box + (k % kInflight) * 16384, off + 128 * b, 128 * c);
    commit();
    ++k;
  }
  wait_all();
}

// The same bytes with 16-byte st.global from 8 lanes per row (aligned offsets only), 8 warps per CTA.
__global__ void __launch_bounds__(256) stg_kernel(uint8_t* q, int64_t ld, int nb, int nc, int off) {
  for (int t = blockIdx.x; t < nb * nc; t += gridDim.x) {
    const int b = t / nc, c = t % nc;
    for (int i = threadIdx.x; i < 128 * 8; i += 256) {
      const int row = i / 8, k = i % 8;
      *reinterpret_cast<uint4*>(q + (int64_t)(128 * c + row) * ld + off + 128 * b + 16 * k) = make_uint4(t, row, k, 1);
    }
  }
}

int main() {
  semantics("aligned", 512, 0, false);
  semantics("offset 16", 512, 16, false);
  semantics("offset 48 swizzled", 512, 48, true);
  semantics("offset 400 extent 500", 500, 400, false);
  semantics("extent 100 (not x16)", 100, 0, false);

  const int R = 8192, C = 4096;
  uint8_t* q;
  CK(cudaMalloc(&q, (size_t)R * C));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CUtensorMap m = make_map(q, R, C, R, 128, 128, CU_TENSOR_MAP_SWIZZLE_128B);
  CUtensorMap m_plain = make_map(q, R, C, R, 128, 128, CU_TENSOR_MAP_SWIZZLE_NONE);
  CK(cudaFuncSetAttribute(bw_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, 5 * 16384));
  CK(cudaFuncSetAttribute(bw_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, 5 * 16384));
  CK(cudaFuncSetAttribute(bw_kernel<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, 5 * 16384));
  auto time = [&](auto launch) { return median_us(launch, 40, [](int) {}) * 1e-3f; };  // ms
  const int nc = C / 128;
  for (int off : {0, 16, 32, 64}) {
    const int nb = (R - off) / 128;
    const double bytes = (double)nb * nc * 16384;
    float t1 = time([&] { bw_kernel<1><<<sms, 32, 5 * 16384>>>(m, nb, nc, off); });
    float t3 = time([&] { bw_kernel<3><<<sms, 32, 5 * 16384>>>(m, nb, nc, off); });
    float t3p = time([&] { bw_kernel<3><<<sms, 32, 5 * 16384>>>(m_plain, nb, nc, off); });
    float t3x2 = time([&] { bw_kernel<3><<<2 * sms, 32, 5 * 16384>>>(m, nb, nc, off); });
    float ts = (off % 16 == 0) ? time([&] { stg_kernel<<<sms, 256>>>(q, R, nb, nc, off); }) : 0.f;
    std::printf("bw off=%2d: TMA 1 in flight %.1f us (%.0f GB/s), 3 in flight %.1f us (%.0f GB/s), "
                "3 unswizzled %.1f us, "
                "2 CTAs/SM x3 %.1f us (%.0f GB/s); STG %.1f us (%.0f GB/s)\n",
                off, t1 * 1e3, bytes / t1 / 1e6, t3 * 1e3, bytes / t3 / 1e6, t3p * 1e3, t3x2 * 1e3, bytes / t3x2 / 1e6,
                ts * 1e3, ts > 0 ? bytes / ts / 1e6 : 0.0);
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
