// Remote roles: the coordinator drives owner and rollout-node processes
// (here: services on loopback TCP in this process, each with its own local
// link to the object store) through proxies, with the same code that drives
// local links. Checked: remote refits equal in-process refits and a dense
// refit byte for byte over random configurations; replaced attempts are
// refused as in-process; a dead or silent peer fails within the deadline;
// bad frames give typed errors.
#include <doctest/doctest.h>

#include <random>
#include <thread>

#include "dcr/protocol/control_channel.hpp"
#include "dcr/protocol/control_frame.hpp"
#include "dcr/protocol/coordinator.hpp"
#include "dcr/protocol/remote_links.hpp"
#include "models.hpp"

using namespace dcr;
using namespace dcr::protocol;
using namespace dcr::test_models;
using store_t = transport::memory_object_store;
using clk = std::chrono::steady_clock;

namespace {

channel_options fast_channel() {
  channel_options o;
  o.connect_timeout = std::chrono::milliseconds(1000);
  o.liveness = std::chrono::milliseconds(600);
  o.heartbeat = std::chrono::milliseconds(50);
  return o;
}

/// One configuration of the training and rollout side, run either through
/// local links or through remote ones; everything else is the same.
struct cluster_rig {
  using endpoint_t = receiver_endpoint<model_receiver>;
  using owner_link_t = local_owner_link<model_owner, store_t>;
  using node_link_t = local_node_link<model_receiver, store_t>;

  std::vector<tensor_meta> metas = canonical_tensors(small_llama());
  trainer_state trainer;
  std::vector<std::unique_ptr<model_owner>> owners;
  store_t objects;
  memory_commit_store commits;
  std::vector<std::unique_ptr<request_gate>> gates;
  std::vector<std::unique_ptr<endpoint_t>> endpoints;
  std::vector<std::vector<endpoint_t*>> nodes;

  // Role side: local links and their services.
  std::vector<std::unique_ptr<owner_link_t>> owner_links;
  std::vector<std::unique_ptr<node_link_t>> node_links;
  std::vector<std::unique_ptr<owner_service<owner_link_t>>> owner_services;
  std::vector<std::unique_ptr<node_service<node_link_t>>> node_services;
  std::vector<std::unique_ptr<control_server>> servers;
  // Coordinator side: proxies.
  std::vector<std::unique_ptr<remote_owner_link>> remote_owners;
  std::vector<std::unique_ptr<remote_node_link>> remote_nodes;

  cluster_rig(std::uint64_t seed, int n_owners, const std::vector<int>& receivers_per_node)
      : trainer(trainer_state::make(metas, seed)) {
    for (int k = 0; k < n_owners; ++k)
      owners.push_back(std::make_unique<model_owner>(
          static_cast<std::uint32_t>(k), static_cast<std::uint32_t>(n_owners), &trainer, 2));
    int r = 0;
    for (int per : receivers_per_node) {
      nodes.emplace_back();
      for (int i = 0; i < per; ++i, ++r) {
        const std::string id = "node" + std::to_string(nodes.size() - 1) + "-r" + std::to_string(i);
        gates.push_back(std::make_unique<request_gate>());
        endpoints.push_back(std::make_unique<endpoint_t>(
            id, [this, id] { return std::make_unique<model_receiver>(id, metas); },
            [this](model_receiver& m) { return dense_refit(m); }, gates.back().get()));
        nodes.back().push_back(endpoints.back().get());
      }
    }
    for (auto& o : owners) owner_links.push_back(std::make_unique<owner_link_t>(*o, objects));
    for (std::size_t n = 0; n < nodes.size(); ++n)
      node_links.push_back(std::make_unique<node_link_t>(nodes[n], objects, n));
  }

