// HTTPS in net::http_client and the backends over it (built with
// dcr-net built with TLS). Suite 'unit' (the default): URL forms, option checks, and
// handshakes against scripted loopback peers that stall or do not speak TLS.
// Suite 'interop' (--interop): a real etcd serving TLS with certificates made
// here by the openssl command line: the commit store laws over https, an
// untrusted CA, a wrong name, plain http against the TLS port, client
// certificate authentication. Suite 'swift' (--swift): the S3 object store
// over https against Swift's proxy serving TLS. --interop and --swift exit 77
// (skip) only when the servers' binaries or /usr/bin/openssl are missing.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include <signal.h>
#include <unistd.h>

#include "dcr/net/http_client.hpp"
#include "dcr/protocol/etcd_commit_store.hpp"
#include "dcr/transport/s3_object_store.hpp"
#include "etcd_server.hpp"
#include "fake_server.hpp"
#include "protocol/commit_store_laws.hpp"
#include "s3/swift_cluster.hpp"
#include "transport/object_store_laws.hpp"

using namespace dcr;
using namespace dcr::net;
using dcr::protocol::etcd_commit_store;
using dcr::protocol::etcd_options;
using dcr::protocol::stored_record;
using dcr::test_etcd::etcd_server;
using dcr::test_etcd::etcd_tls;
using dcr::test_net::fake_server;

namespace {

constexpr const char* openssl_binary = "/usr/bin/openssl";

bool contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

http_request get(std::string target = "/") {
  http_request rq;
  rq.target = std::move(target);
  rq.idempotent = true;
  return rq;
}

/// A throwaway PKI in a temporary directory: a CA, a server certificate it
/// signed for 127.0.0.1 and localhost, a client certificate it signed, and an
/// unrelated second CA. EC P-256 keys (fast to make).
class test_pki {
public:
  test_pki() {
    char tmpl[] = "/tmp/dcr-pki-XXXXXX";
    if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    make_ca("ca", "dcr test CA");
    make_ca("other-ca", "dcr unrelated CA");
    // The etcd gateway dials its own gRPC port with the server certificate,
    // so that one also needs clientAuth.
    make_leaf("server", "localhost",
              "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
              "extendedKeyUsage=serverAuth,clientAuth\n");
    make_leaf("client", "dcr-client", "extendedKeyUsage=clientAuth\n");
    make_leaf("other-client", "dcr-client", "extendedKeyUsage=clientAuth\n", "other-ca");
  }
  ~test_pki() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  test_pki(const test_pki&) = delete;
  test_pki& operator=(const test_pki&) = delete;

  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  std::string cert(const std::string& who) const { return file(who + ".pem"); }
  std::string key(const std::string& who) const { return file(who + ".key"); }

  /// Options that trust `ca` and present `client` (if non-empty).
  tls_options trust(const std::string& ca, const std::string& client = "") const {
    tls_options t;
    t.ca_file = cert(ca);
    if (!client.empty()) {
      t.cert_file = cert(client);
      t.key_file = key(client);
    }
    return t;
  }

private:
  void sh(const std::string& cmd) const {
    const std::string full = "cd '" + dir_.string() + "' && " + cmd + " >>openssl.log 2>&1";
    if (std::system(full.c_str()) != 0) {
      std::ifstream in(dir_ / "openssl.log");
      std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      throw std::runtime_error("openssl failed: " + cmd + "\n" + log);
    }
  }
  void make_ca(const std::string& n, const std::string& cn) {
    sh(std::string(openssl_binary) +
       " req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " + n +
       ".key -out " + n + ".pem -days 2 -subj '/CN=" + cn +
       "' -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign");
  }
  void make_leaf(const std::string& n, const std::string& cn, const std::string& ext,
                 const std::string& ca = "ca") {
    std::ofstream(dir_ / (n + ".ext"))
        << "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        << ext;
    sh(std::string(openssl_binary) +
       " req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " + n +
       ".key -out " + n + ".csr -subj '/CN=" + cn + "'");
    sh(std::string(openssl_binary) + " x509 -req -in " + n + ".csr -CA " + ca + ".pem -CAkey " +
       ca + ".key -set_serial " + std::to_string(++serial_) + " -days 2 -out " + n +
       ".pem -extfile " + n + ".ext");
  }

  std::filesystem::path dir_;
  int serial_ = 1000;
};

} // namespace

