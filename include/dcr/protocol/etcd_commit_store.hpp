#pragma once
/// \file
/// Compiled into the dcr-net library (`dependency('dcr-net')`); this header
/// declares the store and includes no networking header.
///
/// `etcd_commit_store`: the commit record and its counters in etcd v3, through
/// its JSON gateway (`POST /v3/kv/txn`, served by etcd 3.4 and later).
///
/// Keys, under a configurable prefix P (default "dcr/commit/"):
///  - `P record`: the stored record in the `dcr-commit 5` text format of
///    `serialize_commit_record` (digest-sealed, so a value damaged or written by someone
///    else is detected); its embedded `revision` equals the key's version;
///  - `P epoch`: the active coordinator epoch, decimal; absent means 0;
///  - `P attempt`: the last attempt id handed out, decimal; absent means 0.
///
/// `revision` is the record key's etcd *version* (the number of puts since
/// the key was created: 0 when absent, +1 per put), not its mod revision:
/// the mod revision is cluster-wide and jumps with writes to other keys,
/// while the laws need exactly r → r + 1 per compare-and-set. Comparing the
/// version to r in the transaction is the same fence as comparing the mod
/// revision read with r. None of the three keys is ever deleted (deleting
/// one by hand would restart its counter and break the laws).
///
/// Every operation is one transaction (plus retries of a lost race):
///  - `load`: no compares; ranges the three keys, so they come from one snapshot;
///  - `take_over`: compare epoch == e′ (the value last seen); put e′ + 1.
///    When another caller won, the failure branch returns the current epoch
///    and the transaction is retried with it; each lost race means another
///    caller's take_over succeeded, so the loop always makes global progress;
///  - `prepare(e)`: compare epoch == e and attempt == a′; put a′ + 1. A
///    failure with a different epoch is `errc::conflict`; one with only a
///    newer attempt is a lost race, retried with the attempt it returned;
///  - `compare_and_set(e, τ, r, K)`: compare epoch == e, attempt == τ and
///    record version == r; put the record. A failed compare is
///    `errc::conflict` with the same message as the other models, taken
///    from the failure branch's reads of the same transaction.
/// "counter == 0" compares the key's version with 0 (etcd fails every value
/// compare on an absent key). Values are never reused, so comparing values
/// cannot be fooled by an A-B-A change.
///
/// Failures: a server that cannot be reached, times out or answers with an
/// error is `errc::unavailable` (a malformed answer `errc::bad_format`),
/// never a success. `take_over` and `prepare` may be re-sent after a broken
/// connection (a second application only skips a counter value, which keeps
/// the counters strictly increasing). `compare_and_set` is never re-sent: if
/// the connection broke after the request left, the store reads the state
/// back and reports success only if it shows this very record at r + 1 under
/// (e, τ); otherwise `errc::unavailable` says the outcome is unknown (the
/// coordinator stops, and its successor's `load` tells).
///
/// Several endpoints of one cluster may be given: a connection failure moves
/// on to the next (see `net::http_client`). A store object may be shared by
/// threads (calls are serialised); several objects or processes over the
/// same keys are what the transactions arbitrate.
///
/// TLS: `https://` endpoints (etcd `--cert-file`/`--key-file`) need the
/// dcr-net library built with TLS (`net::tls_supported()`); without it they
/// are refused at construction. `etcd_options::http.tls` says which CAs to trust
/// (default: the system store), and gives the client certificate for a
/// cluster started with `--client-cert-auth`. A server whose certificate
/// fails verification, or that refuses the client's, is `errc::io`, not
/// `errc::unavailable`: nothing was written, and retrying will not help.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/net/http_client.hpp"
#include "dcr/protocol/commit_store.hpp"

