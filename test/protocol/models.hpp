#pragma once
// Simple but real models of the protocol's roles: owners that build payloads
// (dcr::encode_payload) from an in-memory canonical diff, receivers that hold
// canonical tensors and apply decoded items (XOR / overwrite), plus fault
// decorators for the object store and the receiver.

#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>

#include "dcr/codec/payload.hpp"
#include "dcr/model/config.hpp"
#include "dcr/protocol/coordinator.hpp"
#include "dcr/transport/object_store.hpp"
#include "support/faults.hpp"

namespace dcr::test_models {

/// Small enough for fast sweeps, with every tensor kind of a Llama model.
inline model_config small_llama() {
  model_config c;
  c.hidden = 64;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 16;
  c.ffn = 96;
  c.vocab = 150;
  return c;
}

/// Shared canonical state of the "trainer": what owners see as their candidate.
struct trainer_state {
  std::vector<host_tensor> tensors;

  static trainer_state make(const std::vector<tensor_meta>& metas, std::uint64_t seed) {
    trainer_state t;
    std::mt19937_64 rng(seed);
    for (auto& m : metas) {
      host_tensor h(m);
      for (auto& b : h.bytes) b = static_cast<std::byte>(rng());
      // keep bf16 words finite-ish: clear exponent top bit of every word
      for (std::size_t i = 1; i < h.bytes.size(); i += 2) h.bytes[i] &= std::byte{0x3F};
      t.tensors.push_back(std::move(h));
    }
    return t;
  }
  /// Change about `fraction` of all words (random new low bits), like an optimizer step.
  void step(double fraction, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::bernoulli_distribution pick(fraction);
    for (auto& t : tensors)
      for (std::size_t i = 0; i + 1 < t.bytes.size(); i += 2)
        if (pick(rng)) t.bytes[i] ^= static_cast<std::byte>(1 + rng() % 255);
  }
};

/// Owner k owns tensors t with t % n == k; baseline is its own copy.
class model_owner {
public:
  model_owner(std::uint32_t id, std::uint32_t n, const trainer_state* candidate,
              std::size_t items_per_payload = 3)
      : id_(id), n_(n), cand_(candidate), per_payload_(items_per_payload) {
    for (std::size_t t = 0; t < cand_->tensors.size(); ++t)
      if (t % n_ == id_) baseline_.emplace(t, cand_->tensors[t]);
  }
  std::uint32_t owner_id() const { return id_; }

  status build(const protocol::build_request& rq, const protocol::payload_sink& emit) {
    ++builds;
    std::vector<item> items;
    std::uint32_t seq = 0;
    auto flush = [&]() -> status {
      if (items.empty()) return status::success();
      auto bytes = encode_payload({rq.attempt, rq.target_version, id_, seq++}, items);
      items.clear();
      return emit(std::move(bytes));
    };
    for (auto& [t, base] : baseline_) {
      auto& c = cand_->tensors[t];
      item it;
      it.tensor = c.meta;
      it.encoding = rq.mode == protocol::refit_mode::mixed ? value_encoding::xor_mask
                                                           : value_encoding::overwrite;
      const auto w = width_of(c.meta.dtype);
      for (std::size_t i = 0; i < c.meta.numel(); ++i) {
        if (std::memcmp(&c.bytes[i * w], &base.bytes[i * w], w) == 0) continue;
        it.indices.push_back(i);
        for (std::size_t b = 0; b < w; ++b)
          it.values.push_back(it.encoding == value_encoding::xor_mask
                                  ? (c.bytes[i * w + b] ^ base.bytes[i * w + b])
                                  : c.bytes[i * w + b]);
      }
      if (it.indices.empty()) continue;
      items.push_back(std::move(it));
      if (items.size() >= per_payload_) DCR_TRY(flush());
    }
    return flush();
  }
  void commit_baseline() {
    for (auto& [t, base] : baseline_) base.bytes = cand_->tensors[t].bytes;
  }
  digest128 baseline_digest() const { return digest_of(false); }
  digest128 candidate_digest() const { return digest_of(true); }

