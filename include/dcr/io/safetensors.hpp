#pragma once
/// \file
/// safetensors checkpoints as files: a validated memory-mapped reader
/// (zero-copy views) and an atomic writer, over the format functions of
/// `io/safetensors_format.hpp` (which holds the format notes below).
///
/// Format: an 8-byte little-endian header length N, N bytes of a UTF-8 JSON
/// object mapping tensor names to {"dtype", "shape", "data_offsets": [b, e]}
/// (offsets relative to the data section after the header) plus an optional
/// "__metadata__" object of strings, then the data section. Validation
/// follows the reference implementation: offsets must tile the data section
/// exactly (no overlap, no hole, no trailing bytes), each tensor's byte count
/// must equal numel × width. Every violation is `errc::bad_format` naming
/// the tensor; `errc::io` reports operating-system failures.
///
/// The header is parsed by dcr's one JSON reader (`core/json.hpp`, strict
/// RFC 8259), then walked; unknown members of an entry are ignored.

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/core/tensor.hpp"
#include "dcr/io/safetensors_format.hpp"

namespace dcr::io {

/// Write a safetensors file atomically (temporary file, fsync, rename).
/// Returns `errc::io` naming the path on failure.
inline status write_safetensors(const std::string& path, std::span<const tensor_meta> metas,
                                std::span<const std::span<const std::byte>> data,
                                const std::map<std::string, std::string>& metadata = {}) {
  std::vector<std::byte> img;
  try {
    img = encode_safetensors(metas, data, metadata);
  } catch (const error& e) {
    return fail(e.code(), e.what());
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  DCR_RETURN_ERROR_IF(fd < 0, io, "open " + tmp + ": " + std::strerror(errno));
  std::size_t done = 0;
  while (done < img.size()) {
    const auto w = ::write(fd, img.data() + done, img.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return fail(errc::io, "write " + tmp + ": " + std::strerror(e));
    }
    done += static_cast<std::size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    return fail(errc::io, "fsync/close " + tmp + ": " + std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return fail(errc::io, "rename to " + path + ": " + std::strerror(e));
  }
  return status::success();
}

/// A validated, memory-mapped safetensors file. Views point into the
/// read-only mapping (zero copy); a tensor whose offset is not aligned to its
/// element width is copied once into an aligned buffer on first use. Models
/// `canonical_source`.
class safetensors_file {
public:
  safetensors_file() = default;
  safetensors_file(const safetensors_file&) = delete;
  safetensors_file& operator=(const safetensors_file&) = delete;
  safetensors_file(safetensors_file&& o) noexcept { *this = std::move(o); }
  safetensors_file& operator=(safetensors_file&& o) noexcept {
    if (this != &o) {
      unmap();
      base_ = std::exchange(o.base_, nullptr);
      size_ = std::exchange(o.size_, 0);
      index_ = std::move(o.index_);
      by_name_ = std::move(o.by_name_);
      aligned_ = std::move(o.aligned_);
      metas_ = std::move(o.metas_);
    }
    return *this;
  }
  ~safetensors_file() { unmap(); }

  /// Map and validate `path`.
  static status open(const std::string& path, safetensors_file& out) {
    out = safetensors_file{};
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    DCR_RETURN_ERROR_IF(fd < 0, io, "open " + path + ": " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int e = errno;
      ::close(fd);
      return fail(errc::io, "fstat " + path + ": " + std::strerror(e));
    }
    const auto size = static_cast<std::uint64_t>(st.st_size);
    void* p = nullptr;
    if (size > 0) {
      p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int e = errno;
        ::close(fd);
        return fail(errc::io, "mmap " + path + ": " + std::strerror(e));
      }
    }
    ::close(fd);
    out.base_ = static_cast<std::byte*>(p);
    out.size_ = size;
    status s =
        parse_safetensors_header({out.base_, static_cast<std::size_t>(size)}, size, out.index_);
    if (!s.ok()) {
      s.message = path + ": " + s.message;
      out = safetensors_file{};
      return s;
    }
    out.finish_index();
    return status::success();
  }
  /// Throwing form of `open`.
  static safetensors_file open_or_throw(const std::string& path) {
    safetensors_file f;
    throw_if_failed(open(path, f));
    return f;
  }

  const safetensors_index& index() const noexcept { return index_; }
  /// Canonical metas in header order.
  const std::vector<tensor_meta>& tensors() const noexcept { return metas_; }
  const std::map<std::string, std::string>& metadata() const noexcept { return index_.metadata; }

  /// Read-only row-major view of tensor `name` (the `canonical_source` interface).
  std::optional<tensor_view> find(std::string_view name) const {
    auto it = by_name_.find(std::string(name));
    if (it == by_name_.end()) return std::nullopt;
    const auto& e = index_.entries[it->second];
    std::byte* p = base_ + index_.data_offset + e.begin;
    const auto w = width_of(e.meta.dtype);
    if (reinterpret_cast<std::uintptr_t>(p) % w != 0) {
      auto& buf = aligned_[it->second];
      if (buf.empty() && e.end > e.begin) {
        buf.resize((e.end - e.begin + 7) / 8);
        std::memcpy(buf.data(), p, e.end - e.begin);
      }
      p = reinterpret_cast<std::byte*>(buf.data());
    }
    return tensor_view{p, e.meta.dtype, strided_layout::row_major(e.meta.shape)};
  }
  /// Raw bytes of tensor `name` in the mapping (empty span when absent).
  std::span<const std::byte> bytes(std::string_view name) const {
    auto it = by_name_.find(std::string(name));
    if (it == by_name_.end()) return {};
    const auto& e = index_.entries[it->second];
    return {base_ + index_.data_offset + e.begin, static_cast<std::size_t>(e.end - e.begin)};
  }

private:
  void finish_index() {
    for (std::size_t i = 0; i < index_.entries.size(); ++i) {
      by_name_.emplace(index_.entries[i].meta.name, i);
      metas_.push_back(index_.entries[i].meta);
    }
  }
  void unmap() noexcept {
    if (base_ && size_ > 0) ::munmap(base_, size_);
    base_ = nullptr;
    size_ = 0;
  }

  std::byte* base_ = nullptr;
  std::uint64_t size_ = 0;
  safetensors_index index_;
  std::unordered_map<std::string, std::size_t> by_name_;
  mutable std::unordered_map<std::size_t, std::vector<std::uint64_t>> aligned_;
  std::vector<tensor_meta> metas_;
};

} // namespace dcr::io
