#pragma once
/// \file
/// The durable commit record K^v and the stores that hold it.
///
/// A commit store holds one record and three counters, all changed atomically
/// together:
///  - `revision`: bumped by every successful compare-and-set (etcd's mod revision
///    of the record key; 0 means "never written");
///  - `epoch`: the active coordinator's term; `take_over` bumps it and thereby
///    fences every older coordinator (their `prepare` and `compare_and_set` get
///    `errc::conflict`);
///  - `attempt`: the last attempt id τ handed out by `prepare`; strictly
///    increasing over the store's life, so a later prepare fences every older
///    attempt (its commit gets `errc::conflict`).
///
/// Minimal complete definition of `commit_store`: `load`, `take_over`,
/// `prepare`, `compare_and_set`. Laws (checked for every model in
/// test/protocol/commit_store_test.cpp):
///  - `compare_and_set(e, τ, r, K)` succeeds iff `e` is the current epoch, `τ`
///    the current attempt and `r` the current revision; then `load` returns `K`
///    with revision `r + 1`;
///  - attempt ids returned by `prepare` are strictly increasing across all
///    callers and processes, and epochs returned by `take_over` likewise;
///  - a failed call changes nothing.
/// These map onto one etcd transaction each (compare epoch key value, attempt
/// key value and record mod revision; then put).

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dcr/core/error.hpp"
#include "dcr/core/hash.hpp"

namespace dcr::protocol {

/// One required receiver's acknowledgement: its id and target-state digest.
struct receiver_ack {
  std::string receiver;
  digest128 state{};
  friend bool operator==(const receiver_ack&, const receiver_ack&) = default;
};

/// The commit record K^v: which policy version is published, bound to the
/// source baseline it was built from and the attempt that produced it.
struct commit_record {
  std::uint64_t version = 0;           ///< committed policy version v
  digest128 source_baseline{};         ///< digest of the owners' baseline B^v
  std::uint64_t attempt = 0;           ///< attempt id τ that committed v (0: initial)
  std::vector<receiver_ack> receivers; ///< every required receiver's target digest
  std::uint64_t time_unix_ns = 0;      ///< wall time of the commit
  /// Identity of this commit history: 32 random hex digits drawn by the
  /// first commit (K^0) and carried by every later one. Attempt objects are
  /// named under it and their manifests carry it, so objects written under
  /// another history (a lost or replaced record restarts attempt numbering)
  /// are never read as this one's.
  std::string incarnation;
  friend bool operator==(const commit_record&, const commit_record&) = default;
};

// Incarnation ids (core/hash.hpp) belong to the commit history; the names
// are here too, where the record that carries them is defined.
using dcr::new_incarnation;
using dcr::valid_incarnation;

/// Largest usable counter value: one below 2^64-1, so `++` never wraps and
/// 2^64-1 never appears in a record a correct writer produced.
inline constexpr std::uint64_t max_counter = ~std::uint64_t{0} - 1;

/// A record as loaded, with the store's counters.
struct stored_record {
  commit_record record;
  std::uint64_t revision = 0; ///< mod revision of the record (0: never committed)
  std::uint64_t epoch = 0;    ///< active coordinator epoch
  std::uint64_t attempt = 0;  ///< last attempt id handed out
  friend bool operator==(const stored_record&, const stored_record&) = default;
};

/// Nanoseconds since the Unix epoch.
inline std::uint64_t unix_time_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count());
}

/// A durable, versioned record changed only by compare-and-set (see file comment).
template <class S>
concept commit_store = requires(S& s, stored_record& out, std::uint64_t& id, std::uint64_t e,
                                std::uint64_t a, std::uint64_t r, const commit_record& k) {
  { s.load(out) } -> std::same_as<status>;
  { s.take_over(id) } -> std::same_as<status>;
  { s.prepare(e, id) } -> std::same_as<status>;
  { s.compare_and_set(e, a, r, k) } -> std::same_as<status>;
};

