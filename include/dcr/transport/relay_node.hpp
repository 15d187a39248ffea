#pragma once
/// \file
/// One rollout node of a relay tree: intake from upstream links, the bounded
/// staging queue, attempt fencing and duplicate suppression, the queueing
/// ACK, forwarding to children and hand-off to local receivers' readers.

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
#include "dcr/net/admission.hpp"
#include "dcr/pipeline/bounded_queue.hpp"
#include "dcr/transport/attempt_objects.hpp"
#include "dcr/transport/attempt_transport.hpp"
#include "dcr/transport/relay_frame.hpp"
#include "dcr/transport/relay_links.hpp"
#include "dcr/transport/relay_topology.hpp"

namespace dcr::transport {

/// Sizes, timeouts and test hooks of a relay tree.
struct relay_options {
  std::uint32_t nodes = 1;
  std::uint32_t fanout = 2;
  std::uint32_t receivers_per_node = 1; ///< receiver r lives on node r / receivers_per_node
  /// Receivers in all (at most nodes · receivers_per_node); must be the
  /// coordinator's receiver count: a node waits for every local reader.
  std::uint32_t receivers = 1;
  std::size_t staging = 8;     ///< frames queued at a node before the upstream blocks
  std::size_t local_queue = 8; ///< frames waiting for each local reader
  std::size_t window = 4;      ///< unacknowledged frames a sender may have in flight
  std::size_t pipe_frames = 2; ///< in-process pipe capacity per direction
  std::uint64_t max_frame_body = default_max_frame_body;
  std::chrono::milliseconds io_timeout{10000}; ///< longest wait for a write or an ACK
  /// Job key payload digests must be keyed with (empty: unkeyed). A node
  /// checks each payload's digest before it forwards or queues it, so a
  /// payload from a peer without the key is refused and that link dropped.
  seal_key key{};
  /// Unkeyed tree: a frame whose attempt lies more than this past the
  /// node's current attempt is rejected without moving the node to it
  /// (net/admission.hpp: anyone who reaches an unkeyed port could send
  /// 2^63 and fence every real attempt). With a key every link proved it
  /// (transport/relay_tcp.hpp) and any id is taken. The local readers'
  /// attempts come from the coordinator and are taken whatever they are.
  std::uint64_t attempt_window = net::default_attempt_window;
  /// Test hook: owners send every payload frame twice.
  bool duplicate_payloads = false;
  /// Test hook: called by an owner's `finish()` before it sends owner_done.
  std::function<void(std::uint64_t attempt, std::uint32_t owner)> before_finish;
};

/// What a node counted (all attempts).
struct relay_counters {
  std::uint64_t payloads = 0;      ///< distinct payloads queued
  std::uint64_t duplicates = 0;    ///< frames seen before (same bytes), acknowledged and dropped
  std::uint64_t stale = 0;         ///< frames of a replaced attempt, rejected
  std::uint64_t rejected = 0;      ///< frames of a failed attempt, rejected
  std::uint64_t forwarded = 0;     ///< frames sent to children
  std::uint64_t failures = 0;      ///< attempts this node failed
  std::uint64_t out_of_window = 0; ///< frames too far ahead of the current attempt, rejected
};

/// One rollout node: intake from upstream connections (parent, or owners at
/// the root), a staging queue, a forwarder to children and local readers.
class relay_node {
public:
  relay_node(std::uint32_t index, const relay_topology& topo, const relay_options& opt,
             relay_network* net, std::uint32_t local_slots)
      : index_(index), opt_(opt), net_(net), slots_(local_slots),
        staging_(std::max<std::size_t>(opt.staging, 1)) {
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
                        "relay node " + std::to_string(index_) + " has no local receiver slot " +
                            std::to_string(slot));
    std::shared_ptr<attempt_state> st;
    {
      std::lock_guard l(m_);
      DCR_RETURN_ERROR_IF(attempt < cur_->id, stale_attempt,
                          "relay node " + std::to_string(index_) + ": attempt " +
                              std::to_string(attempt) + " replaced by " + std::to_string(cur_->id));
      if (attempt > cur_->id) begin_locked(attempt);
      st = cur_;
    }
    auto& q = *st->local[slot];
    struct closer {
      pipeline::bounded_queue<std::shared_ptr<const frame>>& q;
      ~closer() { q.close(); } // the forwarder never blocks on a reader that left
    } guard{q};
    std::map<std::uint32_t, std::uint32_t> delivered, done;
    const auto where =
        "relay node " + std::to_string(index_) + ", attempt " + std::to_string(attempt);
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
        DCR_RETURN_ERROR_IF(cur_ != st, stale_attempt,
                            where + ": replaced by attempt " + std::to_string(cur_->id));
        if (!st->failed) return st->failed;
      }
      const auto now = std::chrono::steady_clock::now();
      if (now > deadline)
        return fail(errc::aborted, where + ": deadline passed with " + std::to_string(done.size()) +
                                       " of " + std::to_string(owners.size()) + " owners done");
      std::shared_ptr<const frame> f;
      if (q.pop_until(f, std::min(deadline, now + std::chrono::milliseconds(20))) !=
          pipeline::queue_wait::ok)
        continue;
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
    /// Per (owner, sequence) taken: the payload's header digest (checked
    /// against its bytes at intake).
    std::map<std::pair<std::uint32_t, std::uint32_t>, digest128> seen;
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
    std::uint64_t broken_for =
        0; ///< newest attempt in which the link failed (not reopened within it)
    std::uint64_t used_for = 0; ///< attempt of the last frame sent
    std::atomic<std::uint64_t> drop_after{0};
  };

  void begin_locked(std::uint64_t attempt) {
    for (auto& q : cur_->local) q->close();
    auto st = std::make_shared<attempt_state>();
    st->id = attempt;
    for (std::uint32_t s = 0; s < slots_; ++s)
      st->local.push_back(
          std::make_shared<local_queue>(std::max<std::size_t>(opt_.local_queue, 1)));
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

  /// `ahead`: rejected as too far past the current attempt (nothing moved).
  enum class reply { none, ack, reject, ahead };

  /// Whether an upstream frame of `attempt` may move this node to it
  /// (`relay_options::attempt_window`).
  bool in_window_locked(std::uint64_t attempt) const {
    return !opt_.key.empty() ||
           net::check_attempt_window(cur_->id, attempt, opt_.attempt_window, "relay node").ok();
  }

  /// Fence, dedupe and account one frame; false = do not queue it.
  /// `digest`: a payload frame's verified header digest.
  reply admit(const frame& f, const digest128& digest, bool& queue_it) {
    queue_it = false;
    const auto& h = f.header;
    std::lock_guard l(m_);
    if (h.attempt < cur_->id) {
      ++c_.stale;
      return reply::reject;
    }
    if (!in_window_locked(h.attempt)) {
      ++c_.out_of_window;
      return reply::ahead;
    }
    if (h.attempt > cur_->id) begin_locked(h.attempt);
    if (!cur_->failed) {
      ++c_.rejected;
      return reply::reject;
    }
    if (h.kind == frame_kind::payload) {
      const auto [taken, fresh] = cur_->seen.emplace(std::pair{h.owner, h.sequence}, digest);
      if (!fresh && taken->second != digest) {
        // Two different payloads under one (owner, sequence): at most one
        // is what the owner sent, and the first was forwarded and delivered
        // as it came. Dropping the second as a duplicate would keep the
        // first even when it is the other one (any peer that can reach this
        // node can send first), so the attempt fails here instead.
        fail_locked(fail(errc::verification,
                         "relay node " + std::to_string(index_) + ": owner " +
                             std::to_string(h.owner) + ", sequence " + std::to_string(h.sequence) +
                             " arrived twice in attempt " + std::to_string(h.attempt) +
                             " with different payloads (digest " + to_hex(taken->second) +
                             ", then " + to_hex(digest) + ")"));
        return reply::reject;
      }
      if (!fresh) { // the same payload again (a resend, or a second path): taken once
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
                                              std::to_string(h.owner) + " declared " +
                                              std::to_string(h.sequence) + " payloads in attempt " +
                                              std::to_string(h.attempt) + ", " +
                                              std::to_string(have) + " arrived"));
        return reply::reject;
      }
      cur_->done[h.owner] = h.sequence;
    }
    queue_it = true;
    return reply::ack;
  }

  void intake_loop(frame_conn& conn) {
    std::uint64_t attempt = 0;       // attempt this connection carried last
    std::set<std::uint32_t> pending; // its owners that started and did not finish
    for (;;) {
      frame f;
      if (!conn.read(f)) break;
      const auto h = f.header;
      if (h.kind == frame_kind::abort) {
        on_abort(h);
        continue;
      }
      if (h.kind != frame_kind::payload && h.kind != frame_kind::owner_done)
        break; // protocol violation
      codec::payload_header ph;
      if (h.kind == frame_kind::payload) {
        codec::decode_limits limits;
        limits.key = opt_.key;
        const auto& pid = ph.id;
        if (!codec::read_payload_header(f.body, ph, limits) || pid.attempt != h.attempt ||
            pid.owner != h.owner || pid.sequence != h.sequence)
          break; // header and payload disagree: nothing on this link can be trusted
      }
      bool queue_it = false;
      const auto r = admit(f, ph.digest, queue_it);
      // A frame too far ahead says nothing about this link's attempt.
      if (r != reply::ahead && h.attempt > attempt) {
        attempt = h.attempt; // an older attempt's frame was rejected by admit
        pending.clear();
      }
      if (r != reply::ahead && h.attempt == attempt) {
        if (h.kind == frame_kind::payload)
          pending.insert(h.owner);
        else
          pending.erase(h.owner);
      }
      if (queue_it && !staging_.push(std::make_shared<const frame>(std::move(f)))) break;
      frame_header a = h;
      a.length = 0;
      a.kind = r == reply::reject || r == reply::ahead ? frame_kind::reject
               : h.kind == frame_kind::payload         ? frame_kind::payload_ack
                                                       : frame_kind::done_ack;
      if (!conn.write(a, {}, opt_.io_timeout)) break;
    }
    conn.close();
    if (pending.empty()) return;
    std::lock_guard l(m_);
    if (cur_->id == attempt)
      fail_locked(fail(errc::unavailable,
                       "relay node " + std::to_string(index_) + ": upstream link lost in attempt " +
                           std::to_string(attempt) + " with " + std::to_string(pending.size()) +
                           " owner(s) unfinished"));
  }

  void on_abort(const frame_header& h) {
    std::lock_guard l(m_);
    if (h.attempt < cur_->id) return;
    if (!in_window_locked(h.attempt)) {
      ++c_.out_of_window;
      return;
    }
    if (h.attempt > cur_->id) begin_locked(h.attempt);
    auto code = static_cast<errc>(h.sequence);
    if (h.sequence == 0 || h.sequence > static_cast<std::uint32_t>(errc::unavailable))
      code = errc::unavailable;
    fail_locked(fail(code, "relay node " + std::to_string(index_) + ": attempt " +
                               std::to_string(h.attempt) + " failed upstream (" +
                               std::string(to_string(code)) + ")"));
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
        if (f->header.attempt != cur_->id || !cur_->failed)
          continue; // replaced or failed meanwhile
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
      const bool room = d.cv.wait_until(l, detail::after(opt_.io_timeout), [&] {
        return d.dead || d.retire || d.unacked < opt_.window;
      });
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
      if (!ok ||
          (k != frame_kind::payload_ack && k != frame_kind::done_ack && k != frame_kind::reject)) {
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
  std::uint64_t abort_sent_ = 0; ///< newest attempt whose abort went out (forwarder only)
  std::thread forwarder_;
  std::mutex up_m_;
  std::vector<std::unique_ptr<upstream>> ups_;
  bool down_ = false;
};

} // namespace dcr::transport