  /// Start one control server per owner and node, and the proxies to them.
  void serve() {
    for (std::size_t k = 0; k < owner_links.size(); ++k) {
      owner_services.push_back(std::make_unique<owner_service<owner_link_t>>(*owner_links[k]));
      servers.push_back(std::make_unique<control_server>(
          [s = owner_services.back().get()](const control_frame& f, const std::atomic<bool>& st,
                                            body_writer& out) { return (*s)(f, st, out); },
          fast_channel()));
      REQUIRE(servers.back()->listen("127.0.0.1", 0).ok());
      remote_owners.push_back(std::make_unique<remote_owner_link>(
          owners[k]->owner_id(), peer_address{"127.0.0.1", servers.back()->port()},
          fast_channel()));
      REQUIRE(remote_owners.back()->connect().ok());
    }
    for (auto& nl : node_links) {
      node_services.push_back(std::make_unique<node_service<node_link_t>>(*nl));
      servers.push_back(std::make_unique<control_server>(
          [s = node_services.back().get()](const control_frame& f, const std::atomic<bool>& st,
                                           body_writer& out) { return (*s)(f, st, out); },
          fast_channel()));
      REQUIRE(servers.back()->listen("127.0.0.1", 0).ok());
      remote_nodes.push_back(std::make_unique<remote_node_link>(
          peer_address{"127.0.0.1", servers.back()->port()}, fast_channel()));
      REQUIRE(remote_nodes.back()->connect().ok());
    }
  }

  status dense_refit(model_receiver& m) {
    for (std::size_t t = 0; t < metas.size(); ++t)
      m.tensors()[t].bytes = owners[t % owners.size()]->baseline(t)->bytes;
    return status::success();
  }

  template <class Links>
  static std::vector<typename Links::value_type::pointer> ptrs(Links& v) {
    std::vector<typename Links::value_type::pointer> p;
    for (auto& x : v) p.push_back(x.get());
    return p;
  }

  /// Every receiver equals a dense load of the committed version and serves
  /// its committed digest.
  void check_dense(std::uint64_t version) {
    stored_record cur;
    REQUIRE(commits.load(cur).ok());
    CHECK(cur.record.version == version);
    REQUIRE(cur.record.receivers.size() == endpoints.size());
    for (std::size_t r = 0; r < endpoints.size(); ++r) {
      INFO("receiver " << endpoints[r]->id());
      REQUIRE(endpoints[r]->alive());
      endpoints[r]->with_receiver([&](model_receiver& m) {
        for (std::size_t t = 0; t < metas.size(); ++t) {
          CHECK(m.tensors()[t].bytes == owners[t % owners.size()]->baseline(t)->bytes);
          CHECK(m.tensors()[t].bytes == trainer.tensors[t].bytes);
        }
        CHECK(cur.record.receivers[r].receiver == endpoints[r]->id());
        CHECK(cur.record.receivers[r].state == m.state_digest());
      });
    }
  }
  std::vector<digest128> receiver_digests() {
    std::vector<digest128> d;
    for (auto& e : endpoints)
      d.push_back(e->with_receiver([](model_receiver& m) { return m.state_digest(); }));
    return d;
  }
};

template <class C>
void run_steps(cluster_rig& s, C& c, int steps, std::uint64_t seed, int kill_at,
               std::vector<std::vector<digest128>>& digests) {
  REQUIRE(c.take_over().ok());
  REQUIRE(c.bootstrap().ok());
  s.check_dense(0);
  for (int step = 1; step <= steps; ++step) {
    s.trainer.step(0.05, seed * 31 + static_cast<std::uint64_t>(step));
    if (step == kill_at)
      support::kill_after(*s.endpoints[static_cast<std::size_t>(step) % s.endpoints.size()], 1);
    auto rep = c.transition();
    INFO("step " << step << ": " << rep.result.message);
    REQUIRE(rep.result.ok());
    CHECK(rep.attempts.size() == (step == kill_at ? 2u : 1u));
    s.check_dense(static_cast<std::uint64_t>(step));
    digests.push_back(s.receiver_digests());
  }
}

} // namespace

