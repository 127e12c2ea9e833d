// Probe (H200): do cache hints on the q_t stores change what a sector shared by two blocks costs? Store-only
// kernels writing q_t's 8192 x 4096 geometry as 128-byte column runs [a, a + 128), every block boundary shared
// by two blocks (the unaligned MoE segments cast in row-major order), as edge_store_probe.cu's modes 0 (a
// 16-aligned: whole 16-byte chunks, two halves per shared sector) and 2 (any a: the three whole middle
// sectors by lanes, the edge sectors a byte per lane), each store with one of these PTX qualifiers:
//   0 none, 1 .L2::cache_hint with an evict_last policy, 2 the same with evict_first (createpolicy.fractional;
//   sm_90 has no plain .L2::evict_* on stores narrower than 256 bits), 3 .L1::no_allocate, 4 .cs (streaming), 5 .wt.
// kHintEdges: the hint on the shared sectors' stores only (the middle sectors plain). No torch or CUTLASS:
// nvcc -std=c++17 -arch=sm_90a -o p edge_hint_probe.cu
#include <cuda_runtime.h>

#include "probe_common.h"

#include <cstdint>
#include <cstdio>

template <int kHint>
__device__ __forceinline__ uint64_t policy() {
  uint64_t pol = 0;
  if constexpr (kHint == 1) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  if constexpr (kHint == 2) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
template <int kHint>
__device__ __forceinline__ void st16(uint8_t* p, uint4 v) {
#define WGRAD_ST16(q)                                                                                     \
  asm volatile("st.global" q ".v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), \
               "r"(v.w)                                                                                  \
               : "memory")
  if constexpr (kHint == 0) WGRAD_ST16("");
  if constexpr (kHint == 1 || kHint == 2) {
    asm volatile("st.global.L2::cache_hint.v4.b32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(p), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w), "l"(policy<kHint>())
                 : "memory");
  }
  if constexpr (kHint == 3) WGRAD_ST16(".L1::no_allocate");
  if constexpr (kHint == 4) WGRAD_ST16(".cs");
  if constexpr (kHint == 5) WGRAD_ST16(".wt");
#undef WGRAD_ST16
}
template <int kHint>
__device__ __forceinline__ void st1(uint8_t* p, uint8_t v) {
  const uint32_t w = v;
#define WGRAD_ST1(q) asm volatile("st.global" q ".b8 [%0], %1;" ::"l"(p), "r"(w) : "memory")
  if constexpr (kHint == 0) WGRAD_ST1("");
  if constexpr (kHint == 1 || kHint == 2) {
    asm volatile("st.global.L2::cache_hint.b8 [%0], %1, %2;" ::"l"(p), "r"(w), "l"(policy<kHint>()) : "memory");
  }
  if constexpr (kHint == 3) WGRAD_ST1(".L1::no_allocate");
  if constexpr (kHint == 4) WGRAD_ST1(".cs");
  if constexpr (kHint == 5) WGRAD_ST1(".wt");
#undef WGRAD_ST1
}

// kMode 0: whole chunks at a (16-aligned); 2: middle sectors + warp-byte edges; 3: the middle sectors alone.
template <int kMode, int kHint, bool kHintEdges>
__global__ void __launch_bounds__(256) store_kernel(uint8_t* q, int64_t ld, int nb, int nc, int off) {
  constexpr int kMid = kHintEdges ? 0 : kHint;
  const int tid = threadIdx.x, col0 = tid / 8, k = tid % 8, warp = tid / 32, lane = tid % 32;
  for (int t = blockIdx.x; t < nb * nc; t += gridDim.x) {
    const int b = t / nc, c = t % nc;
    const int64_t a = off + 128 * int64_t{b};
    const uint4 v = make_uint4(0x01020304u * (t + 1), 0x05060708u ^ t, 0x090A0B0Cu + t, 0x0D0E0F10u * k);
    const int64_t base = a & ~int64_t{31};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint8_t* cb = q + (128 * c + col0 + 32 * i) * ld;
      if (kMode == 0) {
        const bool edge = (a & 31) != 0 && (k < 2 || k >= 6);  // the halves of the shared sectors
        if (edge) st16<kHint>(cb + a + 16 * k, v); else st16<kMid>(cb + a + 16 * k, v);
      } else if (k >= 2) {
        st16<kMid>(cb + base + 16 * k, v);
      }
    }
    if (kMode == 2) {
      const int o = static_cast<int>(a - base);
      const int i = lane < 32 - o ? lane : lane + 96;  // block-relative byte
#pragma unroll 4
      for (int j = 0; j < 16; ++j) {
        st1<kHint>(q + (128 * c + 16 * warp + j) * ld + a + i, static_cast<uint8_t>(t + j + i));
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
  const char* names[] = {"none", "evict_last", "evict_first", "L1::no_allocate", "cs", "wt"};
  for (int flushed = 0; flushed < 2; ++flushed) {
    for (int off : {0, 16, 5, 21}) {
      const int nb = (R - off) / 128 - (off ? 1 : 0);
      auto run = [&](auto hint, auto edges) {
        constexpr int h = decltype(hint)::value;
        constexpr bool e = decltype(edges)::value;
        float t0 = 0, t2 = 0, t3 = 0;
        if (off % 16 == 0) t0 = time([&] { store_kernel<0, h, e><<<sms, 256>>>(q, R, nb, nc, off); }, flushed);
        if (off % 32 != 0) {
          t2 = time([&] { store_kernel<2, h, e><<<sms, 256>>>(q, R, nb, nc, off); }, flushed);
          t3 = time([&] { store_kernel<3, h, e><<<sms, 256>>>(q, R, nb, nc, off); }, flushed);
        }
        std::printf("%s off=%2d hint=%-16s %s: whole chunks %5.1f us | warp byte edges %5.1f (middle only %5.1f)\n",
                    flushed ? "flushed" : "warm   ", off, names[h], e ? "edges" : "all  ", t0, t2, t3);
      };
      using F = std::false_type;
      using T = std::true_type;
      run(std::integral_constant<int, 0>{}, F{});
      run(std::integral_constant<int, 1>{}, F{});
      run(std::integral_constant<int, 1>{}, T{});
      run(std::integral_constant<int, 2>{}, F{});
      run(std::integral_constant<int, 2>{}, T{});
      run(std::integral_constant<int, 3>{}, F{});
      run(std::integral_constant<int, 4>{}, F{});
      run(std::integral_constant<int, 4>{}, T{});
      run(std::integral_constant<int, 5>{}, F{});
      run(std::integral_constant<int, 5>{}, T{});
    }
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
