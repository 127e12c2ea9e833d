// Probe (H200): the unpadded MoE segments cast's memory traffic alone, with no quantization: how fast can any
// kernel that reads x [R, C] bf16 once and writes q_t [C, R] in the contiguous-K layout go, by how the bytes
// of q_t's sectors that two blocks share are written, and in which tile order? Per tile (a block of <= 128
// rows of one segment x 128 columns of x), 256 threads load the tile's x with 16-byte loads, fold them into a
// value (so every store waits for the loads, as in the kernel) and write the tile's run [a, e) of each of its
// 128 q_t rows:
//   direct: the whole sectors inside [a, e) with 16-byte stores, the bytes of the partial sectors at the two
//           ends a byte per lane (every warp 16 rows: the kernel's edge stores since session 16);
//   owner:  every sector from floor32(a) to floor32(e) whole with 16-byte stores, the sector that [a, e)
//           ends in left to the next block (which starts in it): each shared sector written once, whole,
//           as an ideal merge would (no traffic for the merge itself; the bytes of the block before are
//           wrong, timing only).
// Orders (the second number of a cell, "mode/order"): 0 row-major, S strips of S blocks, -1 one contiguous
// range of tiles in column-major order per CTA (the order of csrc/kernels/quantize_segments_carry.cuh).
// Splits (the benchmark's, bench_quant._segment_sizes): one segment, 8 uneven segments ("unaligned"), the
// same padded so that every segment starts on a multiple of 32 columns of q_t ("padded"). Grids of 3 and 4
// CTAs per SM. Against a device copy of half the bytes moved (rounded up to 128 KiB, as the benchmark's), all
// after a 256 MB memset (the benchmark's flush), medians of three rounds of 10 calls, the copy and the probe
// interleaved. Results: docs/perf-notes.md, session 28.
// No torch or CUTLASS: nvcc -std=c++17 -arch=sm_90a -O3 -o p pattern_copy_probe.cu
#include <cuda_runtime.h>

#include "probe_common.h"
#include "../../tests/cpp/bench_split.h"

#include <cstdint>
#include <cstdio>
#include <vector>

struct Block {
  int32_t row;   // first row of x
  int32_t rows;  // rows of x (<= 128)
  int32_t col;   // first column of q_t (a)
};

__device__ __forceinline__ void st16(uint8_t* p, const uint4& v) { *reinterpret_cast<uint4*>(p) = v; }

// kMode 0 direct, 1 owner. Tile order (pattern_kernel's `order`): 0 row-major (tile t = b * nc + c, CTA t % grid), S > 0
// strips of S blocks of one column (unit u = j * nc + c takes blocks j S .. j S + S - 1, CTA u % grid),
// -1 ranges (CTA g the g-th of grid contiguous ranges of tiles in column-major order, c * nb + b).
template <int kMode>
__device__ __forceinline__ void do_tile(const uint4* __restrict__ x, uint8_t* q, const Block* blocks, int b, int c,
                                        int64_t C, int64_t ldq) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t x_row_chunks = C / 8;  // uint4 per row of x
  const Block blk = blocks[b];
  const int64_t a = blk.col, e = a + blk.rows;
  const int64_t a32 = a & ~int64_t{31}, ua32 = (a + 31) & ~int64_t{31}, e32 = e & ~int64_t{31};
  // Loads: thread tid, chunk tid % 16 of rows tid / 16 + 16 j.
  uint4 acc = make_uint4(0, 0, 0, 0);
  uint4 v[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int r = tid / 16 + 16 * j;
    v[j] = r < blk.rows ? __ldg(x + (blk.row + r) * x_row_chunks + 16 * c + tid % 16) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    acc.x ^= v[j].x;
    acc.y += v[j].y;
    acc.z ^= v[j].z;
    acc.w += v[j].w;
  }
  const int k = tid % 8;
  // Whole sectors: [ua32, e32) (direct) or [a32, e32) (owner), 16-byte chunk k of 8 per row.
  const int64_t from = kMode == 1 ? a32 : ua32;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = 128 * c + tid / 8 + 32 * i;
    const int64_t p = from + 16 * k;
    if (p + 16 <= e32) st16(q + row * ldq + p, acc);
  }
  if (kMode == 0) {
    // Partial sectors: head [a, min(ua32, e)), tail [max(e32, ua32), e), a byte per lane, warp w rows
    // 16 w .. 16 w + 15 of the tile.
    const int head = static_cast<int>((ua32 < e ? ua32 : e) - a);
    const int64_t tail0 = e32 > ua32 ? e32 : ua32;
    const int tail = e > tail0 ? static_cast<int>(e - tail0) : 0;
    for (int i = lane; i < head + tail; i += 32) {
      const int64_t p = i < head ? a + i : tail0 + (i - head);
#pragma unroll 4
      for (int j = 0; j < 16; ++j) {
        const int row = 128 * c + 16 * warp + j;
        q[row * ldq + p] = static_cast<uint8_t>(acc.x + j + i);
      }
    }
  }
}

