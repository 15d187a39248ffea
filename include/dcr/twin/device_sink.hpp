#pragma once
/// \file
/// Host twin of `cuda::device_sink` (cuda/dcr/gpu/device_sink.hpp): a
/// receiver storage sink (`storage_sink`, receiver/stages.hpp) that keeps its
/// own copy of every parameter, as the device sink keeps one in device
/// memory, and applies each mapped copy's (element, value) pairs with
/// `twin::scatter<E>`, the host twin of the kernel the device sink launches
/// (same checks, same errors, same bits). `receiver<L, twin::device_sink>`
/// runs the device sink's path through the receiver on any machine, so the
/// receiver tests check it against a dense refit in CI.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dcr/codec/values.hpp"
#include "dcr/core/error.hpp"
#include "dcr/receiver/stages.hpp"
#include "dcr/receiver/storage.hpp"
#include "dcr/twin/element.hpp"
#include "dcr/twin/scatter.hpp"

namespace dcr::twin {

class device_sink {
public:
  static constexpr bool mirrors = true;
  static constexpr bool concurrent = false;

  /// Copy every parameter of `store` (what the device sink uploads).
  status attach(const parameter_store& store) {
    params_.resize(store.size());
    for (std::size_t p = 0; p < store.size(); ++p) params_[p] = store[p].bytes;
    ++attaches_;
    return status::success();
  }
  /// Copy parameter `p` again.
  status refresh(const parameter_store& store, std::size_t p) {
    DCR_RETURN_ERROR_IF(p >= params_.size(), invalid_argument,
                        "device sink: parameter " + std::to_string(p) + " not attached");
    params_[p] = store[p].bytes;
    ++refreshes_;
    return status::success();
  }
  /// `E` at strictly increasing elements `at` of parameter `p`.
  template <codec::delta_encoding E, class W>
  status scatter(std::size_t p, std::span<const std::uint64_t> at, std::span<const W> values) {
    DCR_RETURN_ERROR_IF(p >= params_.size(), invalid_argument,
                        "device sink: parameter " + std::to_string(p) + " not attached");
    auto& b = params_[p];
    const view<W> dst{reinterpret_cast<W*>(b.data()),
                      linear(static_cast<std::int64_t>(b.size() / sizeof(W)))};
    ++scatters_;
    entries_ += at.size();
    return twin::scatter<E, W>(dst, at, values);
  }

  /// The sink's copy of parameter `p`.
  std::span<const std::byte> bytes(std::size_t p) const { return params_.at(p); }
  /// Parameters held.
  std::size_t size() const noexcept { return params_.size(); }
  /// Calls of `scatter`, entries scattered, `refresh` and `attach` calls
  /// (so that a test can tell which path ran).
  std::uint64_t scatters() const noexcept { return scatters_; }
  std::uint64_t entries() const noexcept { return entries_; }
  std::uint64_t refreshes() const noexcept { return refreshes_; }
  std::uint64_t attaches() const noexcept { return attaches_; }

private:
  std::vector<std::vector<std::byte>> params_;
  std::uint64_t scatters_ = 0, entries_ = 0, refreshes_ = 0, attaches_ = 0;
};
static_assert(storage_sink<device_sink>);

/// "" when the sink holds exactly the bytes of `store`, else where it first differs.
template <class Sink>
std::string mirror_difference(const Sink& sink, const parameter_store& store) {
  if (sink.size() != store.size())
    return "sink holds " + std::to_string(sink.size()) + " parameters, store " +
           std::to_string(store.size());
  for (std::size_t p = 0; p < store.size(); ++p) {
    const auto a = sink.bytes(p);
    const auto& b = store[p].bytes;
    if (a.size() != b.size()) return "parameter " + store[p].meta.name + ": size differs";
    for (std::size_t i = 0; i < a.size(); ++i)
      if (a[i] != b[i])
        return "parameter " + store[p].meta.name + " byte " + std::to_string(i) + " differs";
  }
  return "";
}

} // namespace dcr::twin
