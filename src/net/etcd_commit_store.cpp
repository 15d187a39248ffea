/// \file
/// The compiled implementation of `etcd_commit_store` (contract in
/// dcr/protocol/etcd_commit_store.hpp).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/core/json.hpp"
#include "dcr/net/base64.hpp"
#include "dcr/net/http_client.hpp"
#include "dcr/protocol/commit_store.hpp"
#include "dcr/protocol/etcd_response.hpp"

#include "dcr/protocol/etcd_commit_store.hpp"

#include <unistd.h>

namespace dcr::protocol {

struct etcd_commit_store::impl {
  /// Throws `dcr::error(invalid_argument)` for an empty or malformed endpoint
  /// list, an https endpoint without TLS support, or TLS files that cannot be
  /// loaded. Connects lazily: an unreachable server shows on the first call.
  explicit impl(etcd_options opt)
      : opt_(std::move(opt)), http_(parse_endpoints(opt_.endpoints), opt_.http),
        record_key_(opt_.prefix + "record"), epoch_key_(opt_.prefix + "epoch"),
        attempt_key_(opt_.prefix + "attempt") {}

  const std::string& record_key() const noexcept { return record_key_; }
  const std::string& epoch_key() const noexcept { return epoch_key_; }
  const std::string& attempt_key() const noexcept { return attempt_key_; }

  status load(stored_record& out) {
    std::lock_guard g(m_);
    return load_locked(out);
  }

  status take_over(std::uint64_t& epoch) {
    std::lock_guard g(m_);
    std::uint64_t seen = epoch_hint_;
    for (unsigned race = 0; race <= opt_.max_races; ++race) {
      DCR_RETURN_ERROR_IF(seen >= max_counter, length_overflow,
                          "etcd take_over: coordinator epochs exhausted (" + std::to_string(seen) +
                              ")");
      const std::string body =
          txn_body({compare_counter(epoch_key_, seen)}, {put(epoch_key_, std::to_string(seen + 1))},
                   {range(epoch_key_)});
      txn_result t;
      DCR_TRY(txn(body, true, "take_over", t));
      if (t.succeeded) {
        epoch = epoch_hint_ = seen + 1;
        return status::success();
      }
      DCR_TRY(counter_of(t, 0, epoch_key_, seen));
    }
    return fail(errc::conflict, "etcd take_over: lost " + std::to_string(opt_.max_races) +
                                    " races in a row on " + epoch_key_);
  }

  status prepare(std::uint64_t epoch, std::uint64_t& attempt) {
    std::lock_guard g(m_);
    std::uint64_t seen = attempt_hint_;
    for (unsigned race = 0; race <= opt_.max_races; ++race) {
      DCR_RETURN_ERROR_IF(seen >= max_counter, length_overflow,
                          "etcd prepare: attempt ids exhausted (" + std::to_string(seen) + ")");
      const std::string body = txn_body(
          {compare_counter(epoch_key_, epoch), compare_counter(attempt_key_, seen)},
          {put(attempt_key_, std::to_string(seen + 1))}, {range(epoch_key_), range(attempt_key_)});
      txn_result t;
      DCR_TRY(txn(body, true, "prepare", t));
      if (t.succeeded) {
        attempt = attempt_hint_ = seen + 1;
        return status::success();
      }
      stored_record cur;
      DCR_TRY(counter_of(t, 0, epoch_key_, cur.epoch));
      DCR_TRY(counter_of(t, 1, attempt_key_, cur.attempt));
      DCR_TRY(detail::check_prepare(cur, epoch));
      seen = cur.attempt; // same epoch, newer attempt: another prepare won
    }
    return fail(errc::conflict, "etcd prepare: lost " + std::to_string(opt_.max_races) +
                                    " races in a row on " + attempt_key_);
  }

