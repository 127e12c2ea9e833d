// \brief Every op's contract (see the table in registration.cpp), enforced on the host.
#include "checks.h"

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>

#include "kernels/common/layout.h"
#include "quant/plan.h"

namespace wgrad {

namespace {

bool aligned(const torch::stable::Tensor& t, int64_t bytes) {
  const auto addr = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  return addr % bytes == 0;
}

void check_same_device(const char* op, const torch::stable::Tensor& ref, const char* name,
                       const torch::stable::Tensor& t) {
  WGRAD_CHECK(t.device() == ref.device(), op, ": ", name, " must be on ", ref.device(), " like out, got ", t.device());
}

void check_fp8_operand(const char* op, const char* name, const torch::stable::Tensor& t, int64_t rows, int64_t k) {
  WGRAD_CHECK(t.scalar_type() == ScalarType::Float8_e4m3fn, op, ": ", name, " must be float8_e4m3fn, got ",
              t.scalar_type());
  WGRAD_CHECK(t.dim() == 2, op, ": ", name, " must be 2-D [", rows, ", K], got ", t.dim(), "-D ", t.sizes());
  WGRAD_CHECK(t.size(0) == rows && t.size(1) == k, op, ": ", name, " must have shape [", rows, ", ", k, "], got ",
              t.sizes());
  if (rows == 0 || k == 0) return;
  WGRAD_CHECK(t.stride(1) == 1 || k == 1, op, ": ", name, " must be K-contiguous (stride(1) == 1), got strides ",
              t.strides());
  WGRAD_CHECK(rows == 1 || t.stride(0) % kTmaAlignBytes == 0, op, ": ", name,
              " row stride must be a multiple of 16 elements (16 bytes, TMA), got ", t.stride(0));
  WGRAD_CHECK(rows == 1 || t.stride(0) >= k, op, ": ", name, " row stride must be >= K = ", k, ", got ", t.stride(0));
  WGRAD_CHECK(aligned(t, kTmaAlignBytes), op, ": ", name,
              " data pointer must be 16-byte aligned (TMA), got storage offset ", t.storage_offset());
}

void check_mn_major_scales(const char* op, const char* name, const torch::stable::Tensor& s, int64_t mn, int64_t kb) {
  WGRAD_CHECK(s.scalar_type() == ScalarType::Float, op, ": ", name, " must be float32, got ", s.scalar_type());
  WGRAD_CHECK(s.dim() == 2, op, ": ", name, " must be 2-D [", mn, ", ", kb, "], got ", s.dim(), "-D ", s.sizes());
  WGRAD_CHECK(s.size(0) == mn && s.size(1) == kb, op, ": ", name, " must have shape [", mn, ", ", kb,
              "] (one scale per row per 128-wide K block), got ", s.sizes());
  if (mn == 0 || kb == 0) return;
  WGRAD_CHECK(s.stride(0) == 1 || mn == 1, op, ": ", name,
              " must be MN-major (stride(0) == 1, TMA-aligned layout), got strides ", s.strides(),
              "; wgrad.to_mn_major_scales() converts");
  WGRAD_CHECK(kb == 1 || (s.stride(1) % 4 == 0 && s.stride(1) >= mn), op, ": ", name,
              " stride(1) must be a multiple of 4 and >= ", mn, " (TMA-aligned), got ", s.stride(1));
  WGRAD_CHECK(aligned(s, kTmaAlignBytes), op, ": ", name, " data pointer must be 16-byte aligned, got storage offset ",
              s.storage_offset());
}

// out of a weight-gradient GEMM: float32 (accumulated into) or bfloat16 (written); its last two dims [M, N].
void check_gemm_out(const char* op, const torch::stable::Tensor& out, int64_t m, int64_t n, ScalarType dtype) {
  const bool bf16 = dtype == ScalarType::BFloat16;
  WGRAD_CHECK(out.scalar_type() == dtype, op, ": out must be ", bf16 ? "bfloat16" : "float32", ", got ",
              out.scalar_type());
  const int64_t d = out.dim();
  WGRAD_CHECK(out.size(d - 2) == m && out.size(d - 1) == n, op, ": out must end in [", m, ", ", n, "], got ",
              out.sizes());
  if (out.numel() == 0) return;
  WGRAD_CHECK(out.stride(d - 1) == 1 || n == 1, op, ": out must have stride(-1) == 1, got strides ", out.strides());
  const int64_t multiple = kTmaAlignBytes / static_cast<int64_t>(out.element_size());  // 4 or 8 elements
  for (int64_t i = 0; i + 1 < d; ++i) {
    WGRAD_CHECK(out.stride(i) % multiple == 0 || out.size(i) == 1, op, ": out stride(", i, ") must be a multiple of ",
                multiple, " (16 bytes, TMA), got ", out.stride(i));
  }
  WGRAD_CHECK(m == 1 || out.stride(d - 2) >= n, op, ": out row stride must be >= N = ", n, ", got ", out.stride(d - 2));
  WGRAD_CHECK(aligned(out, kTmaAlignBytes), op, ": out data pointer must be 16-byte aligned, got storage offset ",
              out.storage_offset());
}

// The bytes of t's storage its elements span: [first, last) (numel > 0; torch strides are >= 0).
struct ByteSpan {
  int64_t first;
  int64_t last;
};
ByteSpan byte_span(const torch::stable::Tensor& t) {
  int64_t last_element = 0;
  for (int64_t i = 0; i < t.dim(); ++i) last_element += (t.size(i) - 1) * t.stride(i);
  const int64_t first = t.storage_offset() * static_cast<int64_t>(t.element_size());
  return {first, first + (last_element + 1) * static_cast<int64_t>(t.element_size())};
}

// The address where t's storage starts: its first element's less its storage offset. (The stable ABI has no
// storage object to compare; tensors of one storage agree on this address, and tensors of two storages only
// when these share memory, which counts as one storage here.)
uintptr_t storage_start(const torch::stable::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.const_data_ptr()) -
         static_cast<uintptr_t>(t.storage_offset()) * t.element_size();
}

// The kernels write out while they read the operands: out's memory must not overlap any of theirs (the spans
// of their elements in one storage intersecting counts as overlapping).
void check_out_apart(const char* op, const torch::stable::Tensor& out,
                     std::initializer_list<std::pair<const char*, const torch::stable::Tensor*>> inputs) {
  if (out.numel() == 0) return;
  const ByteSpan o = byte_span(out);
  for (const auto& [name, t] : inputs) {
    if (t->numel() == 0 || storage_start(*t) != storage_start(out)) continue;
    const ByteSpan s = byte_span(*t);
    WGRAD_CHECK(o.last <= s.first || s.last <= o.first, op, ": out must not overlap ", name,
                " in memory (the kernel writes out while it reads ", name, "), got out at bytes [", o.first, ", ",
                o.last, ") and ", name, " at bytes [", s.first, ", ", s.last, ") of one storage");
  }
}

// Shared by both k-grouped layouts: out [G, M, N].
void check_grouped_out(const char* op, const torch::stable::Tensor& out, int64_t groups) {
  WGRAD_CHECK(out.dim() == 3, op, ": out must be 3-D [G, M, N], got ", out.dim(), "-D ", out.sizes());
  WGRAD_CHECK(out.size(0) == groups, op, ": out.shape[0] must equal the number of groups ", groups, ", got ",
              out.size(0));
}

// Group sizes on the device: int32, 1-D [G], G >= 1, contiguous. Returns G.
int64_t check_group_size_tensor(const char* op, const char* name, const torch::stable::Tensor& s) {
  WGRAD_CHECK(s.scalar_type() == ScalarType::Int, op, ": ", name, " must be int32, got ", s.scalar_type());
  WGRAD_CHECK(s.dim() == 1, op, ": ", name, " must be 1-D [G], got ", s.dim(), "-D ", s.sizes());
  WGRAD_CHECK(s.is_contiguous(), op, ": ", name, " must be contiguous, got strides ", s.strides());
  WGRAD_CHECK(s.size(0) >= 1, op, ": ", name, " must name at least one group, got an empty tensor");
  return s.size(0);
}

// How the sizes of the groups must add up: to the whole of the grouped dimension, or to at most it (the
// contiguous-K GEMMs do not read the columns past the sum).
enum class SizeSum { Equal, AtMost };

// Their values, where they can be read without a synchronisation (on the CPU; on CUDA the kernels validate
// them): each >= 0, summing to `total` or at most to it (`what` names it in the message).
void check_group_size_values(const char* op, const char* name, const torch::stable::Tensor& s, int64_t total,
                             const char* what, SizeSum rule) {
  if (!s.is_cpu()) return;
  const int32_t* v = s.const_data_ptr<int32_t>();
  int64_t sum = 0;
  for (int64_t g = 0; g < s.size(0); ++g) {
    WGRAD_CHECK(v[g] >= 0, op, ": ", name, "[", g, "] must be >= 0, got ", v[g]);
    sum += v[g];
  }
  if (rule == SizeSum::Equal) {
    WGRAD_CHECK(sum == total, op, ": sum(", name, ") must equal ", what, " = ", total, ", got ", sum);
  } else {
    WGRAD_CHECK(sum <= total, op, ": sum(", name, ") must be at most ", what, " = ", total, ", got ", sum);
  }
}

}  // namespace

