// \brief The plan string of _quantize_fp8_1x128_colwise_segments_with_plan (see plan.h).
#include "quant/plan.h"

#include <cstdlib>

#include "common/stable.h"

namespace wgrad {

namespace {

// A whole decimal integer: false for "", "2x", "yes".
bool parse_int(const std::string& v, long* n) {
  char* end = nullptr;
  *n = std::strtol(v.c_str(), &end, 10);
  return !v.empty() && *end == '\0';
}

bool parse_choice(const std::string& v, PlanChoice* c) {
  if (v == "auto") *c = PlanChoice::kAuto;
  else if (v == "on") *c = PlanChoice::kOn;
  else if (v == "off") *c = PlanChoice::kOff;
  else return false;
  return true;
}

bool parse_order(const std::string& v, SegmentsPlan* p) {
  if (v == "auto") {
    p->order = -1;
    return true;
  }
  p->shared_order = !v.empty() && v[0] == 'c';
  const std::string rest = p->shared_order ? v.substr(1) : v;
  if (rest == "ranges") {
    p->order = 0;
    return true;
  }
  long n = 0;
  if (!parse_int(rest, &n) || n < 1 || n > 64) return false;
  p->order = static_cast<int>(n);
  return true;
}

}  // namespace

SegmentsPlan parse_segments_plan(const char* op, const std::string& plan) {
  SegmentsPlan p;
  if (plan.empty() || plan == "auto") return p;
  bool seen[4] = {false, false, false, false};  // kernel, order, packed, tail
  size_t start = 0;
  while (start <= plan.size()) {
    const size_t comma = plan.find(',', start);
    const std::string item = plan.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    const int slot = key == "kernel" ? 0 : key == "order" ? 1 : key == "packed" ? 2 : key == "tail" ? 3 : -1;
    bool ok = eq != std::string::npos && slot >= 0 && !seen[slot];
    if (ok) {
      seen[slot] = true;
      if (slot == 0) {
        ok = value == "auto" || value == "tma" || value == "carry";
        p.kernel = value == "tma"     ? SegmentsPlan::Kernel::kTma
                   : value == "carry" ? SegmentsPlan::Kernel::kCarry
                                      : SegmentsPlan::Kernel::kAuto;
      } else if (slot == 1) {
        ok = parse_order(value, &p);
      } else {
        ok = parse_choice(value, slot == 2 ? &p.packed : &p.tail);
      }
    }
    WGRAD_CHECK(ok, op,
                ": plan must be 'auto' or comma-separated items, each at most once, of kernel=auto|tma|carry, "
                "order=auto|ranges|cranges|S|cS (S in [1, 64]), packed=auto|on|off, tail=auto|on|off; got '",
                plan, "' (item '", item, "')");
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return p;
}

}  // namespace wgrad
