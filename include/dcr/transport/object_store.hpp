#pragma once
/// \file
/// Object storage transport: a flat namespace of immutable-once-published
/// objects, as S3 offers. dcr uses only what every S3 server provides, so the
/// concept makes no filesystem assumption:
///  - `put(name, bytes)` publishes atomically: a reader sees no object or the
///    whole object, never a prefix;
///  - `get(name, out)` returns `errc::not_found` for a missing object;
///  - `list(prefix, names)` returns every published name starting with
///    `prefix` (plain string prefix, sorted, like ListObjectsV2);
///  - `remove(name)` deletes (`errc::not_found` when missing); named `remove`
///    because `delete` is a keyword.
/// Names are validated by `validate_object_name` in every backend.

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <concepts>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dcr/core/error.hpp"

namespace dcr::transport {

/// A store of named byte objects with atomic publish (see file comment).
template <class S>
concept object_store = requires(S& s, std::string_view name, std::span<const std::byte> bytes,
                                std::vector<std::byte>& out, std::vector<std::string>& names) {
  { s.put(name, bytes) } -> std::same_as<status>;
  { s.get(name, out) } -> std::same_as<status>;
  { s.list(name, names) } -> std::same_as<status>;
  { s.remove(name) } -> std::same_as<status>;
};

/// Longest accepted object name (S3's key limit).
inline constexpr std::size_t max_object_name = 1024;

/// Object names are '/'-separated segments of [A-Za-z0-9._-]; no empty
/// segment, no segment starting with '.' (rules out "." and ".." and keeps
/// backends' temporary names out of the namespace), no leading or trailing '/'.
/// Every backend applies this, so a name valid for one is valid for all and can
/// never escape a filesystem root.
inline status validate_object_name(std::string_view name) {
  DCR_RETURN_ERROR_IF(name.empty(), invalid_argument, "object name is empty");
  DCR_RETURN_ERROR_IF(name.size() > max_object_name, invalid_argument,
                      "object name longer than " + std::to_string(max_object_name) + " bytes");
  std::size_t seg_start = 0;
  for (std::size_t i = 0; i <= name.size(); ++i) {
    if (i == name.size() || name[i] == '/') {
      DCR_RETURN_ERROR_IF(i == seg_start, invalid_argument,
                          "object name '" + std::string(name) + "' has an empty segment at byte " +
                              std::to_string(i));
      DCR_RETURN_ERROR_IF(name[seg_start] == '.', invalid_argument,
                          "object name '" + std::string(name) +
                              "' has a segment starting with '.'");
      seg_start = i + 1;
      continue;
    }
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    DCR_RETURN_ERROR_IF(!ok, invalid_argument,
                        "object name '" + std::string(name) +
                            "' has a byte outside [A-Za-z0-9._-/] at " + std::to_string(i));
  }
  return status::success();
}

/// A store that can list only the names after a given one (S3's
/// `start-after`): `list_after(prefix, after, names)` returns every published
/// name starting with `prefix` that sorts after `after`, sorted. A waiting
/// reader then pays for new names only, not for the whole prefix again at
/// every poll. `list_names_after` falls back to `list` and a filter.
template <class S>
concept lists_after = requires(S& s, std::string_view p, std::vector<std::string>& names) {
  { s.list_after(p, p, names) } -> std::same_as<status>;
};

template <object_store Store>
status list_names_after(Store& store, std::string_view prefix, std::string_view after,
                        std::vector<std::string>& names) {
  if constexpr (lists_after<Store>) {
    return store.list_after(prefix, after, names);
  } else {
    DCR_TRY(store.list(prefix, names));
    names.erase(names.begin(),
                std::upper_bound(names.begin(), names.end(), after,
                                 [](std::string_view a, const std::string& n) { return a < n; }));
    return status::success();
  }
}

/// A prefix for `list` may end in '/' or be empty; otherwise the same rules.
inline status validate_object_prefix(std::string_view prefix) {
  if (prefix.empty()) return status::success();
  if (prefix.back() == '/') prefix.remove_suffix(1);
  return validate_object_name(prefix);
}

/// Thread-safe in-memory object store (tests; single-process runs).
class memory_object_store {
public:
  status put(std::string_view name, std::span<const std::byte> bytes) {
    DCR_TRY(validate_object_name(name));
    std::lock_guard g(m_);
    objects_[std::string(name)].assign(bytes.begin(), bytes.end());
    return status::success();
  }
  status get(std::string_view name, std::vector<std::byte>& out) {
    DCR_TRY(validate_object_name(name));
    std::lock_guard g(m_);
    auto it = objects_.find(std::string(name));
    DCR_RETURN_ERROR_IF(it == objects_.end(), not_found, "no object '" + std::string(name) + "'");
    out = it->second;
    return status::success();
  }
  status list(std::string_view prefix, std::vector<std::string>& names) {
    return list_after(prefix, {}, names);
  }
  status list_after(std::string_view prefix, std::string_view after,
                    std::vector<std::string>& names) {
    DCR_TRY(validate_object_prefix(prefix));
    std::lock_guard g(m_);
    names.clear();
    auto it = after < prefix ? objects_.lower_bound(std::string(prefix))
                             : objects_.upper_bound(std::string(after));
    for (; it != objects_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
      names.push_back(it->first);
    return status::success();
  }
  status remove(std::string_view name) {
    DCR_TRY(validate_object_name(name));
    std::lock_guard g(m_);
    DCR_RETURN_ERROR_IF(objects_.erase(std::string(name)) == 0, not_found,
                        "no object '" + std::string(name) + "'");
    return status::success();
  }

private:
  std::mutex m_;
  std::map<std::string, std::vector<std::byte>> objects_;
};
static_assert(object_store<memory_object_store> && lists_after<memory_object_store>);

/// Object store in a directory tree: object `a/b/c` is file `<root>/a/b/c`.
/// `put` writes a dot-named temporary in the target directory, fsyncs it and
/// renames it into place (atomic publish; the temporary's name is not a valid
/// object name, so `list` never shows it). Safe for concurrent processes.
class fs_object_store {
public:
  /// `durable`: also fsync data and directory on put (crash safety); off only
  /// to measure its cost.
  explicit fs_object_store(std::filesystem::path root, bool durable = true)
      : root_(std::move(root)), durable_(durable) {
    std::error_code ec;
    std::filesystem::create_directories(root_, ec);
    if (ec) throw error(errc::io, "create " + root_.string() + ": " + ec.message());
  }
  const std::filesystem::path& root() const noexcept { return root_; }
  /// Requests attempt writers and readers keep in flight on this store
  /// (`requests_in_flight_of`): with `durable`, a put waits for two fsyncs,
  /// which several puts in flight overlap.
  std::size_t requests_in_flight() const noexcept { return durable_ ? 4 : 1; }