  status compare_and_set(std::uint64_t epoch, std::uint64_t attempt,
                         std::uint64_t expected_revision, const commit_record& next) {
    std::lock_guard g(m_);
    const stored_record written{next, expected_revision + 1, epoch, attempt};
    if (auto v = detail::check_record(written); !v) {
      // A record naming an attempt after τ is refused; but a fenced caller
      // is told `conflict` first, as by the other models.
      stored_record now;
      DCR_TRY(load_locked(now));
      DCR_TRY(detail::check_cas(now, epoch, attempt, expected_revision));
      return v;
    }
    const std::string body =
        txn_body({compare_counter(epoch_key_, epoch), compare_counter(attempt_key_, attempt),
                  compare_version(record_key_, expected_revision)},
                 {put(record_key_, serialize_commit_record(written, opt_.key))},
                 {range(record_key_), range(epoch_key_), range(attempt_key_)});
    txn_result t;
    if (auto s = txn(body, false, "compare_and_set", t); !s) {
      if (s.code != errc::unavailable || s.message.find("outcome unknown") == std::string::npos)
        return s;
      // The request may have been applied: read back, through any endpoint.
      stored_record now;
      if (load_locked(now).ok() && now == written) return status::success();
      return s;
    }
    if (t.succeeded) return status::success();
    snapshot cur;
    DCR_TRY(snapshot_of(t, 0, cur, false));
    DCR_TRY(detail::check_cas(cur.counters, epoch, attempt, expected_revision));
    // Every compare holds in the snapshot, yet the transaction failed: the
    // keys changed between its compare and its reads, which etcd rules out.
    return fail(errc::bad_format,
                "etcd compare_and_set: transaction failed although its compares hold in the "
                "same snapshot (server not serializable?)");
  }

  using txn_result = etcd::txn_result;
  using snapshot = etcd::snapshot;

  static std::vector<net::http_endpoint> parse_endpoints(const std::vector<std::string>& urls) {
    if (urls.empty()) throw error(errc::invalid_argument, "etcd_commit_store: no endpoint");
    std::vector<net::http_endpoint> eps;
    for (auto& u : urls) {
      net::http_endpoint e;
      throw_if_failed(net::parse_endpoint(u, e));
      eps.push_back(std::move(e));
    }
    return eps;
  }

  // Request bodies. Keys and values are base64 and numbers decimal, so no
  // JSON escaping is ever needed.
  static std::string compare_counter(const std::string& key, std::uint64_t v) {
    if (v == 0) return compare_version(key, 0);
    return R"({"result":"EQUAL","target":"VALUE","key":")" + net::base64_encode(key) +
           R"(","value":")" + net::base64_encode(std::to_string(v)) + R"("})";
  }
  static std::string compare_version(const std::string& key, std::uint64_t version) {
    return R"({"result":"EQUAL","target":"VERSION","key":")" + net::base64_encode(key) +
           R"(","version":")" + std::to_string(version) + R"("})";
  }
  static std::string put(const std::string& key, const std::string& value) {
    return R"({"request_put":{"key":")" + net::base64_encode(key) + R"(","value":")" +
           net::base64_encode(value) + R"("}})";
  }
  static std::string range(const std::string& key) {
    return R"({"request_range":{"key":")" + net::base64_encode(key) + R"("}})";
  }
  static std::string txn_body(const std::vector<std::string>& compare,
                              const std::vector<std::string>& success,
                              const std::vector<std::string>& failure) {
    auto list = [](const std::vector<std::string>& v) {
      std::string s = "[";
      for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + v[i];
      return s + "]";
    };
    return R"({"compare":)" + list(compare) + R"(,"success":)" + list(success) + R"(,"failure":)" +
           list(failure) + "}";
  }

  std::string where(const char* op) const {
    return std::string("etcd ") + op + " at " + http_.current_endpoint().url();
  }

  /// POST one transaction; `idempotent` lets the client re-send it after a
  /// broken connection (see file comment).
  status txn(const std::string& body, bool idempotent, const char* op, txn_result& out) {
    net::http_request rq;
    rq.method = "POST";
    rq.target = "/v3/kv/txn";
    rq.headers = {{"Content-Type", "application/json"}};
    rq.body = body;
    rq.idempotent = idempotent;
    net::http_response res;
    if (auto s = http_.request(rq, res); !s) {
      s.message = std::string("etcd ") + op + ": " + s.message;
      return s;
    }
    if (res.status != 200) return etcd::http_error(where(op), res.status, res.reason, res.body);
    return etcd::parse_txn_response(res.body, where(op), out);
  }

  status counter_of(const txn_result& t, std::size_t i, const std::string& key,
                    std::uint64_t& v) const {
    return etcd::counter_of(t, i, key, v);
  }
  status snapshot_of(const txn_result& t, std::size_t first, snapshot& out, bool want_value) const {
    return etcd::snapshot_of(t, first, record_key_, epoch_key_, attempt_key_, out, want_value);
  }

  status load_locked(stored_record& out) {
    txn_result t;
    DCR_TRY(txn(txn_body({}, {range(record_key_), range(epoch_key_), range(attempt_key_)}, {}),
                true, "load", t));
    DCR_RETURN_ERROR_IF(!t.succeeded, bad_format,
                        "etcd load: a transaction without compares failed");
    snapshot s;
    DCR_TRY(snapshot_of(t, 0, s, true));
    stored_record r;
    DCR_TRY(etcd::record_of(s, record_key_, r, opt_.key));
    epoch_hint_ = r.epoch;
    attempt_hint_ = r.attempt;
    out = std::move(r);
    return status::success();
  }

  etcd_options opt_;
  std::mutex m_;
  net::http_client http_;
  std::string record_key_, epoch_key_, attempt_key_;
  // Last values seen: the first compare of take_over / prepare guesses them,
  // so an uncontended call is one round trip.
  std::uint64_t epoch_hint_ = 0, attempt_hint_ = 0;
};