namespace {

// Dense: a [M, K], b [N, K], out [M, N] of `dtype`; `contiguous_op` takes any K.
void check_dense_gemm(const char* op, const char* contiguous_op, const torch::stable::Tensor& a,
                      const torch::stable::Tensor& sa, const torch::stable::Tensor& b, const torch::stable::Tensor& sb,
                      const torch::stable::Tensor& out, ScalarType dtype) {
  WGRAD_CHECK(a.dim() == 2, op, ": a must be 2-D [M, K], got ", a.dim(), "-D ", a.sizes());
  WGRAD_CHECK(b.dim() == 2, op, ": b must be 2-D [N, K], got ", b.dim(), "-D ", b.sizes());
  WGRAD_CHECK(out.dim() == 2, op, ": out must be 2-D [M, N], got ", out.dim(), "-D ", out.sizes());
  const int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  WGRAD_CHECK(b.size(1) == k, op, ": b must have K = ", k, " columns like a, got ", b.size(1));
  WGRAD_CHECK(k % 16 == 0, op, ": K must be a multiple of 16 (16-byte TMA rows; ", contiguous_op,
              " takes any K as one group), got ", k);
  for (auto [name, t] : {std::pair{"a", &a}, {"sa", &sa}, {"b", &b}, {"sb", &sb}}) {
    check_same_device(op, out, name, *t);
  }
  check_fp8_operand(op, "a", a, m, k);
  check_fp8_operand(op, "b", b, n, k);
  const int64_t kb = ceil_div(k, kScaleBlockK);
  check_mn_major_scales(op, "sa", sa, m, kb);
  check_mn_major_scales(op, "sb", sb, n, kb);
  check_gemm_out(op, out, m, n, dtype);
  check_out_apart(op, out, {{"a", &a}, {"sa", &sa}, {"b", &b}, {"sb", &sb}});
}

}  // namespace

