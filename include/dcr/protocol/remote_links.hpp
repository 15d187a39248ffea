#pragma once
/// \file
/// Links to owners and rollout nodes in other processes, over the control
/// channel (control_channel.hpp), and the services those processes run.
///
/// `remote_owner_link` / `remote_node_link` model `owner_link` / `node_link`
/// (links.hpp) as proxies: each operation is one call carrying the attempt
/// id. The process at the other end runs an `owner_service` /
/// `node_service` over the same local link the in-process coordinator uses,
/// with its own connection to the object store: the payload bytes go from
/// the owner process to the store and from the store to the node, never
/// through the coordinator. A replaced attempt's call is refused by that
/// local link exactly as in-process; a call to a peer that is gone fails
/// with `errc::unavailable` within the channel's deadlines.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/core/hash.hpp"
#include "dcr/protocol/control_channel.hpp"
#include "dcr/protocol/control_frame.hpp"
#include "dcr/protocol/links.hpp"

namespace dcr::protocol {

namespace detail {
inline std::span<const std::byte> no_body() { return {}; }

inline status read_digest_reply(const std::vector<std::byte>& b, digest128& d) {
  body_reader r(b);
  DCR_TRY(r.dig(d));
  return r.done();
}
inline status read_empty_reply(const std::vector<std::byte>& b) { return body_reader(b).done(); }
} // namespace detail

/// Proxy of an owner process (see file comment).
class remote_owner_link {
public:
  remote_owner_link(std::uint32_t owner_id, peer_address peer, channel_options opt = {})
      : id_(owner_id), c_(std::move(peer), opt) {}

  std::uint32_t owner_id() const { return id_; }
  const peer_address& peer() const noexcept { return c_.peer(); }

  /// Reach the owner and check that it is owner `owner_id()`.
  status connect() {
    std::vector<std::byte> b;
    DCR_TRY(c_.call(control_type::owner_hello, 0, detail::no_body(), b));
    body_reader r(b);
    std::uint32_t id = 0;
    DCR_TRY(r.u32(id));
    DCR_TRY(r.done());
    DCR_RETURN_ERROR_IF(id != id_, verification,
                        c_.peer().text() + " is owner " + std::to_string(id) + ", expected " +
                            std::to_string(id_));
    return status::success();
  }

  status publish(const publish_request& rq, const std::atomic<bool>& stop, publish_report& rep) {
    body_writer w;
    w.u64(rq.target_version)
        .u8(static_cast<std::uint8_t>(rq.mode))
        .str(rq.incarnation)
        .u64(rq.upload_queue);
    std::vector<std::byte> b;
    DCR_TRY(c_.call(control_type::publish, rq.attempt, w.bytes(), b, &stop));
    body_reader r(b);
    std::uint64_t n = 0;
    DCR_TRY(r.u64(n));
    rep.payloads = static_cast<std::size_t>(n);
    DCR_TRY(r.u64(rep.bytes));
    DCR_TRY(r.f64(rep.construct_seconds));
    DCR_TRY(r.f64(rep.upload_seconds));
    std::uint8_t bound = 0;
    DCR_TRY(r.u8(bound));
    // 0: no digest, 1: a stream digest (relay), 2: a manifest in the object store.
    DCR_RETURN_ERROR_IF(bound > 2, bad_format,
                        "publish reply: manifest flag " + std::to_string(bound));
    rep.manifest_bound = bound >= 1;
    rep.manifest_stored = bound == 2;
    DCR_TRY(r.dig(rep.manifest_digest));
    std::uint32_t sent = 0;
    DCR_TRY(r.count(sent, 16));
    rep.payload_digests.assign(sent, {});
    for (auto& d : rep.payload_digests) DCR_TRY(r.dig(d));
    return r.done();
  }
  status commit_baseline(std::uint64_t attempt, std::uint64_t version) {
    body_writer w;
    w.u64(version);
    std::vector<std::byte> b;
    DCR_TRY(c_.call(control_type::commit_baseline, attempt, w.bytes(), b));
    return detail::read_empty_reply(b);
  }
  status baseline_digest(digest128& d) {
    std::vector<std::byte> b;
    DCR_TRY(c_.call(control_type::baseline_digest, 0, detail::no_body(), b));
    return detail::read_digest_reply(b, d);
  }
  status candidate_digest(digest128& d) {
    std::vector<std::byte> b;
    DCR_TRY(c_.call(control_type::candidate_digest, 0, detail::no_body(), b));
    return detail::read_digest_reply(b, d);
  }
  /// Upload the owner's share of the committed version densely (restores).
  status export_dense(std::uint64_t version, const std::string& incarnation) {
    body_writer w;
    w.u64(version).str(incarnation);
    std::vector<std::byte> b;
    DCR_TRY(c_.call(control_type::export_dense, 0, w.bytes(), b));
    return detail::read_empty_reply(b);
  }

private:
  std::uint32_t id_;
  control_client c_;
};

/// Proxy of a rollout-node process (see file comment).
class remote_node_link {
public:
  explicit remote_node_link(peer_address peer, channel_options opt = {})
      : c_(std::move(peer), opt) {}

