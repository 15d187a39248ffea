// The relay tree across processes (transport/relay_process.hpp) and its
// stream digests (transport/relay_stream.hpp): each node and the owners'
// side built as its own process builds them, here on loopback ports of one
// test process.
#include <doctest/doctest.h>

#include <set>
#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dcr/codec/payload.hpp"
#include "dcr/transport/relay_process.hpp"

using namespace dcr;
using namespace dcr::transport;

namespace {

/// A port on 127.0.0.1 that was free a moment ago (the OS picks it).
unsigned short free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

std::vector<std::byte> small_payload(std::uint64_t attempt, std::uint32_t owner, std::uint32_t seq,
                                     std::byte value = std::byte{1}, const seal_key& key = {}) {
  item it;
  it.tensor = tensor_meta{"t", {8}, dtype_id::bf16};
  it.encoding = value_encoding::overwrite;
  it.indices = {seq % 8};
  it.values = {value, std::byte{2}};
  encode_options eo;
  eo.key = key;
  return encode_payload({attempt, 1, owner, seq}, std::vector<item>{it}, eo);
}

struct tree_of_processes {
  std::vector<net::peer_address> addrs;
  std::vector<std::unique_ptr<process_relay>> nodes;
  std::unique_ptr<process_relay> owners; // the owners' side: no node
  explicit tree_of_processes(std::uint32_t n, std::uint32_t fanout, const seal_key& key = {}) {
    for (std::uint32_t i = 0; i < n; ++i) addrs.push_back({"127.0.0.1", free_port()});
    auto opt = [&](std::optional<std::uint32_t> self) {
      process_relay_options o;
      o.nodes = addrs;
      o.self = self;
      o.fanout = fanout;
      o.key = key;
      return o;
    };
    for (std::uint32_t i = 0; i < n; ++i) nodes.push_back(std::make_unique<process_relay>(opt(i)));
    owners = std::make_unique<process_relay>(opt(std::nullopt));
  }
};

using owner_digests = std::vector<std::pair<std::uint32_t, digest128>>;

/// Reads attempt `a` at every node concurrently (a parent forwards only
/// while its own reader drains it); names and digests per node.
status read_all(tree_of_processes& t, std::uint64_t a, std::vector<std::uint32_t> owners,
                std::vector<std::multiset<std::string>>& names,
                std::vector<owner_digests>& digests) {
  const auto n = t.nodes.size();
  names.assign(n, {});
  digests.assign(n, {});
  std::vector<status> got(n, status::success());
  std::vector<std::thread> th;
  for (std::size_t i = 0; i < n; ++i)
    th.emplace_back([&, i] {
      std::atomic<bool> stop{false};
      auto r = t.nodes[i]->open_reader(a, 0, owners);
      got[i] = r.run(
          [&](std::string_view nm, std::span<const std::byte>) {
            names[i].emplace(nm);
            return status::success();
          },
          stop, std::chrono::steady_clock::now() + std::chrono::seconds(5));
      digests[i] = r.manifest_digests();
    });
  for (auto& x : th) x.join();
  for (auto& s : got) DCR_TRY(s);
  return status::success();
}

} // namespace

TEST_CASE("relay stream digest: binds attempt, owner and payload set, not the order") {
  auto d = [](int i) {
    std::vector<std::byte> b(64, std::byte(i));
    return digest(b);
  };
  seal_key key;
  REQUIRE(seal_key::make("job key", key).ok());
  const std::vector<digest128> sent{d(1), d(2), d(3)};
  const auto want = relay_stream_digest(7, 1, sent, key);
  // Delivered in another order across the tree: the same stream.
  CHECK(relay_stream_digest(7, 1, {d(3), d(1), d(2)}, key) == want);
  // A payload missing, one too many, one replaced, or the same payloads
  // under another attempt, owner or key: another stream.
  CHECK(relay_stream_digest(7, 1, {d(1), d(2)}, key) != want);
  CHECK(relay_stream_digest(7, 1, {d(1), d(2), d(3), d(3)}, key) != want);
  CHECK(relay_stream_digest(7, 1, {d(1), d(2), d(4)}, key) != want);
  CHECK(relay_stream_digest(8, 1, sent, key) != want);
  CHECK(relay_stream_digest(7, 2, sent, key) != want);
  CHECK(relay_stream_digest(7, 1, sent, seal_key{}) != want);
  // An owner that sent nothing still has a digest, which a node that
  // delivered nothing of it matches.
  CHECK(relay_stream_digest(7, 1, {}, key) == relay_stream_digest(7, 1, {}, key));
}