TEST_CASE("remote links: refits equal in-process refits and a dense refit, byte for byte") {
  std::mt19937_64 rng(20261203);
  for (int config = 0; config < 6; ++config) {
    const int n_owners = 1 + static_cast<int>(rng() % 3);
    std::vector<int> per_node(1 + rng() % 3);
    for (auto& p : per_node) p = 1 + static_cast<int>(rng() % 2);
    const bool async = rng() % 2;
    const int kill_at = 1 + static_cast<int>(rng() % 4); // 4: no kill in 3 steps
    const std::uint64_t seed = rng();
    INFO("config " << config << ": " << n_owners << " owners, " << per_node.size()
                   << " nodes, async " << async << ", kill at step " << kill_at);
    coordinator_options opt;
    opt.mode = async ? rl_mode::asynchronous : rl_mode::synchronous;
    opt.attempt_deadline = std::chrono::milliseconds(5000);

    std::vector<std::vector<digest128>> local_d, remote_d;
    {
      cluster_rig s(seed, n_owners, per_node);
      auto ol = cluster_rig::ptrs(s.owner_links);
      auto nl = cluster_rig::ptrs(s.node_links);
      link_coordinator<cluster_rig::owner_link_t, cluster_rig::node_link_t, store_t,
                       memory_commit_store>
          c(s.commits, s.objects, ol, nl, opt);
      run_steps(s, c, 3, seed, kill_at, local_d);
    }
    {
      cluster_rig s(seed, n_owners, per_node);
      s.serve();
      auto ol = cluster_rig::ptrs(s.remote_owners);
      auto nl = cluster_rig::ptrs(s.remote_nodes);
      link_coordinator<remote_owner_link, remote_node_link, store_t, memory_commit_store> c(
          s.commits, s.objects, ol, nl, opt);
      run_steps(s, c, 3, seed, kill_at, remote_d);
    }
    CHECK(local_d == remote_d);
  }
}

TEST_CASE("remote links: a coordinator crash after the first ACK; a successor takes over") {
  cluster_rig s(7, 2, {2, 1});
  s.serve();
  auto ol = cluster_rig::ptrs(s.remote_owners);
  auto nl = cluster_rig::ptrs(s.remote_nodes);
  using coord_t =
      link_coordinator<remote_owner_link, remote_node_link, store_t, memory_commit_store>;
  {
    link_coordinator<remote_owner_link, remote_node_link, store_t, memory_commit_store,
                     support::crash_at>
        c(s.commits, s.objects, ol, nl, {}, support::crash_at(crash_point::after_first_ack));
    REQUIRE(c.take_over().ok());
    REQUIRE(c.bootstrap().ok());
    s.trainer.step(0.05, 1);
    CHECK_FALSE(c.transition().result.ok());
    CHECK(c.dead());
  }
  coord_t c2(s.commits, s.objects, ol, nl);
  REQUIRE(c2.take_over().ok());
  auto rep = c2.transition();
  REQUIRE(rep.result.ok());
  CHECK(rep.attempts.front().mode == refit_mode::overwrite_all);
  s.check_dense(1);
}

