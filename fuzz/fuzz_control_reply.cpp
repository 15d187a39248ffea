// libFuzzer target: the coordinator's side of the control channel, the
// decoding of every call's reply (publish report, refit result, staged
// payloads, node ids, ...) and of error replies. A control server on
// loopback answers each call with the input's bytes as its reply body; the
// first byte picks the call, made through `remote_owner_link` /
// `remote_node_link` exactly as the coordinator makes it, so the decoders
// under test are the ones that run. The same bytes also go to
// `decode_error_reply`. No input may crash, hang, read out of bounds or
// allocate past its size; a reply whose decoding succeeds must have
// consumed every byte.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "dcr/protocol/control_channel.hpp"
#include "dcr/protocol/remote_links.hpp"

namespace {

using namespace dcr;
using namespace dcr::protocol;

std::mutex reply_m;
std::vector<std::byte> reply; // the body the server answers with

struct rig {
  channel_options opt = [] {
    channel_options o;
    o.connect_timeout = std::chrono::milliseconds(2000);
    o.liveness = std::chrono::milliseconds(5000);
    return o;
  }();
  control_server server{[](const control_frame&, const std::atomic<bool>&, body_writer& out) {
                          std::lock_guard l(reply_m);
                          out.bytes() = reply;
                          return status::success();
                        },
                        opt};
  std::unique_ptr<remote_owner_link> owner;
  std::unique_ptr<remote_node_link> node;
  rig() {
    if (!server.listen("127.0.0.1", 0)) std::abort();
    owner = std::make_unique<remote_owner_link>(1, peer_address{"127.0.0.1", server.port()}, opt);
    node = std::make_unique<remote_node_link>(peer_address{"127.0.0.1", server.port()}, opt);
  }
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  static rig r;
  {
    std::lock_guard l(reply_m);
    reply.assign(reinterpret_cast<const std::byte*>(data + 1),
                 reinterpret_cast<const std::byte*>(data + size));
  }
  (void)decode_error_reply(std::span<const std::byte>(reply), "fuzz");
  std::atomic<bool> stop{false};
  status s;
  switch (data[0] % 15) {
  case 0:
    s = r.owner->connect();
    break;
  case 1: {
    publish_request rq;
    rq.attempt = 1;
    rq.target_version = 1;
    publish_report rep;
    s = r.owner->publish(rq, stop, rep);
    if (s && rep.payload_digests.size() > size / 16) std::abort();
    break;
  }
  case 2:
    s = r.owner->commit_baseline(1, 1);
    break;
  case 3: {
    digest128 d{};
    s = r.owner->baseline_digest(d);
    break;
  }
  case 4: {
    digest128 d{};
    s = r.owner->candidate_digest(d);
    break;
  }
  case 5:
    s = r.owner->export_dense(1, "inc");
    break;
  case 6:
    s = r.node->connect();
    break;
  case 7: {
    std::size_t n = 0;
    s = r.node->down(n);
    break;
  }
  case 8: {
    membership m{1, "inc", {{"r0", digest128{}}}};
    std::size_t n = 0;
    s = r.node->ensure_member(m, n);
    break;
  }
  case 9: {
    std::vector<bool> equal;
    std::vector<digest128> digests;
    s = r.node->verify(1, "inc", equal, digests);
    if (s && (equal.size() != digests.size() || equal.size() > size / 17)) std::abort();
    break;
  }
  case 10:
    s = r.node->begin(1);
    break;
  case 11: {
    refit_request rq;
    rq.attempt = 1;
    rq.incarnation = "inc";
    rq.owners = {0};
    rq.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    refit_result res;
    s = r.node->refit(rq, stop, res);
    if (s && res.acks.size() + res.manifests.size() > size / 16) std::abort();
    break;
  }
  case 12: {
    std::vector<digest128> acks;
    s = r.node->acknowledge(1, acks);
    if (s && acks.size() > size / 16) std::abort();
    break;
  }
  case 13: {
    std::vector<staged_set> sets;
    s = r.node->staged_payloads(1, sets);
    if (s && sets.size() > size / 8) std::abort();
    break;
  }
  default:
    s = r.node->kill("r0");
  }
  // A reply the server sent always arrives (loopback); only its decoding fails.
  if (s.code == errc::unavailable) std::abort();
  return 0;
}