namespace detail {

/// The one rule both backends apply; keeps them in lockstep.
inline status check_cas(const stored_record& cur, std::uint64_t epoch, std::uint64_t attempt,
                        std::uint64_t expected_revision) {
  DCR_RETURN_ERROR_IF(epoch != cur.epoch, conflict,
                      "coordinator epoch " + std::to_string(epoch) + " was replaced by epoch " +
                          std::to_string(cur.epoch));
  DCR_RETURN_ERROR_IF(attempt != cur.attempt, conflict,
                      "attempt " + std::to_string(attempt) + " was replaced by attempt " +
                          std::to_string(cur.attempt));
  DCR_RETURN_ERROR_IF(expected_revision != cur.revision, conflict,
                      "record revision is " + std::to_string(cur.revision) + ", expected " +
                          std::to_string(expected_revision));
  return status::success();
}

inline status check_prepare(const stored_record& cur, std::uint64_t epoch) {
  DCR_RETURN_ERROR_IF(epoch != cur.epoch, conflict,
                      "prepare by coordinator epoch " + std::to_string(epoch) +
                          ", active epoch is " + std::to_string(cur.epoch));
  DCR_RETURN_ERROR_IF(cur.attempt >= max_counter, length_overflow,
                      "attempt ids exhausted (last handed out: " + std::to_string(cur.attempt) +
                          ")");
  return status::success();
}

inline status check_take_over(const stored_record& cur) {
  DCR_RETURN_ERROR_IF(cur.epoch >= max_counter, length_overflow,
                      "coordinator epochs exhausted (active: " + std::to_string(cur.epoch) + ")");
  return status::success();
}

/// What no correct writer produces: checked by `parse_commit_record` and before every write.
inline status check_record(const stored_record& r) {
  auto bad = [](std::string what) { return fail(errc::bad_format, "commit record: " + what); };
  if (r.revision > max_counter || r.epoch > max_counter || r.attempt > max_counter ||
      r.record.version > max_counter)
    return bad("a counter at 2^64-1 (no correct writer reaches it; the next step would overflow)");
  if (r.record.attempt > r.attempt)
    return bad("committed attempt " + std::to_string(r.record.attempt) +
               " was never handed out (last: " + std::to_string(r.attempt) + ")");
  if (r.revision == 0) {
    if (!r.record.incarnation.empty() || r.record.version != 0 || !r.record.receivers.empty())
      return bad("a never-committed store (revision 0) holds a record");
  } else if (!valid_incarnation(r.record.incarnation)) {
    return bad("incarnation '" + r.record.incarnation + "' is not 32 lower-case hex digits");
  }
  std::set<std::string_view> ids;
  for (auto& a : r.record.receivers) {
    if (a.receiver.empty()) return bad("empty receiver id");
    if (!ids.insert(a.receiver).second) return bad("receiver '" + a.receiver + "' listed twice");
  }
  return status::success();
}

} // namespace detail

/// Text serialisation of a stored record (format `dcr-commit 5`, documented in
/// docs/protocol.md). The last line is the BLAKE2b-128 of every byte before it,
/// so a damaged file is detected rather than misread; with a job `key` it is
/// keyed, so a record written without the key is refused as well.
inline std::string serialize_commit_record(const stored_record& s, const seal_key& key = {}) {
  std::ostringstream o;
  o << "dcr-commit 5\n"
    << "incarnation " << (s.record.incarnation.empty() ? std::string("none") : s.record.incarnation)
    << "\n"
    << "revision " << s.revision << "\n"
    << "epoch " << s.epoch << "\n"
    << "attempt " << s.attempt << "\n"
    << "version " << s.record.version << "\n"
    << "source_baseline " << to_hex(s.record.source_baseline) << "\n"
    << "committed_attempt " << s.record.attempt << "\n"
    << "time_unix_ns " << s.record.time_unix_ns << "\n"
    << "receivers " << s.record.receivers.size() << "\n";
  for (auto& r : s.record.receivers)
    o << "receiver " << to_hex(r.state) << " " << r.receiver << "\n";
  return seal_text(o.str(), key);
}