  /// Committed canonical tensor t (only owned ones).
  const host_tensor* baseline(std::size_t t) const {
    auto it = baseline_.find(t);
    return it == baseline_.end() ? nullptr : &it->second;
  }
  std::atomic<int> builds{0};

private:
  digest128 digest_of(bool candidate) const {
    blake2b_128 h;
    for (auto& [t, base] : baseline_) {
      auto& b = candidate ? cand_->tensors[t].bytes : base.bytes;
      h.update(std::as_bytes(std::span(cand_->tensors[t].meta.name))).update(b);
    }
    return h.final();
  }
  std::uint32_t id_, n_;
  const trainer_state* cand_;
  std::size_t per_payload_;
  std::map<std::size_t, host_tensor> baseline_;
};
static_assert(protocol::owner_role<model_owner>);

/// Holds every canonical tensor; applies items directly (identity loader).
class model_receiver {
public:
  model_receiver(std::string id, const std::vector<tensor_meta>& metas) : id_(std::move(id)) {
    for (std::size_t i = 0; i < metas.size(); ++i) {
      tensors_.emplace_back(metas[i]);
      by_name_[metas[i].name] = i;
    }
  }
  std::string receiver_id() const { return id_; }
  void begin_attempt(std::uint64_t a) {
    attempt_ = a;
    seen_.clear();
    staged_.clear();
  }
  status stage(std::span<const std::byte> bytes) {
    payload_id pid;
    DCR_TRY(read_payload_id(bytes, pid));
    DCR_RETURN_ERROR_IF(pid.attempt != attempt_, stale_attempt,
                        "payload of attempt " + std::to_string(pid.attempt) + ", current " +
                            std::to_string(attempt_));
    DCR_RETURN_ERROR_IF(!seen_.insert({pid.owner, pid.sequence}).second, duplicate,
                        "payload seen before");
    decoded_payload d;
    if (auto s = decode_payload(bytes, d); !s) {
      seen_.erase({pid.owner, pid.sequence});
      return s;
    }
    for (auto& it : d.items) {
      auto f = by_name_.find(it.tensor.name);
      DCR_RETURN_ERROR_IF(f == by_name_.end(), not_found, "unknown tensor " + it.tensor.name);
      DCR_RETURN_ERROR_IF(tensors_[f->second].meta != it.tensor, shape_mismatch, it.tensor.name);
    }
    staged_.push_back(std::move(d));
    if (crash_after_ && --crash_after_ == 0) lost_ = true;
    return status::success();
  }
  status apply_staged() {
    for (auto& d : staged_)
      for (auto& it : d.items) {
        if (fail_after_items_ >= 0 && applied_items_++ >= fail_after_items_) {
          fail_after_items_ = -1; // one-shot
          staged_.clear();
          return fail(errc::loader_condition, "injected failure mid-apply");
        }
        auto& t = tensors_[by_name_[it.tensor.name]];
        const auto w = width_of(t.meta.dtype);
        for (std::size_t k = 0; k < it.indices.size(); ++k)
          for (std::size_t b = 0; b < w; ++b) {
            auto& dst = t.bytes[it.indices[k] * w + b];
            dst = it.encoding == value_encoding::xor_mask ? dst ^ it.values[k * w + b]
                                                          : it.values[k * w + b];
          }
      }
    staged_.clear();
    return status::success();
  }
  status finish() { return status::success(); }
  digest128 state_digest() const {
    blake2b_128 h;
    for (auto& t : tensors_) h.update(t.bytes);
    return h.final();
  }
  std::vector<host_tensor>& tensors() { return tensors_; }

  /// Fault: fail (once) after `n` more items have been applied.
  void fail_after(long n) {
    fail_after_items_ = n;
    applied_items_ = 0;
  }
  /// Fault: crash (storage lost) after `n` more staged payloads
  /// (`support::kill_after`); 0 disarms.
  void crash_after(std::uint64_t n) noexcept { crash_after_ = n; }
  bool lost() const noexcept { return lost_; }

private:
  std::string id_;
  std::vector<host_tensor> tensors_;
  std::map<std::string, std::size_t> by_name_;
  std::uint64_t attempt_ = 0;
  std::set<std::pair<std::uint32_t, std::uint32_t>> seen_;
  std::vector<decoded_payload> staged_;
  long applied_items_ = 0;
  long fail_after_items_ = -1;
  std::uint64_t crash_after_ = 0;
  bool lost_ = false;
};
static_assert(protocol::receiver_role<model_receiver>);

/// Object store decorator with injectable faults on payload objects.
class faulty_store {
public:
  explicit faulty_store(transport::memory_object_store& inner) : s_(&inner) {}
  enum class fault { none, drop, corrupt, truncate, reverse_list, inject_stale, fail_remove };
  std::atomic<fault> mode{fault::none};
  std::atomic<int> remaining{0}; ///< how many faults are left to inject