void check_wgrad_gemm_fp8_fp8_fp32_nt(const torch::stable::Tensor& a, const torch::stable::Tensor& sa,
                                      const torch::stable::Tensor& b, const torch::stable::Tensor& sb,
                                      const torch::stable::Tensor& out) {
  check_dense_gemm("wgrad_gemm_fp8_fp8_fp32_nt", "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous", a, sa, b, sb, out,
                   ScalarType::Float);
}

void check_wgrad_gemm_fp8_fp8_bf16_nt(const torch::stable::Tensor& a, const torch::stable::Tensor& sa,
                                      const torch::stable::Tensor& b, const torch::stable::Tensor& sb,
                                      const torch::stable::Tensor& out) {
  check_dense_gemm("wgrad_gemm_fp8_fp8_bf16_nt", "k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous", a, sa, b, sb, out,
                   ScalarType::BFloat16);
}

void check_k_grouped_wgrad_gemm_fp8_fp8_fp32_nt(const torch::stable::Tensor& a, const torch::stable::Tensor& sa,
                                                const torch::stable::Tensor& b, const torch::stable::Tensor& sb,
                                                const torch::stable::Tensor& out, IntArrayRef ks) {
  constexpr const char* op = "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt";
  const int64_t groups = static_cast<int64_t>(ks.size());
  WGRAD_CHECK(groups >= 1, op, ": ks must name at least one group, got an empty list");
  check_grouped_out(op, out, groups);
  for (auto [name, t] : {std::pair{"a", &a}, {"sa", &sa}, {"b", &b}, {"sb", &sb}}) {
    check_same_device(op, out, name, *t);
  }
  const int64_t m = out.size(1), n = out.size(2);
  int64_t k_total = 0, kb_total = 0;
  for (int64_t g = 0; g < groups; ++g) {
    WGRAD_CHECK(ks[g] >= 0, op, ": ks[", g, "] must be >= 0, got ", ks[g]);
    WGRAD_CHECK(ks[g] % 16 == 0, op, ": ks[", g, "] must be a multiple of 16 (16-byte TMA rows), got ", ks[g]);
    k_total += ks[g];
    kb_total += ceil_div(ks[g], kScaleBlockK);
  }
  for (auto [name, t, rows] : {std::tuple{"a", &a, m}, {"b", &b, n}}) {
    WGRAD_CHECK(t->scalar_type() == ScalarType::Float8_e4m3fn, op, ": ", name, " must be float8_e4m3fn, got ",
                t->scalar_type());
    WGRAD_CHECK(t->is_contiguous(), op, ": ", name, " must be contiguous (packed groups), got strides ", t->strides());
    WGRAD_CHECK(t->numel() == rows * k_total, op, ": ", name, " must hold ", rows, " * sum(ks) = ", rows * k_total,
                " elements, got ", t->numel());
    WGRAD_CHECK(t->numel() == 0 || aligned(*t, kTmaAlignBytes), op, ": ", name,
                " data pointer must be 16-byte aligned, got storage offset ", t->storage_offset());
  }
  check_mn_major_scales(op, "sa", sa, m, kb_total);
  check_mn_major_scales(op, "sb", sb, n, kb_total);
  check_gemm_out(op, out, m, n, ScalarType::Float);
  check_out_apart(op, out, {{"a", &a}, {"sa", &sa}, {"b", &b}, {"sb", &sb}});
}