etcd_commit_store::etcd_commit_store(etcd_options opt)
    : impl_(std::make_unique<impl>(std::move(opt))) {}
etcd_commit_store::etcd_commit_store(etcd_commit_store&&) noexcept = default;
etcd_commit_store& etcd_commit_store::operator=(etcd_commit_store&&) noexcept = default;
etcd_commit_store::~etcd_commit_store() = default;

const std::string& etcd_commit_store::record_key() const noexcept { return impl_->record_key(); }
const std::string& etcd_commit_store::epoch_key() const noexcept { return impl_->epoch_key(); }
const std::string& etcd_commit_store::attempt_key() const noexcept { return impl_->attempt_key(); }
status etcd_commit_store::load(stored_record& out) { return impl_->load(out); }
status etcd_commit_store::take_over(std::uint64_t& epoch) { return impl_->take_over(epoch); }
status etcd_commit_store::prepare(std::uint64_t epoch, std::uint64_t& attempt) {
  return impl_->prepare(epoch, attempt);
}
status etcd_commit_store::compare_and_set(std::uint64_t epoch, std::uint64_t attempt,
                                          std::uint64_t expected_revision,
                                          const commit_record& next) {
  return impl_->compare_and_set(epoch, attempt, expected_revision, next);
}

// ---- owner lease ------------------------------------------------------------

struct etcd_owner_lease::impl {
  using clock = std::chrono::steady_clock;

  impl(const etcd_options& opt, std::uint32_t owner, owner_lease_options lo)
      : http_(parse_endpoints(opt.endpoints), lease_http(opt.http, lo.ttl)), owner_(owner), lo_(lo),
        key_(opt.prefix + "owners/" + std::to_string(owner)),
        claims_key_(opt.prefix + "owner-claims/" + std::to_string(owner)) {}

  ~impl() {
    {
      std::lock_guard g(stop_m_);
      stop_ = true;
    }
    stop_cv_.notify_all();
    if (renewer_.joinable()) renewer_.join();
    if (lease_id_) revoke(lease_id_); // deletes the key: a clean exit frees the id at once
  }

  /// The lease's calls give up within a quarter of the TTL. With the
  /// client's default (10 s) one keepalive sent into a cut link outlived the
  /// lease it was renewing, and no retry was left before the expiry.
  static net::http_options lease_http(net::http_options o, std::chrono::seconds ttl) {
    const auto quarter = std::max<std::chrono::milliseconds>(
        std::chrono::milliseconds(250),
        std::chrono::duration_cast<std::chrono::milliseconds>(ttl) / 4);
    o.connect_timeout = std::min(o.connect_timeout, quarter);
    o.request_timeout = std::min(o.request_timeout, quarter);
    return o;
  }

  static std::vector<net::http_endpoint> parse_endpoints(const std::vector<std::string>& urls) {
    if (urls.empty()) throw error(errc::invalid_argument, "etcd owner lease: no endpoint");
    std::vector<net::http_endpoint> eps;
    for (auto& u : urls) {
      net::http_endpoint e;
      throw_if_failed(net::parse_endpoint(u, e));
      eps.push_back(std::move(e));
    }
    return eps;
  }