  const peer_address& peer() const noexcept { return c_.peer(); }

  /// Reach the node and learn its receivers' ids (they must not change
  /// between connects: a node restarted with other receivers is refused).
  status connect() {
    std::vector<std::byte> b;
    DCR_TRY(c_.call(control_type::node_hello, 0, detail::no_body(), b));
    body_reader r(b);
    std::uint32_t n = 0;
    DCR_TRY(r.count(n, 4));
    std::vector<std::string> ids(n);
    for (auto& id : ids) DCR_TRY(r.str(id));
    DCR_TRY(r.done());
    DCR_RETURN_ERROR_IF(n == 0, verification, c_.peer().text() + " serves no receivers");
    DCR_RETURN_ERROR_IF(!ids_.empty() && ids != ids_, verification,
                        c_.peer().text() + " now serves other receivers than before");
    ids_ = std::move(ids);
    return status::success();
  }
  /// The node's receivers, as `connect` learnt them.
  std::vector<std::string> ids() const { return ids_; }

  status down(std::size_t& n) {
    std::vector<std::byte> b;
    DCR_TRY(c_.call(control_type::down, 0, detail::no_body(), b));
    body_reader r(b);
    std::uint64_t v = 0;
    DCR_TRY(r.u64(v));
    n = static_cast<std::size_t>(v);
    return r.done();
  }
  status ensure_member(const membership& m, std::size_t& restored) {
    body_writer w;
    w.u64(m.version).str(m.incarnation).u32(static_cast<std::uint32_t>(m.committed.size()));
    for (auto& [id, d] : m.committed) w.str(id).dig(d);
    std::vector<std::byte> b;
    DCR_TRY(c_.call(control_type::ensure_member, 0, w.bytes(), b));
    body_reader r(b);
    std::uint64_t v = 0;
    DCR_TRY(r.u64(v));
    restored = static_cast<std::size_t>(v);
    return r.done();
  }
  /// Compare every receiver's complete storage with a dense load of
  /// `version` (from the owners' dense export) through the same loader;
  /// `equal[i]` for receiver `ids()[i]`.
  status verify(std::uint64_t version, const std::string& incarnation, std::vector<bool>& equal,
                std::vector<digest128>& digests) {
    body_writer w;
    w.u64(version).str(incarnation);
    std::vector<std::byte> b;
    DCR_TRY(c_.call(control_type::verify, 0, w.bytes(), b));
    body_reader r(b);
    std::uint32_t n = 0;
    DCR_TRY(r.count(n, 17));
    equal.assign(n, false);
    digests.assign(n, {});
    for (std::uint32_t i = 0; i < n; ++i) {
      std::uint8_t e = 0;
      DCR_TRY(r.u8(e));
      DCR_TRY(r.dig(digests[i]));
      equal[i] = e == 1;
    }
    return r.done();
  }
  status begin(std::uint64_t a) { return simple(control_type::begin, a); }
  status close_gate(std::uint64_t a) { return simple(control_type::close_gate, a); }
  status open_gate(std::uint64_t a) { return simple(control_type::open_gate, a); }

