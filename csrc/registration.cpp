// \brief Every op schema of torch.ops.wgrad, and the CUDA/CPU kernels registered for them.
//
// ======================================== operand contract ========================================
// GEMMs compute, in place and in fp32,
//     out[m, n] += sum_kb sa[m, kb] * sb[n, kb] * sum_{k in block kb} a[m, k] * b[n, k]
// with 1x128 blocks along K (K is the token count of a weight gradient). K == 0 leaves out untouched.
//
//   a    float8_e4m3fn [M, K]      K-contiguous (stride(1) == 1), row stride a multiple of 16 elements,
//                                  data pointer 16-byte aligned (TMA).
//   b    float8_e4m3fn [N, K]      same rules as a.
//   sa   float32 [M, ceil(K/128)]  "TMA-aligned MN-major": stride(0) == 1, stride(1) = ld with
//                                  ld >= M and ld % 4 == 0 (element (m, kb) at kb * ld + m),
//                                  data pointer 16-byte aligned.
//   sb   float32 [N, ceil(K/128)]  same rules as sa with N.
//   out  float32 [M, N]            stride(1) == 1, row stride >= N and a multiple of 4, data pointer
//                                  16-byte aligned. Only the M x N window is read or written.
//
// k-grouped, packed (DeepGEMM's k_grouped layout); ks is a host list of G sizes, each a multiple of 16:
//   a    float8_e4m3fn, contiguous, numel >= M * sum(ks): group g is the row-major [M, ks[g]] block that
//        starts at element M * sum(ks[:g]).   b: likewise with N.
//   sa   float32 [M, sum_g ceil(ks[g]/128)] MN-major as above; group g's blocks start at column
//        sum_{h<g} ceil(ks[h]/128).           sb: likewise with N.
//   out  float32 [G, M, N], stride(2) == 1, stride(1) and stride(0) multiples of 4.
//
// k-grouped, contiguous-K; ks is an int32 tensor [G] of sizes (each >= 0, any value: a group that
//   starts inside a 16-byte chunk is loaded shifted, see mainloop_sm90.cuh) on the operands' device,
//   read only by the kernel (no host synchronisation; capturable in a CUDA graph). On CUDA the kernel
//   validates the sizes and leaves out untouched when they break the rules; on the CPU they are checked
//   like any argument.
//   a    float8_e4m3fn [M, K_total], the rules of dense a but for K_total, which may be any value (the
//        row stride stays a multiple of 16); columns [off_g, off_g + ks[g]) are group g's,
//        off_g = sum(ks[:g]), and sum(ks) must be at most K_total (the columns past it are not read).
//   b    float8_e4m3fn [N, K_total].
//   sa   float32 [M, kb_cap] MN-major, kb_cap >= ceil(K_total/128) + G - 1 (the most blocks any split of
//        K_total into G groups can need); group g's blocks start at column sum_{h<g} ceil(ks[h]/128).
//   out  float32 [G, M, N] as in the packed layout.
//
// bf16 forms of the dense and contiguous-K GEMMs (the weight gradient of a model without an fp32
// accumulation buffer), out written, not accumulated:
//     out[m, n] = bf16( sum_kb sa[m, kb] * sb[n, kb] * sum_{k in block kb} a[m, k] * b[n, k] )
// rounded once from the fp32 sum (the same bits as the fp32 form into zeros, then cast). K == 0 (a group
// with K_g == 0) writes zeros. The operands as above; out bfloat16 with the fp32 out's rules but strides
// multiples of 8 elements (16 bytes).
//
// m-grouped (the expert GEMM of MoE fprop and dgrad; bf16 out, written, not accumulated):
//     out[r, n] = bf16( sum_kb sa[r, kb] * sb[g, n / 128, kb] * sum_{k in block kb} a[r, k] * b[g, n, k] )
// for every row r of group g (rows [off_g, off_g + group_sizes[g]), off_g = sum(group_sizes[:g])).
//   a    float8_e4m3fn [T, K]      the rules of dense a; K any positive value.
//   sa   float32 [T, ceil(K/128)]  MN-major as above (the 1x128 row-wise cast's scales).
//   b    float8_e4m3fn [G, N, K]   stride(2) == 1, stride(0) and stride(1) multiples of 16 elements, in any
//                                  order (the dgrad form passes the transposed weights as a strided view).
//   sb   float32 [G, ceil(N/128), ceil(K/128)], any strides: b's 128x128 block scales.
//   out  bfloat16 [T, N]           stride(1) == 1, even row stride >= N, N even.
//   group_sizes int32 [G] on the operands' device, each >= 0, sum == T; on CUDA read only by the kernel,
//        which validates them and leaves out untouched when they break the rules (no host synchronisation).
//
// Quantization (1x128 blocks, e4m3, scale = amax / 448, see python/wgrad/reference.py):
//   x      bfloat16 / float16 / float32 [R, C] (leading dims flattened by the Python layer), contiguous.
//   rowwise   -> q [R, C] contiguous, scales [R, ceil(C/128)] MN-major with ld = align_up(R, 4).
//   colwise   -> q_t [C, R] with row stride align_up(R, 16), scales [C, ceil(R/128)] MN-major,
//                ld = align_up(C, 4): the wgrad operand for x = [tokens, features].
//   both      -> rowwise and colwise outputs from one read of x.
//   colwise_segments(x, sizes) -> the colwise outputs with blocks restarting at every segment of rows
//                (int32 sizes on x's device, sum == R), scales [C, ceil(R/128) + G - 1]: the
//                contiguous-K operand of the k-grouped GEMM. Unused trailing scale columns hold 0.
//   colwise_segments_padded(x, sizes, pad) -> the same with every segment's q_t columns padded with zero
//                columns to a multiple of pad (16/32/64/128): q_t [C, K], K = floor((R + G (pad - 1)) / pad)
//                * pad, scales [C, ceil(K/128) + G - 1], and padded_sizes int32 [G] (align_up(size, pad);
//                the zero columns past their sum are not read): what the contiguous-K GEMM takes for any
//                token counts.
//   both_segments_padded(x, sizes, pad) -> (q, scales) of rowwise and (q_t, scales_t, padded_sizes) of
//                colwise_segments_padded from one read of x (an MoE layer's activation: row-wise for the
//                expert GEMM, column-wise per expert for wgrad). Invalid sizes: the column-wise outputs as
//                colwise_segments_padded's; the row-wise ones do not depend on the sizes.
//
// Private: _quantize_fp8_1x128_colwise_segments_with_plan(x, sizes, pad, ue8m0, plan) -> (q_t, scales_t,
//   padded_sizes), the segments cast (pad 0) or the padded one (pad 16/32/64/128, padded_sizes as above;
//   pad 0: a copy of sizes) on the path a plan string names (csrc/quant/plan.h: kernel, tile order, packed
//   tiles, dynamic tail) instead of the automatic one. The same bits whatever the plan: for tests.
//   128x128(w) -> w [N, K] in 128 x 128 blocks (the weight cast of the FP8 layers): q [N, K] and q_t [K, N]
//                contiguous (the same codes, transposed), scales [ceil(N/128), ceil(K/128)] and scales_t
//                (its transpose) contiguous: the operands of fprop (x W^T) and dgrad (dY W).
// ===================================================================================================

