#pragma once
// All owners of a plan in one process (tests, benches, the demo): what a
// trainer of several ranks does across processes (one `owner` per rank,
// flags all-gathered), done in one. Not part of the library's training API
// (a real trainer runs one `owner` per rank); the protocol's adapter for
// owners in this process is `protocol::training_round` (assembly/).

#include <memory>
#include <span>
#include <vector>

#include "dcr/source/builder.hpp"

namespace dcr {

/// All owners of a plan in one process (tests, benches, the demo; a real
/// trainer runs one `owner` per rank and all-gathers the flags).
class training_side {
public:
  training_side(std::shared_ptr<const source_plan> plan, const source_view& committed)
      : plan_(std::move(plan)) {
    for (std::uint32_t r = 0; r < plan_->world; ++r) owners_.emplace_back(plan_, r, committed);
  }
  const source_plan& plan() const noexcept { return *plan_; }
  std::span<const owner> owners() const noexcept { return owners_; }

  /// U_req of a candidate: union of every owner's flags.
  required_set required(const source_view& candidate) const {
    std::vector<std::uint32_t> flags;
    for (auto& o : owners_)
      for (auto s : o.flagged_inputs(candidate)) flags.push_back(s);
    return make_required(*plan_, flags);
  }
  /// Every owner's buckets (owner-major).
  std::vector<delta_bucket> build_items(const source_view& candidate,
                                        const builder_options& opt = {}) const {
    const auto req = required(candidate);
    std::vector<delta_bucket> out;
    for (auto& o : owners_)
      o.build_buckets(candidate, req, opt, [&](delta_bucket&& b) { out.push_back(std::move(b)); });
    return out;
  }
  /// Every owner's payloads, indexed by owner id.
  std::vector<std::vector<std::vector<std::byte>>> build(const source_view& candidate,
                                                         const payload_id& base_id,
                                                         const builder_options& opt = {}) const {
    const auto req = required(candidate);
    std::vector<std::vector<std::vector<std::byte>>> out;
    for (auto& o : owners_) out.push_back(o.build(candidate, req, base_id, opt));
    return out;
  }
  /// Post-commit update of every owner's baseline.
  void commit(const source_view& candidate) {
    const auto req = required(candidate); // before trackers move: flags compare against them
    for (auto& o : owners_) o.commit_baseline(candidate, req);
  }
  /// Baseline memory of all owners together and per owner.
  baseline_memory memory() const noexcept {
    baseline_memory m;
    for (auto& o : owners_) {
      auto x = o.memory();
      m.tracker_bytes += x.tracker_bytes;
      m.residual_bytes += x.residual_bytes;
    }
    return m;
  }
  balance_report memory_balance() const {
    std::vector<std::uint64_t> b;
    for (auto& o : owners_) b.push_back(o.memory().total());
    return make_balance_report(std::move(b));
  }
  /// Baseline memory as a multiple of the canonical checkpoint.
  double memory_vs_checkpoint() const noexcept {
    const auto c = plan_->checkpoint_bytes();
    return c ? static_cast<double>(memory().total()) / static_cast<double>(c) : 0.0;
  }

private:
  std::shared_ptr<const source_plan> plan_;
  std::vector<owner> owners_;
};

} // namespace dcr