  status refit(const refit_request& rq, const std::atomic<bool>& stop, refit_result& res) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        rq.deadline - std::chrono::steady_clock::now());
    body_writer w;
    w.str(rq.incarnation).u32(static_cast<std::uint32_t>(rq.owners.size()));
    for (auto o : rq.owners) w.u32(o);
    w.u8(rq.synchronous ? 1 : 0)
        .u64(rq.apply_queue)
        .u64(static_cast<std::uint64_t>(std::max<std::int64_t>(0, left.count())));
    std::vector<std::byte> b;
    DCR_TRY(c_.call(control_type::refit, rq.attempt, w.bytes(), b, &stop));
    body_reader r(b);
    std::uint32_t n = 0;
    DCR_TRY(r.count(n, 16));
    res.acks.assign(n, {});
    for (auto& d : res.acks) DCR_TRY(r.dig(d));
    DCR_TRY(r.f64(res.fetch_seconds));
    DCR_TRY(r.f64(res.apply_seconds));
    DCR_TRY(r.f64(res.apply_cpu_seconds));
    std::uint32_t m = 0;
    DCR_TRY(r.count(m, 20));
    res.manifests.assign(m, {});
    for (auto& [o, d] : res.manifests) {
      DCR_TRY(r.u32(o));
      DCR_TRY(r.dig(d));
    }
    return r.done();
  }
  status acknowledge(std::uint64_t a, std::vector<digest128>& acks) {
    std::vector<std::byte> b;
    DCR_TRY(c_.call(control_type::acknowledge, a, detail::no_body(), b));
    body_reader r(b);
    std::uint32_t n = 0;
    DCR_TRY(r.count(n, 16));
    acks.assign(n, {});
    for (auto& d : acks) DCR_TRY(r.dig(d));
    return r.done();
  }
  status staged_payloads(std::uint64_t a, std::vector<staged_set>& out) {
    std::vector<std::byte> b;
    DCR_TRY(c_.call(control_type::staged_payloads, a, detail::no_body(), b));
    body_reader r(b);
    std::uint32_t n = 0;
    DCR_TRY(r.count(n, 8));
    out.assign(n, {});
    for (auto& s : out) {
      DCR_TRY(r.str(s.receiver));
      std::uint32_t m = 0;
      DCR_TRY(r.count(m, 20));
      s.payloads.assign(m, {});
      for (auto& [name, d] : s.payloads) {
        DCR_TRY(r.str(name));
        DCR_TRY(r.dig(d));
      }
    }
    return r.done();
  }
  status kill(const std::string& id) {
    body_writer w;
    w.str(id);
    std::vector<std::byte> b;
    DCR_TRY(c_.call(control_type::kill, 0, w.bytes(), b));
    return detail::read_empty_reply(b);
  }

private:
  status simple(control_type t, std::uint64_t a) {
    std::vector<std::byte> b;
    DCR_TRY(c_.call(t, a, detail::no_body(), b));
    return detail::read_empty_reply(b);
  }
  control_client c_;
  std::vector<std::string> ids_;
};

static_assert(owner_link<remote_owner_link>);
static_assert(node_link<remote_node_link>);

/// What an owner process adds around its local link.
struct owner_hooks {
  /// Before `commit_baseline(τ, v)`: check that K^v committed attempt τ
  /// (an owner process reads the commit store itself). Empty: trust the caller.
  std::function<status(std::uint64_t attempt, std::uint64_t version)> verify_commit;
  /// True when the baseline is at `version` already: `commit_baseline` of it
  /// is then a no-op that succeeds. A baseline update whose reply was lost
  /// (the link went down after the owner moved) is retried by the next
  /// coordinator; it must not move the baseline a second time.
  std::function<bool(std::uint64_t version)> at_version;
  /// After the baseline moved to version v (e.g. train the next candidate).
  std::function<void(std::uint64_t version)> committed;
  /// Dense export of the committed baseline (restores); empty: unsupported.
  std::function<status(std::uint64_t version, const std::string& incarnation)> export_dense;
};

/// Serves one owner's local link on a control server (the owner process).
template <owner_link Link>
class owner_service {
public:
  owner_service(Link& link, owner_hooks hooks = {}) : l_(&link), h_(std::move(hooks)) {}

