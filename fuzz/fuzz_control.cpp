// libFuzzer target: the control channel's frame decoder and the body parsers
// of every owner and rollout-node call. The first byte picks the path: raw
// frame bytes, or a call body wrapped in a correctly sealed frame (random
// bytes would never pass the frame digest) and dispatched through
// `owner_service` / `node_service` over links that accept everything. No
// input may crash, hang, read out of bounds or allocate past its size.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "dcr/protocol/control_frame.hpp"
#include "dcr/protocol/remote_links.hpp"

namespace {

using namespace dcr;
using namespace dcr::protocol;

struct accepting_owner {
  std::uint32_t owner_id() const { return 1; }
  status publish(const publish_request&, const std::atomic<bool>&, publish_report&) {
    return status::success();
  }
  status commit_baseline(std::uint64_t, std::uint64_t) { return status::success(); }
  status baseline_digest(digest128&) { return status::success(); }
  status candidate_digest(digest128&) { return status::success(); }
};

struct accepting_node {
  std::vector<std::string> ids() const { return {"r0"}; }
  status down(std::size_t& n) {
    n = 0;
    return status::success();
  }
  status ensure_member(const membership&, std::size_t& n) {
    n = 0;
    return status::success();
  }
  status begin(std::uint64_t) { return status::success(); }
  status close_gate(std::uint64_t) { return status::success(); }
  status open_gate(std::uint64_t) { return status::success(); }
  status refit(const refit_request&, const std::atomic<bool>&, refit_result& r) {
    r.acks.assign(1, {});
    return status::success();
  }
  status acknowledge(std::uint64_t, std::vector<digest128>& a) {
    a.assign(1, {});
    return status::success();
  }
  status staged_payloads(std::uint64_t, std::vector<staged_set>&) { return status::success(); }
  status kill(const std::string&) { return status::success(); }
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const auto bytes = std::as_bytes(std::span(data + 1, size - 1));
  if (data[0] % 2 == 0) {
    control_frame f;
    if (decode_control_frame(bytes, max_control_body, f).ok()) {
      // What decodes must encode back to the same bytes.
      const auto again = encode_control_frame(f.type, f.attempt, f.body);
      if (again.size() != bytes.size() || !std::equal(again.begin(), again.end(), bytes.begin()))
        std::abort();
    }
    return 0;
  }
  static accepting_owner owner;
  static accepting_node node;
  static owner_service<accepting_owner> os(owner);
  static node_service<accepting_node> ns(node);
  const auto type = static_cast<std::uint16_t>(data[0] >> 1);
  if (!known_control_type(type)) return 0;
  const auto frame = encode_control_frame(static_cast<control_type>(type), 3, bytes);
  control_frame f;
  if (!decode_control_frame(frame, max_control_body, f).ok()) std::abort();
  std::atomic<bool> stop{false};
  body_writer out;
  if (type < 16)
    (void)os(f, stop, out);
  else
    (void)ns(f, stop, out);
  return 0;
}
