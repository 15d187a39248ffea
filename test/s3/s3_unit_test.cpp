// SigV4 against AWS's published examples, the XML reader, and the S3 store
// against a loopback peer with scripted answers (retries, error bodies,
// pagination, what is signed). No S3 server needed: suite 'unit'.
#include <doctest/doctest.h>

#include <atomic>

#include "dcr/core/hash.hpp"
#include "dcr/transport/attempt_objects.hpp"
#include "dcr/transport/detail/s3_xml.hpp"
#include "dcr/transport/s3_object_store.hpp"

#include "fake_http_server.hpp"

using namespace dcr;
using namespace dcr::transport;
using namespace dcr::transport::detail;
using dcr::test_s3::fake_http_server;
using dcr::test_s3::http_response;
using dcr::test_s3::recorded_request;

namespace {

// The signature version 4 test suite's credentials and request time.
const sigv4_credentials suite_cred{"AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", ""};
// The S3 API reference's worked examples ("Signature Calculations for the
// Authorization Header: Transferring Payload in a Single Chunk").
const sigv4_credentials s3_doc_cred{"AKIAIOSFODNN7EXAMPLE",
                                    "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""};

sigv4_request suite_request(std::string method,
                            std::vector<std::pair<std::string, std::string>> query = {}) {
  sigv4_request r;
  r.method = std::move(method);
  r.query = std::move(query);
  r.headers = {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", "20150830T123600Z"}};
  r.payload_hash = std::string(empty_payload_sha256);
  r.date = "20150830T123600Z";
  r.region = "us-east-1";
  r.service = "service";
  return r;
}

sigv4_request s3_doc_request(std::string method, std::string uri, std::string payload_hash) {
  sigv4_request r;
  r.method = std::move(method);
  r.canonical_uri = std::move(uri);
  r.payload_hash = payload_hash;
  r.headers = {{"Host", "examplebucket.s3.amazonaws.com"},
               {"x-amz-content-sha256", payload_hash},
               {"x-amz-date", "20130524T000000Z"}};
  r.date = "20130524T000000Z";
  r.region = "us-east-1";
  return r;
}

std::vector<std::byte> bytes_of(std::string_view s) {
  auto b = std::as_bytes(std::span(s.data(), s.size()));
  return {b.begin(), b.end()};
}

s3_options fake_options(const fake_http_server& srv) {
  s3_options o;
  o.endpoint = srv.endpoint();
  o.bucket = "bkt";
  o.credentials = {"AK", "SK", ""};
  o.backoff = std::chrono::milliseconds(1);
  o.max_attempts = 3;
  o.http.request_timeout = std::chrono::milliseconds(3000);
  return o;
}

std::string xml_error(std::string_view code, std::string_view message) {
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>" + std::string(code) +
         "</Code><Message>" + std::string(message) +
         "</Message><RequestId>tx42</RequestId></Error>";
}

// Recompute the signature of a received request from its bytes, as a server
// would: the client must have signed exactly what it sent.
bool signature_holds(const recorded_request& rq, const sigv4_credentials& cred,
                     std::string_view region) {
  const auto auth = rq.header("authorization");
  const auto signed_at = auth.find("SignedHeaders=");
  const auto sig_at = auth.find(", Signature=");
  if (signed_at == std::string::npos || sig_at == std::string::npos) return false;
  const std::string signed_list = auth.substr(signed_at + 14, sig_at - signed_at - 14);
  sigv4_request s;
  s.method = rq.method;
  const auto qm = rq.target.find('?');
  s.canonical_uri = rq.target.substr(0, qm);
  if (qm != std::string::npos) {
    // The target's query is already canonical; decode it for re-encoding.
    auto decode = [](std::string_view v) {
      std::string out;
      for (std::size_t i = 0; i < v.size(); ++i)
        if (v[i] == '%' && i + 2 < v.size() + 0 + 1) {
          out.push_back(static_cast<char>(std::stoi(std::string(v.substr(i + 1, 2)), nullptr, 16)));
          i += 2;
        } else {
          out.push_back(v[i]);
        }
      return out;
    };
    std::string_view q = std::string_view(rq.target).substr(qm + 1);
    while (!q.empty()) {
      auto amp = q.find('&');
      auto kv = q.substr(0, amp);
      auto eq = kv.find('=');
      s.query.emplace_back(decode(kv.substr(0, eq)),
                           decode(eq == std::string_view::npos ? "" : kv.substr(eq + 1)));
      q = amp == std::string_view::npos ? std::string_view() : q.substr(amp + 1);
    }
  }
  std::string_view list = signed_list;
  while (!list.empty()) {
    auto semi = list.find(';');
    std::string name(list.substr(0, semi));
    s.headers.emplace_back(name, rq.header(name));
    list = semi == std::string_view::npos ? std::string_view() : list.substr(semi + 1);
  }
  s.payload_hash = rq.header("x-amz-content-sha256");
  s.date = rq.header("x-amz-date");
  s.region = std::string(region);
  return sigv4_sign(s, cred).authorization == auth;
}

} // namespace

TEST_CASE("SigV4 test suite: get-vanilla and get-vanilla-query-order-key-case") {
  auto s = sigv4_sign(suite_request("GET"), suite_cred);
  CHECK(s.canonical_request ==
        "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n" +
            std::string(empty_payload_sha256));
  CHECK(s.string_to_sign ==
        "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n"
        "bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63");
  CHECK(s.authorization ==
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        "SignedHeaders=host;x-amz-date, "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
  // Parameters are sorted by name before signing.
  auto q =
      sigv4_sign(suite_request("GET", {{"Param2", "value2"}, {"Param1", "value1"}}), suite_cred);
  CHECK(q.signature == "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500");
  // A changed secret, date, region or header changes the signature.
  auto other = suite_cred;
  other.secret_key.back() = 'X';
  CHECK(sigv4_sign(suite_request("GET"), other).signature != s.signature);
  auto r = suite_request("GET");
  r.region = "eu-west-1";
  CHECK(sigv4_sign(r, suite_cred).signature != s.signature);
}

TEST_CASE("SigV4 S3 examples: GET object with Range, PUT object, GET lifecycle, list objects") {
  auto get = s3_doc_request("GET", "/test.txt", std::string(empty_payload_sha256));
  get.headers.emplace_back("Range", "bytes=0-9");
  auto g = sigv4_sign(get, s3_doc_cred);
  CHECK(g.signed_headers == "host;range;x-amz-content-sha256;x-amz-date");
  CHECK(to_hex(sha256(g.canonical_request)) ==
        "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
  CHECK(g.signature == "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");

  // "test$file.text": the key is URI-encoded into the canonical URI.
  const std::string body = "Welcome to Amazon S3.";
  const auto body_hash = to_hex(sha256(body));
  CHECK(body_hash == "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
  CHECK(uri_encode("/test$file.text", true) == "/test%24file.text");
  auto put = s3_doc_request("PUT", uri_encode("/test$file.text", true), body_hash);
  put.headers.emplace_back("Date", "Fri, 24 May 2013 00:00:00 GMT");
  put.headers.emplace_back("x-amz-storage-class", "REDUCED_REDUNDANCY");
  auto p = sigv4_sign(put, s3_doc_cred);
  CHECK(p.signed_headers == "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class");
  CHECK(p.signature == "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");

  auto lc = s3_doc_request("GET", "/", std::string(empty_payload_sha256));
  lc.query = {{"lifecycle", ""}};
  CHECK(sigv4_sign(lc, s3_doc_cred).signature ==
        "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");

  auto ls = s3_doc_request("GET", "/", std::string(empty_payload_sha256));
  ls.query = {{"prefix", "J"}, {"max-keys", "2"}};
  auto l = sigv4_sign(ls, s3_doc_cred);
  CHECK(to_hex(sha256(l.canonical_request)) ==
        "df57d21db20da04d7fa30298dd4488ba3a2b47ca3a489c74750e0f1e7df1b9b7");
  CHECK(l.signature == "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

TEST_CASE("SigV4 URI encoding, query and header canonicalisation") {
  CHECK(uri_encode("AZaz09-._~", false) == "AZaz09-._~");
  CHECK(uri_encode("a/b c+d=e&f%", false) == "a%2Fb%20c%2Bd%3De%26f%25");
  CHECK(uri_encode("a/b c", true) == "a/b%20c");
  CHECK(uri_encode("\xC3\xBC*", false) == "%C3%BC%2A"); // UTF-8 bytes one by one; '*' is reserved
  CHECK(canonical_query({{"b", "2"}, {"a", "x/y"}, {"A", ""}, {"a", "1"}}) == "A=&a=1&a=x%2Fy&b=2");
  CHECK(canonical_header_value("  a   b \t c  ") == "a b c");
  auto r = suite_request("GET");
  r.headers.emplace_back("X-Multi", " one ");
  r.headers.emplace_back("x-multi", "two  words");
  auto s = sigv4_sign(r, suite_cred);
  CHECK(s.canonical_request.find("x-multi:one,two words\n") != std::string::npos);
  CHECK(s.signed_headers == "host;x-amz-date;x-multi");
  CHECK(amz_date(std::chrono::system_clock::time_point(std::chrono::seconds(1440938160))) ==
        "20150830T123600Z");
}

TEST_CASE("XML reader: entities, CDATA, comments, namespaces; malformed input is bad_format") {
  std::vector<std::pair<std::string, std::string>> leaves;
  auto collect = [&](std::string_view p, std::string_view t) { leaves.emplace_back(p, t); };
  REQUIRE(
      xml_walk("<?xml version=\"1.0\"?>\n<!-- c --><r xmlns=\"http://s3\" "
               "a='x>y'><k>a&amp;b&lt;&gt;&quot;&apos;"
               "&#65;&#x42;&#xfc;</k>\n <s:n><![CDATA[<raw&>]]></s:n><e/><m>x<!-- in -->y</m></r>",
               collect)
          .ok());
  REQUIRE(leaves.size() == 4);
  CHECK(leaves[0] == std::pair<std::string, std::string>{"r/k", "a&b<>\"'AB\xC3\xBC"});
  CHECK(leaves[1] == std::pair<std::string, std::string>{"r/n", "<raw&>"});
  CHECK(leaves[2] == std::pair<std::string, std::string>{"r/e", ""});
  CHECK(leaves[3] == std::pair<std::string, std::string>{"r/m", "xy"});
  auto noop = [](std::string_view, std::string_view) {};
  for (std::string bad :
       {"", "text", "<a>", "<a></b>", "<a>&bogus;</a>", "<a>&#xD800;</a>", "<a>&#0;</a>",
        "<a>&amp</a>", "<!DOCTYPE a [<!ENTITY x \"y\">]><a>&x;</a>", "<a/><b/>", "<a></a>x",
        "<a><![CDATA[x</a>", "<a b=\"c></a>", "<a>&#x110000;</a>"}) {
    INFO(bad);
    CHECK(xml_walk(bad, noop).code == errc::bad_format);
  }
}

TEST_CASE("ListObjectsV2 page and error body parsing") {
  s3_list_page page;
  REQUIRE(parse_s3_list_page(
              "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>b</Name>"
              "<IsTruncated>true</IsTruncated><Contents><Key>a/1</Key><Size>3</Size></Contents>"
              "<Contents><Key>a/2&amp;</Key></Contents><NextContinuationToken>t+/=&lt;"
              "</NextContinuationToken></ListBucketResult>",
              page)
              .ok());
  CHECK(page.keys == std::vector<std::string>{"a/1", "a/2&"});
  CHECK(page.truncated);
  CHECK(page.next_token == "t+/=<");
  REQUIRE(parse_s3_list_page(
              "<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>", page)
              .ok());
  CHECK(page.keys.empty());
  CHECK_FALSE(page.truncated);
  CHECK(parse_s3_list_page("<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>",
                           page)
            .code == errc::bad_format);
  CHECK(parse_s3_list_page("<ListBucketResult><IsTruncated>maybe</IsTruncated></ListBucketResult>",
                           page)
            .code == errc::bad_format);
  CHECK(parse_s3_list_page("<ListBucketResult></ListBucketResult>", page).code == errc::bad_format);
  CHECK(parse_s3_list_page("<Error><IsTruncated>false</IsTruncated></Error>", page).code ==
        errc::bad_format);
  auto e = parse_s3_error(xml_error("AccessDenied", "no &amp; never"));
  CHECK(e.code == "AccessDenied");
  CHECK(e.message == "no & never");
  CHECK(e.request_id == "tx42");
  CHECK(parse_s3_error("<html>proxy error").code.empty());
}

TEST_CASE("s3_object_store: options are checked at construction") {
  s3_options o;
  o.bucket = "bk1";
  o.credentials = {"AK", "SK", ""};
  CHECK_NOTHROW(s3_object_store{o});
  std::string const too_long(64, 'a');
  for (std::string const& b :
       {std::string{}, std::string{"ab"}, std::string{"Upper"}, std::string{"-ab"},
        std::string{"ab-"}, std::string{"a_b"}, too_long}) {
    auto bad = o;
    bad.bucket = b;
    CHECK_THROWS_AS(s3_object_store{bad}, dcr::error);
  }
  auto bad = o;
  bad.endpoint = "https://x:1"; // connects lazily: refused at construction only without TLS
  if (dcr::net::tls_supported())
    CHECK_NOTHROW(s3_object_store{bad});
  else
    CHECK_THROWS_AS(s3_object_store{bad}, dcr::error);
  bad.endpoint = "ftp://x:1";
  CHECK_THROWS_AS(s3_object_store{bad}, dcr::error);
  bad = o;
  bad.max_keys = 0;
  CHECK_THROWS_AS(s3_object_store{bad}, dcr::error);
  bad = o;
  bad.list_poll_max = std::chrono::milliseconds(0);
  CHECK_THROWS_AS(s3_object_store{bad}, dcr::error);
  // Waiting attempt readers on S3 back off to its list interval, not the 5 ms default.
  bad = o;
  bad.list_poll_max = std::chrono::milliseconds(250);
  s3_object_store slow{bad};
  CHECK(dcr::transport::default_poll_policy(slow).max == std::chrono::milliseconds(250));
  CHECK(dcr::transport::default_poll_policy(s3_object_store{o}).max ==
        std::chrono::milliseconds(50));
  bad = o;
  bad.credentials.access_key.clear();
  CHECK_THROWS_AS(s3_object_store{bad}, dcr::error);
}

TEST_CASE("s3_object_store: requests are signed as sent, the payload hash is the body's") {
  fake_http_server srv([](const recorded_request& rq) {
    if (rq.method == "PUT") return http_response(200, "OK", "");
    if (rq.method == "GET") return http_response(200, "OK", "got it");
    return http_response(400, "Bad", "");
  });
  auto o = fake_options(srv);
  o.region = "eu-central-1";
  s3_object_store s(o);
  const auto body = bytes_of("payload bytes \x01\x02");
  REQUIRE(s.put("dir/a-b_c.d/x", body).ok());
  std::vector<std::byte> out;
  REQUIRE(s.get("dir/a-b_c.d/x", out).ok());
  CHECK(out == bytes_of("got it"));
  auto rqs = srv.requests();
  REQUIRE(rqs.size() == 2);
  CHECK(rqs[0].method == "PUT");
  CHECK(rqs[0].target == "/bkt/dir/a-b_c.d/x");
  CHECK(rqs[0].body == "payload bytes \x01\x02");
  CHECK(rqs[0].header("x-amz-content-sha256") == to_hex(sha256(body)));
  CHECK(rqs[0].header("authorization").find("Credential=AK/") != std::string::npos);
  CHECK(rqs[0].header("authorization").find("/eu-central-1/s3/aws4_request") != std::string::npos);
  CHECK(rqs[0]
            .header("authorization")
            .find("SignedHeaders=content-type;host;x-amz-content-sha256;x-amz-date,") !=
        std::string::npos);
  CHECK(rqs[1].header("x-amz-content-sha256") == empty_payload_sha256);
  for (auto& rq : rqs) {
    CHECK(signature_holds(rq, {"AK", "SK", ""}, "eu-central-1"));
    CHECK_FALSE(signature_holds(rq, {"AK", "SK2", ""}, "eu-central-1"));
  }
  // Invalid names never reach the wire.
  CHECK(s.put("a//b", body).code == errc::invalid_argument);
  CHECK(s.get("../x", out).code == errc::invalid_argument);
  CHECK(srv.requests().size() == 2);
}

TEST_CASE("s3_object_store: 5xx answers and dropped connections are retried with backoff, then "
          "unavailable") {
  std::atomic<int> n{0};
  std::atomic<int> fail_first{2};
  std::atomic<bool> drop{false};
  fake_http_server srv([&](const recorded_request&) -> std::string {
    if (n++ < fail_first) {
      if (drop) return "";
      return http_response(503, "Slow Down",
                           xml_error("SlowDown", "Please reduce your request rate."));
    }
    return http_response(200, "OK", "fine");
  });
  s3_object_store s(fake_options(srv));
  std::vector<std::byte> out;
  REQUIRE(s.get("x", out).ok());
  CHECK(out == bytes_of("fine"));
  CHECK(s.stats().retries == 2);
  CHECK(s.stats().requests == 3);

  n = 0;
  drop = true;
  REQUIRE(s.get("x", out).ok());
  CHECK(n == 3);
  // The http client itself replaces a kept-alive connection that broke once;
  // the store retries the rest.
  CHECK(s.stats().retries >= 3);

  n = 0;
  drop = false;
  fail_first = 100;
  auto st = s.get("x", out);
  CHECK(st.code == errc::unavailable);
  CHECK(st.message.find("HTTP 503 SlowDown: Please reduce your request rate.") !=
        std::string::npos);
  CHECK(st.message.find("after 3 attempts") != std::string::npos);
  CHECK(n == 3);
}

TEST_CASE("s3_object_store: error bodies become typed errors with the S3 code and message") {
  fake_http_server srv([](const recorded_request& rq) -> std::string {
    if (rq.target == "/bkt/missing")
      return http_response(404, "Not Found", xml_error("NoSuchKey", "gone"));
    if (rq.target == "/bkt/nobucket")
      return http_response(404, "Not Found", xml_error("NoSuchBucket", "no bucket"));
    if (rq.method == "HEAD") return http_response(404, "Not Found", "");
    return http_response(
        403, "Forbidden",
        xml_error("SignatureDoesNotMatch", "The request signature &lt;sig&gt; &amp; more"));
  });
  s3_object_store s(fake_options(srv));
  std::vector<std::byte> out;
  CHECK(s.get("missing", out).code == errc::not_found);
  auto nb = s.get("nobucket", out);
  CHECK(nb.code == errc::io);
  CHECK(nb.message.find("NoSuchBucket") != std::string::npos);
  auto st = s.put("denied", bytes_of("x"));
  CHECK(st.code == errc::io);
  CHECK(
      st.message.find(
          "HTTP 403 SignatureDoesNotMatch: The request signature <sig> & more (request id tx42)") !=
      std::string::npos);
  CHECK(st.message.find("/bkt/denied") != std::string::npos);
  const auto before = srv.requests().size();
  CHECK(s.remove("gone").code == errc::not_found);
  auto rqs = srv.requests();
  REQUIRE(rqs.size() == before + 1); // HEAD only: no DELETE for a missing key
  CHECK(rqs.back().method == "HEAD");
  CHECK(s.stats().retries == 0); // 4xx are final
}

TEST_CASE("s3_object_store: list follows continuation tokens and checks the order") {
  // Keys and tokens as a server would page them; tokens carry bytes that
  // must be encoded in the query.
  std::vector<std::string> pages = {
      "<ListBucketResult><IsTruncated>true</IsTruncated><Contents><Key>p/a</Key></Contents>"
      "<Contents><Key>p/b</Key></Contents><NextContinuationToken>t1+/=</NextContinuationToken></"
      "ListBucketResult>",
      "<ListBucketResult><IsTruncated>true</IsTruncated><Contents><Key>p/b.x</Key></Contents>"
      "<Contents><Key>p/bad "
      "name</Key></Contents><NextContinuationToken>t2&amp;</NextContinuationToken>"
      "</ListBucketResult>",
      "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>p/c</Key></Contents></"
      "ListBucketResult>"};
  std::atomic<std::size_t> page{0};
  std::atomic<int> mode{0};
  fake_http_server srv([&](const recorded_request&) -> std::string {
    if (mode == 1) // keys out of order
      return http_response(
          200, "OK",
          "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>p/b</Key>"
          "</Contents><Contents><Key>p/a</Key></Contents></ListBucketResult>");
    if (mode == 2) // a key outside the prefix
      return http_response(
          200, "OK",
          "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>q</Key>"
          "</Contents></ListBucketResult>");
    if (mode == 3) // the same token forever
      return http_response(
          200, "OK",
          "<ListBucketResult><IsTruncated>true</IsTruncated>"
          "<NextContinuationToken>same</NextContinuationToken></ListBucketResult>");
    return http_response(200, "OK", pages[page++ % pages.size()]);
  });
  auto o = fake_options(srv);
  o.max_keys = 2;
  s3_object_store s(o);
  std::vector<std::string> names;
  REQUIRE(s.list("p/", names).ok());
  CHECK(names ==
        std::vector<std::string>{"p/a", "p/b", "p/b.x", "p/c"}); // "p/bad name" is no object name
  CHECK(s.stats().list_pages == 3);
  auto rqs = srv.requests();
  REQUIRE(rqs.size() == 3);
  CHECK(rqs[0].target == "/bkt?list-type=2&max-keys=2&prefix=p%2F");
  CHECK(rqs[1].target == "/bkt?continuation-token=t1%2B%2F%3D&list-type=2&max-keys=2&prefix=p%2F");
  CHECK(rqs[2].target == "/bkt?continuation-token=t2%26&list-type=2&max-keys=2&prefix=p%2F");
  for (auto& rq : rqs) CHECK(signature_holds(rq, {"AK", "SK", ""}, "us-east-1"));
  mode = 1;
  CHECK(s.list("p/", names).code == errc::bad_format);
  mode = 2;
  CHECK(s.list("p/", names).code == errc::bad_format);
  mode = 3;
  CHECK(s.list("", names).code == errc::bad_format);
  CHECK(s.list("../", names).code == errc::invalid_argument);
}

TEST_CASE("s3_object_store: nothing listening is unavailable after the retries") {
  int port = 0;
  {
    fake_http_server srv([](const recorded_request&) { return std::string(); });
    port = srv.port();
  } // closed: the port refuses connections now
  s3_options o;
  o.endpoint = "http://127.0.0.1:" + std::to_string(port);
  o.bucket = "bkt";
  o.credentials = {"AK", "SK", ""};
  o.backoff = std::chrono::milliseconds(1);
  o.max_attempts = 2;
  s3_object_store s(o);
  std::vector<std::byte> out;
  auto st = s.get("x", out);
  CHECK(st.code == errc::unavailable);
  CHECK(st.message.find("after 2 attempts") != std::string::npos);
  CHECK(s.stats().retries == 1);
}