  status operator()(const control_frame& call, const std::atomic<bool>& stop, body_writer& out) {
    body_reader r(call.body);
    switch (call.type) {
    case control_type::owner_hello:
      DCR_TRY(r.done());
      out.u32(l_->owner_id());
      return status::success();
    case control_type::baseline_digest:
    case control_type::candidate_digest: {
      DCR_TRY(r.done());
      digest128 d{};
      DCR_TRY(call.type == control_type::baseline_digest ? l_->baseline_digest(d)
                                                         : l_->candidate_digest(d));
      out.dig(d);
      return status::success();
    }
    case control_type::publish: {
      publish_request rq;
      rq.attempt = call.attempt;
      std::uint8_t mode = 0;
      std::uint64_t queue = 0;
      DCR_TRY(r.u64(rq.target_version));
      DCR_TRY(r.u8(mode));
      DCR_TRY(r.str(rq.incarnation));
      DCR_TRY(r.u64(queue));
      DCR_TRY(r.done());
      DCR_RETURN_ERROR_IF(mode > static_cast<std::uint8_t>(refit_mode::overwrite_all), bad_format,
                          "publish: unknown mode " + std::to_string(mode));
      DCR_RETURN_ERROR_IF(call.attempt == 0 || queue == 0 || queue > 1024, bad_format,
                          "publish: attempt 0 or upload queue outside 1..1024");
      rq.mode = static_cast<refit_mode>(mode);
      rq.upload_queue = static_cast<std::size_t>(queue);
      publish_report rep;
      DCR_TRY(l_->publish(rq, stop, rep));
      out.u64(rep.payloads).u64(rep.bytes).f64(rep.construct_seconds).f64(rep.upload_seconds);
      out.u8(!rep.manifest_bound ? 0 : rep.manifest_stored ? 2 : 1).dig(rep.manifest_digest);
      out.u32(static_cast<std::uint32_t>(rep.payload_digests.size()));
      for (auto& d : rep.payload_digests) out.dig(d);
      return status::success();
    }
    case control_type::commit_baseline: {
      std::uint64_t v = 0;
      DCR_TRY(r.u64(v));
      DCR_TRY(r.done());
      if (h_.at_version && h_.at_version(v)) return status::success();
      if (h_.verify_commit) DCR_TRY(h_.verify_commit(call.attempt, v));
      DCR_TRY(l_->commit_baseline(call.attempt, v));
      if (h_.committed) h_.committed(v);
      return status::success();
    }
    case control_type::export_dense: {
      std::uint64_t v = 0;
      std::string inc;
      DCR_TRY(r.u64(v));
      DCR_TRY(r.str(inc));
      DCR_TRY(r.done());
      DCR_RETURN_ERROR_IF(!h_.export_dense, not_found, "this owner offers no dense export");
      return h_.export_dense(v, inc);
    }
    default:
      return fail(errc::bad_format, "owner: call of type " +
                                        std::to_string(static_cast<unsigned>(call.type)) +
                                        " is not an owner call");
    }
  }

private:
  Link* l_;
  owner_hooks h_;
};

/// Serves one rollout node's local link on a control server (the rollout process).
template <node_link Link>
class node_service {
public:
  /// `(version, incarnation, equal, digests)`: compare every receiver with a
  /// dense load of that version (`remote_node_link::verify`).
  using verifier = std::function<status(std::uint64_t, const std::string&, std::vector<bool>&,
                                        std::vector<digest128>&)>;
  explicit node_service(Link& link, verifier verify = {}) : l_(&link), verify_(std::move(verify)) {}