namespace dcr::protocol {

/// Where and how an `etcd_commit_store` talks to etcd.
struct etcd_options {
  /// Client URLs of one etcd cluster ("http://host:port" or
  /// "https://host:port"), tried in order.
  std::vector<std::string> endpoints{"http://127.0.0.1:2379"};
  /// Prefix of the three keys; one prefix per deployment.
  std::string prefix = "dcr/commit/";
  /// Connect and request timeouts, body limit, TLS trust and client certificate.
  net::http_options http{};
  /// Lost races a `take_over` or `prepare` retries before `errc::conflict`.
  unsigned max_races = 1000;
  /// Job key the record value is sealed with (empty: unkeyed); a value
  /// sealed otherwise is refused (`digest_mismatch`).
  seal_key key{};
};

/// `commit_store` in etcd (see file comment for keys, transactions, failures).
class etcd_commit_store {
public:
  /// Throws `dcr::error(invalid_argument)` for an empty or malformed endpoint
  /// list, an https endpoint without TLS support, or TLS files that cannot be
  /// loaded. Connects lazily: an unreachable server shows on the first call.
  explicit etcd_commit_store(etcd_options opt);
  /// A moved-from store may only be destroyed or assigned to.
  etcd_commit_store(etcd_commit_store&&) noexcept;
  etcd_commit_store& operator=(etcd_commit_store&&) noexcept;
  ~etcd_commit_store();

  const std::string& record_key() const noexcept;
  const std::string& epoch_key() const noexcept;
  const std::string& attempt_key() const noexcept;

  status load(stored_record& out);
  status take_over(std::uint64_t& epoch);
  status prepare(std::uint64_t epoch, std::uint64_t& attempt);
  status compare_and_set(std::uint64_t epoch, std::uint64_t attempt,
                         std::uint64_t expected_revision, const commit_record& next);

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};
static_assert(commit_store<etcd_commit_store>);

/// How an `etcd_owner_lease` is held.
struct owner_lease_options {
  /// TTL of the etcd lease: a holder that stops renewing (killed, cut off
  /// from etcd) loses the claim this long after its last renewal.
  std::chrono::seconds ttl{10};
  /// How long `acquire` waits for a held claim to be released or expire
  /// before refusing (0: refuse at once). A restart after SIGKILL needs up
  /// to `ttl`.
  std::chrono::milliseconds wait{0};
};

/// The owner lease (see "Owner leases" in commit_store.hpp) in etcd: key
/// `P owners/<id>` (P: the store's prefix) holds "token <hex> pid <pid>",
/// attached to an etcd lease of `ttl` seconds that a thread renews every
/// ttl/3. `acquire` grants the lease and creates the key in one transaction
/// that compares the key's version with 0 (so exactly one claimant wins),
/// renewing its own lease as often while it waits for a held claim to go;
/// the destructor stops renewing and revokes the lease, which deletes the
/// key, so a clean exit frees the id at once. `check` compares the key's
/// value with this claim's in one transaction. The lease's calls time out
/// within ttl/4, and a failed renewal is retried every 250 ms, so a holder
/// cut off from etcd for less than about a TTL keeps its claim. A renewal
/// that finds the lease expired, or none that succeeded for a whole TTL,
/// marks the claim lost: every later `check` is `conflict`, and `hold`
/// claims the id again if nobody else has since (key `P owner-claims/<id>`,
/// kept without a lease, names the token of the id's last claim).
class etcd_owner_lease {
public:
  /// Claims owner `owner` under `opt.prefix`: `errc::conflict` naming the
  /// holder when it is still held after `lo.wait`; `errc::unavailable` when
  /// etcd cannot be reached.
  static status acquire(const etcd_options& opt, std::uint32_t owner, const owner_lease_options& lo,
                        std::unique_ptr<etcd_owner_lease>& out);
  etcd_owner_lease(const etcd_owner_lease&) = delete;
  etcd_owner_lease& operator=(const etcd_owner_lease&) = delete;
  ~etcd_owner_lease();

  /// The fence token of this claim (32 hex digits); a new one after `hold`
  /// claimed the id again.
  std::string token() const;
  /// Success iff etcd still names this claim's token for the owner id;
  /// `errc::conflict` when it does not (a stale owner does not write),
  /// `errc::unavailable` when etcd cannot be asked.
  status check();
  /// `check`, and when it fails because the claim lapsed (the lease expired
  /// while this process was cut off from etcd, or its key was deleted) and
  /// no other process has claimed the id since, a new claim under a fresh
  /// token, so that a partition longer than the TTL does not fence a live
  /// owner for good. `conflict` when another process holds the id or has
  /// claimed it since (what it wrote as this owner is not this process's
  /// to continue: exit). Call it only before a write, never between a write
  /// and the `check` that closes it: that `check` must see the token held
  /// when the write began.
  status hold();

  struct impl;

private:
  explicit etcd_owner_lease(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

} // namespace dcr::protocol
