#pragma once
/// \file
/// Decoding of etcd v3 JSON gateway responses for `etcd_commit_store`
/// (dcr/protocol/etcd_commit_store.hpp): the transaction response, the range
/// responses in it, the counters and the commit record they hold. Header-only
/// and free of the HTTP client, so that the unit tests and the fuzz target
/// `fuzz_net` reach every check without a server. Everything a response may
/// get wrong is `errc::bad_format` (or the commit record's own error) naming
/// the key; nothing a server sends can crash or hang them.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "dcr/core/error.hpp"
#include "dcr/core/json.hpp"
#include "dcr/net/base64.hpp"
#include "dcr/protocol/commit_store.hpp"

namespace dcr::protocol::etcd {

/// A decoded transaction response.
struct txn_result {
  bool succeeded = false;
  json_value responses; ///< array: one entry per request of the branch taken
};

/// Record version (= revision), epoch and attempt read in one transaction.
struct snapshot {
  stored_record counters; ///< revision, epoch, attempt (record left empty)
  std::string record_value;
};

/// The first 200 bytes of a body, for messages.
inline std::string excerpt(std::string_view body) {
  return body.size() <= 200 ? std::string(body) : std::string(body.substr(0, 200)) + "...";
}

/// Decode the body of a `/v3/kv/txn` response with HTTP status 200; `where`
/// names the operation and endpoint in messages.
inline status parse_txn_response(std::string_view body, const std::string& where, txn_result& out) {
  json_value doc;
  DCR_TRY(parse_json(body, doc, where + " response"));
  DCR_RETURN_ERROR_IF(!doc.is_object() || !doc.get("header"), bad_format,
                      where + ": response is not a transaction response: " + excerpt(body));
  out.succeeded = false;
  if (auto* s = doc.get("succeeded")) {
    DCR_RETURN_ERROR_IF(s->type != json_value::kind::boolean, bad_format,
                        where + ": 'succeeded' is not a boolean");
    out.succeeded = s->boolean;
  }
  out.responses = json_value{};
  out.responses.type = json_value::kind::array;
  if (auto* r = doc.get("responses")) {
    DCR_RETURN_ERROR_IF(!r->is_array(), bad_format, where + ": 'responses' is not an array");
    out.responses = *r;
  }
  return status::success();
}

/// The error of a response whose HTTP status is not 200: gRPC codes
/// INVALID_ARGUMENT (3) and OUT_OF_RANGE (11) mean the request itself is at
/// fault (e.g. a record above the server's request size limit); anything
/// else is the service failing to serve it.
inline status http_error(const std::string& where, unsigned http_status, std::string_view reason,
                         std::string_view body) {
  std::string msg = excerpt(body);
  std::uint64_t code = 0;
  json_value doc;
  if (parse_json(body, doc).ok() && doc.is_object()) {
    if (auto* m = doc.get("message"); m && m->is_string()) msg = m->text;
    if (auto* c = doc.get("code")) (void)c->as_u64(code);
  }
  const errc e = (code == 3 || code == 11) ? errc::invalid_argument : errc::unavailable;
  return fail(e, where + ": HTTP " + std::to_string(http_status) + " " + std::string(reason) +
                     ": " + msg);
}

/// The single key-value of the i-th range response, if the key exists.
inline status kv_of(const txn_result& t, std::size_t i, const std::string& key,
                    const json_value*& kv) {
  kv = nullptr;
  DCR_RETURN_ERROR_IF(i >= t.responses.items.size(), bad_format,
                      "etcd: transaction returned " + std::to_string(t.responses.items.size()) +
                          " responses, expected a range of " + key);
  const auto* rr = t.responses.items[i].get("response_range");
  DCR_RETURN_ERROR_IF(!rr || !rr->is_object(), bad_format,
                      "etcd: response " + std::to_string(i) + " is not a range of " + key);
  const auto* kvs = rr->get("kvs");
  if (!kvs) return status::success(); // absent key: the gateway omits the empty list
  DCR_RETURN_ERROR_IF(!kvs->is_array() || kvs->items.size() > 1 ||
                          (kvs->items.size() == 1 && !kvs->items[0].is_object()),
                      bad_format, "etcd: malformed kvs in the range of " + key);
  if (kvs->items.empty()) return status::success();
  kv = &kvs->items[0];
  std::string got;
  const auto* k = kv->get("key");
  DCR_RETURN_ERROR_IF(!k || !k->is_string(), bad_format,
                      "etcd: range of " + key + " returned a kv without key");
  DCR_TRY(net::base64_decode(k->text, got, "etcd key"));
  DCR_RETURN_ERROR_IF(got != key, bad_format, "etcd: range of " + key + " returned key " + got);
  return status::success();
}

/// Value bytes of a kv (the gateway omits an empty value).
inline status value_of(const json_value& kv, const std::string& key, std::string& out) {
  out.clear();
  const auto* v = kv.get("value");
  if (!v) return status::success();
  DCR_RETURN_ERROR_IF(!v->is_string(), bad_format, "etcd: value of " + key + " is not a string");
  return net::base64_decode(v->text, out, "etcd value of " + key);
}

/// A counter key's value from the i-th range response (absent: 0).
inline status counter_of(const txn_result& t, std::size_t i, const std::string& key,
                         std::uint64_t& v) {
  const json_value* kv = nullptr;
  DCR_TRY(kv_of(t, i, key, kv));
  if (!kv) {
    v = 0;
    return status::success();
  }
  std::string text;
  DCR_TRY(value_of(*kv, key, text));
  json_value n;
  n.type = json_value::kind::string;
  n.text = text;
  DCR_RETURN_ERROR_IF(!n.as_u64(v) || v == 0, bad_format,
                      "etcd: " + key + " holds '" + excerpt(text) +
                          "', not a positive decimal counter");
  return status::success();
}

/// Record version (= revision), epoch and attempt from three range
/// responses starting at `first` (keys `record`, `epoch`, `attempt`).
inline status snapshot_of(const txn_result& t, std::size_t first, const std::string& record_key,
                          const std::string& epoch_key, const std::string& attempt_key,
                          snapshot& out, bool want_value) {
  const json_value* kv = nullptr;
  DCR_TRY(kv_of(t, first, record_key, kv));
  out.counters = stored_record{};
  out.record_value.clear();
  if (kv) {
    const auto* ver = kv->get("version");
    DCR_RETURN_ERROR_IF(!ver || !ver->as_u64(out.counters.revision) || out.counters.revision == 0,
                        bad_format, "etcd: " + record_key + " has no valid version");
    if (want_value) DCR_TRY(value_of(*kv, record_key, out.record_value));
  }
  DCR_TRY(counter_of(t, first + 1, epoch_key, out.counters.epoch));
  DCR_TRY(counter_of(t, first + 2, attempt_key, out.counters.attempt));
  return status::success();
}

/// The stored record of a snapshot read with its value: the counters, and
/// the commit record embedded in the value, whose revision must be the key's
/// version (only `etcd_commit_store` writes the key, always with its next
/// version inside).
inline status record_of(const snapshot& s, const std::string& record_key, stored_record& out,
                        const seal_key& key = {}) {
  stored_record r = s.counters;
  if (r.revision > 0) {
    stored_record embedded;
    if (auto p = parse_commit_record(s.record_value, embedded, key); !p) {
      p.message = "etcd " + record_key + ": " + p.message;
      return p;
    }
    // Only this store writes the key, always with its next version inside.
    DCR_RETURN_ERROR_IF(embedded.revision != r.revision, bad_format,
                        "etcd " + record_key + ": record says revision " +
                            std::to_string(embedded.revision) + " but the key is at version " +
                            std::to_string(r.revision) + " (written by something other than dcr?)");
    r.record = std::move(embedded.record);
  }
  out = std::move(r);
  return status::success();
}

} // namespace dcr::protocol::etcd