  status put(std::string_view name, std::span<const std::byte> in) {
    std::vector<std::byte> changed;
    std::span<const std::byte> b = in;
    if (before_put) {
      changed.assign(in.begin(), in.end());
      DCR_TRY(before_put(name, changed));
      b = changed;
    }
    const bool payload = name.find("/payload/") != std::string_view::npos;
    if (payload && mode == fault::drop && take()) return status::success(); // lost in transit
    if (payload && mode == fault::inject_stale) {
      std::lock_guard l(m_);
      // Names arrive inside the coordinator's incarnation scope: keep it.
      const auto at = name.find("attempt/");
      const auto scope = std::string(name.substr(0, at));
      const auto a = transport::attempt_of(name.substr(at));
      if (!old_.empty() && old_attempt_ < a && take()) {
        // Under the writing owner's payload names (a reader never fetches
        // objects under no required owner's name), after its real ones.
        const auto o = name.find("payload/o", at);
        DCR_TRY(s_->put(scope + transport::attempt_prefix(a) + std::string(name.substr(o, 19)) +
                            "-s4294967295",
                        old_));
      }
      if (old_.empty() || a == old_attempt_) {
        old_.assign(b.begin(), b.end());
        old_attempt_ = a;
      }
    }
    DCR_TRY(s_->put(name, b));
    if (after_put) after_put(name);
    return status::success();
  }
  /// Called after every put that landed (on the putting thread).
  std::function<void(std::string_view)> after_put;
  /// Called before every put, on the putting thread, with the bytes about to
  /// land: may write other objects (`inner()`, a writer racing the owner),
  /// change the bytes, or fail the put (nothing lands).
  std::function<status(std::string_view, std::vector<std::byte>&)> before_put;
  /// Called after every get that succeeded (on the getting thread).
  std::function<void(std::string_view)> after_get;
  /// The store underneath, written without any fault or hook.
  transport::memory_object_store& inner() noexcept { return *s_; }
  status get(std::string_view name, std::vector<std::byte>& out) {
    DCR_TRY(s_->get(name, out));
    if (after_get) after_get(name);
    const bool payload = name.find("/payload/") != std::string_view::npos;
    if (payload && mode == fault::corrupt && take()) out[out.size() / 2] ^= std::byte{0x10};
    if (payload && mode == fault::truncate && take()) out.resize(out.size() - 7);
    return status::success();
  }
  status list(std::string_view prefix, std::vector<std::string>& names) {
    DCR_TRY(s_->list(prefix, names));
    if (mode == fault::reverse_list) std::reverse(names.begin(), names.end());
    return status::success();
  }
  status remove(std::string_view name) {
    if (mode == fault::fail_remove && take())
      return fail(errc::io, "injected remove failure: " + std::string(name));
    return s_->remove(name);
  }

private:
  bool take() {
    int r = remaining.load();
    while (r > 0)
      if (remaining.compare_exchange_weak(r, r - 1)) return true;
    return false;
  }
  transport::memory_object_store* s_;
  std::mutex m_;
  std::vector<std::byte> old_;
  std::uint64_t old_attempt_ = 0;
};
static_assert(transport::object_store<faulty_store>);

/// Receiver decorator: the transport delivers every payload twice and
/// buffers `reorder` payloads to stage them in reverse.
class duplicating_receiver {
public:
  explicit duplicating_receiver(std::unique_ptr<model_receiver> r) : r_(std::move(r)) {}
  std::string receiver_id() const { return r_->receiver_id(); }
  void begin_attempt(std::uint64_t a) { r_->begin_attempt(a); }
  status stage(std::span<const std::byte> b) {
    DCR_TRY(r_->stage(b));
    auto s = r_->stage(b);
    DCR_RETURN_ERROR_IF(s.code != errc::duplicate, verification,
                        "second delivery was not suppressed: " + s.message);
    ++duplicates;
    return status::success();
  }
  status apply_staged() { return r_->apply_staged(); }
  status finish() { return r_->finish(); }
  digest128 state_digest() const { return r_->state_digest(); }
  model_receiver& inner() { return *r_; }
  int duplicates = 0;

private:
  std::unique_ptr<model_receiver> r_;
};
static_assert(protocol::receiver_role<duplicating_receiver>);

/// A valid payload of `owner`, sequence `seq` in attempt τ that XORs
/// element 0 of `meta` (an element outside the changed set that the tests
/// keep as committed): what a process planting objects in the store or
/// frames in a relay tree sends.
inline std::vector<std::byte> xor_element0(const tensor_meta& meta, std::uint64_t tau,
                                           std::uint32_t owner, std::uint32_t seq) {
  item it;
  it.tensor = meta;
  it.encoding = value_encoding::xor_mask;
  it.indices = {0};
  it.values.assign(width_of(it.tensor.dtype), std::byte{0x40});
  return encode_payload({tau, 1, owner, seq}, std::vector<item>{it});
}

} // namespace dcr::test_models
