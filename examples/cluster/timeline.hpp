#pragma once
// Timestamped intervals of a cluster job's processes, for dcr-bench-cluster's
// refit window, lower bounds and timeline picture (docs/benchmarks.md). When
// DCR_TIMELINE names a file, every interval is appended to it as one JSON
// line {"who","what","t0","t1","bytes"}; times are CLOCK_REALTIME in ns,
// which every network namespace of the testbed shares. One write(2) per line
// on an O_APPEND descriptor, so the lines of concurrent processes never
// interleave. Without DCR_TIMELINE nothing is written. Besides intervals of
// work, a role records "peak_rss" (its peak resident set in bytes over
// [t0, t1]) and "held" (the bytes it must hold) for the bench's memory
// columns.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include "dcr/core/error.hpp"
#include "dcr/transport/attempt_objects.hpp"
#include "dcr/transport/object_store.hpp"

namespace dcr::cluster::timeline {

inline std::uint64_t now_ns() {
  timespec t{};
  clock_gettime(CLOCK_REALTIME, &t);
  return std::uint64_t(t.tv_sec) * 1000000000u + std::uint64_t(t.tv_nsec);
}

inline int sink() {
  static const int fd = [] {
    const char* p = std::getenv("DCR_TIMELINE");
    return p && *p ? ::open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644) : -1;
  }();
  return fd;
}

/// This process's name in the records ("owner0", "node1", "coordinator").
inline std::string& who() {
  static std::string w = "process";
  return w;
}

/// Appends one interval (names are plain identifiers: no JSON escaping).
inline void record(std::string_view what, std::uint64_t t0, std::uint64_t t1,
                   std::uint64_t bytes = 0) {
  const std::string_view w = who();
  const int fd = sink();
  if (fd < 0) return;
  char line[256];
  const int n = std::snprintf(
      line, sizeof line,
      "{\"who\":\"%.*s\",\"what\":\"%.*s\",\"t0\":%llu,\"t1\":%llu,"
      "\"bytes\":%llu}\n",
      int(w.size()), w.data(), int(what.size()), what.data(), static_cast<unsigned long long>(t0),
      static_cast<unsigned long long>(t1), static_cast<unsigned long long>(bytes));
  if (n > 0) [[maybe_unused]]
    auto w = ::write(fd, line, std::size_t(std::min(n, 255)));
}

/// The process's peak resident set (VmHWM of /proc/self/status) in bytes; 0
/// where it cannot be read.
inline std::uint64_t peak_rss_bytes() {
  const int fd = ::open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[8192];
  std::size_t n = 0;
  for (ssize_t r; n < sizeof buf - 1 && (r = ::read(fd, buf + n, sizeof buf - 1 - n)) > 0;)
    n += std::size_t(r);
  ::close(fd);
  buf[n] = 0;
  const char* at = std::strstr(buf, "VmHWM:");
  if (!at) return 0;
  return std::strtoull(at + 6, nullptr, 10) * 1024; // "VmHWM:   123456 kB"
}

/// When the peak was last reset (0: never; then it covers the process's life).
inline std::uint64_t& peak_since_ns() {
  static std::uint64_t t = 0;
  return t;
}

/// Starts a new peak: the kernel's high-water mark drops to the current
/// resident set ("5" to /proc/self/clear_refs), so the next
/// `record_peak_rss` covers what happened since (one refit, not the model
/// loading or dense restores before it). Where the kernel refuses, the peak
/// keeps covering the process's life.
inline void reset_peak_rss() {
  const int fd = ::open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return;
  if (::write(fd, "5", 1) == 1) peak_since_ns() = now_ns();
  ::close(fd);
}

/// Records "peak_rss": the peak resident set in bytes over [t0, t1] (t0 the
/// last `reset_peak_rss`, else t1: over the process's life so far).
inline void record_peak_rss() {
  const auto t1 = now_ns();
  const auto t0 = peak_since_ns() ? peak_since_ns() : t1;
  record("peak_rss", t0, t1, peak_rss_bytes());
}

/// Records "held": the bytes this role must hold (an owner: its shards and
/// baseline trackers; a rollout node: its receivers' storage and scratch and
/// the payloads it may hold at once), beside its peak_rss.
inline void record_held(std::uint64_t bytes) {
  const auto t = now_ns();
  record("held", t, t, bytes);
}

/// Records [construction, destruction) as one interval.
struct scope {
  std::string_view what;
  std::uint64_t t0 = now_ns();
  ~scope() { record(what, t0, now_ns()); }
};

/// An object store whose puts ("upload") and gets ("fetch") of payloads are
/// recorded; everything else passes through.
template <class Store>
struct timed_store {
  Store* inner;

  static bool payload(std::string_view n) { return n.find("/payload/") != std::string_view::npos; }
  status put(std::string_view n, std::span<const std::byte> b) {
    const auto t0 = now_ns();
    auto s = inner->put(n, b);
    if (payload(n)) record("upload", t0, now_ns(), b.size());
    return s;
  }
  status get(std::string_view n, std::vector<std::byte>& out) {
    const auto t0 = now_ns();
    auto s = inner->get(n, out);
    if (payload(n)) record("fetch", t0, now_ns(), out.size());
    return s;
  }
  status list(std::string_view p, std::vector<std::string>& names) { return inner->list(p, names); }
  // Forwarded so that wrapping keeps the store's incremental listing (S3
  // start-after): a node polls only the names published since its last poll.
  status list_after(std::string_view p, std::string_view after,
                    std::vector<std::string>& names) requires transport::lists_after<Store> {
    return inner->list_after(p, after, names);
  }
  status remove(std::string_view n) { return inner->remove(n); }
  // The job key manifests are sealed with: a wrapper that did not forward it
  // would make its scopes write and read unkeyed manifests.
  dcr::seal_key seal_key() const { return transport::seal_key_of(*inner); }
  // Forwarded, or a node would fetch one payload at a time.
  std::size_t requests_in_flight() const { return transport::requests_in_flight_of(*inner); }
};

} // namespace dcr::cluster::timeline