namespace {

void check_contiguous_gemm(const char* op, const torch::stable::Tensor& a, const torch::stable::Tensor& sa,
                           const torch::stable::Tensor& b, const torch::stable::Tensor& sb,
                           const torch::stable::Tensor& out, const torch::stable::Tensor& ks, ScalarType dtype) {
  const int64_t groups = check_group_size_tensor(op, "ks", ks);
  check_grouped_out(op, out, groups);
  for (auto [name, t] : {std::pair{"a", &a}, {"sa", &sa}, {"b", &b}, {"sb", &sb}, {"ks", &ks}}) {
    check_same_device(op, out, name, *t);
  }
  WGRAD_CHECK(a.dim() == 2, op, ": a must be 2-D [M, K_total], got ", a.dim(), "-D ", a.sizes());
  WGRAD_CHECK(b.dim() == 2, op, ": b must be 2-D [N, K_total], got ", b.dim(), "-D ", b.sizes());
  const int64_t m = out.size(1), n = out.size(2), k_total = a.size(1);
  WGRAD_CHECK(b.size(1) == k_total, op, ": b must have K_total = ", k_total, " columns like a, got ", b.size(1));
  check_fp8_operand(op, "a", a, m, k_total);
  check_fp8_operand(op, "b", b, n, k_total);
  const int64_t kb_cap = k_block_capacity(k_total, groups);
  for (auto [name, s, rows] : {std::tuple{"sa", &sa, m}, {"sb", &sb, n}}) {
    WGRAD_CHECK(s->dim() == 2 && s->size(1) >= kb_cap, op, ": ", name, " must be [", rows, ", >= ", kb_cap,
                "] (ceil(K_total/128) + G - 1 blocks: blocks restart at every group), got ", s->sizes());
    check_mn_major_scales(op, name, *s, rows, s->size(1));
  }
  check_gemm_out(op, out, m, n, dtype);
  check_out_apart(op, out, {{"a", &a}, {"sa", &sa}, {"b", &b}, {"sb", &sb}, {"ks", &ks}});
  check_group_size_values(op, "ks", ks, k_total, "K_total", SizeSum::AtMost);
}

}  // namespace