  /// POST `body` to `target`, the parsed JSON answer in `doc`.
  status post(const char* target, const std::string& body, const char* op, json_value& doc) {
    std::lock_guard g(http_m_);
    net::http_request rq;
    rq.method = "POST";
    rq.target = target;
    rq.headers = {{"Content-Type", "application/json"}};
    rq.body = body;
    rq.idempotent = true;
    net::http_response res;
    const std::string where = std::string("etcd ") + op + " of owner " + std::to_string(owner_);
    if (auto s = http_.request(rq, res); !s) {
      s.message = where + ": " + s.message;
      return s;
    }
    if (res.status != 200) return etcd::http_error(where, res.status, res.reason, res.body);
    return parse_json(res.body, doc, where + " response");
  }

  status txn(const std::string& body, const char* op, etcd::txn_result& out) {
    std::lock_guard g(http_m_);
    net::http_request rq;
    rq.method = "POST";
    rq.target = "/v3/kv/txn";
    rq.headers = {{"Content-Type", "application/json"}};
    rq.body = body;
    rq.idempotent = true; // a second create fails its compare; a check only reads
    net::http_response res;
    const std::string where = std::string("etcd ") + op + " of owner " + std::to_string(owner_);
    if (auto s = http_.request(rq, res); !s) {
      s.message = where + ": " + s.message;
      return s;
    }
    if (res.status != 200) return etcd::http_error(where, res.status, res.reason, res.body);
    return etcd::parse_txn_response(res.body, where, out);
  }

  status grant(std::uint64_t& id) {
    json_value doc;
    DCR_TRY(post("/v3/lease/grant", R"({"TTL":")" + std::to_string(lo_.ttl.count()) + R"("})",
                 "lease grant", doc));
    const auto* v = doc.get("ID");
    DCR_RETURN_ERROR_IF(!v || !v->as_u64(id) || id == 0, bad_format,
                        "etcd lease grant: no lease ID in the answer");
    return status::success();
  }

  void revoke(std::uint64_t id) {
    json_value doc;
    (void)post("/v3/lease/revoke", R"({"ID":")" + std::to_string(id) + R"("})", "lease revoke",
               doc);
  }

