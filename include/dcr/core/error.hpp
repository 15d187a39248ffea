#pragma once
/// \file
/// Typed errors. Byte-level decoders return a `dcr::status`; the convenience
/// API throws `dcr::error` carrying the same code. Every message names what was
/// wrong and where (tensor, item, byte offset).

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace dcr {

/// What went wrong. Stable numeric values: tools print them and tests match them.
enum class errc : std::uint16_t {
  ok = 0,
  invalid_argument = 1,     ///< a caller passed a value outside the documented domain
  bad_magic = 2,            ///< payload does not start with the dcr magic
  unsupported_version = 3,  ///< payload format version this build cannot read
  truncated = 4,            ///< input ends before a declared field or buffer
  trailing_bytes = 5,       ///< input continues past its declared end
  length_overflow = 6,      ///< declared lengths overflow or exceed a limit
  digest_mismatch = 7,      ///< BLAKE2b-128 of the body differs from the header
  compression = 8,          ///< zstd refused to compress or decompress
  bad_dtype = 9,            ///< unknown dtype id or dtype mismatch
  bad_encoding = 10,        ///< unknown value encoding id
  bad_location = 11,        ///< unknown location coding or malformed locations
  index_out_of_range = 12,  ///< a location points outside its tensor
  not_increasing = 13,      ///< locations not strictly increasing
  offset_out_of_range = 14, ///< an offset/length points outside its buffer
  shape_mismatch = 15,      ///< tensor shape disagrees with what is expected
  duplicate = 16,           ///< a payload or item seen before (suppressed)
  stale_attempt = 17,       ///< input belongs to an attempt that was replaced
  loader_condition = 18,    ///< a native loader broke a loader condition at apply
  unsupported_loader = 19,  ///< a loader path rejected at prewarm
  conflict = 20,            ///< compare-and-set lost, or a fenced coordinator acted
  io = 21,                  ///< an operating-system I/O call failed
  not_found = 22,           ///< a named object, tensor or record does not exist
  nan_value = 23,           ///< a NaN value where the path cannot represent it
  parts_disagree = 24,      ///< overlapping residual parts differ bit for bit
  coverage = 25,            ///< residual parts do not cover every element
  bad_format = 26,          ///< malformed structured input (JSON, safetensors, ...)
  device = 27,              ///< a CUDA runtime error
  verification = 28,        ///< a post-apply check found bits that differ
  aborted = 29,             ///< work stopped because its attempt was stopped
  unavailable = 30, ///< a remote service could not be reached, timed out or refused the request
  foreign_incarnation =
      31, ///< state written under another commit history (a lost or replaced commit record)
};

/// Short stable name of an error code, e.g. "digest_mismatch".
constexpr std::string_view to_string(errc e) noexcept {
  switch (e) {
  case errc::ok:
    return "ok";
  case errc::invalid_argument:
    return "invalid_argument";
  case errc::bad_magic:
    return "bad_magic";
  case errc::unsupported_version:
    return "unsupported_version";
  case errc::truncated:
    return "truncated";
  case errc::trailing_bytes:
    return "trailing_bytes";
  case errc::length_overflow:
    return "length_overflow";
  case errc::digest_mismatch:
    return "digest_mismatch";
  case errc::compression:
    return "compression";
  case errc::bad_dtype:
    return "bad_dtype";
  case errc::bad_encoding:
    return "bad_encoding";
  case errc::bad_location:
    return "bad_location";
  case errc::index_out_of_range:
    return "index_out_of_range";
  case errc::not_increasing:
    return "not_increasing";
  case errc::offset_out_of_range:
    return "offset_out_of_range";
  case errc::shape_mismatch:
    return "shape_mismatch";
  case errc::duplicate:
    return "duplicate";
  case errc::stale_attempt:
    return "stale_attempt";
  case errc::loader_condition:
    return "loader_condition";
  case errc::unsupported_loader:
    return "unsupported_loader";
  case errc::conflict:
    return "conflict";
  case errc::io:
    return "io";
  case errc::not_found:
    return "not_found";
  case errc::nan_value:
    return "nan_value";
  case errc::parts_disagree:
    return "parts_disagree";
  case errc::coverage:
    return "coverage";
  case errc::bad_format:
    return "bad_format";
  case errc::device:
    return "device";
  case errc::verification:
    return "verification";
  case errc::aborted:
    return "aborted";
  case errc::unavailable:
    return "unavailable";
  case errc::foreign_incarnation:
    return "foreign_incarnation";
  }
  return "unknown";
}

/// Result of a non-throwing operation: a code and a message saying where.
struct [[nodiscard]] status {
  errc code = errc::ok;
  std::string message;

  static status success() { return {}; }
  bool ok() const noexcept { return code == errc::ok; }
  explicit operator bool() const noexcept { return ok(); }
};

/// Build a failed status.
inline status fail(errc code, std::string message) { return status{code, std::move(message)}; }

/// Exception thrown by the convenience API; `what()` is "<code>: <message>".
class error : public std::runtime_error {
public:
  error(errc code, const std::string& message)
      : std::runtime_error(std::string(to_string(code)) + ": " + message), code_(code) {}
  explicit error(const status& s) : error(s.code, s.message) {}
  errc code() const noexcept { return code_; }

private:
  errc code_;
};

/// Throw `dcr::error` unless `s` is ok.
inline void throw_if_failed(const status& s) {
  if (!s.ok()) throw error(s);
}

} // namespace dcr

/// Return a failed status from the enclosing function when `cond` holds.
#define DCR_RETURN_ERROR_IF(cond, code, msg)                                                       \
  do {                                                                                             \
    if (cond) return ::dcr::fail(::dcr::errc::code, (msg));                                        \
  } while (0)

/// Propagate a failed status from the enclosing function.
#define DCR_TRY(expr)                                                                              \
  do {                                                                                             \
    if (auto dcr_try_status_ = (expr); !dcr_try_status_.ok()) return dcr_try_status_;              \
  } while (0)
