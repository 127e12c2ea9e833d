// Where the carry kernel's time goes in one launch: the kernel itself (quantize_segments_carry.cuh, 128 x 8
// tiles, bf16 x) built with WGRAD_CARRY_TIMELINE, so that every CTA records the global timer at its entry,
// after the table, after its first loads and at its end, and its SM. Per case (R x C, G segments split as the
// benchmark's _segment_sizes(R, G, align)) it prints the kernel's median time beside a copy of the same
// bytes (L2 flushed before each call), then, from the last call: the entry spread, the table build, the
// spread of the CTAs' ends, the first two tiles and the later ones, the mean end by tiles per CTA and by
// tiles per SM; and the kernel's time when a small cast ran between the flush and the call (its code in
// the L2).
// Build: nvcc -std=c++20 -arch=sm_90a -O3 -I csrc -I scripts/experiments carry_timeline_probe.cu
// Run: ./a.out 4096x7168x8x1 4096x7168x1x1 ... (R x C x G x align); CARRY_DYNAMIC=BACK:CHUNK in the
// environment (or BACK:CHUNK:MAX_REMAINDER): the kernel's dynamic tail (CarryDynamic) with one counter the launches leave at 0 (timed
// without a memset; the tiles per CTA are the kernel's own count).
#include <cuda_bf16.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "probe_common.h"
#include "../../tests/cpp/bench_split.h"

constexpr int kMaxCtas = 4096;
constexpr int kCarryTimelineSlots = 16;  // per CTA (the kernel's WGRAD_CARRY_MARK slots, 0-9)
__device__ unsigned long long wgrad_carry_timeline[kCarryTimelineSlots * kMaxCtas];
#define WGRAD_CARRY_TIMELINE
#include "kernels/quantize_segments_carry.cuh"
#include "kernels/tma_descriptor.h"

using namespace wgrad;
using namespace wgrad::quant;
using Cfg = SegmentsCarryConfig<128, 8>;

__global__ void fill_x(__nv_bfloat16* x, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ static_cast<uint32_t>(i >> 32) * 40503u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = __float2bfloat16((static_cast<float>(h & 0xFFFFFF) / 16777216.0f - 0.5f) * 4.0f);
  }
}

// The benchmark's split (python/wgrad/bench_quant.py, _segment_sizes).
std::vector<int32_t> segment_sizes(int rows, int groups, int align) {
  return wgrad::bench::segment_sizes<int32_t>(rows, groups, align);
}

// One cast's buffers on the device (x random, the sizes copied) and the kernel's arguments for it.
struct Cast {
  QuantizeParams p{};
  SegmentTableArgs a;
  int64_t row_blocks;
  Cast(int R, int C, const std::vector<int32_t>& sizes) {
    const int G = static_cast<int>(sizes.size());
    row_blocks = k_block_capacity(R, G);
    const int64_t ldq = align_up(R, 16), sld = scale_ld(C);
    __nv_bfloat16* x;
    int32_t* d_sizes;
    CK(cudaMalloc(&x, size_t{2} * R * C));
    CK(cudaMalloc(&p.q_t, size_t(C) * ldq));
    CK(cudaMalloc(&p.scales_t, sizeof(float) * row_blocks * sld));
    CK(cudaMalloc(&d_sizes, sizeof(int32_t) * G));
    CK(cudaMemcpy(d_sizes, sizes.data(), sizeof(int32_t) * G, cudaMemcpyHostToDevice));
    fill_x<<<1024, 256>>>(x, size_t(R) * C);
    p.x = x;
    p.rows = R;
    p.cols = C;
    p.q_t_ld = ldq;
    p.scales_t_ld = sld;
    a.sizes = d_sizes;
    a.num_segments = G;
    a.rows = R;
    a.num_row_blocks = row_blocks;
  }
  ~Cast() {
    CK(cudaFree(const_cast<void*>(p.x)));
    CK(cudaFree(p.q_t));
    CK(cudaFree(p.scales_t));
    CK(cudaFree(const_cast<int32_t*>(a.sizes)));
  }
};