TEST_SUITE("unit") {

  TEST_CASE("the linked dcr-net library has TLS support") { REQUIRE(tls_supported()); }

  TEST_CASE("parse_endpoint: https forms and default ports") {
    http_endpoint e;
    REQUIRE(parse_endpoint("https://127.0.0.1:2379", e).ok());
    CHECK(e == http_endpoint{"127.0.0.1", 2379, true});
    CHECK(e.url() == "https://127.0.0.1:2379");
    CHECK(e.authority() == "127.0.0.1:2379");
    CHECK(e.host_header() == "127.0.0.1:2379");
    REQUIRE(parse_endpoint("https://s3.example.org/", e).ok());
    CHECK(e == http_endpoint{"s3.example.org", 443, true});
    CHECK(e.host_header() == "s3.example.org"); // default port left out
    CHECK(http_endpoint{"h", 80, true}.host_header() == "h:80");
    CHECK(http_endpoint{"h", 80, false}.host_header() == "h");
    CHECK(http_endpoint{"::1", 443, true}.host_header() == "[::1]");
    REQUIRE(parse_endpoint("https://[::1]:8443", e).ok());
    CHECK(e == http_endpoint{"::1", 8443, true});
    REQUIRE(parse_endpoint("https://[::1]", e).ok());
    CHECK(e == http_endpoint{"::1", 443, true});
    REQUIRE(parse_endpoint("http://h:1", e).ok());
    CHECK_FALSE(e.tls);
    REQUIRE(parse_endpoint("h:1", e).ok()); // no scheme: plain HTTP, as before
    CHECK_FALSE(e.tls);
    for (const char* bad :
         {"https://", "https://h:0", "https://h:1/path", "https://[::1", "httpss://h:1"})
      CHECK_MESSAGE(parse_endpoint(bad, e).code == errc::invalid_argument, bad);
  }

  TEST_CASE("tls_options that cannot be used are refused at construction") {
    auto refused = [](tls_options t, std::string_view why) {
      http_options o;
      o.tls = std::move(t);
      try {
        http_client c(http_endpoint{"127.0.0.1", 1, true}, o);
        FAIL("constructed");
      } catch (const error& x) {
        CHECK(x.code() == errc::invalid_argument);
        CHECK_MESSAGE(contains(x.what(), why), x.what());
      }
    };
    tls_options t;
    t.ca_file = "/nonexistent/ca.pem";
    refused(t, "cannot load CA file '/nonexistent/ca.pem'");
    t = {};
    t.cert_file = "/nonexistent/client.pem";
    refused(t, "both cert_file and key_file");
    // TLS options are unused (and unchecked) without an https endpoint.
    http_options o;
    o.tls.ca_file = "/nonexistent/ca.pem";
    http_client plain(http_endpoint{"127.0.0.1", 1}, o);
  }

  TEST_CASE("https handshake: a silent peer times out under connect_timeout; a plain-HTTP peer is "
            "refused") {
    SUBCASE("silent peer") {
      fake_server srv([&](int, int) {
        while (!srv.stopping()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      });
      http_options o;
      o.connect_timeout = std::chrono::milliseconds(300);
      auto ep = srv.endpoint();
      ep.tls = true;
      http_client c(ep, o);
      http_response res;
      const auto t0 = std::chrono::steady_clock::now();
      const auto st = c.request(get(), res);
      CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));
      CHECK(st.code == errc::unavailable);
      CHECK_MESSAGE(contains(st.message, "TLS handshake failed: timed out after 300 ms"),
                    st.message);
      CHECK(contains(st.message, "https://" + srv.endpoint().authority()));
    }
    SUBCASE("plain HTTP peer") {
      fake_server srv([&](int fd, int) {
        fake_server::write_all(
            fd, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
      });
      auto ep = srv.endpoint();
      ep.tls = true;
      http_client c(ep);
      http_response res;
      const auto st = c.request(get(), res);
      CHECK(st.code == errc::io);
      CHECK_MESSAGE(contains(st.message, "TLS handshake failed"), st.message);
      CHECK(srv.connections == 1); // refused, not retried on the same endpoint
    }
  }

} // TEST_SUITE("unit")