/// Parse what `serialize_commit_record` wrote; `errc::bad_format` names the first bad line.
/// `key`: the job key it must be sealed with (empty: unkeyed); another seal
/// is `digest_mismatch`.
inline status parse_commit_record(std::string_view text, stored_record& out,
                                  const seal_key& key = {}) {
  std::string_view body;
  DCR_TRY(open_sealed_text(text, "commit record", body, key));
  std::istringstream in{std::string(body)};
  std::string line;
  std::size_t lineno = 0;
  auto next = [&](std::string_view key) -> std::optional<std::string> {
    if (!std::getline(in, line)) return std::nullopt;
    ++lineno;
    if (line.size() <= key.size() + 1 || line.compare(0, key.size(), key) != 0 ||
        line[key.size()] != ' ')
      return std::nullopt;
    return line.substr(key.size() + 1);
  };
  auto bad = [&](std::string_view what) {
    return fail(errc::bad_format, "commit record line " + std::to_string(lineno + 1) +
                                      ": expected " + std::string(what));
  };
  auto number = [&](std::string_view key, std::uint64_t& v) -> bool {
    auto s = next(key);
    if (!s || s->empty() || s->size() > 20 ||
        !std::all_of(s->begin(), s->end(), [](char c) { return c >= '0' && c <= '9'; }))
      return false;
    errno = 0;
    char* end = nullptr;
    v = std::strtoull(s->c_str(), &end, 10);
    return errno == 0 && end == s->c_str() + s->size();
  };
  stored_record r;
  {
    auto m = next("dcr-commit");
    if (m && *m == "1")
      return fail(
          errc::unsupported_version,
          "commit record: 'dcr-commit 1' (written before incarnations; its attempt objects are not "
          "bound to it): finish or abandon that deployment with the dcr that wrote it");
    if (m && *m == "2")
      return fail(errc::unsupported_version,
                  "commit record: 'dcr-commit 2' (its digests hash whole storage; this version's "
                  "are set digests, so no receiver or baseline could match them): finish that "
                  "transition with the dcr that wrote it, or bootstrap a new history");
    if (m && *m == "3")
      return fail(errc::unsupported_version,
                  "commit record: 'dcr-commit 3' (its digests are state digests of version 1, "
                  "another element hash, so no receiver or baseline of this version could match "
                  "them): finish that transition with the dcr that wrote it, or bootstrap a new "
                  "history");
    if (m && *m == "4")
      return fail(errc::unsupported_version,
                  "commit record: 'dcr-commit 4' (its digests are state digests of version 2, "
                  "another element hash, so no receiver or baseline of this version could match "
                  "them): finish that transition with the dcr that wrote it, or bootstrap a new "
                  "history");
    if (!m || *m != "5")
      return fail(errc::unsupported_version, "commit record: not a 'dcr-commit 5' record");
  }
  {
    auto s = next("incarnation");
    if (!s || (*s != "none" && !valid_incarnation(*s))) return bad("incarnation <32 hex | none>");
    if (*s != "none") r.record.incarnation = *s;
  }
  if (!number("revision", r.revision)) return bad("revision");
  if (!number("epoch", r.epoch)) return bad("epoch");
  if (!number("attempt", r.attempt)) return bad("attempt");
  if (!number("version", r.record.version)) return bad("version");
  {
    auto s = next("source_baseline");
    if (!s || !parse_hex_digest(*s, r.record.source_baseline)) return bad("source_baseline");
  }
  if (!number("committed_attempt", r.record.attempt)) return bad("committed_attempt");
  if (!number("time_unix_ns", r.record.time_unix_ns)) return bad("time_unix_ns");
  std::uint64_t n = 0;
  if (!number("receivers", n) || n > (1u << 20)) return bad("receivers");
  for (std::uint64_t i = 0; i < n; ++i) {
    auto s = next("receiver");
    receiver_ack a;
    if (!s || s->size() < 34 || (*s)[32] != ' ' ||
        !parse_hex_digest(std::string_view(*s).substr(0, 32), a.state))
      return bad("receiver <digest> <id>");
    a.receiver = s->substr(33);
    r.record.receivers.push_back(std::move(a));
  }
  if (std::getline(in, line))
    return fail(errc::trailing_bytes, "commit record: unexpected line after receivers");
  DCR_TRY(detail::check_record(r));
  out = std::move(r);
  return status::success();
}