void check_k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous(
    const torch::stable::Tensor& a, const torch::stable::Tensor& sa, const torch::stable::Tensor& b,
    const torch::stable::Tensor& sb, const torch::stable::Tensor& out, const torch::stable::Tensor& ks) {
  check_contiguous_gemm("k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous", a, sa, b, sb, out, ks, ScalarType::Float);
}

void check_k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous(
    const torch::stable::Tensor& a, const torch::stable::Tensor& sa, const torch::stable::Tensor& b,
    const torch::stable::Tensor& sb, const torch::stable::Tensor& out, const torch::stable::Tensor& ks) {
  check_contiguous_gemm("k_grouped_wgrad_gemm_fp8_fp8_bf16_nt_contiguous", a, sa, b, sb, out, ks,
                        ScalarType::BFloat16);
}

void check_m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(const torch::stable::Tensor& a, const torch::stable::Tensor& sa,
                                                     const torch::stable::Tensor& b, const torch::stable::Tensor& sb,
                                                     const torch::stable::Tensor& out,
                                                     const torch::stable::Tensor& group_sizes) {
  constexpr const char* op = "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous";
  const torch::stable::Tensor& sizes = group_sizes;
  const int64_t groups = check_group_size_tensor(op, "group_sizes", sizes);
  for (auto [name, t] : {std::pair{"a", &a}, {"sa", &sa}, {"b", &b}, {"sb", &sb}, {"group_sizes", &sizes}}) {
    check_same_device(op, out, name, *t);
  }
  WGRAD_CHECK(a.dim() == 2, op, ": a must be 2-D [T, K], got ", a.dim(), "-D ", a.sizes());
  WGRAD_CHECK(b.dim() == 3, op, ": b must be 3-D [G, N, K], got ", b.dim(), "-D ", b.sizes());
  const int64_t t = a.size(0), k = a.size(1), n = b.size(1);
  WGRAD_CHECK(b.size(0) == groups, op, ": b.shape[0] must equal the number of groups ", groups, ", got ", b.size(0));
  WGRAD_CHECK(b.size(2) == k, op, ": b must have K = ", k, " columns like a, got ", b.size(2));
  WGRAD_CHECK(k >= 1, op, ": K must be positive, got ", k);
  WGRAD_CHECK(t <= std::numeric_limits<int32_t>::max() && n <= std::numeric_limits<int32_t>::max() &&
                  k <= std::numeric_limits<int32_t>::max(),
              op, ": T, N and K must fit TMA's 32-bit coordinates, got ", t, ", ", n, " and ", k);
  WGRAD_CHECK(n % 2 == 0, op, ": N must be even (the kernel stores bf16 pairs), got ", n);
  check_fp8_operand(op, "a", a, t, k);
  WGRAD_CHECK(b.scalar_type() == ScalarType::Float8_e4m3fn, op, ": b must be float8_e4m3fn, got ", b.scalar_type());
  if (b.numel() > 0) {
    WGRAD_CHECK(b.stride(2) == 1 || k == 1, op, ": b must be K-contiguous (stride(2) == 1), got strides ", b.strides());
    WGRAD_CHECK((n == 1 || b.stride(1) % kTmaAlignBytes == 0) && (groups == 1 || b.stride(0) % kTmaAlignBytes == 0), op,
                ": b strides (0) and (1) must be multiples of 16 elements (16 bytes, TMA), got ", b.strides());
    WGRAD_CHECK(aligned(b, kTmaAlignBytes), op, ": b data pointer must be 16-byte aligned (TMA), got storage offset ",
                b.storage_offset());
  }
  const int64_t kb = ceil_div(k, kScaleBlockK);
  check_mn_major_scales(op, "sa", sa, t, kb);
  WGRAD_CHECK(sb.scalar_type() == ScalarType::Float, op, ": sb must be float32, got ", sb.scalar_type());
  WGRAD_CHECK(sb.dim() == 3 && sb.size(0) == groups && sb.size(1) == ceil_div(n, kScaleBlockK) && sb.size(2) == kb, op,
              ": sb must have shape [", groups, ", ", ceil_div(n, kScaleBlockK), ", ", kb,
              "] (one scale per 128 x 128 block of b), got ", sb.sizes());
  WGRAD_CHECK(out.scalar_type() == ScalarType::BFloat16, op, ": out must be bfloat16, got ", out.scalar_type());
  WGRAD_CHECK(out.dim() == 2 && out.size(0) == t && out.size(1) == n, op, ": out must have shape [", t, ", ", n,
              "], got ", out.sizes());
  if (out.numel() > 0) {
    WGRAD_CHECK(out.stride(1) == 1, op, ": out must have stride(1) == 1, got strides ", out.strides());
    WGRAD_CHECK(t == 1 || (out.stride(0) >= n && out.stride(0) % 2 == 0), op,
                ": out row stride must be even and >= N = ", n, ", got ", out.stride(0));
    WGRAD_CHECK(aligned(out, 4), op, ": out data pointer must be 4-byte aligned, got storage offset ",
                out.storage_offset());
  }
  check_out_apart(op, out, {{"a", &a}, {"sa", &sa}, {"b", &b}, {"sb", &sb}, {"group_sizes", &sizes}});
  check_group_size_values(op, "group_sizes", sizes, t, "the rows of a, T", SizeSum::Equal);
}

