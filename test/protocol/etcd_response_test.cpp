// The etcd v3 gateway responses as the etcd commit store reads them
// (dcr/protocol/etcd_response.hpp), without a server: what a well-formed
// response yields, and the typed error of each way a response can be wrong.
#include <doctest/doctest.h>

#include <string>

#include "dcr/protocol/etcd_response.hpp"

using namespace dcr;
using namespace dcr::protocol;

namespace {

std::string kv(const std::string& key, const std::string& value, int version) {
  return R"({"response_range":{"header":{},"kvs":[{"key":")" + net::base64_encode(key) +
         R"(","version":")" + std::to_string(version) + R"(","value":")" +
         net::base64_encode(value) + R"("}],"count":"1"}})";
}
const std::string empty_range = R"({"response_range":{"header":{}}})";

std::string txn(const std::string& a, const std::string& b, const std::string& c) {
  return R"({"header":{"revision":"7"},"succeeded":true,"responses":[)" + a + "," + b + "," + c +
         "]}";
}

/// Decode `body` as `load` does: the response, the snapshot, the record.
status load(const std::string& body, stored_record& out) {
  etcd::txn_result t;
  DCR_TRY(etcd::parse_txn_response(body, "etcd load", t));
  etcd::snapshot s;
  DCR_TRY(etcd::snapshot_of(t, 0, "k/record", "k/epoch", "k/attempt", s, true));
  return etcd::record_of(s, "k/record", out);
}

stored_record record_at(std::uint64_t revision) {
  stored_record r;
  r.revision = revision;
  r.epoch = 2;
  r.attempt = 3;
  r.record.version = 1;
  r.record.attempt = 3;
  r.record.incarnation = "0123456789abcdef0123456789abcdef";
  return r;
}

} // namespace

TEST_CASE("etcd response: absent keys read as a never-committed store") {
  stored_record r;
  REQUIRE(load(txn(empty_range, empty_range, empty_range), r).ok());
  CHECK(r == stored_record{});
}

TEST_CASE("etcd response: counters and the record at the key's version") {
  const auto want = record_at(4);
  stored_record r;
  REQUIRE(load(txn(kv("k/record", serialize_commit_record(want), 4), kv("k/epoch", "2", 1),
                   kv("k/attempt", "3", 3)),
               r)
              .ok());
  CHECK(r == want);
}

TEST_CASE("etcd response: each malformed response is a typed error") {
  stored_record r;
  // Not JSON, not a transaction response, a non-boolean 'succeeded'.
  CHECK(load("{", r).code == errc::bad_format);
  CHECK(load(R"({"responses":[]})", r).code == errc::bad_format);
  CHECK(load(R"({"header":{},"succeeded":"yes"})", r).code == errc::bad_format);
  // Fewer range responses than requested.
  CHECK(load(R"({"header":{},"succeeded":true,"responses":[]})", r).code == errc::bad_format);
  // A range of another key, a counter that is not a positive decimal.
  CHECK(load(txn(kv("k/other", "x", 1), empty_range, empty_range), r).code == errc::bad_format);
  CHECK(load(txn(empty_range, kv("k/epoch", "0", 1), empty_range), r).code == errc::bad_format);
  CHECK(load(txn(empty_range, kv("k/epoch", "-1", 1), empty_range), r).code == errc::bad_format);
  // Base64 that is not strict.
  const std::string bad_key = R"({"response_range":{"kvs":[{"key":"a2V5=","value":"MQ=="}]}})";
  CHECK(load(txn(empty_range, bad_key, empty_range), r).code == errc::bad_format);
  // A record whose revision is not the key's version (written by something else).
  const auto rec = serialize_commit_record(record_at(4));
  const auto s =
      load(txn(kv("k/record", rec, 5), kv("k/epoch", "2", 1), kv("k/attempt", "3", 3)), r);
  CHECK(s.code == errc::bad_format);
  CHECK(s.message.find("revision 4") != std::string::npos);
}

TEST_CASE("etcd response: HTTP errors name the request's fault or the service's") {
  CHECK(etcd::http_error("etcd put", 400, "Bad Request", R"({"code":3,"message":"too large"})")
            .code == errc::invalid_argument);
  CHECK(etcd::http_error("etcd put", 400, "Bad Request", R"({"code":11})").code ==
        errc::invalid_argument);
  const auto s = etcd::http_error("etcd put", 503, "Service Unavailable", "not json");
  CHECK(s.code == errc::unavailable);
  CHECK(s.message.find("HTTP 503") != std::string::npos);
}