namespace {

test_pki& pki() {
  static test_pki p;
  return p;
}

/// HTTPS etcd trusting nobody's client certificates.
etcd_server& tls_server() {
  static etcd_server s(etcd_tls{pki().cert("server"), pki().key("server"), "", pki().trust("ca")});
  return s;
}

/// HTTPS etcd that requires client certificates signed by the test CA.
etcd_server& mtls_server() {
  static etcd_server s(etcd_tls{pki().cert("server"), pki().key("server"), pki().cert("ca"),
                                pki().trust("ca", "client")});
  return s;
}

etcd_options options_for(const std::string& url, std::string prefix, tls_options t) {
  etcd_options o;
  o.endpoints = {url};
  o.prefix = std::move(prefix);
  o.http.connect_timeout = std::chrono::milliseconds(1000);
  o.http.request_timeout = std::chrono::milliseconds(5000);
  o.http.tls = std::move(t);
  return o;
}

/// A TLS 1.3 server judges the client certificate after the client's side of
/// the handshake is done, so the refusal arrives with the first exchange: as
/// the server's alert (errc::io), or as a reset when the server closed before
/// the request was written (errc::unavailable). Either way: a failure.
bool rejected_client(const status& st) {
  if (st.code == errc::io) return contains(st.message, "TLS: ") && contains(st.message, "alert");
  return st.code == errc::unavailable && contains(st.message, "https://");
}

std::string url_by_name(const etcd_server& s) {
  return "https://localhost:" + std::to_string(s.client_port());
}

/// The stored state under `prefix`, read by a client that trusts the server.
stored_record state_of(etcd_server& s, const std::string& prefix) {
  etcd_commit_store st(options_for(s.url(), prefix, pki().trust("ca", "client")));
  stored_record r;
  REQUIRE(st.load(r).ok());
  return r;
}

} // namespace

