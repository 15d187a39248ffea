#pragma once
/// \file
/// Span-based zstd wrappers with typed errors. Frames are single-threaded and
/// carry their content size and no checksum (the payload digest covers the
/// body), so the same input and level always give the same bytes.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>
#include <zstd.h>

#include "dcr/core/error.hpp"

namespace dcr::codec {

namespace detail {
struct cctx_deleter {
  void operator()(ZSTD_CCtx* c) const noexcept { ZSTD_freeCCtx(c); }
};
struct dctx_deleter {
  void operator()(ZSTD_DCtx* d) const noexcept { ZSTD_freeDCtx(d); }
};
/// One context per thread: creating contexts dominates small payloads.
inline ZSTD_CCtx* thread_cctx() {
  thread_local std::unique_ptr<ZSTD_CCtx, cctx_deleter> c{ZSTD_createCCtx()};
  return c.get();
}
inline ZSTD_DCtx* thread_dctx() {
  thread_local std::unique_ptr<ZSTD_DCtx, dctx_deleter> d{ZSTD_createDCtx()};
  return d.get();
}
} // namespace detail

/// Compress `in` into one zstd frame at `level`, replacing `out`.
inline status zstd_compress(std::span<const std::byte> in, int level, std::vector<std::byte>& out) {
  DCR_RETURN_ERROR_IF(level < ZSTD_minCLevel() || level > ZSTD_maxCLevel(), invalid_argument,
                      "zstd level " + std::to_string(level) + " outside [" +
                          std::to_string(ZSTD_minCLevel()) + ", " +
                          std::to_string(ZSTD_maxCLevel()) + "]");
  ZSTD_CCtx* c = detail::thread_cctx();
  DCR_RETURN_ERROR_IF(c == nullptr, compression, "ZSTD_createCCtx failed");
  ZSTD_CCtx_reset(c, ZSTD_reset_session_and_parameters);
  auto check = [](std::size_t r, const char* what) -> status {
    if (ZSTD_isError(r))
      return fail(errc::compression, std::string(what) + ": " + ZSTD_getErrorName(r));
    return status::success();
  };
  DCR_TRY(check(ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, level), "set level"));
  DCR_TRY(check(ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 1), "set content size"));
  DCR_TRY(check(ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 0), "set checksum"));
  out.resize(ZSTD_compressBound(in.size()));
  const std::size_t n = ZSTD_compress2(c, out.data(), out.size(), in.data(), in.size());
  DCR_TRY(check(n, "ZSTD_compress2"));
  out.resize(n);
  return status::success();
}

/// Check, without decompressing, that `in` is exactly one zstd frame whose
/// declared content size (when present) is `size`: callers run it before
/// allocating the output.
inline status zstd_check_frame(std::span<const std::byte> in, std::uint64_t size) {
  const std::size_t frame = ZSTD_findFrameCompressedSize(in.data(), in.size());
  DCR_RETURN_ERROR_IF(ZSTD_isError(frame), compression,
                      std::string("body is not a complete zstd frame: ") +
                          ZSTD_getErrorName(frame));
  DCR_RETURN_ERROR_IF(frame != in.size(), trailing_bytes,
                      "zstd frame ends at body byte " + std::to_string(frame) + " of " +
                          std::to_string(in.size()));
  const unsigned long long declared = ZSTD_getFrameContentSize(in.data(), in.size());
  DCR_RETURN_ERROR_IF(declared == ZSTD_CONTENTSIZE_ERROR, compression, "bad zstd frame header");
  DCR_RETURN_ERROR_IF(declared != ZSTD_CONTENTSIZE_UNKNOWN && declared != size, length_overflow,
                      "zstd frame declares " + std::to_string(declared) + " bytes, expected " +
                          std::to_string(size));
  return status::success();
}

/// Decompress exactly one zstd frame `in` into `out`, which must be filled
/// exactly: a frame that is shorter, longer, declares another content size,
/// or is followed by more bytes is an error. Never writes outside `out`.
inline status zstd_decompress(std::span<const std::byte> in, std::span<std::byte> out) {
  DCR_TRY(zstd_check_frame(in, out.size()));
  ZSTD_DCtx* d = detail::thread_dctx();
  DCR_RETURN_ERROR_IF(d == nullptr, compression, "ZSTD_createDCtx failed");
  // out.data() may be null for an empty span; zstd accepts (nullptr, 0).
  const std::size_t n = ZSTD_decompressDCtx(d, out.data(), out.size(), in.data(), in.size());
  DCR_RETURN_ERROR_IF(ZSTD_isError(n), compression,
                      std::string("ZSTD_decompress: ") + ZSTD_getErrorName(n));
  DCR_RETURN_ERROR_IF(n != out.size(), truncated,
                      "zstd frame holds " + std::to_string(n) + " bytes, expected " +
                          std::to_string(out.size()));
  return status::success();
}

/// Decompress only the first `out.size()` bytes of the zstd frame `in`
/// (streaming, so the frame's later blocks are never decoded): what reading
/// a body's leading section costs. `truncated` when the frame holds fewer.
inline status zstd_decompress_prefix(std::span<const std::byte> in, std::span<std::byte> out) {
  ZSTD_DCtx* d = detail::thread_dctx();
  DCR_RETURN_ERROR_IF(d == nullptr, compression, "ZSTD_createDCtx failed");
  ZSTD_DCtx_reset(d, ZSTD_reset_session_only);
  ZSTD_inBuffer ib{in.data(), in.size(), 0};
  ZSTD_outBuffer ob{out.data(), out.size(), 0};
  while (ob.pos < ob.size) {
    const std::size_t before_in = ib.pos, before_out = ob.pos;
    const std::size_t r = ZSTD_decompressStream(d, &ob, &ib);
    DCR_RETURN_ERROR_IF(ZSTD_isError(r), compression,
                        std::string("ZSTD_decompressStream: ") + ZSTD_getErrorName(r));
    DCR_RETURN_ERROR_IF(
        (r == 0 || (ib.pos == before_in && ob.pos == before_out)) && ob.pos < ob.size, truncated,
        "zstd frame ends after " + std::to_string(ob.pos) + " bytes, " +
            std::to_string(out.size()) + " wanted");
  }
  ZSTD_DCtx_reset(d, ZSTD_reset_session_only);
  return status::success();
}

/// Throwing forms.
inline std::vector<std::byte> zstd_compress_or_throw(std::span<const std::byte> in, int level = 1) {
  std::vector<std::byte> out;
  throw_if_failed(zstd_compress(in, level, out));
  return out;
}
inline std::vector<std::byte> zstd_decompress_or_throw(std::span<const std::byte> in,
                                                       std::size_t size) {
  std::vector<std::byte> out(size);
  throw_if_failed(zstd_decompress(in, out));
  return out;
}

/// Bytes after zstd at `level` (benches and coding selection).
inline std::size_t zstd_size(std::span<const std::byte> in, int level = 1) {
  return zstd_compress_or_throw(in, level).size();
}

} // namespace dcr::codec