TEST_CASE("relay tree across processes: every node delivers each payload once, and its stream "
          "digests equal the owners'") {
  for (std::uint32_t fanout : {1u, 2u}) {
    for (bool keyed : {false, true}) {
      CAPTURE(fanout);
      CAPTURE(keyed);
      seal_key key;
      if (keyed) REQUIRE(seal_key::make("relay-process-test-key-0123", key).ok());
      tree_of_processes t(4, fanout, key);
      owner_digests sent;
      std::vector<std::thread> writers;
      std::vector<status> wrote(2, status::success());
      for (std::uint32_t o = 0; o < 2; ++o) sent.emplace_back(o, digest128{});
      for (std::uint32_t o = 0; o < 2; ++o)
        writers.emplace_back([&, o] {
          auto w = t.owners->open_writer(5, o);
          for (std::uint32_t q = 0; q < 3 && wrote[o]; ++q)
            wrote[o] = w.put_payload(small_payload(5, o, q, std::byte{1}, key));
          if (wrote[o]) wrote[o] = w.finish();
          sent[o].second = w.manifest_digest();
        });
      std::vector<std::multiset<std::string>> names;
      std::vector<owner_digests> got;
      const auto read = read_all(t, 5, {0, 1}, names, got);
      for (auto& w : writers) w.join();
      REQUIRE(wrote[0].ok());
      REQUIRE(wrote[1].ok());
      REQUIRE_MESSAGE(read.ok(), read.message);
      for (std::size_t i = 0; i < t.nodes.size(); ++i) {
        CAPTURE(i);
        CHECK(names[i].size() == 6);
        CHECK(std::set<std::string>(names[i].begin(), names[i].end()).size() == 6);
        CHECK(got[i] == sent);
      }
      CHECK(t.nodes[0]->counters_text().find("6 payloads queued") != std::string::npos);
      CHECK(t.owners->counters_text().empty());
    }
  }
}

TEST_CASE("relay tree across processes: a frame planted under an owner's name changes the node's "
          "stream digest or fails its read, never passes as the owner's") {
  tree_of_processes t(2, 2);
  {
    // A local process that knows the root's address sends (owner 0, seq 0)
    // with other bytes before the owner does.
    relay_options ro;
    ro.nodes = 2;
    process_network net(t.addrs, std::nullopt, tcp_link_options{});
    std::shared_ptr<frame_conn> c;
    REQUIRE(net.dial(0, c).ok());
    const auto forged = small_payload(3, 0, 0, std::byte{0x55});
    REQUIRE(c->write({frame_kind::payload, 3, 0, 0, forged.size()}, forged,
                     std::chrono::milliseconds(2000))
                .ok());
    frame f;
    REQUIRE(c->read(f).ok()); // acknowledged: queued at the root
    c->close();
  }
  owner_digests sent{{0, {}}};
  status wrote = status::success();
  std::thread writer([&] {
    auto w = t.owners->open_writer(3, 0);
    for (std::uint32_t q = 0; q < 2 && wrote; ++q) wrote = w.put_payload(small_payload(3, 0, q));
    if (wrote) wrote = w.finish();
    sent[0].second = w.manifest_digest();
  });
  std::vector<std::multiset<std::string>> names;
  std::vector<owner_digests> got;
  const auto read = read_all(t, 3, {0}, names, got);
  writer.join();
  if (read.ok()) {
    for (auto& g : got) CHECK(g != sent); // the coordinator's binding fails the attempt
  } else {
    CHECK(read.code != errc::ok);
  }
}

TEST_CASE("relay tree across processes: bad configurations and an owner-side reader are typed") {
  process_relay_options o;
  CHECK_THROWS_AS(process_relay{o}, dcr::error);
  o.nodes = {{"127.0.0.1", free_port()}};
  o.self = 1;
  CHECK_THROWS_AS(process_relay{o}, dcr::error);
  o.self.reset();
  o.fanout = 0;
  CHECK_THROWS_AS(process_relay{o}, dcr::error);
  o.fanout = 2;
  process_relay owners(o);
  std::atomic<bool> stop{false};
  auto r = owners.open_reader(1, 0, {0});
  const auto s =
      r.run([](std::string_view, std::span<const std::byte>) { return status::success(); }, stop,
            std::chrono::steady_clock::now() + std::chrono::seconds(1));
  CHECK(s.code == errc::invalid_argument);
  // A node address that does not resolve: the owner's first write is unavailable.
  o.nodes = {{"no-such-host.invalid", 1}};
  process_relay lost(o);
  auto w = lost.open_writer(1, 0);
  CHECK(w.put_payload(small_payload(1, 0, 0)).code == errc::unavailable);
}
