#pragma once
/// \file
/// Relay-tree transport (docs/architecture.md, "Relay tree"): owners stream
/// their payloads to one root rollout node, which forwards them through a
/// balanced k-ary tree; every node hands each payload to the readers of its
/// local receivers. A node acknowledges a frame once it sits in the node's
/// bounded staging queue ("queueing ACK": queued, not applied), fences stale
/// attempts and suppresses duplicates. Links are `frame_conn`s made by a
/// `relay_network`: in-process pipes here, TCP in relay_tcp.hpp.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "dcr/codec/payload_format.hpp"
#include "dcr/core/error.hpp"
#include "dcr/pipeline/bounded_queue.hpp"
#include "dcr/transport/attempt_objects.hpp"
#include "dcr/transport/attempt_transport.hpp"
#include "dcr/transport/relay_frame.hpp"

namespace dcr::transport {

/// Balanced k-ary tree over `nodes` rollout nodes in heap order: node 0 is the
/// root, the parent of i > 0 is (i-1)/k, its children are k·i+1 … k·i+k. Every
/// node is reached exactly once from the root, and the height is the least h
/// with 1 + k + … + k^h >= nodes (n-1 for a chain, k = 1).
class relay_topology {
public:
  /// `nodes >= 1`, `fanout >= 1`; throws `dcr::error(invalid_argument)` otherwise.
  relay_topology(std::uint32_t nodes, std::uint32_t fanout) : n_(nodes), k_(fanout) {
    if (nodes == 0 || fanout == 0) throw error(errc::invalid_argument, "relay_topology: nodes and fan-out must be >= 1");
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
    for (std::uint64_t j = std::uint64_t{k_} * i + 1; j <= std::uint64_t{k_} * i + k_ && j < n_; ++j)
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

/// Sizes, timeouts and test hooks of a relay tree.
struct relay_options {
  std::uint32_t nodes = 1;
  std::uint32_t fanout = 2;
  std::uint32_t receivers_per_node = 1; ///< receiver r lives on node r / receivers_per_node
  /// Receivers in all (at most nodes · receivers_per_node); must be the
  /// coordinator's receiver count: a node waits for every local reader.
  std::uint32_t receivers = 1;
  std::size_t staging = 8;              ///< frames queued at a node before the upstream blocks
  std::size_t local_queue = 8;          ///< frames waiting for each local reader
  std::size_t window = 4;               ///< unacknowledged frames a sender may have in flight
  std::size_t pipe_frames = 2;          ///< in-process pipe capacity per direction
  std::uint64_t max_frame_body = default_max_frame_body;
  std::chrono::milliseconds io_timeout{10000}; ///< longest wait for a write or an ACK
  /// Test hook: owners send every payload frame twice.
  bool duplicate_payloads = false;
  /// Test hook: called by an owner's `finish()` before it sends owner_done.
  std::function<void(std::uint64_t attempt, std::uint32_t owner)> before_finish;
};

/// What a node counted (all attempts).
struct relay_counters {
  std::uint64_t payloads = 0;   ///< distinct payloads queued
  std::uint64_t duplicates = 0; ///< frames seen before, acknowledged and dropped
  std::uint64_t stale = 0;      ///< frames of a replaced attempt, rejected
  std::uint64_t rejected = 0;   ///< frames of a failed attempt, rejected
  std::uint64_t forwarded = 0;  ///< frames sent to children
  std::uint64_t failures = 0;   ///< attempts this node failed
};

/// Makes the links of a tree: `listen` arranges that connections to node i
/// reach `accept(i, conn)`; `dial(i)` opens a connection to node i.
class relay_network {
public:
  using acceptor = std::function<void(std::uint32_t node, std::shared_ptr<frame_conn> conn)>;
  virtual ~relay_network() = default;
  virtual status listen(std::uint32_t nodes, acceptor accept) = 0;
  virtual status dial(std::uint32_t node, std::shared_ptr<frame_conn>& out) = 0;
  /// Stop accepting; existing connections are closed by their holders.
  virtual void shutdown() = 0;
};

namespace detail {

inline std::chrono::steady_clock::time_point after(std::chrono::milliseconds d) {
  return std::chrono::steady_clock::now() + d;
}

} // namespace detail

/// In-process pipe: two bounded frame queues. Frames travel encoded, so the
/// reading end checks them exactly as a socket's reader does.
class inproc_conn final : public frame_conn {
public:
  using queue = pipeline::bounded_queue<std::vector<std::byte>>;
  /// Both ends of a new pipe.
  static std::pair<std::shared_ptr<inproc_conn>, std::shared_ptr<inproc_conn>> pipe(std::size_t frames,
                                                                                    std::uint64_t max_body) {
    auto a = std::make_shared<queue>(std::max<std::size_t>(frames, 1));
    auto b = std::make_shared<queue>(std::max<std::size_t>(frames, 1));
    return {std::make_shared<inproc_conn>(a, b, max_body), std::make_shared<inproc_conn>(b, a, max_body)};
  }
  inproc_conn(std::shared_ptr<queue> out, std::shared_ptr<queue> in, std::uint64_t max_body)
      : out_(std::move(out)), in_(std::move(in)), max_(max_body) {}

  status write(const frame_header& h, std::span<const std::byte> body, std::chrono::milliseconds timeout) override {
    switch (out_->push_until(encode_frame(h, body), detail::after(timeout))) {
    case pipeline::queue_wait::ok: return status::success();
    case pipeline::queue_wait::closed: return fail(errc::unavailable, "relay link closed");
    case pipeline::queue_wait::timeout: break;
    }
    return fail(errc::unavailable, "relay link: peer took no frame for " + std::to_string(timeout.count()) + " ms");
  }
  status read(frame& out) override {
    auto b = in_->pop();
    DCR_RETURN_ERROR_IF(!b, unavailable, "relay link closed");
    return decode_frame(*b, max_, out);
  }
  void close() override {
    out_->close();
    in_->close();
  }
  /// Test hook: put raw bytes on the link as if they were a frame.
  status write_raw(std::vector<std::byte> bytes) {
    DCR_RETURN_ERROR_IF(!out_->push(std::move(bytes)), unavailable, "relay link closed");
    return status::success();
  }

private:
  std::shared_ptr<queue> out_, in_;
  std::uint64_t max_;
};

/// Links between the nodes of one process.
class inproc_network final : public relay_network {
public:
  explicit inproc_network(std::size_t pipe_frames = 2, std::uint64_t max_body = default_max_frame_body)
      : frames_(pipe_frames), max_(max_body) {}
  status listen(std::uint32_t nodes, acceptor accept) override {
    std::lock_guard l(m_);
    nodes_ = nodes;
    accept_ = std::move(accept);
    return status::success();
  }
  status dial(std::uint32_t node, std::shared_ptr<frame_conn>& out) override {
    acceptor a;
    {
      std::lock_guard l(m_);
      DCR_RETURN_ERROR_IF(!accept_ || node >= nodes_, unavailable, "relay node " + std::to_string(node) + " unreachable");
      a = accept_;
    }
    auto [mine, theirs] = inproc_conn::pipe(frames_, max_);
    a(node, theirs);
    out = mine;
    return status::success();
  }
  void shutdown() override {
    std::lock_guard l(m_);
    accept_ = nullptr;
  }

private:
  std::mutex m_;
  std::size_t frames_;
  std::uint64_t max_;
  std::uint32_t nodes_ = 0;
  acceptor accept_;
};

/// One rollout node: intake from upstream connections (parent, or owners at
/// the root), a staging queue, a forwarder to children and local readers.
class relay_node {
public:
  relay_node(std::uint32_t index, const relay_topology& topo, const relay_options& opt, relay_network* net,
             std::uint32_t local_slots)
      : index_(index), opt_(opt), net_(net), slots_(local_slots), staging_(std::max<std::size_t>(opt.staging, 1)) {
    for (auto c : topo.children(index)) {
      children_.push_back(std::make_unique<downlink>());
      children_.back()->node = c;
    }
    cur_ = std::make_shared<attempt_state>();
    forwarder_ = std::thread([this] { forward_loop(); });
  }
  relay_node(const relay_node&) = delete;
  relay_node& operator=(const relay_node&) = delete;
  ~relay_node() { shutdown(); }

  std::uint32_t index() const noexcept { return index_; }

  /// A new upstream connection: read frames from it until it closes.
  void accept(std::shared_ptr<frame_conn> c) {
    std::lock_guard l(up_m_);
    if (down_) {
      c->close();
      return;
    }
    std::erase_if(ups_, [](auto& u) {
      if (!u->ended) return false;
      u->t.join();
      return true;
    });
    auto u = std::make_unique<upstream>();
    u->conn = std::move(c);
    auto* p = u.get();
    u->t = std::thread([this, p] {
      intake_loop(*p->conn);
      p->ended = true;
    });
    ups_.push_back(std::move(u));
  }

  /// Deliver attempt τ to local slot `slot` (see `relay_reader::run`).
  status read(std::uint64_t attempt, std::uint32_t slot, const std::set<std::uint32_t>& owners,
              const payload_delivery& deliver, const std::atomic<bool>& stop,
              std::chrono::steady_clock::time_point deadline) {
    DCR_RETURN_ERROR_IF(slot >= slots_, invalid_argument,
                        "relay node " + std::to_string(index_) + " has no local receiver slot " + std::to_string(slot));
    std::shared_ptr<attempt_state> st;
    {
      std::lock_guard l(m_);
      DCR_RETURN_ERROR_IF(attempt < cur_->id, stale_attempt,
                          "relay node " + std::to_string(index_) + ": attempt " + std::to_string(attempt) +
                              " replaced by " + std::to_string(cur_->id));
      if (attempt > cur_->id) begin_locked(attempt);
      st = cur_;
    }
    auto& q = *st->local[slot];
    struct closer {
      pipeline::bounded_queue<std::shared_ptr<const frame>>& q;
      ~closer() { q.close(); } // the forwarder never blocks on a reader that left
    } guard{q};
    std::map<std::uint32_t, std::uint32_t> delivered, done;
    const auto where = "relay node " + std::to_string(index_) + ", attempt " + std::to_string(attempt);
    for (;;) {
      DCR_RETURN_ERROR_IF(stop.load(), aborted, where + ": stopped");
      // Complete wins over a failure noticed later: everything was delivered.
      bool complete = true;
      for (auto o : owners) {
        auto d = done.find(o);
        complete = complete && d != done.end() && delivered[o] == d->second;
      }
      if (complete) return status::success();
      {
        std::lock_guard l(m_);
        DCR_RETURN_ERROR_IF(cur_ != st, stale_attempt, where + ": replaced by attempt " + std::to_string(cur_->id));
        if (!st->failed) return st->failed;
      }
      const auto now = std::chrono::steady_clock::now();
      if (now > deadline)
        return fail(errc::aborted, where + ": deadline passed with " + std::to_string(done.size()) + " of " +
                                       std::to_string(owners.size()) + " owners done");
      std::shared_ptr<const frame> f;
      if (q.pop_until(f, std::min(deadline, now + std::chrono::milliseconds(20))) != pipeline::queue_wait::ok) continue;
      const auto& h = f->header;
      if (h.kind == frame_kind::owner_done) {
        done[h.owner] = h.sequence;
        continue;
      }
      DCR_TRY(deliver(payload_name(h.attempt, h.owner, h.sequence), f->body));
      ++delivered[h.owner];
    }
  }

  /// Newest attempt this node has seen.
  std::uint64_t current_attempt() const {
    std::lock_guard l(m_);
    return cur_->id;
  }
  relay_counters counters() const {
    std::lock_guard l(m_);
    return c_;
  }
  /// Test hook: drop the link to child `child` after `frames` more frames of
  /// the attempt then current (the next attempt reconnects).
  void drop_child_after(std::uint32_t child, std::uint64_t frames) {
    for (auto& d : children_)
      if (d->node == child) d->drop_after = frames;
  }

  /// Close every link and end every thread.
  void shutdown() {
    {
      std::lock_guard l(up_m_);
      if (down_) return;
      down_ = true;
      for (auto& u : ups_) u->conn->close();
    }
    staging_.close();
    for (auto& d : children_) close_async(*d, ~std::uint64_t{0});
    {
      std::lock_guard l(m_);
      for (auto& q : cur_->local) q->close();
    }
    if (forwarder_.joinable()) forwarder_.join();
    for (auto& d : children_) retire(*d);
    std::lock_guard l(up_m_);
    for (auto& u : ups_) u->t.join();
    ups_.clear();
  }

private:
  using frame_ptr = std::shared_ptr<const frame>;
  using local_queue = pipeline::bounded_queue<frame_ptr>;

  struct attempt_state {
    std::uint64_t id = 0;
    status failed;
    std::set<std::pair<std::uint32_t, std::uint32_t>> seen;
    std::map<std::uint32_t, std::uint32_t> count, done;
    std::vector<std::shared_ptr<local_queue>> local;
  };
  struct upstream {
    std::shared_ptr<frame_conn> conn;
    std::thread t;
    std::atomic<bool> ended{false};
  };
  /// The link to one child; only the forwarder opens it, anyone may close it.
  struct downlink {
    std::uint32_t node = 0;
    std::mutex m;
    std::condition_variable cv;
    std::shared_ptr<frame_conn> conn;
    std::thread acks;
    std::size_t unacked = 0;
    bool dead = false;   ///< the ACK reader saw the link end
    bool retire = false; ///< closed by a failure or shutdown; replace before use
    std::uint64_t broken_for = 0; ///< newest attempt in which the link failed (not reopened within it)
    std::uint64_t used_for = 0;   ///< attempt of the last frame sent
    std::atomic<std::uint64_t> drop_after{0};
  };

  void begin_locked(std::uint64_t attempt) {
    for (auto& q : cur_->local) q->close();
    auto st = std::make_shared<attempt_state>();
    st->id = attempt;
    for (std::uint32_t s = 0; s < slots_; ++s) st->local.push_back(std::make_shared<local_queue>(std::max<std::size_t>(opt_.local_queue, 1)));
    cur_ = std::move(st);
  }

  /// Fail the current attempt here and below: local readers see the status,
  /// and the forwarder sends `abort` to every child, which fails it too (a
  /// child may not have seen the attempt at all, so losing the link alone
  /// would not tell it).
  void fail_locked(status s) {
    if (!cur_->failed) return;
    cur_->failed = std::move(s);
    ++c_.failures;
    for (auto& q : cur_->local) q->close();
    abort_for_ = cur_->id;
  }

  enum class reply { none, ack, reject };

  /// Fence, dedupe and account one frame; false = do not queue it.
  reply admit(const frame& f, bool& queue_it) {
    queue_it = false;
    const auto& h = f.header;
    std::lock_guard l(m_);
    if (h.attempt < cur_->id) {
      ++c_.stale;
      return reply::reject;
    }
    if (h.attempt > cur_->id) begin_locked(h.attempt);
    if (!cur_->failed) {
      ++c_.rejected;
      return reply::reject;
    }
    if (h.kind == frame_kind::payload) {
      if (!cur_->seen.insert({h.owner, h.sequence}).second) {
        ++c_.duplicates;
        return reply::ack;
      }
      ++cur_->count[h.owner];
      ++c_.payloads;
    } else {
      if (cur_->done.count(h.owner)) {
        ++c_.duplicates;
        return reply::ack;
      }
      const auto have = cur_->count[h.owner];
      if (have != h.sequence) {
        fail_locked(fail(errc::not_found, "relay node " + std::to_string(index_) + ": owner " +
                                              std::to_string(h.owner) + " declared " + std::to_string(h.sequence) +
                                              " payloads in attempt " + std::to_string(h.attempt) + ", " +
                                              std::to_string(have) + " arrived"));
        return reply::reject;
      }
      cur_->done[h.owner] = h.sequence;
    }
    queue_it = true;
    return reply::ack;
  }

  void intake_loop(frame_conn& conn) {
    std::uint64_t attempt = 0;              // attempt this connection carried last
    std::set<std::uint32_t> pending;        // its owners that started and did not finish
    for (;;) {
      frame f;
      if (!conn.read(f)) break;
      const auto h = f.header;
      if (h.kind == frame_kind::abort) {
        on_abort(h);
        continue;
      }
      if (h.kind != frame_kind::payload && h.kind != frame_kind::owner_done) break; // protocol violation
      if (h.kind == frame_kind::payload) {
        payload_id pid;
        if (!read_payload_id(f.body, pid) || pid.attempt != h.attempt || pid.owner != h.owner ||
            pid.sequence != h.sequence)
          break; // header and payload disagree: nothing on this link can be trusted
      }
      if (h.attempt != attempt) {
        if (h.attempt < attempt) {
          // an older attempt on the same link: rejected by admit below
        } else {
          attempt = h.attempt;
          pending.clear();
        }
      }
      bool queue_it = false;
      const auto r = admit(f, queue_it);
      if (h.attempt == attempt) {
        if (h.kind == frame_kind::payload) pending.insert(h.owner);
        else pending.erase(h.owner);
      }
      if (queue_it && !staging_.push(std::make_shared<const frame>(std::move(f)))) break;
      frame_header a = h;
      a.length = 0;
      a.kind = r == reply::reject ? frame_kind::reject
               : h.kind == frame_kind::payload ? frame_kind::payload_ack : frame_kind::done_ack;
      if (!conn.write(a, {}, opt_.io_timeout)) break;
    }
    conn.close();
    if (pending.empty()) return;
    std::lock_guard l(m_);
    if (cur_->id == attempt)
      fail_locked(fail(errc::unavailable, "relay node " + std::to_string(index_) + ": upstream link lost in attempt " +
                                              std::to_string(attempt) + " with " + std::to_string(pending.size()) +
                                              " owner(s) unfinished"));
  }

  void on_abort(const frame_header& h) {
    std::lock_guard l(m_);
    if (h.attempt < cur_->id) return;
    if (h.attempt > cur_->id) begin_locked(h.attempt);
    auto code = static_cast<errc>(h.sequence);
    if (h.sequence == 0 || h.sequence > static_cast<std::uint32_t>(errc::unavailable)) code = errc::unavailable;
    fail_locked(fail(code, "relay node " + std::to_string(index_) + ": attempt " + std::to_string(h.attempt) +
                               " failed upstream (" + std::string(to_string(code)) + ")"));
  }

  /// Tell every child that attempt τ failed here (best effort: a child that
  /// cannot be reached fails τ when its link is found lost or by its deadline).
  void send_aborts(std::uint64_t tau) {
    errc code = errc::unavailable;
    {
      std::lock_guard l(m_);
      if (cur_->id == tau && !cur_->failed) code = cur_->failed.code;
    }
    const frame_header h{frame_kind::abort, tau, 0, static_cast<std::uint32_t>(code), 0};
    for (auto& d : children_) {
      std::shared_ptr<frame_conn> c;
      {
        std::lock_guard l(d->m);
        if (d->broken_for == ~std::uint64_t{0}) continue; // shutting down
        if (d->conn && !d->dead && !d->retire) c = d->conn;
      }
      if (!c) {
        retire(*d);
        if (!net_->dial(d->node, c)) continue;
        std::lock_guard l(d->m);
        if (d->retire) { // shut down meanwhile
          c->close();
          continue;
        }
        d->conn = c;
        d->dead = false;
        d->unacked = 0;
        d->acks = std::thread([dp = d.get(), c] { ack_loop(*dp, *c); });
      }
      if (!c->write(h, {}, opt_.io_timeout)) break_link(*d, tau);
    }
  }

  void forward_loop() {
    for (;;) {
      if (const auto a = abort_for_.load(); a > abort_sent_) {
        abort_sent_ = a;
        send_aborts(a);
      }
      frame_ptr f;
      const auto r = staging_.pop_until(f, detail::after(std::chrono::milliseconds(20)));
      if (r == pipeline::queue_wait::closed) return;
      if (r == pipeline::queue_wait::timeout) continue;
      std::vector<std::shared_ptr<local_queue>> local;
      {
        std::lock_guard l(m_);
        if (f->header.attempt != cur_->id || !cur_->failed) continue; // replaced or failed meanwhile
        local = cur_->local;
      }
      for (auto& d : children_) forward(*d, *f);
      for (auto& q : local) (void)q->push(f); // closed when its reader left or the attempt ended
    }
  }

  // The helpers below that join an ACK thread run on the forwarder thread only
  // (or after it ended), so no thread is joined twice.
  void retire(downlink& d) {
    std::shared_ptr<frame_conn> c;
    {
      std::lock_guard l(d.m);
      c = std::move(d.conn);
      d.conn.reset();
    }
    if (c) c->close();
    if (d.acks.joinable()) d.acks.join();
  }
  void break_link(downlink& d, std::uint64_t attempt) {
    {
      std::lock_guard l(d.m);
      d.broken_for = std::max(d.broken_for, attempt);
    }
    retire(d);
  }
  /// Close a link from any thread; the forwarder replaces it at the next attempt.
  static void close_async(downlink& d, std::uint64_t attempt) {
    std::lock_guard l(d.m);
    d.broken_for = std::max(d.broken_for, attempt);
    d.retire = true;
    if (d.conn) d.conn->close();
    d.cv.notify_all();
  }

  /// Send one frame to a child. A link that failed in attempt τ stays down for
  /// the rest of τ (the child has failed τ: its upstream closed with owners
  /// unfinished) and is opened again by the first frame of a newer attempt.
  void forward(downlink& d, const frame& f) {
    const auto tau = f.header.attempt;
    bool reopen = false, down = false;
    {
      std::lock_guard l(d.m);
      if (tau <= d.broken_for) return;
      if (d.conn && d.dead && !d.retire && d.used_for == tau) d.broken_for = tau; // died within τ
      down = tau <= d.broken_for;
      reopen = !d.conn || d.dead || d.retire;
    }
    if (down) {
      retire(d);
      return;
    }
    if (reopen) {
      retire(d);
      std::shared_ptr<frame_conn> fresh;
      if (!net_->dial(d.node, fresh)) {
        std::lock_guard l(d.m);
        d.broken_for = std::max(d.broken_for, tau);
        return;
      }
      std::lock_guard l(d.m);
      if (tau <= d.broken_for) { // failed or shut down while dialing
        fresh->close();
        return;
      }
      d.conn = fresh;
      d.dead = d.retire = false;
      d.unacked = 0;
      d.acks = std::thread([&d, fresh] { ack_loop(d, *fresh); });
    }
    std::shared_ptr<frame_conn> c;
    {
      std::unique_lock l(d.m);
      const bool room = d.cv.wait_until(l, detail::after(opt_.io_timeout),
                                        [&] { return d.dead || d.retire || d.unacked < opt_.window; });
      if (!room || d.dead || d.retire) {
        l.unlock();
        break_link(d, tau);
        return;
      }
      ++d.unacked;
      d.used_for = tau;
      c = d.conn;
    }
    if (!c->write(f.header, f.body, opt_.io_timeout)) {
      break_link(d, tau);
      return;
    }
    {
      std::lock_guard l(m_);
      ++c_.forwarded;
    }
    if (d.drop_after.load() > 0 && d.drop_after.fetch_sub(1) == 1) break_link(d, tau);
  }

  static void ack_loop(downlink& d, frame_conn& c) {
    for (;;) {
      frame f;
      const bool ok = static_cast<bool>(c.read(f));
      std::lock_guard l(d.m);
      const auto k = f.header.kind;
      if (!ok || (k != frame_kind::payload_ack && k != frame_kind::done_ack && k != frame_kind::reject)) {
        d.dead = true;
        d.cv.notify_all();
        return;
      }
      if (d.unacked > 0) --d.unacked; // a reject also frees the window: the child dropped the frame
      d.cv.notify_all();
    }
  }

  const std::uint32_t index_;
  const relay_options opt_;
  relay_network* net_;
  const std::uint32_t slots_;
  mutable std::mutex m_;
  std::shared_ptr<attempt_state> cur_;
  relay_counters c_;
  pipeline::bounded_queue<frame_ptr> staging_;
  std::vector<std::unique_ptr<downlink>> children_;
  std::atomic<std::uint64_t> abort_for_{0}; ///< newest attempt failed here
  std::uint64_t abort_sent_ = 0;            ///< newest attempt whose abort went out (forwarder only)
  std::thread forwarder_;
  std::mutex up_m_;
  std::vector<std::unique_ptr<upstream>> ups_;
  bool down_ = false;
};

/// Owner side of one attempt: streams payload frames to the root with at most
/// `window` unacknowledged, then owner_done. Every failure is typed: a lost or
/// closed link or a missing ACK is `errc::unavailable`, a reject (attempt
/// replaced or failed at the root) is `errc::aborted`.
class relay_writer {
public:
  relay_writer(relay_network& net, const relay_options& opt, std::uint64_t attempt, std::uint32_t owner)
      : s_(std::make_unique<shared>()) {
    s_->net = &net;
    s_->opt = &opt;
    s_->attempt = attempt;
    s_->owner = owner;
  }
  relay_writer(relay_writer&&) noexcept = default;
  relay_writer& operator=(relay_writer&& o) noexcept {
    if (this != &o) {
      if (s_) s_->end();
      s_ = std::move(o.s_);
    }
    return *this;
  }
  ~relay_writer() {
    if (s_) s_->end();
  }

  /// Send the next payload; blocks while the window is full.
  status put_payload(std::span<const std::byte> bytes) {
    auto& s = *s_;
    payload_id pid;
    DCR_TRY(read_payload_id(bytes, pid));
    DCR_RETURN_ERROR_IF(pid.attempt != s.attempt || pid.owner != s.owner, invalid_argument,
                        "relay writer of owner " + std::to_string(s.owner) + ", attempt " + std::to_string(s.attempt) +
                            " got a payload of owner " + std::to_string(pid.owner) + ", attempt " +
                            std::to_string(pid.attempt));
    DCR_TRY(s.connect());
    const frame_header h{frame_kind::payload, s.attempt, s.owner, pid.sequence, bytes.size()};
    DCR_TRY(s.send(h, bytes));
    if (s.opt->duplicate_payloads) DCR_TRY(s.send(h, bytes));
    ++s.sent;
    return status::success();
  }

  /// Send owner_done and wait until every frame is acknowledged.
  status finish() {
    auto& s = *s_;
    if (s.opt->before_finish) s.opt->before_finish(s.attempt, s.owner);
    DCR_TRY(s.connect());
    DCR_TRY(s.send({frame_kind::owner_done, s.attempt, s.owner, s.sent, 0}, {}));
    {
      std::unique_lock l(s.m);
      const bool got = s.cv.wait_until(l, detail::after(s.opt->io_timeout),
                                       [&] { return !s.err || (s.done_acked && s.unacked == 0); });
      if (!s.err) return s.err;
      DCR_RETURN_ERROR_IF(!got, unavailable,
                          "owner " + std::to_string(s.owner) + ": no queueing ACK for owner_done of attempt " +
                              std::to_string(s.attempt) + " within " + std::to_string(s.opt->io_timeout.count()) +
                              " ms");
    }
    s.end();
    return status::success();
  }

private:
  struct shared {
    relay_network* net = nullptr;
    const relay_options* opt = nullptr;
    std::uint64_t attempt = 0;
    std::uint32_t owner = 0, sent = 0;
    std::shared_ptr<frame_conn> conn;
    std::thread acks;
    std::mutex m;
    std::condition_variable cv;
    std::size_t unacked = 0;
    bool done_acked = false, closing = false;
    status err;

    std::string who() const { return "owner " + std::to_string(owner) + ", attempt " + std::to_string(attempt); }
    status connect() {
      if (conn) return status::success();
      auto s = net->dial(0, conn);
      if (!s) return fail(errc::unavailable, who() + ": cannot reach the relay root: " + s.message);
      acks = std::thread([this] { ack_loop(); });
      return status::success();
    }
    status send(const frame_header& h, std::span<const std::byte> body) {
      {
        std::unique_lock l(m);
        const bool room =
            cv.wait_until(l, detail::after(opt->io_timeout), [&] { return !err || unacked < opt->window; });
        if (!err) return err;
        DCR_RETURN_ERROR_IF(!room, unavailable,
                            who() + ": no queueing ACK within " + std::to_string(opt->io_timeout.count()) + " ms");
        ++unacked;
      }
      auto s = conn->write(h, body, opt->io_timeout);
      if (!s) {
        std::lock_guard l(m);
        if (err) err = fail(errc::unavailable, who() + ": " + s.message);
        return err;
      }
      return status::success();
    }
    void ack_loop() {
      for (;;) {
        frame f;
        auto s = conn->read(f);
        std::lock_guard l(m);
        if (!s) {
          if (!closing && err && !(done_acked && unacked == 0))
            err = fail(errc::unavailable, who() + ": link to the relay root lost: " + s.message);
          cv.notify_all();
          return;
        }
        const auto& h = f.header;
        if (h.kind == frame_kind::reject) {
          if (err) err = fail(errc::aborted, who() + ": rejected by the relay root (attempt replaced or failed)");
        } else if ((h.kind != frame_kind::payload_ack && h.kind != frame_kind::done_ack) || h.attempt != attempt ||
                   h.owner != owner || unacked == 0) {
          if (err) err = fail(errc::bad_format, who() + ": unexpected frame from the relay root");
        } else {
          --unacked;
          if (h.kind == frame_kind::done_ack) done_acked = true;
        }
        cv.notify_all();
      }
    }
    void end() {
      {
        std::lock_guard l(m);
        closing = true;
      }
      if (conn) conn->close();
      if (acks.joinable()) acks.join();
    }
  };
  std::unique_ptr<shared> s_;
};

/// Receiver side of one attempt at one node slot (contract of `attempt_reader`:
/// each payload delivered once, complete when every required owner's
/// owner_done arrived and all its payloads were delivered). Payload names are
/// the object-store names, so endpoints see the same ids on either transport.
class relay_reader {
public:
  relay_reader(relay_node* node, std::uint32_t slot, std::uint64_t attempt, std::vector<std::uint32_t> owners,
               status setup = status::success())
      : node_(node), slot_(slot), attempt_(attempt), owners_(owners.begin(), owners.end()), setup_(std::move(setup)) {}

  template <class Deliver>
  status run(Deliver&& deliver, const std::atomic<bool>& stop, std::chrono::steady_clock::time_point deadline) {
    DCR_TRY(setup_);
    payload_delivery d = [&](std::string_view n, std::span<const std::byte> b) -> status { return deliver(n, b); };
    return node_->read(attempt_, slot_, owners_, d, stop, deadline);
  }

private:
  relay_node* node_;
  std::uint32_t slot_;
  std::uint64_t attempt_;
  std::set<std::uint32_t> owners_;
  status setup_;
};

/// A relay tree of `opt.nodes` nodes over a network (an `attempt_transport`).
class relay_tree {
public:
  /// Builds the nodes and starts listening; throws `dcr::error` on a bad
  /// configuration or when the network cannot listen.
  relay_tree(relay_options opt, std::unique_ptr<relay_network> net)
      : opt_(std::move(opt)), topo_(opt_.nodes, opt_.fanout), net_(std::move(net)) {
    if (opt_.receivers_per_node == 0 ||
        std::uint64_t{opt_.receivers} > std::uint64_t{opt_.nodes} * opt_.receivers_per_node)
      throw error(errc::invalid_argument, "relay_tree: " + std::to_string(opt_.receivers) + " receivers do not fit " +
                                              std::to_string(opt_.nodes) + " nodes of " +
                                              std::to_string(opt_.receivers_per_node));
    for (std::uint32_t i = 0; i < opt_.nodes; ++i) {
      const std::uint64_t first = std::uint64_t{i} * opt_.receivers_per_node;
      const auto slots = static_cast<std::uint32_t>(
          first >= opt_.receivers ? 0 : std::min<std::uint64_t>(opt_.receivers_per_node, opt_.receivers - first));
      nodes_.push_back(std::make_unique<relay_node>(i, topo_, opt_, net_.get(), slots));
    }
    throw_if_failed(net_->listen(opt_.nodes, [this](std::uint32_t n, std::shared_ptr<frame_conn> c) {
      nodes_[n]->accept(std::move(c));
    }));
  }
  relay_tree(const relay_tree&) = delete;
  relay_tree& operator=(const relay_tree&) = delete;
  ~relay_tree() {
    net_->shutdown();
    for (auto& n : nodes_) n->shutdown();
  }

  relay_writer open_writer(std::uint64_t attempt, std::uint32_t owner) {
    return relay_writer(*net_, opt_, attempt, owner);
  }
  relay_reader open_reader(std::uint64_t attempt, std::size_t receiver, std::vector<std::uint32_t> owners) {
    if (receiver >= opt_.receivers)
      return relay_reader(nodes_[0].get(), 0, attempt, std::move(owners),
                          fail(errc::invalid_argument, "relay_tree: receiver " + std::to_string(receiver) + " of " +
                                                           std::to_string(opt_.receivers)));
    return relay_reader(nodes_[receiver / opt_.receivers_per_node].get(),
                        static_cast<std::uint32_t>(receiver % opt_.receivers_per_node), attempt, std::move(owners));
  }
  /// Nodes hold only the current attempt, which the next one replaces: nothing to remove.
  status collect(std::uint64_t, std::size_t* removed) {
    if (removed) *removed = 0;
    return status::success();
  }

  /// Receivers the tree has reader slots for (a coordinator checks it against its own).
  std::size_t receiver_count() const noexcept { return opt_.receivers; }
  const relay_topology& topology() const noexcept { return topo_; }
  relay_node& node(std::uint32_t i) { return *nodes_.at(i); }
  relay_network& network() { return *net_; }
  const relay_options& options() const noexcept { return opt_; }

private:
  relay_options opt_;
  relay_topology topo_;
  std::unique_ptr<relay_network> net_;
  std::vector<std::unique_ptr<relay_node>> nodes_;
};
static_assert(attempt_transport<relay_tree>);

/// A relay tree whose links are in-process pipes (tests, single-process runs).
inline std::unique_ptr<relay_tree> make_inproc_relay_tree(relay_options opt) {
  auto net = std::make_unique<inproc_network>(opt.pipe_frames, opt.max_frame_body);
  return std::make_unique<relay_tree>(std::move(opt), std::move(net));
}

} // namespace dcr::transport