// ---- quantization ---------------------------------------------------------------------------------------

namespace {

constexpr int64_t kMaxColTiles = 65535;  // gridDim.y of the generic kernel: one CTA per 128 columns

}  // namespace

void check_quantize_input(const char* op, const torch::stable::Tensor& x) {
  WGRAD_CHECK(x.dim() == 2, op, ": x must be 2-D [R, C] (the Python layer flattens leading dims), got ", x.dim(), "-D ",
              x.sizes());
  const auto dt = x.scalar_type();
  WGRAD_CHECK(dt == ScalarType::BFloat16 || dt == ScalarType::Half || dt == ScalarType::Float, op,
              ": x must be bfloat16, float16 or float32, got ", dt);
  WGRAD_CHECK(x.is_contiguous(), op, ": x must be contiguous (row-major [R, C]), got strides ", x.strides(),
              " for shape ", x.sizes());
  WGRAD_CHECK(x.size(0) <= std::numeric_limits<int32_t>::max(), op, ": x must have at most 2^31 - 1 rows, got ",
              x.size(0));
  WGRAD_CHECK(ceil_div(x.size(1), kScaleBlockK) <= kMaxColTiles, op, ": x must have at most ",
              kMaxColTiles * kScaleBlockK, " columns (one CTA per 128), got ", x.size(1));
}