/// In-process commit store (tests, single-process deployments).
class memory_commit_store {
public:
  status load(stored_record& out) {
    std::lock_guard g(m_);
    out = s_;
    return status::success();
  }
  status take_over(std::uint64_t& epoch) {
    std::lock_guard g(m_);
    DCR_TRY(detail::check_take_over(s_));
    epoch = ++s_.epoch;
    return status::success();
  }
  status prepare(std::uint64_t epoch, std::uint64_t& attempt) {
    std::lock_guard g(m_);
    DCR_TRY(detail::check_prepare(s_, epoch));
    attempt = ++s_.attempt;
    return status::success();
  }
  status compare_and_set(std::uint64_t epoch, std::uint64_t attempt,
                         std::uint64_t expected_revision, const commit_record& next) {
    std::lock_guard g(m_);
    DCR_TRY(detail::check_cas(s_, epoch, attempt, expected_revision));
    stored_record n = s_;
    n.record = next;
    ++n.revision;
    DCR_TRY(detail::check_record(n));
    s_ = std::move(n);
    return status::success();
  }

private:
  std::mutex m_;
  stored_record s_;
};
static_assert(commit_store<memory_commit_store>);

/// Commit store in a directory: `<dir>/commit` holds the serialised record,
/// `<dir>/commit.lock` serialises writers across processes with flock. Each
/// change writes `commit.tmp`, fsyncs it, renames it over `commit` and fsyncs
/// the directory, so a crash at any point leaves either the old or the new
/// record, never a mix. The flock is released by the kernel when a holder dies.
class file_commit_store {
public:
  /// Opens (and creates) the directory; throws `dcr::error(io)` on failure.
  /// `key`: the job key the record is sealed with (empty: unkeyed).
  explicit file_commit_store(std::filesystem::path dir, seal_key key = {})
      : dir_(std::move(dir)), key_(key) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) throw error(errc::io, "create " + dir_.string() + ": " + ec.message());
  }

  const std::filesystem::path& directory() const noexcept { return dir_; }

  /// How long a call waits for `commit.lock` (held by another process's
  /// call) before `errc::unavailable`. Every holder keeps it for one read
  /// and one durable write, milliseconds; 10 s by default.
  void set_lock_timeout(std::chrono::milliseconds t) noexcept { lock_timeout_ = t; }

  status load(stored_record& out) {
    lock l;
    DCR_TRY(l.acquire(dir_ / "commit.lock", lock_timeout_));
    return read(out);
  }
  status take_over(std::uint64_t& epoch) {
    return update([&](stored_record& s) {
      DCR_TRY(detail::check_take_over(s));
      epoch = ++s.epoch;
      return status::success();
    });
  }
  status prepare(std::uint64_t epoch, std::uint64_t& attempt) {
    return update([&](stored_record& s) {
      DCR_TRY(detail::check_prepare(s, epoch));
      attempt = ++s.attempt;
      return status::success();
    });
  }
  status compare_and_set(std::uint64_t epoch, std::uint64_t attempt,
                         std::uint64_t expected_revision, const commit_record& next) {
    return update([&](stored_record& s) {
      DCR_TRY(detail::check_cas(s, epoch, attempt, expected_revision));
      s.record = next;
      ++s.revision;
      return status::success();
    });
  }