#include <torch/csrc/stable/library.h>

#include "checks.h"
#include "ops.h"

// Through torch's stable ABI (common/stable.h): STABLE_TORCH_LIBRARY registers the same schemas that
// TORCH_LIBRARY did, and TORCH_BOX turns each C++ function into the boxed kernel the C shim takes.
STABLE_TORCH_LIBRARY(wgrad, m) {
  m.def("wgrad_gemm_fp8_fp8_fp32_nt(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor(a!) out) -> ()");
  m.def(
      "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor(a!) out, "
      "int[] ks) -> ()");
  m.def(
      "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous(Tensor a, Tensor sa, Tensor b, Tensor sb, "
      "Tensor(a!) out, Tensor ks) -> ()");
  m.def(
      "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor(a!) out, "
      "Tensor group_sizes) -> ()");
  m.def("wgrad_gemm_fp8_fp8_bf16_nt(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor(a!) out) -> ()");
  m.def(
      "k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous(Tensor a, Tensor sa, Tensor b, Tensor sb, "
      "Tensor(a!) out, Tensor ks) -> ()");

  // The checks on their own, so that the Python CPU kernels (reference math) enforce exactly the
  // contract the CUDA kernels enforce.
  m.def("_check_wgrad_gemm_fp8_fp8_fp32_nt(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor out) -> ()");
  m.def(
      "_check_k_grouped_wgrad_gemm_fp8_fp8_fp32_nt(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor out, "
      "int[] ks) -> ()");
  m.def(
      "_check_k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous(Tensor a, Tensor sa, Tensor b, Tensor sb, "
      "Tensor out, Tensor ks) -> ()");
  m.def(
      "_check_m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor out, "
      "Tensor group_sizes) -> ()");
  m.def("_check_wgrad_gemm_fp8_fp8_bf16_nt(Tensor a, Tensor sa, Tensor b, Tensor sb, Tensor out) -> ()");
  m.def(
      "_check_k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous(Tensor a, Tensor sa, Tensor b, Tensor sb, "
      "Tensor out, Tensor ks) -> ()");

  m.def("quantize_fp8_1x128_rowwise(Tensor x, bool ue8m0=False) -> (Tensor q, Tensor scales)");
  m.def("quantize_fp8_1x128_colwise(Tensor x, bool ue8m0=False) -> (Tensor q_t, Tensor scales_t)");
  m.def(
      "quantize_fp8_1x128_both(Tensor x, bool ue8m0=False) -> "
      "(Tensor q, Tensor scales, Tensor q_t, Tensor scales_t)");
  m.def(
      "quantize_fp8_1x128_colwise_segments(Tensor x, Tensor sizes, bool ue8m0=False) -> "
      "(Tensor q_t, Tensor scales_t)");
  m.def(
      "quantize_fp8_1x128_colwise_segments_padded(Tensor x, Tensor sizes, int pad=32, bool ue8m0=False) -> "
      "(Tensor q_t, Tensor scales_t, Tensor padded_sizes)");
  m.def(
      "quantize_fp8_1x128_both_segments_padded(Tensor x, Tensor sizes, int pad=32, bool ue8m0=False) -> "
      "(Tensor q, Tensor scales, Tensor q_t, Tensor scales_t, Tensor padded_sizes)");
  m.def(
      "_quantize_fp8_1x128_colwise_segments_with_plan(Tensor x, Tensor sizes, int pad, bool ue8m0, str plan) -> "
      "(Tensor q_t, Tensor scales_t, Tensor padded_sizes)");
  m.def(
      "quantize_fp8_128x128(Tensor w, bool ue8m0=False) -> "
      "(Tensor q, Tensor scales, Tensor q_t, Tensor scales_t)");
  m.def("_check_quantize_fp8_1x128(Tensor x) -> ()");
  m.def("_check_quantize_fp8_128x128(Tensor w) -> ()");
  m.def("_check_quantize_fp8_1x128_segments(Tensor x, Tensor sizes) -> ()");
  m.def("_check_quantize_fp8_1x128_segments_padded(Tensor x, Tensor sizes, int pad) -> ()");
  m.def("_check_quantize_fp8_1x128_both_segments_padded(Tensor x, Tensor sizes, int pad) -> ()");
  m.def("_check_quantize_fp8_1x128_segments_plan(str plan) -> ()");
}

