// \brief Host entry of the k-grouped SM90 wgrad GEMM, packed layout (one persistent launch for all groups).
//
// Every group's A/B block is its own row-major [rows, K_g] matrix, so each group gets its own pair of
// TMA descriptors, built here on the host and copied (stream-ordered, no host sync) into device memory
// next to the per-group K and first scale column. The kernel never writes a descriptor, so it needs
// no tensormap fences.
#include <cstring>

#include "gemm_common.h"
#include "ops.h"

namespace wgrad {

void k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_cuda(const at::Tensor& a, const at::Tensor& sa, const at::Tensor& b,
                                               const at::Tensor& sb, const at::Tensor& out, c10::IntArrayRef ks) {
  constexpr const char* op = "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt";
  check_k_grouped_wgrad_gemm_fp8_fp8_fp32_nt(a, sa, b, sb, out, ks);
  check_sm90(op, out);
  const int64_t groups = static_cast<int64_t>(ks.size());
  const int64_t m = out.size(1), n = out.size(2);
  int64_t non_empty = 0;
  for (int64_t k : ks) non_empty += k > 0;
  if (m == 0 || n == 0 || non_empty == 0) return;
  TORCH_CHECK(groups <= INT32_MAX, op, ": too many groups: ", groups);
  const c10::cuda::CUDAGuard guard(out.device());
  const int block_n = select_block_n(m, n, non_empty, num_sms_of(out));

  // One pinned buffer: 2G descriptors (A then B), then K_g and the first scale column per group.
  const int64_t desc_bytes = 2 * groups * static_cast<int64_t>(sizeof(CUtensorMap));
  const int64_t bytes = desc_bytes + 2 * groups * static_cast<int64_t>(sizeof(int));
  at::Tensor host = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  auto* descs = reinterpret_cast<CUtensorMap*>(host.data_ptr());
  auto* group_k = reinterpret_cast<int*>(host.data_ptr<uint8_t>() + desc_bytes);
  int* group_kb_base = group_k + groups;
  const auto* a_ptr = static_cast<const uint8_t*>(a.const_data_ptr());
  const auto* b_ptr = static_cast<const uint8_t*>(b.const_data_ptr());
  int64_t k_offset = 0, kb_offset = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t kg = ks[g];
    TORCH_CHECK(kg <= INT32_MAX, op, ": ks[", g, "] must fit TMA's 32-bit coordinates, got ", kg);
    group_k[g] = static_cast<int>(kg);
    group_kb_base[g] = static_cast<int>(kb_offset);
    if (kg > 0) {
      check_desc(op, "a", make_operand_desc(&descs[g], a_ptr + m * k_offset, m, kg, kg, kTmaBoxRowsA));
      check_desc(op, "b", make_operand_desc(&descs[groups + g], b_ptr + n * k_offset, n, kg, kg, block_n));
    } else {
      std::memset(&descs[g], 0, sizeof(CUtensorMap));  // never used: the group's tiles are skipped
      std::memset(&descs[groups + g], 0, sizeof(CUtensorMap));
    }
    k_offset += kg;
    kb_offset += ceil_div(kg, kScaleBlockK);
  }
  // Descriptors in global memory must be 64-byte aligned: the caching allocator gives >= 512.
  at::Tensor device = host.to(out.device(), /*non_blocking=*/true);

  GemmParamsSm90<GroupMode::Packed> p;
  const auto* dev = device.const_data_ptr<uint8_t>();
  p.group_tma_a = reinterpret_cast<const CUtensorMap*>(dev);
  p.group_tma_b = p.group_tma_a + groups;
  p.group_k = reinterpret_cast<const int*>(dev + desc_bytes);
  p.group_kb_base = p.group_k + groups;
  set_scale_and_out_descs(op, p, sa, sb, out, block_n);
  p.scheduler = {static_cast<int>(ceil_div(m, kBlockM)), static_cast<int>(ceil_div(n, block_n)),
                 static_cast<int>(groups)};
  launch(op, p, block_n, out);
}

}  // namespace wgrad