TEST_SUITE("interop") {

  TEST_CASE("etcd over https: commit_store laws, by address and by name") {
    REQUIRE(contains(tls_server().url(), "https://"));
    SUBCASE("by address (IP SAN)") {
      etcd_commit_store s(options_for(tls_server().url(), "tls-laws/", pki().trust("ca")));
      dcr::test_laws::check_laws(s);
    }
    SUBCASE("by name (DNS SAN, SNI)") {
      etcd_commit_store s(
          options_for(url_by_name(tls_server()), "tls-laws-name/", pki().trust("ca")));
      dcr::test_laws::check_laws(s);
    }
    SUBCASE("trust from a CA directory") {
      const auto dir = pki().file("ca-dir");
      std::filesystem::create_directories(dir);
      std::filesystem::copy_file(pki().cert("ca"), dir + "/ca.pem",
                                 std::filesystem::copy_options::overwrite_existing);
      REQUIRE(std::system((std::string(openssl_binary) + " rehash '" + dir + "' >/dev/null 2>&1")
                              .c_str()) == 0);
      tls_options t;
      t.ca_dir = dir;
      etcd_commit_store s(options_for(tls_server().url(), "tls-dir/", t));
      std::uint64_t e = 0;
      REQUIRE(s.take_over(e).ok());
      CHECK(e == 1);
    }
  }

  TEST_CASE(
      "etcd over https: an untrusted or misnamed server is refused, typed, and nothing changes") {
    auto& srv = tls_server();
    SUBCASE("certificate from an unrelated CA") {
      etcd_commit_store s(options_for(srv.url(), "tls-wrong-ca/", pki().trust("other-ca")));
      std::uint64_t e = 0;
      const auto st = s.take_over(e);
      CHECK(st.code == errc::io);
      CHECK_MESSAGE(contains(st.message, "failed verification"), st.message);
      CHECK_MESSAGE(contains(st.message, "other-ca.pem"), st.message);
      CHECK(state_of(srv, "tls-wrong-ca/") == stored_record{});
    }
    SUBCASE("the system trust store does not know the test CA") {
      etcd_commit_store s(options_for(srv.url(), "tls-system/", tls_options{}));
      std::uint64_t e = 0;
      const auto st = s.take_over(e);
      CHECK(st.code == errc::io);
      CHECK_MESSAGE(contains(st.message, "the system trust store"), st.message);
    }
    SUBCASE("a name the certificate does not carry") {
      auto t = pki().trust("ca");
      t.server_name = "etcd.example.org";
      etcd_commit_store s(options_for(srv.url(), "tls-wrong-name/", t));
      std::uint64_t e = 0;
      const auto st = s.take_over(e);
      CHECK(st.code == errc::io);
      CHECK_MESSAGE(contains(st.message, "does not name 'etcd.example.org'"), st.message);
      CHECK(state_of(srv, "tls-wrong-name/") == stored_record{});
    }
    SUBCASE("an address the certificate does not carry") {
      auto t = pki().trust("ca");
      t.server_name = "127.0.0.2"; // checked as an IP address SAN, and not sent as SNI
      etcd_commit_store s(options_for(srv.url(), "tls-wrong-ip/", t));
      std::uint64_t e = 0;
      const auto st = s.take_over(e);
      CHECK(st.code == errc::io);
      CHECK_MESSAGE(contains(st.message, "does not name '127.0.0.2'"), st.message);
    }
    SUBCASE("insecure: verify_peer = false accepts it (documented escape hatch)") {
      tls_options t;
      t.verify_peer = false;
      etcd_commit_store s(options_for(srv.url(), "tls-insecure/", t));
      std::uint64_t e = 0;
      REQUIRE(s.take_over(e).ok());
      CHECK(state_of(srv, "tls-insecure/").epoch == 1);
    }
    SUBCASE("failover: past a refused handshake to a good endpoint; if none is good, the refusal "
            "is reported") {
      fake_server not_tls([&](int fd, int) {
        fake_server::write_all(
            fd, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
      });
      auto first = not_tls.endpoint();
      first.tls = true;
      http_options o;
      o.tls = pki().trust("ca");
      http_client c({first, http_endpoint{"127.0.0.1", srv.client_port(), true}}, o);
      http_response res;
      const auto st = c.request(get("/health"), res);
      REQUIRE_MESSAGE(st.ok(), st.message);
      CHECK(res.status == 200);
      CHECK(c.current_endpoint().port == srv.client_port());

      o.tls = pki().trust("other-ca");
      http_client all_bad({http_endpoint{"127.0.0.1", srv.client_port(), true},
                           http_endpoint{"127.0.0.1", dcr::test_etcd::free_port(), true}},
                          o);
      const auto bad = all_bad.request(get("/health"), res);
      CHECK(bad.code == errc::io); // not masked by the second endpoint's refused connection
      CHECK_MESSAGE(contains(bad.message, "failed verification"), bad.message);
    }
  }

  TEST_CASE("etcd over https: plain http:// against the TLS port fails cleanly") {
    auto& srv = tls_server();
    auto o = options_for("http://127.0.0.1:" + std::to_string(srv.client_port()), "tls-plain/", {});
    etcd_commit_store s(o);
    std::uint64_t e = 0;
    const auto t0 = std::chrono::steady_clock::now();
    const auto st = s.take_over(e);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(4));
    CHECK_FALSE(st.ok());
    // etcd closes a connection that does not start a TLS handshake.
    CHECK(st.code == errc::unavailable);
    CHECK_MESSAGE(contains(st.message, "http://127.0.0.1:" + std::to_string(srv.client_port())),
                  st.message);
    CHECK(state_of(srv, "tls-plain/") == stored_record{});
  }

  TEST_CASE("etcd over https with client certificate authentication") {
    auto& srv = mtls_server();
    SUBCASE("a client certificate from the trusted CA: the laws hold") {
      etcd_commit_store s(options_for(srv.url(), "mtls-laws/", pki().trust("ca", "client")));
      dcr::test_laws::check_laws(s);
    }
    SUBCASE("no client certificate: refused, typed, no hang") {
      etcd_commit_store s(options_for(srv.url(), "mtls-none/", pki().trust("ca")));
      std::uint64_t e = 0;
      const auto t0 = std::chrono::steady_clock::now();
      const auto st = s.take_over(e);
      CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(4));
      CHECK_MESSAGE(rejected_client(st), st.message);
      CHECK(state_of(srv, "mtls-none/") == stored_record{});
    }
    SUBCASE("a client certificate from an unrelated CA: refused") {
      etcd_commit_store s(options_for(srv.url(), "mtls-other/", pki().trust("ca", "other-client")));
      std::uint64_t e = 0;
      const auto st = s.take_over(e);
      CHECK_MESSAGE(rejected_client(st), st.message);
      CHECK(state_of(srv, "mtls-other/") == stored_record{});
    }
    SUBCASE("a key that is not the certificate's: refused at construction") {
      auto t = pki().trust("ca", "client");
      t.key_file = pki().key("other-client");
      CHECK_THROWS_AS(etcd_commit_store(options_for(srv.url(), "mtls-key/", t)), error);
    }
  }

  TEST_CASE("http_client over https: keep-alive reuse and a clean close") {
    auto& srv = tls_server();
    http_options o;
    o.tls = pki().trust("ca");
    http_client c(http_endpoint{"127.0.0.1", srv.client_port(), true}, o);
    for (int i = 0; i < 5; ++i) {
      http_response res;
      const auto st = c.request(get("/health"), res);
      REQUIRE_MESSAGE(st.ok(), st.message);
      CHECK(res.status == 200);
    }
    c.close(); // close_notify; then a fresh connection works
    http_response res;
    REQUIRE(c.request(get("/health"), res).ok());
    CHECK(res.status == 200);
  }

} // TEST_SUITE("interop")