int main(int argc, char** argv) {
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int ctas = sms * Cfg::kCtasPerSm;
  if (ctas > kMaxCtas) return 1;
  uint8_t* flush;
  const size_t kFlush = size_t{256} << 20;
  CK(cudaMalloc(&flush, kFlush));
  auto kernel = &quantize_fp8_1x128_segments_carry_kernel<__nv_bfloat16, 128, 8>;
  CarryDynamic dyn;
  if (const char* v = std::getenv("CARRY_DYNAMIC")) {
    dyn.max_remainder = 1 << 30;  // (BACK:CHUNK:MAX_REMAINDER: the tail only for remainders up to that)
    if (std::sscanf(v, "%d:%d:%d", &dyn.back, &dyn.chunk, &dyn.max_remainder) < 2) return 1;
    CK(cudaMalloc(&dyn.counter, sizeof(int32_t)));
    CK(cudaMemset(dyn.counter, 0, sizeof(int32_t)));
    std::printf("dynamic tail: back %d, chunk %d, max remainder %d\n", dyn.back, dyn.chunk, dyn.max_remainder);
  }
  // CARRY_PREFETCH=N or boxN: the kernel's L2 prefetch of the first N tiles it guesses (0: none), a row at a
  // time or a TMA box per tile (CarryPrefetch; the box form's descriptor is x's, so one per cast).
  const char* pf_env = std::getenv("CARRY_PREFETCH");
  const bool pf_boxes = pf_env != nullptr && std::strncmp(pf_env, "box", 3) == 0;
  const int32_t pf_tiles = pf_env == nullptr ? 0 : std::atoi(pf_boxes ? pf_env + 3 : pf_env);
  std::printf("prefetch: %d tiles%s\n", pf_tiles, pf_boxes ? ", a TMA box each" : "");
  auto prefetch_of = [&](const Cast& c) {
    CarryPrefetch pf{};
    pf.tiles = pf_tiles;
    pf.boxes = pf_boxes;
    if (pf_boxes) {
      const std::string err = encode_matrix_descriptor(&pf.tma_x, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, c.p.x,
                                                       c.p.rows, c.p.cols, c.p.cols, Cfg::kTileCols, kCarryBlockRows);
      if (!err.empty()) {
        std::printf("%s\n", err.c_str());
        std::exit(1);
      }
    }
    return pf;
  };
  // A small cast of its own (512 x 512, two unaligned segments) that brings the kernel's code into the L2
  // after the flush and before a timed call ("code warm"): what the rest of the launch costs is then not
  // the first fetch of its instructions.
  const Cast warm(512, 512, {200, 312});
  const CarryPrefetch warm_prefetch = prefetch_of(warm);
  for (int arg = 1; arg < argc; ++arg) {
    int R, C, G, align;
    if (std::sscanf(argv[arg], "%dx%dx%dx%d", &R, &C, &G, &align) != 4) return 1;
    const std::vector<int32_t> sizes = segment_sizes(R, G, align);
    const Cast cast(R, C, sizes);
    const QuantizeParams& p = cast.p;
    const SegmentTableArgs& a = cast.a;
    const CarryPrefetch prefetch = prefetch_of(cast);
    const int64_t row_blocks = cast.row_blocks;
    const int smem = Cfg::smem_bytes(row_blocks);
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    // The bytes moved: x read, q_t and the scales written; the copy moves as many (half read, half written).
    const size_t bytes = size_t{2} * R * C + size_t(C) * R + sizeof(float) * row_blocks * C;
    uint8_t *src, *dst;
    CK(cudaMalloc(&src, bytes / 2));
    CK(cudaMalloc(&dst, bytes / 2));
    auto flushed = [&](int rep) { CK(cudaMemsetAsync(flush, rep, kFlush)); };
    const float copy_us = median_us([&] { CK(cudaMemcpyAsync(dst, src, bytes / 2, cudaMemcpyDeviceToDevice)); }, 15,
                                    flushed);
    const float us_warm = median_us([&] { kernel<<<ctas, Cfg::kThreads, smem>>>(p, a, dyn, prefetch); }, 15, [&](int rep) {
      flushed(rep);
      kernel<<<ctas, Cfg::kThreads, Cfg::smem_bytes(warm.row_blocks)>>>(warm.p, warm.a, dyn, warm_prefetch);
    });
    // (With the dynamic tail: also with the host's memset of the counter before each call, as the op does.)
    const float us_memset = dyn.counter == nullptr ? 0.0f : median_us([&] {
      CK(cudaMemsetAsync(dyn.counter, 0, sizeof(int32_t)));
      kernel<<<ctas, Cfg::kThreads, smem>>>(p, a, dyn, prefetch);
    }, 15, flushed);
    const float us = median_us([&] { kernel<<<ctas, Cfg::kThreads, smem>>>(p, a, dyn, prefetch); }, 15, flushed);
    CK(cudaGetLastError());
    std::vector<unsigned long long> tl(kCarryTimelineSlots * ctas);
    CK(cudaMemcpyFromSymbol(tl.data(), wgrad_carry_timeline, sizeof(unsigned long long) * kCarryTimelineSlots * ctas));

    // Tiles (and rows) per CTA, as the kernel splits them.
    std::vector<int32_t> block_rows;
    for (int32_t s : sizes)
      for (int32_t r = 0; r < s; r += 128) block_rows.push_back(std::min(128, s - r));
    const int64_t used = static_cast<int64_t>(block_rows.size()), col_tiles = (C + 127) / 128;
    unsigned long long t_min = ~0ull;
    for (int b = 0; b < ctas; ++b) t_min = std::min(t_min, tl[kCarryTimelineSlots * b]);
    auto at = [&](int b, int k) { return (tl[kCarryTimelineSlots * b + k] - t_min) * 1e-3; };  // us after the first entry
    std::vector<double> entry, table, first, end, tile1, tile2, later;  // later: mean of the tiles after the 2nd
    std::vector<double> fill, range, issue;  // the start after the table: slots 1 -> 9 -> 8 -> 2 (CTAs with tiles)
    std::map<int64_t, std::pair<double, int>> by_tiles;   // tiles per CTA -> (sum of ends, CTAs)
    std::map<int64_t, int64_t> sm_tiles;                  // SM -> tiles
    std::map<int64_t, double> sm_end;                     // SM -> its last CTA's end
    for (int b = 0; b < ctas; ++b) {
      const int64_t n = static_cast<int64_t>(tl[kCarryTimelineSlots * b + 7]);  // tiles the CTA walked
      entry.push_back(at(b, 0));
      table.push_back(at(b, 1) - at(b, 0));
      first.push_back(at(b, 2) - at(b, 1));
      end.push_back(at(b, 3));
      if (n >= 1) {
        tile1.push_back(at(b, 5) - at(b, 2));
        fill.push_back(at(b, 9) - at(b, 1));
        range.push_back(at(b, 8) - at(b, 9));
        issue.push_back(at(b, 2) - at(b, 8));
      }
      if (n >= 2) tile2.push_back(at(b, 6) - at(b, 5));
      if (n >= 3) later.push_back((at(b, 3) - at(b, 6)) / double(n - 2));
      by_tiles[n].first += at(b, 3);
      by_tiles[n].second += 1;
      const int64_t sm = static_cast<int64_t>(tl[kCarryTimelineSlots * b + 4]);
      sm_tiles[sm] += n;
      sm_end[sm] = std::max(sm_end[sm], at(b, 3));
    }
    auto pct = [](std::vector<double> v, double q) {
      std::sort(v.begin(), v.end());
      return v[static_cast<size_t>(q * (v.size() - 1))];
    };
    std::printf("%dx%d G=%d align=%d: %zu blocks, %lld tiles (%.2f per CTA); "
                "kernel %.2f us (code warm %.2f), copy %.2f us: %.1f %% of copy\n",
                R, C, G, align, block_rows.size(), static_cast<long long>(used * col_tiles),
                double(used * col_tiles) / ctas, us, us_warm, copy_us, 100.0 * copy_us / us);
    if (dyn.counter != nullptr) std::printf("  with the counter's memset before each call: %.2f us\n", us_memset);
    std::printf("  entry spread: p50 %.2f max %.2f us; table: p50 %.2f max %.2f us; "
                "to first loads: p50 %.2f max %.2f\n",
                pct(entry, 0.5), pct(entry, 1.0), pct(table, 0.5), pct(table, 1.0), pct(first, 0.5), pct(first, 1.0));
    if (!fill.empty())
      std::printf("  after the table: scale fill p50 %.2f max %.2f us; range p50 %.2f max %.2f; "
                  "first loads issued p50 %.2f max %.2f\n",
                  pct(fill, 0.5), pct(fill, 1.0), pct(range, 0.5), pct(range, 1.0), pct(issue, 0.5), pct(issue, 1.0));
    if (!later.empty())
      std::printf("  tile 1: p50 %.2f max %.2f us; tile 2: p50 %.2f max %.2f; "
                  "later tiles (mean per CTA): p50 %.2f max %.2f\n",
                  pct(tile1, 0.5), pct(tile1, 1.0), pct(tile2, 0.5), pct(tile2, 1.0), pct(later, 0.5), pct(later, 1.0));
    std::printf("  CTA ends (us after the first entry): min %.2f p10 %.2f p50 %.2f p90 %.2f max %.2f\n", pct(end, 0.0),
                pct(end, 0.1), pct(end, 0.5), pct(end, 0.9), pct(end, 1.0));
    std::printf("  mean end by tiles per CTA:");
    for (auto& [n, s] : by_tiles) {
      std::printf("  %lld: %.2f (%d)", static_cast<long long>(n), s.first / s.second, s.second);
    }
    // Where a CTA's lag comes from: among the CTAs of the most common tile count, the spread (standard
    // deviation) of their ends, of the ends of their first and second tiles, and of what comes after those,
    // and the correlation of the first tile's end with the CTA's.
    {
      int64_t mode = 0;
      for (auto& [n, st] : by_tiles)
        if (st.second > by_tiles[mode].second) mode = n;
      std::vector<double> e, t1, t2;
      for (int b = 0; b < ctas; ++b) {
        if (static_cast<int64_t>(tl[kCarryTimelineSlots * b + 7]) != mode || mode < 3) continue;
        e.push_back(at(b, 3));
        t1.push_back(at(b, 5));
        t2.push_back(at(b, 6));
      }
      auto mean = [](const std::vector<double>& v) {
        double m = 0;
        for (double a : v) m += a;
        return v.empty() ? 0.0 : m / v.size();
      };
      auto cov = [&](const std::vector<double>& a, const std::vector<double>& b) {
        const double ma = mean(a), mb = mean(b);
        double c = 0;
        for (size_t i = 0; i < a.size(); ++i) c += (a[i] - ma) * (b[i] - mb);
        return a.empty() ? 0.0 : c / a.size();
      };
      auto minus = [](std::vector<double> a, const std::vector<double>& b) {
        for (size_t i = 0; i < a.size(); ++i) a[i] -= b[i];
        return a;
      };
      const std::vector<double> after1 = minus(e, t1), after2 = minus(e, t2);
      if (!e.empty())
        std::printf("\n  CTAs of %lld tiles (%zu): std of end %.2f us, of tile 1's end %.2f, of tile 2's end %.2f, "
                    "of end - tile 1's end %.2f, of end - tile 2's end %.2f; corr(tile 1's end, end) %.2f",
                    static_cast<long long>(mode), e.size(), std::sqrt(cov(e, e)), std::sqrt(cov(t1, t1)),
                    std::sqrt(cov(t2, t2)), std::sqrt(cov(after1, after1)), std::sqrt(cov(after2, after2)),
                    cov(t1, e) / std::sqrt(cov(t1, t1) * cov(e, e)));
    }
    std::printf("\n  mean SM end by tiles per SM:");
    std::map<int64_t, std::pair<double, int>> by_sm;
    for (auto& [sm, n] : sm_tiles) {
      by_sm[n].first += sm_end[sm];
      by_sm[n].second += 1;
    }
    for (auto& [n, s] : by_sm) {
      std::printf("  %lld: %.2f (%d)", static_cast<long long>(n), s.first / s.second, s.second);
    }
    std::printf("\n");
    CK(cudaFree(src));
    CK(cudaFree(dst));
    if (dyn.counter != nullptr) {
      int32_t left = -1;
      CK(cudaMemcpy(&left, dyn.counter, sizeof(int32_t), cudaMemcpyDeviceToHost));
      if (left != 0) std::printf("  COUNTER LEFT AT %d (must be 0)\n", left);
    }
  }
  return 0;
}