  std::string b64(const std::string& s) const { return net::base64_encode(s); }
  std::string claim_value(const std::string& token) const {
    return "token " + token + " pid " + std::to_string(static_cast<long>(::getpid()));
  }
  /// The puts of a claim: the owner key with the lease, and the claims key
  /// (no lease: it outlives every holder) naming the claimant's token.
  std::string claim_puts(const std::string& value, const std::string& token,
                         std::uint64_t lease) const {
    return R"({"request_put":{"key":")" + b64(key_) + R"(","value":")" + b64(value) +
           R"(","lease":")" + std::to_string(lease) + R"("}},{"request_put":{"key":")" +
           b64(claims_key_) + R"(","value":")" + b64(token) + R"("}})";
  }
  /// The value `t`'s range response `i` holds for `key` (empty: no such key).
  static status value_at(const etcd::txn_result& t, std::size_t i, const std::string& key,
                         std::string& out) {
    out.clear();
    const json_value* kv = nullptr;
    DCR_TRY(etcd::kv_of(t, i, key, kv));
    if (kv) DCR_TRY(etcd::value_of(*kv, key, out));
    return status::success();
  }

  /// One create: compare version == 0, put the claim with the lease; the
  /// failure branch reads the holder's value into `holder`.
  status try_create(bool& won, std::string& holder) {
    const std::string body = R"({"compare":[{"result":"EQUAL","target":"VERSION","key":")" +
                             b64(key_) + R"(","version":"0"}],"success":[)" +
                             claim_puts(value_, token_, lease_id_) +
                             R"(],"failure":[{"request_range":{"key":")" + b64(key_) + R"("}}]})";
    etcd::txn_result t;
    DCR_TRY(txn(body, "lease claim", t));
    won = t.succeeded;
    holder.clear();
    if (won) return status::success();
    return value_at(t, 0, key_, holder);
  }

  status acquire() {
    token_ = new_incarnation();
    value_ = claim_value(token_);
    DCR_TRY(grant(lease_id_));
    const auto until = clock::now() + lo_.wait;
    // Our own lease runs down while we wait for a held claim to expire (a
    // restart after SIGKILL waits up to a whole TTL): it is renewed every
    // ttl/3 here as the renewer does after the claim, and granted again if it
    // ran out, so that a claim won at the end of the wait does not carry a
    // lease about to expire (its key would vanish before the first renewal).
    auto renewed = clock::now();
    std::string holder;
    for (;;) {
      bool won = false;
      if (auto s = try_create(won, holder); !s) {
        revoke(lease_id_);
        lease_id_ = 0;
        return s;
      }
      if (won) break;
      if (clock::now() >= until) {
        revoke(lease_id_);
        lease_id_ = 0;
        return fail(errc::conflict, "owner " + std::to_string(owner_) +
                                        " is held by another process (" +
                                        (holder.empty() ? std::string("expiring") : holder) +
                                        ", etcd key " + key_ + "): refused");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      if (clock::now() - renewed >= renew_every()) {
        bool alive = true;
        const auto sent = clock::now();
        if (renew_once(lease_id_, alive).ok()) {
          renewed = sent;
          if (!alive) DCR_TRY(grant(lease_id_)); // expired while waiting: a fresh lease
        }
      }
    }
    last_renewed_ = renewed;
    renewer_ = std::thread([this] { renew_loop(); });
    return status::success();
  }

  std::chrono::milliseconds renew_every() const {
    return std::max<std::chrono::milliseconds>(
        std::chrono::milliseconds(100),
        std::chrono::duration_cast<std::chrono::milliseconds>(lo_.ttl) / 3);
  }
  /// After a failed renewal: soon again, so that a link back up before the
  /// TTL runs out finds the lease renewed in time.
  std::chrono::milliseconds retry_every() const {
    return std::min<std::chrono::milliseconds>(std::chrono::milliseconds(250), renew_every());
  }

  /// One keepalive of lease `id`: `alive` false when etcd answers that the
  /// lease is gone (TTL absent or 0); a failed call (etcd down) is the status.
  status renew_once(std::uint64_t id, bool& alive) {
    json_value doc;
    DCR_TRY(post("/v3/lease/keepalive", R"({"ID":")" + std::to_string(id) + R"("})",
                 "lease keepalive", doc));
    const auto* r = doc.get("result");
    std::uint64_t ttl = 0;
    const auto* t = r ? r->get("TTL") : nullptr;
    alive = !(r && (!t || !t->as_u64(ttl) || ttl == 0));
    return status::success();
  }

  /// Renews every ttl/3, and every retry_every() after a failed call (etcd
  /// down or cut off). The claim is marked lost when a renewal finds the
  /// lease gone, or when no renewal succeeded for a whole TTL (etcd has
  /// dropped it by then, or will before anyone can tell).
  void renew_loop() {
    auto wait = renew_every();
    std::unique_lock l(stop_m_);
    while (!stop_cv_.wait_for(l, wait, [&] { return stop_; })) {
      l.unlock();
      {
        std::lock_guard g(state_m_);
        wait = renew_every();
        if (!lost_) {
          bool alive = true;
          const auto sent = clock::now();
          if (!renew_once(lease_id_, alive)) {
            wait = retry_every();
            if (clock::now() - last_renewed_ >= lo_.ttl) lost_ = true;
          } else if (!alive) {
            lost_ = true;
          } else {
            last_renewed_ = sent;
          }
        }
      }
      l.lock();
    }
  }

  std::string token() const {
    std::lock_guard g(state_m_);
    return token_;
  }

  status lost_status() const {
    return fail(errc::conflict, "owner " + std::to_string(owner_) + ": lease with token " + token_ +
                                    " expired: a stale owner process does not write");
  }

  /// The check under `state_m_`; `holder` gets what the key holds when it
  /// does not hold this claim (empty: nothing).
  status check_locked(std::string& holder) {
    holder.clear();
    if (lost_) return lost_status();
    const std::string body = R"({"compare":[{"result":"EQUAL","target":"VALUE","key":")" +
                             b64(key_) + R"(","value":")" + b64(value_) +
                             R"("}],"success":[],"failure":[{"request_range":{"key":")" +
                             b64(key_) + R"("}}]})";
    etcd::txn_result t;
    DCR_TRY(txn(body, "lease check", t));
    if (t.succeeded) return status::success();
    DCR_TRY(value_at(t, 0, key_, holder));
    return fail(errc::conflict, "owner " + std::to_string(owner_) + ": lease with token " + token_ +
                                    " lost (etcd key " + key_ + " holds " +
                                    (holder.empty() ? std::string("nothing") : holder) +
                                    "): a stale owner process does not write");
  }

  status check() {
    std::lock_guard g(state_m_);
    std::string holder;
    return check_locked(holder);
  }

  /// See `etcd_owner_lease::hold`.
  status hold() {
    std::lock_guard g(state_m_);
    std::string holder;
    auto s = check_locked(holder);
    if (s || s.code != errc::conflict || !holder.empty()) return s; // held, unknown, or taken
    // The key is gone (the lease expired while this process was cut off, or
    // the key was deleted). Claim the id again under a fresh token, in one
    // transaction that also requires the claims key to still name this
    // process's token: a claim another process made (and maybe released)
    // meanwhile changed it, and whatever that process wrote as this owner is
    // not this process's to continue.
    const std::string token = new_incarnation();
    const std::string value = claim_value(token);
    std::uint64_t id = 0;
    const auto granted = clock::now();
    DCR_TRY(grant(id));
    const std::string body =
        R"({"compare":[{"result":"EQUAL","target":"VERSION","key":")" + b64(key_) +
        R"(","version":"0"},{"result":"EQUAL","target":"VALUE","key":")" + b64(claims_key_) +
        R"(","value":")" + b64(token_) + R"("}],"success":[)" + claim_puts(value, token, id) +
        R"(],"failure":[{"request_range":{"key":")" + b64(key_) +
        R"("}},{"request_range":{"key":")" + b64(claims_key_) + R"("}}]})";
    etcd::txn_result t;
    if (auto r = txn(body, "lease re-claim", t); !r) {
      revoke(id);
      return r;
    }
    if (!t.succeeded) {
      revoke(id);
      std::string last;
      DCR_TRY(value_at(t, 0, key_, holder));
      DCR_TRY(value_at(t, 1, claims_key_, last));
      if (holder == value_) {
        // Still ours: the renewals failed for a TTL by this clock, but etcd
        // kept the lease. A live keepalive proves the claim never lapsed.
        bool alive = false;
        const auto sent = clock::now();
        DCR_TRY(renew_once(lease_id_, alive));
        if (alive) {
          lost_ = false;
          last_renewed_ = sent;
          return status::success();
        }
        return lost_status();
      }
      if (!holder.empty())
        return fail(errc::conflict, "owner " + std::to_string(owner_) +
                                        " is held by another process (" + holder + ", etcd key " +
                                        key_ + "): the claim with token " + token_ +
                                        " expired; this process does not write as the owner again");
      return fail(errc::conflict, "owner " + std::to_string(owner_) +
                                      " was claimed by another process (token " +
                                      (last.empty() ? std::string("unknown") : last) +
                                      ") after the claim with token " + token_ +
                                      " expired; this process does not write as the owner again");
    }
    if (!lost_) revoke(lease_id_); // the key was deleted by hand: its lease holds nothing now
    lease_id_ = id;
    token_ = token;
    value_ = value;
    lost_ = false;
    last_renewed_ = granted;
    return status::success();
  }

  mutable std::mutex state_m_; ///< the claim (lease id, token, lost); taken before http_m_
  std::mutex http_m_;
  net::http_client http_;
  std::uint32_t owner_;
  owner_lease_options lo_;
  std::string key_, claims_key_, token_, value_;
  std::uint64_t lease_id_ = 0;
  bool lost_ = false;
  clock::time_point last_renewed_{};
  std::mutex stop_m_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread renewer_;
};

status etcd_owner_lease::acquire(const etcd_options& opt, std::uint32_t owner,
                                 const owner_lease_options& lo,
                                 std::unique_ptr<etcd_owner_lease>& out) {
  auto p = std::make_unique<impl>(opt, owner, lo);
  DCR_TRY(p->acquire());
  out.reset(new etcd_owner_lease(std::move(p)));
  return status::success();
}
etcd_owner_lease::etcd_owner_lease(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
etcd_owner_lease::~etcd_owner_lease() = default;
std::string etcd_owner_lease::token() const { return impl_->token(); }
status etcd_owner_lease::check() { return impl_->check(); }
status etcd_owner_lease::hold() { return impl_->hold(); }

} // namespace dcr::protocol