template <int kMode>
__global__ void __launch_bounds__(256) pattern_kernel(const uint4* __restrict__ x, uint8_t* q, const Block* blocks,
                                                      int nb, int nc, int64_t C, int64_t ldq, int order) {
  if (order == 0) {
    for (int t = blockIdx.x; t < nb * nc; t += gridDim.x) do_tile<kMode>(x, q, blocks, t / nc, t % nc, C, ldq);
  } else if (order > 0) {
    const int strips = (nb + order - 1) / order;
    for (int u = blockIdx.x; u < strips * nc; u += gridDim.x) {
      const int j = u / nc, c = u % nc;
      for (int b = j * order; b < nb && b < (j + 1) * order; ++b) do_tile<kMode>(x, q, blocks, b, c, C, ldq);
    }
  } else {
    const int64_t T = int64_t{nb} * nc;
    for (int64_t t = T * blockIdx.x / gridDim.x; t < T * (blockIdx.x + 1) / gridDim.x; ++t) {
      do_tile<kMode>(x, q, blocks, static_cast<int>(t % nb), static_cast<int>(t / nb), C, ldq);
    }
  }
}

// bench_quant._segment_sizes(rows, 8): R / 8 moved by fixed offsets, the last taking the rest.
static std::vector<int> segment_sizes(int rows) { return wgrad::bench::segment_sizes<int>(rows); }

// Blocks of a split: segment g's rows at x row offset, q_t columns from its (padded) start.
static std::vector<Block> make_blocks(const std::vector<int>& sizes, int pad, int64_t* q_cols) {
  std::vector<Block> out;
  int row = 0;
  int64_t col = 0;
  for (int s : sizes) {
    for (int r = 0; r < s; r += 128) out.push_back({row + r, s - r < 128 ? s - r : 128, static_cast<int32_t>(col + r)});
    row += s;
    col += (s + pad - 1) / pad * pad;
  }
  *q_cols = (col + 15) / 16 * 16;
  return out;
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t flush_bytes = size_t{256} << 20;
  uint8_t* flush = nullptr;
  CK(cudaMalloc(&flush, flush_bytes));
  const int shapes[5][2] = {{4096, 7168}, {8192, 2112}, {8192, 4096}, {16384, 7168}, {4096, 24576}};
  for (const auto& shape : shapes) {
    const int R = shape[0], C = shape[1], nc = C / 128;
    uint4* x = nullptr;
    CK(cudaMalloc(&x, size_t{2} * R * C));
    CK(cudaMemset(x, 0x3c, size_t{2} * R * C));
    const std::vector<int> split = segment_sizes(R), one = {R};
    struct Case {
      const char* name;
      std::vector<int> sizes;
      int pad;
    } cases[3] = {{"one segment", one, 1}, {"padded 32", split, 32}, {"unaligned", split, 1}};
    for (const Case& cs : cases) {
      int64_t qcols = 0;
      const std::vector<Block> blocks = make_blocks(cs.sizes, cs.pad, &qcols);
      const int nb = static_cast<int>(blocks.size());
      Block* dblocks = nullptr;
      uint8_t* q = nullptr;
      CK(cudaMalloc(&dblocks, sizeof(Block) * nb));
      CK(cudaMemcpy(dblocks, blocks.data(), sizeof(Block) * nb, cudaMemcpyHostToDevice));
      CK(cudaMalloc(&q, size_t{static_cast<size_t>(C)} * qcols));
      const double bytes = 2.0 * R * C + double(C) * qcols;
      const size_t half = (static_cast<size_t>(bytes / 2) + (size_t{128} << 10) - 1) / (size_t{128} << 10) * (size_t{128} << 10);
      uint8_t *src = nullptr, *dst = nullptr;
      CK(cudaMalloc(&src, half));
      CK(cudaMalloc(&dst, half));
      auto before = [&](int rep) { CK(cudaMemsetAsync(flush, rep, flush_bytes)); };
      auto copy = [&] { CK(cudaMemcpyAsync(dst, src, half, cudaMemcpyDeviceToDevice)); };
      std::printf("%5d x %5d %-12s blocks %3d:", R, C, cs.name, nb);
      struct Run {
        int mode, order;
      };
      const Run runs[] = {{0, 0}, {1, 0}, {1, 3}, {1, 6}, {1, 18}, {1, -1}};
      for (const Run& run : runs) {
        if (run.mode == 0 && cs.pad == 32) continue;
        for (int per_sm : {3, 4}) {
          auto probe = [&] {
            if (run.mode == 0) pattern_kernel<0><<<sms * per_sm, 256>>>(x, q, dblocks, nb, nc, C, qcols, run.order);
            if (run.mode == 1) pattern_kernel<1><<<sms * per_sm, 256>>>(x, q, dblocks, nb, nc, C, qcols, run.order);
          };
          CK(cudaGetLastError());
          // Interleaved: three rounds of 10, medians over all.
          std::vector<float> tp, tc;
          for (int round = 0; round < 3; ++round) {
            tp.push_back(median_us(probe, 10, before));
            tc.push_back(median_us(copy, 10, before));
          }
          std::sort(tp.begin(), tp.end());
          std::sort(tc.begin(), tc.end());
          const double gbps = bytes / tp[1] * 1e-3, copy_gbps = 2.0 * half / tc[1] * 1e-3;
          std::printf("  %s/%d %d/SM %.1f%%", run.mode == 0 ? "direct" : "owner", run.order, per_sm,
                      100.0 * gbps / copy_gbps);
        }
      }
      std::printf("\n");
      CK(cudaFree(dblocks));
      CK(cudaFree(q));
      CK(cudaFree(src));
      CK(cudaFree(dst));
    }
    CK(cudaFree(x));
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