  status put(std::string_view name, std::span<const std::byte> bytes) {
    DCR_TRY(validate_object_name(name));
    const auto dst = root_ / std::string(name);
    DCR_TRY(make_directories(dst.parent_path()));
    const auto tmp =
        dst.parent_path() / (".tmp." + std::to_string(::getpid()) + "." +
                             std::to_string(counter_.fetch_add(1)) + "." + dst.filename().string());
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    DCR_RETURN_ERROR_IF(fd < 0, io, "open " + tmp.string() + ": " + std::strerror(errno));
    auto fail_io = [&](const char* what) {
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return fail(errc::io, std::string(what) + " " + tmp.string() + ": " + std::strerror(e));
    };
    std::size_t done = 0;
    while (done < bytes.size()) {
      auto n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return fail_io("write");
      done += static_cast<std::size_t>(n);
    }
    if (durable_ && ::fsync(fd) != 0) return fail_io("fsync");
    ::close(fd);
    if (::rename(tmp.c_str(), dst.c_str()) != 0) {
      const int e = errno;
      ::unlink(tmp.c_str());
      return fail(errc::io, "rename to " + dst.string() + ": " + std::strerror(e));
    }
    // The rename is durable once its directory is: a failure here leaves
    // the object visible but perhaps not on disk, reported as such.
    if (durable_) DCR_TRY(sync_directory(dst.parent_path(), "put of '" + std::string(name) + "'"));
    return status::success();
  }

  status get(std::string_view name, std::vector<std::byte>& out) {
    DCR_TRY(validate_object_name(name));
    const auto p = root_ / std::string(name);
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      DCR_RETURN_ERROR_IF(errno == ENOENT || errno == ENOTDIR, not_found,
                          "no object '" + std::string(name) + "'");
      return fail(errc::io, "open " + p.string() + ": " + std::strerror(errno));
    }
    out.clear();
    std::byte buf[1 << 16];
    for (;;) {
      auto n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int e = errno;
        ::close(fd);
        return fail(errc::io, "read " + p.string() + ": " + std::strerror(e));
      }
      if (n == 0) break;
      out.insert(out.end(), buf, buf + n);
    }
    ::close(fd);
    return status::success();
  }