namespace {

test_s3::swift_cluster* swift = nullptr;

transport::s3_options swift_options(std::string bucket, tls_options t) {
  transport::s3_options o;
  o.endpoint = "https://127.0.0.1:" + std::to_string(swift->port);
  o.region = swift->region;
  o.bucket = std::move(bucket);
  o.credentials = {swift->access_key, swift->secret_key, ""};
  o.http.tls = std::move(t);
  o.backoff = std::chrono::milliseconds(10);
  return o;
}

} // namespace

TEST_SUITE("swift") {

  TEST_CASE("S3 over https (Swift s3api behind TLS): the object_store laws") {
    transport::s3_object_store s(swift_options("dcr-tls-laws", pki().trust("ca")));
    const auto st = s.create_bucket();
    REQUIRE_MESSAGE(st.ok(), st.message);
    test_transport::check_laws(s);
  }

  TEST_CASE("S3 over https: an untrusted server is refused once, typed, and not retried") {
    transport::s3_object_store s(swift_options("dcr-tls-untrusted", pki().trust("other-ca")));
    const auto st = s.create_bucket();
    CHECK(st.code == errc::io);
    CHECK_MESSAGE(contains(st.message, "failed verification"), st.message);
    CHECK(s.stats().requests == 1);
    CHECK(s.stats().retries == 0);
    // The bucket was not created: a trusting client does not find it.
    transport::s3_object_store ok(swift_options("dcr-tls-untrusted", pki().trust("ca")));
    std::vector<std::string> names;
    CHECK(ok.list("", names).code == errc::io); // NoSuchBucket
  }

} // TEST_SUITE("swift")

int main(int argc, char** argv) {
  std::string suite = "unit";
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--interop" || a == "--swift")
      suite = a.substr(2);
    else
      args.push_back(argv[i]);
  }
  auto missing = [](std::initializer_list<const char*> bins, const char* packages) {
    for (const char* bin : bins)
      if (::access(bin, X_OK) != 0) {
        std::printf("skip: %s not found (install the Debian packages %s)\n", bin, packages);
        return true;
      }
    return false;
  };
  if (suite == "interop" &&
      missing({test_etcd::etcd_binary, openssl_binary}, "etcd-server and openssl"))
    return 77;
  test_s3::swift_cluster cluster;
  if (suite == "swift") {
    if (missing({"/usr/bin/swift-proxy-server", "/usr/bin/swift-object-server",
                 "/usr/bin/swift-container-server", "/usr/bin/swift-account-server",
                 "/usr/bin/swift-ring-builder", openssl_binary},
                "swift swift-proxy swift-account swift-container swift-object and openssl"))
      return 77;
    ::signal(SIGPIPE, SIG_IGN);
    const int rc = cluster.start(
        {"DCR_SWIFT_CERT=" + pki().cert("server"), "DCR_SWIFT_KEY=" + pki().key("server")});
    if (rc == 77) {
      std::printf("skip: start-swift.sh found no swift installation\n");
      return 77;
    }
    if (rc != 0) {
      std::fprintf(stderr, "could not start Swift over TLS (see start-swift.sh messages above)\n");
      return 1;
    }
    swift = &cluster;
  }
  doctest::Context ctx(static_cast<int>(args.size()), args.data());
  ctx.addFilter("test-suite", suite.c_str());
  const int result = ctx.run();
  cluster.stop();
  return result;
}