TEST_CASE("remote links: a replaced attempt's calls are refused exactly as in-process") {
  cluster_rig s(3, 1, {2});
  s.serve();
  auto& local = *s.node_links[0];
  auto& remote = *s.remote_nodes[0];
  std::size_t n = 0;
  REQUIRE(remote.ensure_member({}, n).ok());
  CHECK(n == 2);
  std::atomic<bool> stop{false};
  REQUIRE(remote.begin(5).ok());
  refit_request rq{4, "", {0}, true, 4, clk::now() + std::chrono::seconds(2)};
  refit_result res;
  const auto remote_st = remote.refit(rq, stop, res);
  const auto local_st = local.refit(rq, stop, res);
  CHECK(remote_st.code == errc::stale_attempt);
  CHECK(local_st.code == errc::stale_attempt);
  std::vector<digest128> acks;
  CHECK(remote.acknowledge(4, acks).code == errc::stale_attempt);
  CHECK(local.acknowledge(4, acks).code == errc::stale_attempt);
  REQUIRE(remote.acknowledge(5, acks).ok());
  CHECK(acks.size() == 2);
  // Gate operations of a replaced attempt are ignored: the gate stays closed.
  REQUIRE(remote.close_gate(6).ok());
  REQUIRE(remote.open_gate(5).ok());
  CHECK_FALSE(s.gates[0]->is_open());
  REQUIRE(remote.open_gate(6).ok());
  CHECK(s.gates[0]->is_open());
  // Owners: a publish of an older attempt than one already published.
  publish_report rep;
  publish_request p{9, 1, refit_mode::mixed, "", 2};
  REQUIRE(s.remote_owners[0]->publish(p, stop, rep).ok());
  p.attempt = 8;
  CHECK(s.remote_owners[0]->publish(p, stop, rep).code == errc::stale_attempt);
  CHECK(s.owner_links[0]->publish(p, stop, rep).code == errc::stale_attempt);
}

TEST_CASE("remote links: a dead or silent peer fails within the stated deadline") {
  cluster_rig s(5, 1, {1});
  s.serve();
  digest128 d{};
  REQUIRE(s.remote_owners[0]->baseline_digest(d).ok());
  // The owner's process is gone: its port refuses.
  s.servers[0]->shutdown();
  auto t0 = clk::now();
  CHECK(s.remote_owners[0]->baseline_digest(d).code == errc::unavailable);
  CHECK(clk::now() - t0 < std::chrono::milliseconds(1500));

  // A peer that accepts and then never answers (frozen process).
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(fd, 4) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  remote_node_link silent(peer_address{"127.0.0.1", ntohs(a.sin_port)}, fast_channel());
  t0 = clk::now();
  const auto st = silent.connect();
  const auto took = clk::now() - t0;
  CHECK(st.code == errc::unavailable);
  CHECK(took >= std::chrono::milliseconds(500));
  CHECK(took < std::chrono::milliseconds(2000));
  ::close(fd);

  // A node stopped in the middle of a refit: the call ends (aborted),
  // nothing hangs.
  std::size_t n = 0;
  REQUIRE(s.remote_nodes[0]->ensure_member({}, n).ok());
  REQUIRE(s.remote_nodes[0]->begin(3).ok());
  std::atomic<bool> stop{false};
  refit_request rq{3, "", {0}, true, 4, clk::now() + std::chrono::seconds(30)};
  refit_result res;
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    s.servers[1]->shutdown();
  });
  t0 = clk::now();
  CHECK(s.remote_nodes[0]->refit(rq, stop, res).code == errc::aborted);
  CHECK(clk::now() - t0 < std::chrono::milliseconds(3000));
  stopper.join();

  // A peer whose process dies in the middle of a call (it took the call,
  // answered with heartbeats, then its socket closed): unavailable, at once.
  const int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(lfd >= 0);
  sockaddr_in b{};
  b.sin_family = AF_INET;
  b.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(lfd, reinterpret_cast<sockaddr*>(&b), sizeof b) == 0);
  REQUIRE(::listen(lfd, 4) == 0);
  len = sizeof b;
  REQUIRE(::getsockname(lfd, reinterpret_cast<sockaddr*>(&b), &len) == 0);
  std::thread dying([&] {
    const int c = ::accept(lfd, nullptr, nullptr);
    if (c < 0) return;
    const auto beat = encode_control_frame(control_type::heartbeat, 3, {});
    for (int i = 0; i < 3; ++i) {
      (void)::send(c, beat.data(), beat.size(), MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ::close(c);
  });
  remote_node_link victim(peer_address{"127.0.0.1", ntohs(b.sin_port)}, fast_channel());
  t0 = clk::now();
  CHECK(victim.begin(3).code == errc::unavailable);
  CHECK(clk::now() - t0 < std::chrono::milliseconds(1500));
  dying.join();
  ::close(lfd);
}

TEST_CASE("remote links: a stop reaches the call running at the peer") {
  cluster_rig s(5, 1, {1});
  s.serve();
  std::size_t n = 0;
  REQUIRE(s.remote_nodes[0]->ensure_member({}, n).ok());
  REQUIRE(s.remote_nodes[0]->begin(3).ok());
  std::atomic<bool> stop{false};
  // No owner publishes: the node would wait until the deadline.
  refit_request rq{3, "", {0}, true, 4, clk::now() + std::chrono::seconds(30)};
  refit_result res;
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    stop = true;
  });
  const auto t0 = clk::now();
  CHECK(s.remote_nodes[0]->refit(rq, stop, res).code == errc::aborted);
  CHECK(clk::now() - t0 < std::chrono::milliseconds(2000));
  stopper.join();
}

