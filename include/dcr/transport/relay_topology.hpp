#pragma once
/// \file
/// Shape of a relay tree (docs/architecture.md, "Relay tree"): which rollout
/// node forwards to which. Pure arithmetic, no I/O.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dcr/core/error.hpp"

namespace dcr::transport {

/// Balanced k-ary tree over `nodes` rollout nodes in heap order: node 0 is the
/// root, the parent of i > 0 is (i-1)/k, its children are k·i+1 … k·i+k. Every
/// node is reached exactly once from the root, and the height is the least h
/// with 1 + k + … + k^h >= nodes (n-1 for a chain, k = 1).
class relay_topology {
public:
  /// `nodes >= 1`, `fanout >= 1`; throws `dcr::error(invalid_argument)` otherwise.
  relay_topology(std::uint32_t nodes, std::uint32_t fanout) : n_(nodes), k_(fanout) {
    if (nodes == 0 || fanout == 0)
      throw error(errc::invalid_argument, "relay_topology: nodes and fan-out must be >= 1");
  }
  std::uint32_t nodes() const noexcept { return n_; }
  std::uint32_t fanout() const noexcept { return k_; }
  /// Parent of node i; none for the root.
  std::optional<std::uint32_t> parent(std::uint32_t i) const {
    check(i);
    if (i == 0) return std::nullopt;
    return (i - 1) / k_;
  }
  /// Children of node i, ascending.
  std::vector<std::uint32_t> children(std::uint32_t i) const {
    check(i);
    std::vector<std::uint32_t> c;
    for (std::uint64_t j = std::uint64_t{k_} * i + 1; j <= std::uint64_t{k_} * i + k_ && j < n_;
         ++j)
      c.push_back(static_cast<std::uint32_t>(j));
    return c;
  }
  /// Links from the root to node i.
  std::uint32_t depth(std::uint32_t i) const {
    check(i);
    std::uint32_t d = 0;
    for (; i != 0; i = (i - 1) / k_) ++d;
    return d;
  }
  /// Largest depth.
  std::uint32_t height() const { return depth(n_ - 1); }

private:
  void check(std::uint32_t i) const {
    if (i >= n_)
      throw error(errc::invalid_argument,
                  "relay_topology: node " + std::to_string(i) + " of " + std::to_string(n_));
  }
  std::uint32_t n_, k_;
};

} // namespace dcr::transport
