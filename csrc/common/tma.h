// \brief The error of a TMA descriptor that could not be built (kernels/common/tma_descriptor.h returns its
// reason as a string), in the words of every host entry.
#pragma once

#include <string>

#include "common/stable.h"

namespace wgrad {

// `err` empty: the descriptor of `what` was built; else an error naming the op, the tensor and the reason.
inline void check_tma_descriptor(const char* op, const char* what, const std::string& err) {
  WGRAD_CHECK(err.empty(), op, ": could not build the TMA descriptor of ", what, ": ", err);
}

}  // namespace wgrad