TEST_CASE("control frames: round trip and a typed error for every malformation") {
  body_writer w;
  w.u64(42).str("incarnation").u8(1).dig(digest128{1, 2, 3});
  const auto f = encode_control_frame(control_type::refit, 7, w.bytes());
  control_frame out;
  REQUIRE(decode_control_frame(f, max_control_body, out).ok());
  CHECK(out.type == control_type::refit);
  CHECK(out.attempt == 7);
  CHECK(out.body == w.bytes());

  auto mutate = [&](auto&& change) {
    auto g = f;
    change(g);
    return decode_control_frame(g, max_control_body, out).code;
  };
  CHECK(mutate([](auto& g) { g.resize(10); }) == errc::truncated);
  CHECK(mutate([](auto& g) { g.pop_back(); }) == errc::truncated);
  CHECK(mutate([](auto& g) { g.push_back(std::byte{0}); }) == errc::trailing_bytes);
  CHECK(mutate([](auto& g) { g[0] = std::byte{'X'}; }) == errc::bad_magic);
  CHECK(mutate([](auto& g) { g[4] = std::byte{9}; }) == errc::unsupported_version);
  CHECK(mutate([](auto& g) { g[6] = std::byte{99}; }) == errc::bad_format);
  CHECK(mutate([](auto& g) { g[30] ^= std::byte{1}; }) == errc::digest_mismatch);
  CHECK(mutate([](auto& g) { g[8] ^= std::byte{1}; }) == errc::digest_mismatch);
  CHECK(mutate([](auto& g) { g.back() ^= std::byte{1}; }) == errc::digest_mismatch);
  CHECK(decode_control_frame(f, 8, out).code == errc::length_overflow);

  // Bodies: every read bounded, the whole body consumed, counts bounded.
  body_reader r(w.bytes());
  std::uint64_t v = 0;
  std::string s;
  REQUIRE(r.u64(v).ok());
  CHECK(r.done().code == errc::trailing_bytes);
  REQUIRE(r.str(s).ok());
  CHECK(s == "incarnation");
  std::uint8_t b = 0;
  REQUIRE(r.u8(b).ok());
  digest128 d{};
  REQUIRE(r.dig(d).ok());
  CHECK(r.done().ok());
  CHECK(r.u8(b).code == errc::truncated);
  body_writer huge;
  huge.u32(1u << 30);
  body_reader hr(huge.bytes());
  std::uint32_t n = 0;
  CHECK(hr.count(n, 4).code == errc::length_overflow);
  body_writer long_str;
  long_str.u32(100);
  body_reader lr(long_str.bytes());
  CHECK(lr.str(s).code == errc::truncated);
}

