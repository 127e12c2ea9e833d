// \brief Host entry of the k-grouped SM90 wgrad GEMM, packed layout.
//
// Every group's A/B block is its own row-major [rows, K_g] matrix, so the kernel needs one pair of TMA
// descriptors per group. They are built here and passed in the kernel's parameters (PackedGroups in
// kernel_sm90.cuh), up to kMaxPackedGroups non-empty groups per launch: one launch for any realistic
// expert count per GPU, ceil(G' / kMaxPackedGroups) launches beyond that (G' = non-empty groups).
// Empty groups are never launched: out[g] stays as it is. Nothing is copied to the device and nothing
// synchronises with it.
//
// (Descriptors kept in device memory, copied there per call from pinned host memory, failed the
// benchmark's accuracy check intermittently. Parameters remove the copy, the buffer reuse across queued
// calls and any descriptor caching by address, all at once.)
#include <algorithm>
#include <vector>

#include "checks.h"
#include "gemm/launch.h"
#include "ops.h"

namespace wgrad {

void k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_cuda(const torch::stable::Tensor& a, const torch::stable::Tensor& sa,
                                               const torch::stable::Tensor& b, const torch::stable::Tensor& sb,
                                               const torch::stable::Tensor& out, IntArrayRef ks) {
  constexpr const char* op = "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt";
  check_k_grouped_wgrad_gemm_fp8_fp8_fp32_nt(a, sa, b, sb, out, ks);
  check_sm90(op, out);
  const int64_t groups = static_cast<int64_t>(ks.size());
  const int64_t m = out.size(1), n = out.size(2);
  int64_t non_empty = 0, k_sum = 0;
  for (int64_t k : ks) {
    non_empty += k > 0;
    k_sum += k;
  }
  if (m == 0 || n == 0 || non_empty == 0) return;
  WGRAD_CHECK(groups <= INT32_MAX, op, ": too many groups: ", groups);
  const DeviceGuard guard(out.get_device_index());

  const GemmConfig cfg = choose_config<false>(m, n, non_empty, k_sum / non_empty, out);
  const int block_n = cfg.block_n;
  const auto* a_ptr = static_cast<const uint8_t*>(a.const_data_ptr());
  const auto* b_ptr = static_cast<const uint8_t*>(b.const_data_ptr());

  // The non-empty groups with their K offset (elements of the packed a/b) and first scale column.
  struct Group {
    int64_t index, k, k_offset, kb_base;
  };
  std::vector<Group> work;
  work.reserve(static_cast<size_t>(non_empty));
  int64_t k_offset = 0, kb_offset = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t kg = ks[g];
    WGRAD_CHECK(kg <= INT32_MAX, op, ": ks[", g, "] must fit TMA's 32-bit coordinates, got ", kg);
    if (kg > 0) work.push_back({g, kg, k_offset, kb_offset});
    k_offset += kg;
    kb_offset += ceil_div(kg, kScaleBlockK);
  }
  WGRAD_CHECK(kb_offset <= INT32_MAX, op, ": too many scale blocks: ", kb_offset);

  // Scales and out are shared by every launch; each launch refills its groups and its scheduler.
  GemmParamsSm90<GroupMode::Packed> p;
  set_scale_and_out_descs(op, p, sa, sb, out, cfg);
  for (size_t first = 0; first < work.size(); first += kMaxPackedGroups) {
    const size_t count = std::min(work.size() - first, static_cast<size_t>(kMaxPackedGroups));
    for (size_t i = 0; i < count; ++i) {
      const Group& grp = work[first + i];
      check_tma_descriptor(op, "a",
                           make_operand_desc(&p.packed.a[i], a_ptr + m * grp.k_offset, m, grp.k, grp.k, kTmaBoxRowsA));
      check_tma_descriptor(op, "b",
                           make_operand_desc(&p.packed.b[i], b_ptr + n * grp.k_offset, n, grp.k, grp.k, block_n));
      p.packed.k[i] = static_cast<int>(grp.k);
      p.packed.kb_base[i] = static_cast<int>(grp.kb_base);
      p.packed.out_group[i] = static_cast<int>(grp.index);
    }
    p.scheduler = {static_cast<int>(ceil_div(m, kBlockM)), static_cast<int>(ceil_div(n, block_n)),
                   static_cast<int>(count)};
    launch(op, p, cfg, out);
  }
}

}  // namespace wgrad