private:
  struct lock {
    int fd = -1;
    /// Waits up to `timeout` for the flock: a holder stopped while it holds
    /// it (SIGSTOP, a debugger) would otherwise hang every call of every
    /// process on the store, and the callers' heartbeats would hide it.
    status acquire(const std::filesystem::path& p, std::chrono::milliseconds timeout) {
      fd = ::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      DCR_RETURN_ERROR_IF(fd < 0, io, "open " + p.string() + ": " + std::strerror(errno));
      const auto until = std::chrono::steady_clock::now() + timeout;
      auto pause = std::chrono::microseconds(200);
      while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EINTR) continue;
        DCR_RETURN_ERROR_IF(errno != EWOULDBLOCK, io,
                            "flock " + p.string() + ": " + std::strerror(errno));
        DCR_RETURN_ERROR_IF(std::chrono::steady_clock::now() >= until, unavailable,
                            p.string() + " is held by another process for more than " +
                                std::to_string(timeout.count()) +
                                " ms (a holder stopped or hung?): commit store busy");
        std::this_thread::sleep_for(pause);
        pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(20));
      }
      return status::success();
    }
    ~lock() {
      if (fd >= 0) ::close(fd); // closing drops the flock
    }
  };

  status read(stored_record& out) const {
    const auto p = dir_ / "commit";
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      DCR_RETURN_ERROR_IF(errno != ENOENT, io, "open " + p.string() + ": " + std::strerror(errno));
      out = stored_record{};
      return status::success();
    }
    std::string text;
    char buf[4096];
    for (;;) {
      auto n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        auto e = errno;
        ::close(fd);
        return fail(errc::io, "read " + p.string() + ": " + std::strerror(e));
      }
      if (n == 0) break;
      text.append(buf, static_cast<std::size_t>(n));
      if (text.size() > (std::size_t{64} << 20)) {
        ::close(fd);
        return fail(errc::length_overflow, p.string() + ": commit record larger than 64 MiB");
      }
    }
    ::close(fd);
    auto s = parse_commit_record(text, out, key_);
    if (!s) s.message = p.string() + ": " + s.message;
    return s;
  }

  status write(const stored_record& s) const {
    const auto tmp = dir_ / "commit.tmp", dst = dir_ / "commit";
    const std::string text = serialize_commit_record(s, key_);
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    DCR_RETURN_ERROR_IF(fd < 0, io, "open " + tmp.string() + ": " + std::strerror(errno));
    std::size_t done = 0;
    while (done < text.size()) {
      auto n = ::write(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        auto e = errno;
        ::close(fd);
        return fail(errc::io, "write " + tmp.string() + ": " + std::strerror(e));
      }
      done += static_cast<std::size_t>(n);
    }
    if (::fsync(fd) != 0) {
      auto e = errno;
      ::close(fd);
      return fail(errc::io, "fsync " + tmp.string() + ": " + std::strerror(e));
    }
    ::close(fd);
    DCR_RETURN_ERROR_IF(::rename(tmp.c_str(), dst.c_str()) != 0, io,
                        "rename " + tmp.string() + ": " + std::strerror(errno));
    // Past the rename every reader sees the new record: a failure now must
    // not say "not written" (a caller would act on the old record while the
    // new one is in force). It is `unavailable` with "outcome unknown", as
    // an etcd call whose answer was lost; the caller loads the record to
    // learn where it stands.
    int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const int rc = dfd < 0 ? -1 : ::fsync(dfd);
    const int e = errno;
    if (dfd >= 0) ::close(dfd);
    DCR_RETURN_ERROR_IF(rc != 0, unavailable,
                        "fsync " + dir_.string() +
                            " after the record was renamed into place: " + std::strerror(e) +
                            " (the new record is visible but may not survive a crash: outcome "
                            "unknown)");
    return status::success();
  }

  template <class F>
  status update(F&& change) {
    lock l;
    DCR_TRY(l.acquire(dir_ / "commit.lock", lock_timeout_));
    stored_record s;
    DCR_TRY(read(s));
    DCR_TRY(change(s));
    DCR_TRY(detail::check_record(s));
    return write(s);
  }

  std::filesystem::path dir_;
  seal_key key_{}; ///< job key of the record's seal (empty: unkeyed)
  std::chrono::milliseconds lock_timeout_{10000};
};
static_assert(commit_store<file_commit_store>);