TEST_CASE("control server: a bad frame or a malformed call gets its typed error back") {
  cluster_rig s(5, 1, {1});
  s.serve();
  const peer_address peer{"127.0.0.1", s.servers[1]->port()}; // the node
  {
    // Garbage instead of a frame: bad_magic comes back, then the stream closes.
    auto f = encode_control_frame(control_type::begin, 3, {});
    f[0] = std::byte{'Z'};
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(peer.port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::send(fd, f.data(), f.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(f.size()));
    std::vector<std::byte> reply(256);
    std::size_t got = 0;
    for (;;) {
      const auto k = ::recv(fd, reply.data() + got, reply.size() - got, 0);
      if (k <= 0) break;
      got += static_cast<std::size_t>(k);
    }
    ::close(fd);
    reply.resize(got);
    control_frame rf;
    REQUIRE(decode_control_frame(reply, max_control_body, rf).ok());
    CHECK(rf.type == control_type::reply_err);
    body_reader br(rf.body);
    std::uint16_t code = 0;
    REQUIRE(br.u16(code).ok());
    CHECK(static_cast<errc>(code) == errc::bad_magic);
  }
  {
    // A well-framed call with a malformed body: the call's typed error, and
    // the connection stays usable.
    control_client c(peer, fast_channel());
    std::vector<std::byte> out;
    body_writer w;
    w.u32(5); // refit body cut short
    CHECK(c.call(control_type::refit, 3, w.bytes(), out).code == errc::truncated);
    CHECK(c.call(control_type::publish, 3, {}, out).code == errc::bad_format); // not a node call
    CHECK(c.call(control_type::node_hello, 0, {}, out).ok());
  }
}

TEST_CASE("owner service: the baseline moves only after the commit it can verify") {
  cluster_rig s(9, 1, {1});
  auto& link = *s.owner_links[0];
  memory_commit_store commits;
  int moved = 0;
  owner_hooks hooks;
  hooks.verify_commit = [&](std::uint64_t tau, std::uint64_t v) -> status {
    stored_record r;
    DCR_TRY(commits.load(r));
    DCR_RETURN_ERROR_IF(r.revision == 0 || r.record.version != v || r.record.attempt != tau,
                        verification, "not committed");
    return status::success();
  };
  hooks.committed = [&](std::uint64_t) { ++moved; };
  owner_service<cluster_rig::owner_link_t> service(link, hooks);
  control_server server([&](const control_frame& f, const std::atomic<bool>& st,
                            body_writer& out) { return service(f, st, out); },
                        fast_channel());
  REQUIRE(server.listen("127.0.0.1", 0).ok());
  remote_owner_link owner(0, peer_address{"127.0.0.1", server.port()}, fast_channel());
  REQUIRE(owner.connect().ok());
  remote_owner_link wrong(1, peer_address{"127.0.0.1", server.port()}, fast_channel());
  CHECK(wrong.connect().code == errc::verification);

  s.trainer.step(0.05, 3);
  digest128 before{}, cand{}, after{};
  REQUIRE(owner.baseline_digest(before).ok());
  REQUIRE(owner.candidate_digest(cand).ok());
  REQUIRE(before != cand);
  // No record: refused, baseline unchanged.
  CHECK(owner.commit_baseline(2, 1).code == errc::verification);
  REQUIRE(owner.baseline_digest(after).ok());
  CHECK(after == before);
  CHECK(moved == 0);
  // K^1 committed by attempt 2: a commit of another attempt is refused, the right one moves it.
  std::uint64_t epoch = 0, tau = 0;
  REQUIRE(commits.take_over(epoch).ok());
  REQUIRE(commits.prepare(epoch, tau).ok());
  REQUIRE(commits.prepare(epoch, tau).ok());
  commit_record k;
  k.version = 1;
  k.attempt = tau;
  k.incarnation = new_incarnation();
  REQUIRE(commits.compare_and_set(epoch, tau, 0, k).ok());
  CHECK(owner.commit_baseline(tau - 1, 1).code == errc::verification);
  REQUIRE(owner.baseline_digest(after).ok());
  CHECK(after == before);
  REQUIRE(owner.commit_baseline(tau, 1).ok());
  REQUIRE(owner.baseline_digest(after).ok());
  CHECK(after == cand);
  CHECK(moved == 1);
}
