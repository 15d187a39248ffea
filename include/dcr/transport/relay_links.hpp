#pragma once
/// \file
/// Links of a relay tree: the `relay_network` interface that makes them, and
/// in-process pipes (`inproc_network`) for tests and single-process runs;
/// TCP links are in relay_tcp.hpp. A link carries checked frames
/// (relay_frame.hpp).

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "dcr/core/error.hpp"
#include "dcr/pipeline/bounded_queue.hpp"
#include "dcr/transport/relay_frame.hpp"

namespace dcr::transport {

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
  static std::pair<std::shared_ptr<inproc_conn>, std::shared_ptr<inproc_conn>>
  pipe(std::size_t frames, std::uint64_t max_body) {
    auto a = std::make_shared<queue>(std::max<std::size_t>(frames, 1));
    auto b = std::make_shared<queue>(std::max<std::size_t>(frames, 1));
    return {std::make_shared<inproc_conn>(a, b, max_body),
            std::make_shared<inproc_conn>(b, a, max_body)};
  }
  inproc_conn(std::shared_ptr<queue> out, std::shared_ptr<queue> in, std::uint64_t max_body)
      : out_(std::move(out)), in_(std::move(in)), max_(max_body) {}

  status write(const frame_header& h, std::span<const std::byte> body,
               std::chrono::milliseconds timeout) override {
    switch (out_->push_until(encode_frame(h, body), detail::after(timeout))) {
    case pipeline::queue_wait::ok:
      return status::success();
    case pipeline::queue_wait::closed:
      return fail(errc::unavailable, "relay link closed");
    case pipeline::queue_wait::timeout:
      break;
    }
    return fail(errc::unavailable,
                "relay link: peer took no frame for " + std::to_string(timeout.count()) + " ms");
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
  explicit inproc_network(std::size_t pipe_frames = 2,
                          std::uint64_t max_body = default_max_frame_body)
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
      DCR_RETURN_ERROR_IF(!accept_ || node >= nodes_, unavailable,
                          "relay node " + std::to_string(node) + " unreachable");
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

} // namespace dcr::transport