/// Owner leases: at most one process serves an owner id at a time.
///
/// An owner process claims its id in the commit store at startup and holds
/// the claim for its life; a second process claiming the same id meanwhile
/// is refused (`errc::conflict`, naming the holder). Each claim carries a
/// fresh random token (the fence token). The owner checks, before and after
/// every publish and dense export, that the store still names its token: a
/// stale process (its claim lost or replaced) refuses to write, and a claim
/// held at both checks was held throughout, since no later claim can bring
/// the same token back. What an attacker with bucket access can still write
/// is caught by the coordinator's manifest binding and the keyed seals
/// (docs/protocol.md, "Threat model").
///
/// `file_owner_lease`: `<dir>/owners/<id>.lock`, flock'd (LOCK_EX, not
/// blocking) for the holder's life and holding its token and pid. The kernel
/// drops the flock when the holder dies, SIGKILL included, so a restarted
/// owner gets the lease at once. The check also compares the lock file's
/// inode with the one locked, so a lock file deleted or replaced by hand
/// (which would let a second process lock a new inode) fences the old holder.
class file_owner_lease {
public:
  /// Claims owner `owner` in the commit store directory `dir`. `errc::conflict`
  /// while another process holds it; `errc::io` when the file cannot be made.
  static status acquire(const std::filesystem::path& dir, std::uint32_t owner,
                        std::unique_ptr<file_owner_lease>& out) {
    auto l = std::unique_ptr<file_owner_lease>(new file_owner_lease());
    std::error_code ec;
    std::filesystem::create_directories(dir / "owners", ec);
    DCR_RETURN_ERROR_IF(ec, io, "create " + (dir / "owners").string() + ": " + ec.message());
    l->path_ = dir / "owners" / (std::to_string(owner) + ".lock");
    l->owner_ = owner;
    l->fd_ = ::open(l->path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    DCR_RETURN_ERROR_IF(l->fd_ < 0, io, "open " + l->path_.string() + ": " + std::strerror(errno));
    while (::flock(l->fd_, LOCK_EX | LOCK_NB) != 0) {
      if (errno == EINTR) continue;
      if (errno != EWOULDBLOCK)
        return fail(errc::io, "flock " + l->path_.string() + ": " + std::strerror(errno));
      std::string holder;
      read_all(l->fd_, holder);
      while (!holder.empty() && holder.back() == '\n') holder.pop_back();
      for (auto& c : holder)
        if (c == '\n') c = ' ';
      return fail(errc::conflict,
                  "owner " + std::to_string(owner) + " is held by another process (" +
                      (holder.empty() ? std::string("no holder recorded") : holder) + ", " +
                      l->path_.string() + "): refused");
    }
    l->token_ = new_incarnation();
    const std::string text =
        "token " + l->token_ + "\npid " + std::to_string(static_cast<long>(::getpid())) + "\n";
    DCR_RETURN_ERROR_IF(::ftruncate(l->fd_, 0) != 0 ||
                            ::pwrite(l->fd_, text.data(), text.size(), 0) !=
                                static_cast<ssize_t>(text.size()) ||
                            ::fsync(l->fd_) != 0,
                        io, "write " + l->path_.string() + ": " + std::strerror(errno));
    out = std::move(l);
    return status::success();
  }

  file_owner_lease(const file_owner_lease&) = delete;
  file_owner_lease& operator=(const file_owner_lease&) = delete;
  ~file_owner_lease() {
    if (fd_ >= 0) ::close(fd_); // closing drops the flock
  }

  /// The fence token of this claim (32 hex digits).
  const std::string& token() const noexcept { return token_; }

  /// Success iff this process still holds the claim: the lock file at its
  /// path is the inode it locked and names its token. Otherwise
  /// `errc::conflict` (a stale holder must not write).
  status check() const {
    struct stat mine {};
    struct stat now {};
    DCR_RETURN_ERROR_IF(::fstat(fd_, &mine) != 0, io,
                        "fstat " + path_.string() + ": " + std::strerror(errno));
    const bool same =
        ::stat(path_.c_str(), &now) == 0 && now.st_dev == mine.st_dev && now.st_ino == mine.st_ino;
    std::string text;
    if (same) read_all(fd_, text);
    DCR_RETURN_ERROR_IF(!same || text.rfind("token " + token_ + "\n", 0) != 0, conflict,
                        "owner " + std::to_string(owner_) + ": lease with token " + token_ +
                            " lost (" + path_.string() +
                            " was replaced): a stale owner "
                            "process does not write");
    return status::success();
  }

private:
  file_owner_lease() = default;
  static void read_all(int fd, std::string& out) {
    char buf[512];
    out.clear();
    for (off_t at = 0;;) {
      const auto n = ::pread(fd, buf, sizeof buf, at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || out.size() > 4096) return;
      out.append(buf, static_cast<std::size_t>(n));
      at += n;
    }
  }

  std::filesystem::path path_;
  std::uint32_t owner_ = 0;
  int fd_ = -1;
  std::string token_;
};

} // namespace dcr::protocol
