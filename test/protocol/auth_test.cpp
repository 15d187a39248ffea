// Keyed seals and the authenticated control channel. Checked: payloads,
// manifests and commit records sealed with a job key round-trip with it and
// are refused, typed, without it or with another key (and unkeyed ones by a
// keyed reader); a keyed control server serves a keyed client, refuses a
// client without the key or with another one, and refuses a replayed or
// modified frame; a keyed client refuses a server without the key.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <atomic>
#include <poll.h>
#include <random>
#include <sys/socket.h>
#include <thread>

#include "dcr/codec/payload_decode.hpp"
#include "dcr/codec/payload_encode.hpp"
#include "dcr/protocol/commit_store.hpp"
#include "dcr/protocol/control_channel.hpp"
#include "dcr/transport/attempt_objects.hpp"
#include "dcr/transport/object_store.hpp"

using namespace dcr;
using namespace dcr::protocol;

namespace {

seal_key key_of(std::string_view text) {
  seal_key k;
  throw_if_failed(seal_key::make(text, k)); // runs before doctest starts
  return k;
}

const seal_key job_key = key_of("0123456789abcdef-job-key");
const seal_key other_key = key_of("0123456789abcdef-other-key");

std::vector<std::byte> sample_payload(const seal_key& key) {
  std::mt19937_64 rng(7);
  item it;
  it.tensor = {"w", {64}, dtype_id::bf16};
  it.encoding = value_encoding::xor_mask;
  it.indices = {1, 5, 9, 40};
  it.values.resize(it.indices.size() * 2);
  for (auto& b : it.values) b = static_cast<std::byte>(rng());
  encode_options opt;
  opt.key = key;
  std::vector<std::byte> out;
  REQUIRE(codec::encode_payload({3, 4, 1, 0}, std::span<const item>(&it, 1), opt, out).ok());
  return out;
}

status decode_with(std::span<const std::byte> bytes, const seal_key& key) {
  codec::decode_limits limits;
  limits.key = key;
  decoded_payload out;
  return codec::decode_payload(bytes, out, limits);
}

channel_options keyed(const seal_key& key) {
  channel_options o;
  o.connect_timeout = std::chrono::milliseconds(1000);
  o.liveness = std::chrono::milliseconds(1000);
  o.heartbeat = std::chrono::milliseconds(50);
  o.key = key;
  return o;
}

/// A server whose every call answers its type number.
std::unique_ptr<control_server> echo_server(const seal_key& key, channel_options opt = keyed({})) {
  opt.key = key;
  auto s = std::make_unique<control_server>(
      [](const control_frame& f, const std::atomic<bool>&, body_writer& w) {
        w.u32(static_cast<std::uint32_t>(f.type));
        return status::success();
      },
      opt);
  REQUIRE(s->listen("127.0.0.1", 0).ok());
  return s;
}

int raw_connect(unsigned short port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

void raw_send(int fd, const std::vector<std::byte>& f) {
  REQUIRE(::send(fd, f.data(), f.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(f.size()));
}

} // namespace

TEST_CASE("keyed payloads: round trip with the key, typed refusal otherwise") {
  const auto keyed_bytes = sample_payload(job_key);
  const auto plain_bytes = sample_payload({});
  // Same layout: only the 16 digest bytes at offset 80 differ.
  REQUIRE(keyed_bytes.size() == plain_bytes.size());
  CHECK(std::equal(keyed_bytes.begin(), keyed_bytes.begin() + 80, plain_bytes.begin()));
  CHECK(!std::equal(keyed_bytes.begin() + 80, keyed_bytes.begin() + 96, plain_bytes.begin() + 80));
  CHECK(std::equal(keyed_bytes.begin() + 96, keyed_bytes.end(), plain_bytes.begin() + 96));

  CHECK(decode_with(keyed_bytes, job_key).ok());
  CHECK(decode_with(plain_bytes, {}).ok());
  CHECK(decode_with(keyed_bytes, other_key).code == errc::digest_mismatch);
  CHECK(decode_with(keyed_bytes, {}).code == errc::digest_mismatch);
  CHECK(decode_with(plain_bytes, job_key).code == errc::digest_mismatch);

  payload_id id;
  CHECK(read_payload_id(keyed_bytes, id, job_key).ok());
  CHECK(id.attempt == 3);
  CHECK(read_payload_id(plain_bytes, id, job_key).code == errc::digest_mismatch);
  CHECK(read_payload_id(keyed_bytes, id, other_key).code == errc::digest_mismatch);
}

TEST_CASE("seal keys: at most 64 bytes") {
  seal_key k;
  CHECK(seal_key::make(std::string(64, 'k'), k).ok());
  CHECK(k.size() == 64);
  CHECK(seal_key::make(std::string(65, 'k'), k).code == errc::invalid_argument);
}

TEST_CASE("keyed manifests: a keyed scope writes and requires keyed manifests") {
  transport::memory_object_store base;
  const std::string inc(32, 'a');
  transport::incarnation_scope<transport::memory_object_store> keyed_scope(base, inc, job_key);
  const std::vector<std::byte> payload(100, std::byte{7});
  {
    transport::attempt_writer w(keyed_scope, 5, 0);
    REQUIRE(w.put_payload(payload).ok());
    REQUIRE(w.finish().ok());
  }
  std::vector<std::byte> text_bytes;
  REQUIRE(keyed_scope.get(transport::manifest_name(5, 0), text_bytes).ok());
  const std::string_view text(reinterpret_cast<const char*>(text_bytes.data()), text_bytes.size());
  transport::manifest m;
  CHECK(transport::parse_manifest(text, m, job_key).ok());
  CHECK(m.payloads.size() == 1);
  CHECK(transport::parse_manifest(text, m).code == errc::digest_mismatch);
  CHECK(transport::parse_manifest(text, m, other_key).code == errc::digest_mismatch);

  // A keyed reader takes the keyed manifest and its payload.
  std::atomic<bool> stop{false};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  {
    transport::attempt_reader r(keyed_scope, 5, {0});
    std::size_t got = 0;
    CHECK(r.run(
               [&](std::string_view, std::span<const std::byte>) {
                 ++got;
                 return status::success();
               },
               stop, deadline)
              .ok());
    CHECK(got == 1);
  }
  // A forged manifest (sealed without the key) under the same name is refused by a keyed reader.
  transport::manifest forged = m;
  forged.payloads.clear();
  const auto forged_text = transport::serialize_manifest(forged);
  REQUIRE(
      keyed_scope.put(transport::manifest_name(5, 0), std::as_bytes(std::span(forged_text))).ok());
  {
    transport::attempt_reader r(keyed_scope, 5, {0});
    CHECK(r.run([&](std::string_view, std::span<const std::byte>) { return status::success(); },
                stop, deadline)
              .code == errc::digest_mismatch);
  }
  // ... and not listed as published.
  transport::listed_payloads listed;
  REQUIRE(transport::read_listed(keyed_scope, 5, listed).ok());
  CHECK(listed.owners.empty());
}

TEST_CASE("keyed commit records: round trip with the key, typed refusal otherwise") {
  stored_record s;
  s.revision = 2;
  s.epoch = 3;
  s.attempt = 4;
  s.record.incarnation = std::string(32, 'b');
  s.record.version = 9;
  s.record.attempt = 4;
  s.record.receivers.push_back({"r0", digest128{1, 2, 3}});
  const auto text = serialize_commit_record(s, job_key);
  stored_record back;
  REQUIRE(parse_commit_record(text, back, job_key).ok());
  CHECK(back == s);
  CHECK(parse_commit_record(text, back).code == errc::digest_mismatch);
  CHECK(parse_commit_record(text, back, other_key).code == errc::digest_mismatch);
  CHECK(parse_commit_record(serialize_commit_record(s), back, job_key).code ==
        errc::digest_mismatch);

  // A file store with the key refuses a record written without it.
  const auto dir =
      std::filesystem::temp_directory_path() / ("dcr-auth-test-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  {
    file_commit_store keyed_store(dir, job_key);
    std::uint64_t epoch = 0;
    REQUIRE(keyed_store.take_over(epoch).ok());
    stored_record r;
    REQUIRE(keyed_store.load(r).ok());
    file_commit_store plain_store(dir);
    CHECK(plain_store.load(r).code == errc::digest_mismatch);
    file_commit_store wrong_store(dir, other_key);
    CHECK(wrong_store.load(r).code == errc::digest_mismatch);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("control channel: keyed round trips; peers without the key are refused, typed") {
  auto server = echo_server(job_key);
  const peer_address peer{"127.0.0.1", server->port()};
  std::vector<std::byte> out;
  {
    control_client c(peer, keyed(job_key));
    for (int i = 0; i < 3; ++i) {
      REQUIRE(c.call(control_type::begin, 1, {}, out).ok());
      body_reader r(out);
      std::uint32_t t = 0;
      REQUIRE(r.u32(t).ok());
      CHECK(t == static_cast<std::uint32_t>(control_type::begin));
    }
  }
  {
    control_client c(peer, keyed({})); // no key
    CHECK(c.call(control_type::begin, 1, {}, out).code == errc::verification);
  }
  {
    control_client c(peer, keyed(other_key)); // another key: its first frame fails the tag
    CHECK(c.call(control_type::begin, 1, {}, out).code == errc::verification);
  }
  {
    // A keyed client refuses a server without the key.
    auto plain = echo_server({});
    control_client c({"127.0.0.1", plain->port()}, keyed(job_key));
    CHECK(c.call(control_type::begin, 1, {}, out).code == errc::verification);
    control_client p({"127.0.0.1", plain->port()}, keyed({}));
    CHECK(p.call(control_type::begin, 1, {}, out).ok()); // unkeyed: as before
  }
}

TEST_CASE("control channel: a replayed or modified frame is refused") {
  auto server = echo_server(job_key);
  for (int mode = 0; mode < 2; ++mode) {
    CAPTURE(mode);
    const int fd = raw_connect(server->port());
    control_socket sock(fd, keyed(job_key)); // owns fd
    const auto mine = new_control_nonce();
    raw_send(fd, encode_control_frame(control_type::auth_hello, 0, std::as_bytes(std::span(mine))));
    control_frame f;
    bool timed_out = false;
    const auto deadline = [] { return std::chrono::steady_clock::now() + std::chrono::seconds(5); };
    REQUIRE(sock.receive(f, deadline(), timed_out).ok());
    REQUIRE(f.type == control_type::auth_hello);
    REQUIRE(f.body.size() == control_nonce_size);
    control_nonce theirs{};
    std::memcpy(theirs.data(), f.body.data(), theirs.size());
    sock.authenticate(job_key, mine, theirs, true);

    control_mac mac{job_key, mine, theirs, 0, 0};
    const auto call0 = encode_control_frame(control_type::begin, 1, {}, &mac);
    raw_send(fd, call0);
    REQUIRE(sock.receive(f, deadline(), timed_out).ok());
    CHECK(f.type == control_type::reply_ok);

    if (mode == 0) {
      raw_send(fd, call0); // the same bytes again: sequence 0 is spent
    } else {
      mac.sequence = 1;
      auto call1 = encode_control_frame(control_type::begin, 1, {}, &mac);
      call1[8] ^= std::byte{1}; // the attempt field, after the tag was made
      raw_send(fd, call1);
    }
    REQUIRE(sock.receive(f, deadline(), timed_out).ok());
    REQUIRE(f.type == control_type::reply_err);
    body_reader br(f.body);
    std::uint16_t code = 0;
    REQUIRE(br.u16(code).ok());
    CHECK(static_cast<errc>(code) == errc::verification);
    // The server closed the connection.
    CHECK(sock.receive(f, deadline(), timed_out).code == errc::unavailable);
  }
}

TEST_CASE("control channel: before the key exchange a peer gets a few KiB, a deadline and a "
          "connection cap") {
  const auto deadline = [] { return std::chrono::steady_clock::now() + std::chrono::seconds(3); };
  SUBCASE("a header announcing a large body is refused at once, before the body is read") {
    auto server = echo_server(job_key);
    const int fd = raw_connect(server->port());
    control_socket sock(fd, keyed(job_key)); // owns fd; not authenticated
    auto f = encode_control_frame(control_type::auth_hello, 0, {});
    store_le(f.data() + 16, std::uint64_t{32} << 20); // 32 MiB, never sent
    f.resize(control_header_size);
    raw_send(fd, f);
    control_frame reply;
    bool timed_out = false;
    const auto t0 = std::chrono::steady_clock::now();
    REQUIRE(sock.receive(reply, deadline(), timed_out).ok());
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
    REQUIRE(reply.type == control_type::reply_err);
    body_reader br(reply.body);
    std::uint16_t code = 0;
    REQUIRE(br.u16(code).ok());
    CHECK(static_cast<errc>(code) == errc::length_overflow);
    CHECK(sock.receive(reply, deadline(), timed_out).code == errc::unavailable); // dropped
  }
  SUBCASE("a connection that never sends its hello is dropped after the hello timeout") {
    auto o = keyed({});
    o.hello_timeout = std::chrono::milliseconds(300);
    auto server = echo_server(job_key, o);
    const int fd = raw_connect(server->port());
    control_socket sock(fd, keyed(job_key));
    control_frame f;
    bool timed_out = false;
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(sock.receive(f, deadline(), timed_out).code == errc::unavailable);
    CHECK_FALSE(timed_out);
    const auto took = std::chrono::steady_clock::now() - t0;
    CHECK(took >= std::chrono::milliseconds(250));
    CHECK(took < std::chrono::milliseconds(2500));
    // A keyed client still gets through.
    control_client c({"127.0.0.1", server->port()}, keyed(job_key));
    std::vector<std::byte> out;
    CHECK(c.call(control_type::begin, 1, {}, out).ok());
  }
  SUBCASE("past the connection cap a new connection is closed on accept") {
    auto o = keyed({});
    o.max_connections = 2;
    auto server = echo_server(job_key, o);
    const int a = raw_connect(server->port()), b = raw_connect(server->port());
    std::this_thread::sleep_for(std::chrono::milliseconds(200)); // both accepted
    const int c = raw_connect(server->port());
    pollfd pf{c, POLLIN, 0};
    REQUIRE(::poll(&pf, 1, 3000) == 1);
    char byte = 0;
    CHECK(::recv(c, &byte, 1, 0) == 0); // closed, nothing sent
    // The two held connections are still open (nothing to read yet).
    pollfd held[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
    CHECK(::poll(held, 2, 100) == 0);
    for (int fd : {a, b, c}) ::close(fd);
  }
}

TEST_CASE("control channel: a key exchange refused by an unauthenticated reply fails as "
          "verification, never as the code it claims") {
  // A listener that answers the hello with a forged refusal (`conflict`:
  // "a fenced coordinator acted"), which it cannot tag without the key.
  int lfd = -1;
  unsigned short port = 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(net::listen_tcp(a, "forger: ", lfd, port).ok());
  std::thread forger([lfd] {
    pollfd pf{lfd, POLLIN, 0};
    if (::poll(&pf, 1, 5000) != 1) return;
    const int fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    std::vector<std::byte> hello(control_header_size + control_nonce_size + control_trailer_size);
    (void)::recv(fd, hello.data(), hello.size(), MSG_WAITALL);
    body_writer w;
    w.u16(static_cast<std::uint16_t>(errc::conflict)).str("fenced: stop this coordinator");
    const auto f = encode_control_frame(control_type::reply_err, 0, w.bytes());
    (void)::send(fd, f.data(), f.size(), MSG_NOSIGNAL);
    char c = 0;
    (void)::recv(fd, &c, 1, 0); // until the client closes
    ::close(fd);
  });
  control_client c({"127.0.0.1", port}, keyed(job_key));
  std::vector<std::byte> out;
  const auto s = c.call(control_type::begin, 1, {}, out);
  CHECK(s.code == errc::verification);
  CHECK(s.message.find("unauthenticated") != std::string::npos);
  c.disconnect();
  forger.join();
  ::close(lfd);
}

TEST_CASE("control server, unkeyed: a call far past the newest attempt is refused before its "
          "handler runs; keyed, any attempt is taken") {
  constexpr std::uint64_t far = std::uint64_t{1} << 63;
  for (bool with_key : {false, true}) {
    CAPTURE(with_key);
    std::atomic<std::uint64_t> newest{0}; // what the handler fenced to
    auto o = keyed(with_key ? job_key : seal_key{});
    o.attempt_window = 16;
    control_server server(
        [&](const control_frame& f, const std::atomic<bool>&, body_writer&) {
          auto n = newest.load();
          while (f.attempt > n && !newest.compare_exchange_weak(n, f.attempt)) {
          }
          return f.attempt < newest.load() ? fail(errc::stale_attempt, "fenced")
                                           : status::success();
        },
        o);
    REQUIRE(server.listen("127.0.0.1", 0).ok());
    control_client c({"127.0.0.1", server.port()}, o);
    std::vector<std::byte> out;
    REQUIRE(c.call(control_type::begin, 5, {}, out).ok());
    const auto s = c.call(control_type::begin, far, {}, out);
    if (with_key) {
      CHECK(s.ok());
      CHECK(newest == far);
      continue;
    }
    CHECK(s.code == errc::invalid_argument);
    CHECK(c.call(control_type::publish, 5 + 17, {}, out).code == errc::invalid_argument);
    CHECK(newest == 5);                                       // nothing fenced
    CHECK(c.call(control_type::begin, 6, {}, out).ok());      // the real next attempt
    CHECK(c.call(control_type::begin, 6 + 16, {}, out).ok()); // inside the window
    CHECK(newest == 6 + 16);
  }
}
