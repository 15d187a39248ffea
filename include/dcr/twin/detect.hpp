#pragma once
/// \file
/// Vocabulary: `twin/` (namespace `dcr::twin`) holds the host twins of the GPU
/// kernels in `cuda/dcr/gpu/` (namespace `dcr::gpu`) and the element-level code
/// both share; a twin has its kernel's semantics, checks and errors, runs in
/// CI, and the GPU tests compare the two.
///
/// Host twin of the CUDA change detection (`cuda/dcr/gpu/detect.cuh`):
/// compare two word buffers and append `base + i` for every `i` whose stored
/// bits differ, in increasing order. It is the training side's
/// `dcr::detect_changes` (core/detect.hpp, SSE2 masks) behind a status
/// for buffers of different lengths and for a base that would overflow.

#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "dcr/core/detect.hpp"
#include "dcr/core/error.hpp"
#include "dcr/twin/element.hpp"

namespace dcr::twin {

/// Append `base + i` to `out` for every `i` with `old_words[i] != new_words[i]`.
template <word W>
status detect_changes(std::span<const W> old_words,
                      std::type_identity_t<std::span<const W>> new_words, std::uint64_t base,
                      std::vector<std::uint64_t>& out) {
  DCR_RETURN_ERROR_IF(old_words.size() != new_words.size(), invalid_argument,
                      "detect_changes: " + std::to_string(old_words.size()) + " old words but " +
                          std::to_string(new_words.size()) + " new words");
  DCR_RETURN_ERROR_IF(old_words.size() != 0 && base > UINT64_MAX - (old_words.size() - 1),
                      length_overflow, "detect_changes: base + length overflows 64 bits");
  dcr::detect_changes<W>(old_words, new_words, base, out);
  return status::success();
}

} // namespace dcr::twin