void check_segment_sizes(const char* op, const torch::stable::Tensor& x, const torch::stable::Tensor& sizes) {
  WGRAD_CHECK(sizes.scalar_type() == ScalarType::Int, op, ": sizes must be int32, got ", sizes.scalar_type());
  WGRAD_CHECK(sizes.dim() == 1, op, ": sizes must be 1-D [G], got ", sizes.dim(), "-D ", sizes.sizes());
  WGRAD_CHECK(sizes.size(0) >= 1, op, ": sizes must name at least one segment, got an empty tensor");
  WGRAD_CHECK(sizes.is_contiguous(), op, ": sizes must be contiguous, got strides ", sizes.strides());
  WGRAD_CHECK(sizes.device() == x.device(), op, ": sizes must be on ", x.device(), " like x, got ", sizes.device());
  if (sizes.is_cpu()) {
    // On the CPU the values can be read without a synchronisation; on CUDA the kernel validates them.
    const int32_t* s = sizes.const_data_ptr<int32_t>();
    int64_t sum = 0;
    for (int64_t g = 0; g < sizes.size(0); ++g) {
      WGRAD_CHECK(s[g] >= 0, op, ": sizes[", g, "] must be >= 0, got ", s[g]);
      sum += s[g];
    }
    WGRAD_CHECK(sum == x.size(0), op, ": sum(sizes) must equal the rows of x, R = ", x.size(0), ", got ", sum);
  }
}

void check_segment_pad(const char* op, int64_t pad) {
  WGRAD_CHECK(pad == 16 || pad == 32 || pad == 64 || pad == 128, op, ": pad must be 16, 32, 64 or 128, got ", pad);
}

void check_quantize_fp8_1x128(const torch::stable::Tensor& x) { check_quantize_input("quantize_fp8_1x128", x); }

void check_quantize_fp8_1x128_segments(const torch::stable::Tensor& x, const torch::stable::Tensor& sizes) {
  constexpr const char* op = "quantize_fp8_1x128_colwise_segments";
  check_quantize_input(op, x);
  check_segment_sizes(op, x, sizes);
}

namespace {

void check_padded_segments_cast(const char* op, const torch::stable::Tensor& x, const torch::stable::Tensor& sizes,
                                int64_t pad) {
  check_quantize_input(op, x);
  check_segment_sizes(op, x, sizes);
  check_segment_pad(op, pad);
}

}  // namespace

void check_quantize_fp8_1x128_segments_padded(const torch::stable::Tensor& x, const torch::stable::Tensor& sizes,
                                              int64_t pad) {
  check_padded_segments_cast("quantize_fp8_1x128_colwise_segments_padded", x, sizes, pad);
}

void check_quantize_fp8_1x128_both_segments_padded(const torch::stable::Tensor& x, const torch::stable::Tensor& sizes,
                                                   int64_t pad) {
  check_padded_segments_cast("quantize_fp8_1x128_both_segments_padded", x, sizes, pad);
}

void check_quantize_fp8_1x128_segments_plan(std::string_view plan) {
  parse_segments_plan("_quantize_fp8_1x128_colwise_segments_with_plan", std::string(plan));
}

void check_quantize_fp8_128x128(const torch::stable::Tensor& w) {
  constexpr const char* op = "quantize_fp8_128x128";
  WGRAD_CHECK(w.dim() == 2, op, ": w must be 2-D [N, K], got ", w.dim(), "-D ", w.sizes());
  const auto dt = w.scalar_type();
  WGRAD_CHECK(dt == ScalarType::BFloat16 || dt == ScalarType::Half || dt == ScalarType::Float, op,
              ": w must be bfloat16, float16 or float32, got ", dt);
  WGRAD_CHECK(w.is_contiguous(), op, ": w must be contiguous (row-major [N, K]), got strides ", w.strides(),
              " for shape ", w.sizes());
  // One CTA per 128 x 128 block: gridDim.y counts the row blocks, gridDim.x the column blocks.
  WGRAD_CHECK(ceil_div(w.size(0), kScaleBlockK) <= 65535, op, ": w must have at most ", 65535 * kScaleBlockK,
              " rows, got ", w.size(0));
  WGRAD_CHECK(ceil_div(w.size(1), kScaleBlockK) <= INT32_MAX, op, ": w must have at most ",
              int64_t{INT32_MAX} * kScaleBlockK, " columns, got ", w.size(1));
}

}  // namespace wgrad
