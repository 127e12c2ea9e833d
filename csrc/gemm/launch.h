// \brief Shared pieces of the GEMM host entries (torch side, stable ABI): the scale and out descriptors, the
// tile width, the launch.
#pragma once

#include <cstdint>

#include "common/device.h"
#include "common/knobs.h"
#include "common/tma.h"
#include "kernels/gemm/launch_sm90.cuh"

namespace wgrad {

// Descriptors of the per-row scales and of out, shared by every mode: out fp32 (accumulated into) or bf16
// (written), [M, N] or [G, M, N]; cfg: the call's tile width and fp32 epilogue (choose_config).
template <class Params>
void set_scale_and_out_descs(const char* op, Params& p, const torch::stable::Tensor& sa,
                             const torch::stable::Tensor& sb, const torch::stable::Tensor& out, GemmConfig cfg) {
  const int block_n = cfg.block_n;
  const int64_t d = out.dim();  // 2 (dense) or 3 (k-grouped: [G, M, N])
  const int64_t m = out.size(d - 2), n = out.size(d - 1);
  const int64_t g = d == 3 ? out.size(0) : 1;
  const int64_t ld = out.stride(d - 2), g_stride = d == 3 ? out.stride(0) : 0;
  if (sa.size(1) > 0) {  // (a bf16 out of K == 0 is written without operands: no scale columns)
    check_tma_descriptor(op, "sa",
                         make_scale_desc(&p.tma_sa, sa.const_data_ptr<float>(), m, sa.size(1), sa.stride(1), kBlockM));
    check_tma_descriptor(op, "sb",
                         make_scale_desc(&p.tma_sb, sb.const_data_ptr<float>(), n, sb.size(1), sb.stride(1), block_n));
  }
  WGRAD_CHECK(m <= INT32_MAX && n <= INT32_MAX, op, ": M and N must fit TMA's 32-bit coordinates, got ", m, " and ", n);
  if constexpr (Params::kBf16Out) {
    // The tensor maps cover whole 16-byte chunks, [0, N & ~7); the kernel's threads store the rest
    // (epilogue_bf16_sm90.cuh).
    const int64_t tma_cols = n & ~int64_t{7};
    void* ptr = out.mutable_data_ptr();
    if (tma_cols > 0) {
      check_tma_descriptor(op, "out", make_bf16_out_desc(&p.tma_out, ptr, g, m, tma_cols, ld, g_stride, 64));
      if (block_n % 128 != 0) {
        check_tma_descriptor(op, "out", make_bf16_out_desc(&p.tma_out_narrow, ptr, g, m, tma_cols, ld, g_stride, 8));
      }
    }
    p.out_bf16.ptr = static_cast<__nv_bfloat16*>(ptr);
    p.out_bf16.ld = m > 1 ? ld : 0;
    p.out_bf16.group_stride = g > 1 ? g_stride : 0;
    p.out_bf16.n = static_cast<int>(n);
    p.out_bf16.m = static_cast<int>(m);
    p.out_bf16.tma_cols = static_cast<int>(tma_cols);
    p.out_bf16.tma = tma_cols > 0;
  } else {
    // The TMA reduce-add writes whole 16-byte chunks: it covers the columns [0, N & ~3) only and the
    // kernel's threads add the rest (epilogue_sm90.cuh).
    const int64_t tma_cols = n & ~int64_t{3};
    if (tma_cols > 0) {
      check_tma_descriptor(op, "out", make_out_desc(&p.tma_out, out.mutable_data_ptr<float>(), g, m, tma_cols, ld,
                                                    g_stride, block_n, cfg.load_out));
    }
    p.out = OutView{out.mutable_data_ptr<float>(), m > 1 ? ld : 0, g > 1 ? g_stride : 0,
                    static_cast<int>(m),           static_cast<int>(n), static_cast<int>(tma_cols)};
  }
}

// cfg: the tile width and, for an fp32 out, the epilogue (choose_config).
template <class Params>
void launch(const char* op, Params& p, GemmConfig cfg, const torch::stable::Tensor& out) {
#ifdef WGRAD_DIAG_VARIANTS
  p.diag = diag_bits();  // measurement build only: the bits drop parts of the work (kernels/common/diag.h)
#endif
  WGRAD_CHECK(p.scheduler.total_cluster_tiles() < INT32_MAX / 2, op, ": too many output tiles (",
              p.scheduler.total_cluster_tiles(), "): the persistent scheduler counts tiles in 32 bits");
  const cudaError_t err = launch_gemm_sm90(p, cfg.block_n, cfg.load_out, num_sms_of(out), current_stream(out));
  WGRAD_CHECK(err == cudaSuccess, op, ": kernel launch failed: ", cudaGetErrorString(err));
}

// The tile width and epilogue of a weight-gradient call, M x N repeated `batches` times with tiles of
// k_per_tile (dense K, or the mean K_g of a k-grouped call): a bf16 out has one epilogue (select_bf16_block_n);
// an fp32 one is loaded ahead or reduce-added into (select_fp32_config, unless WGRAD_BLOCK_N or
// WGRAD_FP32_EPILOGUE forces).
template <bool kBf16Out>
GemmConfig choose_config(int64_t m, int64_t n, int64_t batches, int64_t k_per_tile, const torch::stable::Tensor& out) {
  if constexpr (kBf16Out) {
    return {select_bf16_block_n(m, n, batches, k_per_tile, num_sms_of(out), forced_block_n()), false};
  } else {
    return select_fp32_config(m, n, batches, k_per_tile, num_sms_of(out), forced_block_n(), forced_fp32_epilogue());
  }
}

}  // namespace wgrad