namespace {

// The checks run on every backend that holds real data. (A template: the stable library's type is torch's
// detail.)
template <class Library>
void register_checks(Library& m) {
  m.impl("_check_wgrad_gemm_fp8_fp8_fp32_nt", TORCH_BOX(&wgrad::check_wgrad_gemm_fp8_fp8_fp32_nt));
  m.impl("_check_k_grouped_wgrad_gemm_fp8_fp8_fp32_nt", TORCH_BOX(&wgrad::check_k_grouped_wgrad_gemm_fp8_fp8_fp32_nt));
  m.impl("_check_k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous",
         TORCH_BOX(&wgrad::check_k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous));
  m.impl("_check_m_grouped_gemm_fp8_fp8_bf16_nt_contiguous",
         TORCH_BOX(&wgrad::check_m_grouped_gemm_fp8_fp8_bf16_nt_contiguous));
  m.impl("_check_wgrad_gemm_fp8_fp8_bf16_nt", TORCH_BOX(&wgrad::check_wgrad_gemm_fp8_fp8_bf16_nt));
  m.impl("_check_k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous",
         TORCH_BOX(&wgrad::check_k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous));
  m.impl("_check_quantize_fp8_1x128", TORCH_BOX(&wgrad::check_quantize_fp8_1x128));
  m.impl("_check_quantize_fp8_1x128_segments", TORCH_BOX(&wgrad::check_quantize_fp8_1x128_segments));
  m.impl("_check_quantize_fp8_1x128_segments_padded", TORCH_BOX(&wgrad::check_quantize_fp8_1x128_segments_padded));
  m.impl("_check_quantize_fp8_1x128_both_segments_padded",
         TORCH_BOX(&wgrad::check_quantize_fp8_1x128_both_segments_padded));
  m.impl("_check_quantize_fp8_128x128", TORCH_BOX(&wgrad::check_quantize_fp8_128x128));
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(wgrad, CPU, m) { register_checks(m); }

STABLE_TORCH_LIBRARY_IMPL(wgrad, CUDA, m) {
  register_checks(m);

  m.impl("wgrad_gemm_fp8_fp8_fp32_nt", TORCH_BOX(&wgrad::wgrad_gemm_fp8_fp8_fp32_nt_cuda));
  m.impl("k_grouped_wgrad_gemm_fp8_fp8_fp32_nt", TORCH_BOX(&wgrad::k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_cuda));
  m.impl("k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous",
         TORCH_BOX(&wgrad::k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous_cuda));
  m.impl("m_grouped_gemm_fp8_fp8_bf16_nt_contiguous",
         TORCH_BOX(&wgrad::m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_cuda));
  m.impl("wgrad_gemm_fp8_fp8_bf16_nt", TORCH_BOX(&wgrad::wgrad_gemm_fp8_fp8_bf16_nt_cuda));
  m.impl("k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous",
         TORCH_BOX(&wgrad::k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous_cuda));
  m.impl("quantize_fp8_1x128_rowwise", TORCH_BOX(&wgrad::quantize_fp8_1x128_rowwise_cuda));
  m.impl("quantize_fp8_1x128_colwise", TORCH_BOX(&wgrad::quantize_fp8_1x128_colwise_cuda));
  m.impl("quantize_fp8_1x128_both", TORCH_BOX(&wgrad::quantize_fp8_1x128_both_cuda));
  m.impl("quantize_fp8_1x128_colwise_segments", TORCH_BOX(&wgrad::quantize_fp8_1x128_colwise_segments_cuda));
  m.impl("quantize_fp8_1x128_colwise_segments_padded",
         TORCH_BOX(&wgrad::quantize_fp8_1x128_colwise_segments_padded_cuda));
  m.impl("quantize_fp8_1x128_both_segments_padded", TORCH_BOX(&wgrad::quantize_fp8_1x128_both_segments_padded_cuda));
  m.impl("_quantize_fp8_1x128_colwise_segments_with_plan",
         TORCH_BOX(&wgrad::quantize_fp8_1x128_colwise_segments_with_plan_cuda));
  m.impl("quantize_fp8_128x128", TORCH_BOX(&wgrad::quantize_fp8_128x128_cuda));
}

// No tensor argument, so no backend to dispatch on: one kernel for every call, fake tensors included (what
// TORCH_LIBRARY's def(schema, function) registered).
STABLE_TORCH_LIBRARY_IMPL(wgrad, CompositeImplicitAutograd, m) {
  m.impl("_check_quantize_fp8_1x128_segments_plan", TORCH_BOX(&wgrad::check_quantize_fp8_1x128_segments_plan));
}

// CPU kernels of the public ops are the reference math, registered from python/wgrad/_ops.py and quant.py;
// the private op's from python/wgrad/_plans.py.

// A Python module object so that `import wgrad._C` loads the library (and its registrations). Python's
// limited API only (setup.py builds with Py_LIMITED_API 3.10): one binary for every CPython from 3.10 on.
#include <Python.h>
static struct PyModuleDef wgrad_module = {.m_base = PyModuleDef_HEAD_INIT, .m_name = "_C", .m_size = -1};
PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&wgrad_module); }