  status list(std::string_view prefix, std::vector<std::string>& names) {
    DCR_TRY(validate_object_prefix(prefix));
    names.clear();
    // Walk only the deepest directory the prefix names completely.
    const auto slash = prefix.rfind('/');
    const std::string dir_part =
        slash == std::string_view::npos ? "" : std::string(prefix.substr(0, slash));
    const auto start = dir_part.empty() ? root_ : root_ / dir_part;
    std::error_code ec;
    if (!std::filesystem::is_directory(start, ec)) return status::success();
    std::filesystem::recursive_directory_iterator it(start, ec), end;
    DCR_RETURN_ERROR_IF(ec, io, "list " + start.string() + ": " + ec.message());
    for (; it != end; it.increment(ec)) {
      DCR_RETURN_ERROR_IF(ec, io, "list " + start.string() + ": " + ec.message());
      const auto fname = it->path().filename().string();
      if (!fname.empty() && fname[0] == '.') {
        if (it->is_directory(ec)) it.disable_recursion_pending();
        continue;
      }
      const bool file = it->is_regular_file(ec);
      if (ec) {
        // Gone since the directory was read (a concurrent remove): not an
        // object any more. Any other failure to stat an entry is an error:
        // skipping it would let "this prefix is empty" pass over objects.
        if (ec == std::errc::no_such_file_or_directory || ec == std::errc::not_a_directory)
          continue;
        return fail(errc::io, "list " + start.string() + ": stat " + it->path().string() + ": " +
                                  ec.message());
      }
      if (!file) continue;
      auto rel = std::filesystem::relative(it->path(), root_, ec).generic_string();
      DCR_RETURN_ERROR_IF(ec, io, "list: " + it->path().string() + ": " + ec.message());
      if (rel.compare(0, prefix.size(), prefix) == 0) names.push_back(std::move(rel));
    }
    std::sort(names.begin(), names.end());
    return status::success();
  }

  status remove(std::string_view name) {
    DCR_TRY(validate_object_name(name));
    const auto p = root_ / std::string(name);
    if (::unlink(p.c_str()) != 0) {
      DCR_RETURN_ERROR_IF(errno == ENOENT || errno == ENOTDIR, not_found,
                          "no object '" + std::string(name) + "'");
      return fail(errc::io, "unlink " + p.string() + ": " + std::strerror(errno));
    }
    // Drop now-empty parent directories up to the root (best effort).
    std::error_code ec;
    for (auto d = p.parent_path(); d != root_ && d.string().size() > root_.string().size();
         d = d.parent_path())
      if (!std::filesystem::remove(d, ec)) break;
    return status::success();
  }

private:
  /// fsync of directory `d` (`what`: the operation, for the message).
  static status sync_directory(const std::filesystem::path& d, const std::string& what) {
    int dfd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DCR_RETURN_ERROR_IF(dfd < 0, io,
                        what + ": open " + d.string() + " to sync it: " + std::strerror(errno));
    const int rc = ::fsync(dfd);
    const int e = errno;
    ::close(dfd);
    DCR_RETURN_ERROR_IF(rc != 0, io,
                        what + ": fsync " + d.string() + ": " + std::strerror(e) +
                            " (the object is in place but may not survive a crash)");
    return status::success();
  }
  /// `d` and its missing parents under the root; with `durable_`, each new
  /// directory's entry is fsynced into its parent (else a crash can lose a
  /// directory whose files were fsynced).
  status make_directories(const std::filesystem::path& d) {
    std::error_code ec;
    if (std::filesystem::is_directory(d, ec)) return status::success();
    if (d != root_ && d.has_parent_path() && d.parent_path() != d)
      DCR_TRY(make_directories(d.parent_path()));
    if (::mkdir(d.c_str(), 0755) != 0) {
      DCR_RETURN_ERROR_IF(errno != EEXIST, io,
                          "create " + d.string() + ": " + std::strerror(errno));
      return status::success(); // made meanwhile by a concurrent put
    }
    if (durable_) DCR_TRY(sync_directory(d.parent_path(), "create " + d.string()));
    return status::success();
  }

  std::filesystem::path root_;
  bool durable_ = true;
  inline static std::atomic<std::uint64_t> counter_{0};
};
static_assert(object_store<fs_object_store>);

} // namespace dcr::transport