  status operator()(const control_frame& call, const std::atomic<bool>& stop, body_writer& out) {
    body_reader r(call.body);
    const auto tau = call.attempt;
    switch (call.type) {
    case control_type::node_hello: {
      DCR_TRY(r.done());
      const auto ids = l_->ids();
      out.u32(static_cast<std::uint32_t>(ids.size()));
      for (auto& id : ids) out.str(id);
      return status::success();
    }
    case control_type::down: {
      DCR_TRY(r.done());
      std::size_t n = 0;
      DCR_TRY(l_->down(n));
      out.u64(n);
      return status::success();
    }
    case control_type::ensure_member: {
      membership m;
      std::uint32_t n = 0;
      DCR_TRY(r.u64(m.version));
      DCR_TRY(r.str(m.incarnation));
      DCR_TRY(r.count(n, 20));
      for (std::uint32_t i = 0; i < n; ++i) {
        std::string id;
        digest128 d{};
        DCR_TRY(r.str(id));
        DCR_TRY(r.dig(d));
        m.committed[id] = d;
      }
      DCR_TRY(r.done());
      std::size_t restored = 0;
      DCR_TRY(l_->ensure_member(m, restored));
      out.u64(restored);
      return status::success();
    }
    case control_type::verify: {
      std::uint64_t v = 0;
      std::string inc;
      DCR_TRY(r.u64(v));
      DCR_TRY(r.str(inc));
      DCR_TRY(r.done());
      DCR_RETURN_ERROR_IF(!verify_, not_found, "this node offers no dense verification");
      std::vector<bool> equal;
      std::vector<digest128> digests;
      DCR_TRY(verify_(v, inc, equal, digests));
      out.u32(static_cast<std::uint32_t>(equal.size()));
      for (std::size_t i = 0; i < equal.size(); ++i) out.u8(equal[i] ? 1 : 0).dig(digests[i]);
      return status::success();
    }
    case control_type::begin:
    case control_type::close_gate:
    case control_type::open_gate:
      DCR_TRY(r.done());
      DCR_RETURN_ERROR_IF(tau == 0, bad_format, "gate or begin call without an attempt");
      return call.type == control_type::begin        ? l_->begin(tau)
             : call.type == control_type::close_gate ? l_->close_gate(tau)
                                                     : l_->open_gate(tau);
    case control_type::refit: {
      refit_request rq;
      rq.attempt = tau;
      std::uint32_t n = 0;
      std::uint8_t sync = 0;
      std::uint64_t queue = 0, ms = 0;
      DCR_TRY(r.str(rq.incarnation));
      DCR_TRY(r.count(n, 4));
      rq.owners.assign(n, 0);
      for (auto& o : rq.owners) DCR_TRY(r.u32(o));
      DCR_TRY(r.u8(sync));
      DCR_TRY(r.u64(queue));
      DCR_TRY(r.u64(ms));
      DCR_TRY(r.done());
      DCR_RETURN_ERROR_IF(tau == 0 || sync > 1 || queue == 0 || queue > 1024, bad_format,
                          "refit: attempt 0, bad mode or apply queue outside 1..1024");
      rq.synchronous = sync == 1;
      rq.apply_queue = static_cast<std::size_t>(queue);
      rq.deadline = std::chrono::steady_clock::now() +
                    std::chrono::milliseconds(std::min<std::uint64_t>(ms, 1ull << 40));
      refit_result res;
      DCR_TRY(l_->refit(rq, stop, res));
      out.u32(static_cast<std::uint32_t>(res.acks.size()));
      for (auto& d : res.acks) out.dig(d);
      out.f64(res.fetch_seconds).f64(res.apply_seconds).f64(res.apply_cpu_seconds);
      out.u32(static_cast<std::uint32_t>(res.manifests.size()));
      for (auto& [o, d] : res.manifests) out.u32(o).dig(d);
      return status::success();
    }
    case control_type::acknowledge: {
      DCR_TRY(r.done());
      std::vector<digest128> acks;
      DCR_TRY(l_->acknowledge(tau, acks));
      out.u32(static_cast<std::uint32_t>(acks.size()));
      for (auto& d : acks) out.dig(d);
      return status::success();
    }
    case control_type::staged_payloads: {
      DCR_TRY(r.done());
      std::vector<staged_set> staged;
      DCR_TRY(l_->staged_payloads(tau, staged));
      out.u32(static_cast<std::uint32_t>(staged.size()));
      for (auto& s : staged) {
        out.str(s.receiver).u32(static_cast<std::uint32_t>(s.payloads.size()));
        for (auto& [name, d] : s.payloads) out.str(name).dig(d);
      }
      return status::success();
    }
    case control_type::kill: {
      std::string id;
      DCR_TRY(r.str(id));
      DCR_TRY(r.done());
      return l_->kill(id);
    }
    default:
      return fail(errc::bad_format, "node: call of type " +
                                        std::to_string(static_cast<unsigned>(call.type)) +
                                        " is not a rollout-node call");
    }
  }

private:
  Link* l_;
  verifier verify_;
};

} // namespace dcr::protocol
