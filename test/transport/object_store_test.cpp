// Laws of object_store for every model, name validation, atomic publish,
// manifests, the attempt reader and garbage collection.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "dcr/transport/attempt_objects.hpp"
#include "dcr/transport/object_store.hpp"

#include "object_store_laws.hpp"

using namespace dcr;
using namespace dcr::transport;
using namespace dcr::test_transport;

namespace {

struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    char tmpl[] = "/tmp/dcr-objects-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~temp_dir() { std::filesystem::remove_all(path); }
};

} // namespace

TEST_CASE("object name validation") {
  for (auto& bad : bad_names) CHECK(validate_object_name(bad).code == errc::invalid_argument);
  for (auto good : {"a", "a/b/c", "attempt/00000000000000000001/payload/o0000000001-s0000000002",
                    "x.y-z_w", "A9/b..c"})
    CHECK(validate_object_name(good).ok());
  CHECK(validate_object_name(std::string(max_object_name, 'a')).ok());
}

TEST_CASE("object_store laws: memory backend") {
  memory_object_store s;
  check_laws(s);
}

TEST_CASE("object_store laws: filesystem backend") {
  temp_dir d;
  fs_object_store s(d.path / "root");
  check_laws(s);
  // Nothing was written outside the root, whatever the names tried.
  for (auto& e : std::filesystem::directory_iterator(d.path)) CHECK(e.path().filename() == "root");
  // Removing the last object of a directory drops the empty directory too.
  REQUIRE(s.put("deep/er/x", bytes_of("1")).ok());
  REQUIRE(s.remove("deep/er/x").ok());
  CHECK_FALSE(std::filesystem::exists(d.path / "root" / "deep"));
}

TEST_CASE("filesystem backend: an entry list cannot stat is an error, not a skip") {
  // "The fresh attempt prefix is empty" and the readers' listings rely on
  // list naming every object: one it cannot stat (a symlink loop here;
  // EACCES or EIO elsewhere) must not be passed over silently.
  temp_dir d;
  fs_object_store s(d.path / "root");
  REQUIRE(s.put("attempt/1/a", bytes_of("1")).ok());
  std::vector<std::string> names;
  REQUIRE(s.list("attempt/", names).ok());
  CHECK(names == std::vector<std::string>{"attempt/1/a"});
  std::filesystem::create_symlink("loop", d.path / "root" / "attempt" / "1" / "loop");
  auto st = s.list("attempt/", names);
  CHECK(st.code == errc::io);
  CHECK(st.message.find("loop") != std::string::npos);
  // A dangling link (a name gone meanwhile) is no object, and no error.
  std::filesystem::remove(d.path / "root" / "attempt" / "1" / "loop");
  std::filesystem::create_symlink("gone", d.path / "root" / "attempt" / "1" / "dangling");
  REQUIRE(s.list("attempt/", names).ok());
  CHECK(names == std::vector<std::string>{"attempt/1/a"});
}

TEST_CASE("filesystem backend: readers never see a partial object; temporaries are never listed") {
  temp_dir d;
  fs_object_store s(d.path, /*durable=*/false);
  constexpr std::size_t n = 1 << 18;
  REQUIRE(s.put("obj", std::vector<std::byte>(n, std::byte{0})).ok());
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int i = 1; i <= 40; ++i)
      (void)s.put("obj", std::vector<std::byte>(n, static_cast<std::byte>(i)));
    done = true;
  });
  int reads = 0;
  std::vector<std::byte> out;
  std::vector<std::string> names;
  while (!done || reads < 5) {
    REQUIRE(s.get("obj", out).ok());
    REQUIRE(out.size() == n);
    CHECK(std::all_of(out.begin(), out.end(), [&](std::byte b) { return b == out[0]; }));
    REQUIRE(s.list("", names).ok());
    CHECK(names == std::vector<std::string>{"obj"});
    ++reads;
  }
  writer.join();
}

TEST_CASE("manifest serialisation round-trips and rejects damage") {
  manifest m{std::string(32, 'c'), 42, 7, {}};
  for (std::uint32_t i = 0; i < 5; ++i)
    m.payloads.push_back(
        {payload_name(42, 7, i), 100u + i, digest(random_bytes(10, i)), std::nullopt});
  const auto text = serialize_manifest(m);
  manifest back;
  REQUIRE(parse_manifest(text, back).ok());
  CHECK(back == m);
  {
    auto unscoped = m;
    unscoped.incarnation.clear();
    REQUIRE(parse_manifest(serialize_manifest(unscoped), back).ok());
    CHECK(back == unscoped);
  }
  for (std::size_t pos = 0; pos < text.rfind("digest "); pos += 7) {
    auto bad = text;
    bad[pos] = static_cast<char>(bad[pos] ^ 0x02);
    CHECK(parse_manifest(bad, back).code == errc::digest_mismatch);
  }
  auto with_digest = [](std::string body) {
    return body + "digest " + to_hex(digest(std::as_bytes(std::span(body)))) + "\n";
  };
  const std::string head = "dcr-manifest 2\nincarnation none\nattempt 1\nowner 0\n";
  CHECK(
      parse_manifest(with_digest("dcr-manifest 1\nattempt 1\nowner 0\npayloads 0\n"), back).code ==
      errc::unsupported_version);
  CHECK(parse_manifest(
            with_digest("dcr-manifest 4\nincarnation none\nattempt 1\nowner 0\npayloads 0\n"), back)
            .code == errc::unsupported_version);
  CHECK(parse_manifest(with_digest(head + "payloads 1\n"), back).code == errc::bad_format);
  CHECK(parse_manifest(with_digest(head + "payloads 1\nattempt/00000000000000000002/payload/x 1 " +
                                   std::string(32, '0') + "\n"),
                       back)
            .code == errc::bad_format); // entry of another attempt
  const std::string entry = "attempt/00000000000000000001/payload/o0000000000-s0000000000 1 " +
                            std::string(32, '0') + "\n";
  CHECK(parse_manifest(with_digest(head + "payloads 2\n" + entry + entry), back).code ==
        errc::bad_format); // listed twice
  CHECK(parse_manifest(
            with_digest("dcr-manifest 2\nincarnation XYZ\nattempt 1\nowner 0\npayloads 0\n"), back)
            .code == errc::bad_format);
  CHECK(parse_manifest(with_digest(head + "payloads 0\nextra\n"), back).code ==
        errc::trailing_bytes);
  CHECK(parse_manifest("no digest", back).code == errc::bad_format);
}

namespace {
/// Random sorted unique tensor names sharing prefixes (as canonical names do).
std::vector<std::string> random_tensor_names(std::mt19937_64& rng, std::size_t n) {
  static const char* parts[] = {"model", "layers", "0",  "1",      "12",        "mlp",    "experts",
                                "3",     "w1",     "w2", "weight", "self_attn", "q_proj", "a-b_c"};
  std::set<std::string> out;
  while (out.size() < n) {
    std::string name;
    const auto k = 1 + rng() % 6;
    for (std::size_t i = 0; i < k; ++i)
      name += (i ? "." : "") + std::string(parts[rng() % std::size(parts)]);
    out.insert(name);
  }
  return {out.begin(), out.end()};
}
} // namespace

TEST_CASE("manifest version 3: the tensor index round-trips, front-coded, and rejects damage") {
  std::mt19937_64 rng(11);
  for (int round = 0; round < 40; ++round) {
    manifest m{round % 2 ? std::string(32, 'a') : std::string(), 9, 3, {}};
    const auto n = rng() % 6;
    for (std::uint32_t i = 0; i < n; ++i) {
      manifest_entry e{payload_name(9, 3, i), rng() % 1000, digest(random_bytes(8, rng())),
                       std::nullopt};
      if (rng() % 4) e.tensors = random_tensor_names(rng, rng() % 7);
      m.payloads.push_back(std::move(e));
    }
    const auto text = serialize_manifest(m);
    bool any = false;
    for (auto& e : m.payloads) any = any || e.tensors.has_value();
    // Without any index the text is version 2, as older writers wrote it.
    CHECK(text.rfind(any ? "dcr-manifest 3\n" : "dcr-manifest 2\n", 0) == 0);
    manifest back;
    REQUIRE(parse_manifest(text, back).ok());
    CHECK(back == m);
    for (std::size_t pos = 0; pos < text.rfind("digest "); pos += 5) {
      auto bad = text;
      bad[pos] = static_cast<char>(bad[pos] ^ 0x04);
      const auto code = parse_manifest(bad, back).code; // the seal's line itself may break
      CHECK((code == errc::digest_mismatch || code == errc::bad_format));
    }
  }
  {
    // Front coding: each name is (bytes shared with the previous, suffix).
    manifest m{"", 1, 0, {}};
    m.payloads.push_back({payload_name(1, 0, 0), 5, digest(random_bytes(4, 1)),
                          std::vector<std::string>{"m.l.0.e.1.w", "m.l.0.e.1.x", "m.l.0.e.12.w"}});
    const auto text = serialize_manifest(m);
    CHECK(text.find(" 3\n0 m.l.0.e.1.w\n10 x\n9 2.w\n") != std::string::npos);
  }
  auto with_digest = [](std::string body) {
    return body + "digest " + to_hex(digest(std::as_bytes(std::span(body)))) + "\n";
  };
  const std::string head = "dcr-manifest 3\nincarnation none\nattempt 1\nowner 0\npayloads 1\n";
  const std::string entry =
      "attempt/00000000000000000001/payload/o0000000000-s0000000000 1 " + std::string(32, '0');
  manifest back;
  REQUIRE(parse_manifest(with_digest(head + entry + " -\n"), back).ok());
  CHECK(!back.payloads.at(0).tensors);
  REQUIRE(parse_manifest(with_digest(head + entry + " 0\n"), back).ok());
  CHECK(back.payloads.at(0).tensors == std::vector<std::string>{});
  REQUIRE(parse_manifest(with_digest(head + entry + " 2\n0 a.b\n2 c\n"), back).ok());
  CHECK(back.payloads.at(0).tensors == std::vector<std::string>{"a.b", "a.c"});
  for (const char* bad : {"\n",                   // no index count
                          " x\n",                 // not a count
                          " -1\n",                // not a count
                          " 99999999999\n",       // count too long
                          " 2\n0 a\n",            // fewer names than counted
                          " 2\n0 b\n0 a\n",       // not sorted
                          " 2\n0 a\n1 \n",        // missing suffix
                          " 2\n0 ab\n2 c\n1 x\n", // more names than counted
                          " 1\n1 a\n",            // first name shares with nothing
                          " 2\n0 ab\n3 c\n",      // shares more than the previous has
                          " 2\n0 ab\n0 ab\n"}) {  // repeated
    const auto code = parse_manifest(with_digest(head + entry + bad), back).code;
    CAPTURE(bad);
    CHECK((code == errc::bad_format || code == errc::trailing_bytes));
  }
  // A count beyond the bound is refused before anything is read for it.
  CHECK(parse_manifest(with_digest(head + entry + " 16777217\n"), back).code == errc::bad_format);
  // Names the text form cannot hold are refused by the serialiser.
  manifest m{"", 1, 0, {}};
  m.payloads.push_back({payload_name(1, 0, 0), 1, {}, std::vector<std::string>{"has space"}});
  CHECK_THROWS_AS(serialize_manifest(m), error);
  m.payloads.back().tensors = std::vector<std::string>{"b", "a"};
  CHECK_THROWS_AS(serialize_manifest(m), error);
}

TEST_CASE("attempt writer: indexes a payload by its tensors, or not when a name cannot be held") {
  memory_object_store s;
  attempt_writer w(s, 2, 1);
  REQUIRE(w.put_payload(random_bytes(10, 1), {"z.w", "a.w", "z.w"}).ok());
  REQUIRE(w.put_payload(random_bytes(10, 2), {"ok", "not ok"}).ok());
  REQUIRE(w.put_payload(random_bytes(10, 3)).ok());
  REQUIRE(w.finish().ok());
  std::vector<std::byte> bytes;
  REQUIRE(s.get(manifest_name(2, 1), bytes).ok());
  manifest m;
  REQUIRE(parse_manifest({reinterpret_cast<const char*>(bytes.data()), bytes.size()}, m).ok());
  REQUIRE(m.payloads.size() == 3);
  CHECK(m.payloads[0].tensors == std::vector<std::string>{"a.w", "z.w"});
  CHECK(!m.payloads[1].tensors);
  CHECK(!m.payloads[2].tensors);
  CHECK(m == w.listed());
}

TEST_CASE("filtered attempt reader: fetches exactly the payloads the index says it needs") {
  std::mt19937_64 rng(5);
  for (int round = 0; round < 30; ++round) {
    memory_object_store s;
    const std::uint32_t owners = 1 + rng() % 3;
    const auto universe = random_tensor_names(rng, 12);
    std::set<std::string> held;
    for (auto& t : universe)
      if (rng() % 3 == 0) held.insert(t);
    std::map<std::string, std::vector<std::byte>> all, needed;
    std::uint64_t skipped_bytes = 0;
    std::size_t skipped = 0;
    std::vector<digest128> want;
    for (std::uint32_t o = 0; o < owners; ++o) {
      attempt_writer w(s, 4, o);
      const auto n = rng() % 5;
      for (std::uint32_t i = 0; i < n; ++i) {
        auto b = random_bytes(10 + rng() % 50, rng());
        const bool indexed = rng() % 5 != 0;
        std::vector<std::string> t;
        for (auto& u : universe)
          if (rng() % 4 == 0) t.push_back(u);
        bool need = !indexed;
        for (auto& u : t) need = need || held.count(u);
        if (indexed)
          REQUIRE(w.put_payload(b, t).ok());
        else
          REQUIRE(w.put_payload(b).ok());
        all[payload_name(4, o, i)] = b;
        if (need) {
          needed[payload_name(4, o, i)] = b;
          want.push_back(digest(b));
        } else {
          ++skipped;
          skipped_bytes += b.size();
        }
      }
      REQUIRE(w.finish().ok());
    }
    std::sort(want.begin(), want.end());
    for (const bool filtered : {false, true}) {
      attempt_reader<memory_object_store> reader(s, 4, [&] {
        std::vector<std::uint32_t> v;
        for (std::uint32_t o = 0; o < owners; ++o) v.push_back(o);
        return v;
      }());
      if (filtered)
        reader.need_only([&](std::string_view t) { return held.count(std::string(t)) > 0; });
      std::map<std::string, std::vector<std::byte>> got;
      std::atomic<bool> stop{false};
      REQUIRE(reader
                  .run(
                      [&](std::string_view n, std::span<const std::byte> b) {
                        CHECK(got.emplace(std::string(n), std::vector(b.begin(), b.end())).second);
                        return status::success();
                      },
                      stop, std::chrono::steady_clock::now() + std::chrono::seconds(5))
                  .ok());
      if (filtered) {
        CHECK(got == needed);
        CHECK(reader.listed() == want);
        CHECK(reader.skipped() == skipped);
        CHECK(reader.skipped_bytes() == skipped_bytes);
      } else {
        CHECK(got == all);
        CHECK(reader.skipped() == 0);
        CHECK(reader.listed().size() == all.size());
      }
      std::uint64_t bytes = 0;
      for (auto& [n, b] : got) bytes += b.size();
      CHECK(reader.delivered() == got.size());
      CHECK(reader.delivered_bytes() == bytes);
    }
  }
}

TEST_CASE("filtered attempt reader: an object no manifest lists is never fetched") {
  memory_object_store s;
  attempt_writer w(s, 3, 0);
  REQUIRE(w.put_payload(random_bytes(10, 1), {"a"}).ok());
  REQUIRE(s.put(payload_name(3, 0, 7), random_bytes(10, 9)).ok()); // a stray copy
  REQUIRE(w.finish().ok());
  {
    attempt_reader<memory_object_store> unfiltered(s, 3, {0});
    std::atomic<bool> stop{false};
    CHECK(unfiltered
              .run([](std::string_view, std::span<const std::byte>) { return status::success(); },
                   stop, std::chrono::steady_clock::now() + std::chrono::seconds(5))
              .code == errc::verification); // delivered before the manifest said no
  }
  attempt_reader<memory_object_store> reader(s, 3, {0});
  reader.need_only([](std::string_view) { return true; });
  std::vector<std::string> got;
  std::atomic<bool> stop{false};
  REQUIRE(reader
              .run(
                  [&](std::string_view n, std::span<const std::byte>) {
                    got.emplace_back(n);
                    return status::success();
                  },
                  stop, std::chrono::steady_clock::now() + std::chrono::seconds(5))
              .ok());
  CHECK(got == std::vector<std::string>{payload_name(3, 0, 0)});
  // The index objects and the manifests, once each: no payload listing at
  // all, and the stray copy, which no index object names, is never fetched.
  CHECK(reader.listings() == 2);
  CHECK(reader.fetched_early() == 0);
}

TEST_CASE("filtered attempt reader: a payload that differs from its entry still fails the read") {
  memory_object_store s;
  attempt_writer w(s, 3, 0);
  REQUIRE(w.put_payload(random_bytes(10, 1), {"a"}).ok());
  REQUIRE(w.put_payload(random_bytes(10, 2), {"b"}).ok());
  REQUIRE(w.finish().ok());
  REQUIRE(s.put(payload_name(3, 0, 0), random_bytes(10, 7)).ok()); // replaced behind its back
  for (const char* need : {"a", "b"}) {
    attempt_reader<memory_object_store> reader(s, 3, {0});
    reader.need_only([&](std::string_view t) { return t == need; });
    std::atomic<bool> stop{false};
    const auto st =
        reader.run([](std::string_view, std::span<const std::byte>) { return status::success(); },
                   stop, std::chrono::steady_clock::now() + std::chrono::seconds(5));
    // Only the node that needs the damaged payload reads (and refuses) it.
    CHECK(st.code == (std::string_view(need) == "a" ? errc::digest_mismatch : errc::ok));
  }
}

namespace {
/// A memory store whose listings leave out owner 1's manifest of attempt
/// `attempt` until it has served `release_after` gets of owner 0's payloads
/// of that attempt: a reader that waits for every manifest before it
/// fetches never sees owner 1's, and runs into its deadline.
struct late_owner_store {
  memory_object_store inner;
  std::uint64_t attempt = 0;
  std::size_t release_after = 0;
  std::size_t owner0_gets = 0;
  bool revealed = false;          ///< a listing showed owner 1's manifest
  std::vector<std::string> order; ///< payload names got, in order

  status put(std::string_view n, std::span<const std::byte> b) { return inner.put(n, b); }
  status get(std::string_view n, std::vector<std::byte>& out) {
    if (payload_owner(n, attempt)) {
      order.emplace_back(n);
      if (*payload_owner(n, attempt) == 0) ++owner0_gets;
    }
    return inner.get(n, out);
  }
  status remove(std::string_view n) { return inner.remove(n); }
  status list(std::string_view p, std::vector<std::string>& names) {
    DCR_TRY(inner.list(p, names));
    const auto late = manifest_name(attempt, 1);
    if (std::find(names.begin(), names.end(), late) == names.end()) return status::success();
    if (owner0_gets < release_after)
      std::erase(names, late);
    else
      revealed = true;
    return status::success();
  }
};
static_assert(object_store<late_owner_store>);
} // namespace

TEST_CASE("filtered attempt reader: fetches an owner's payloads once its manifest is in, "
          "before the other owners' manifests are") {
  for (const bool everything : {false, true}) {
    CAPTURE(everything);
    late_owner_store s;
    s.attempt = 6;
    attempt_writer w0(s, 6, 0), w1(s, 6, 1);
    REQUIRE(w0.put_payload(random_bytes(30, 1), {"a"}).ok());
    REQUIRE(w0.put_payload(random_bytes(30, 2), {"b"}).ok());
    REQUIRE(w0.put_payload(random_bytes(30, 3), {"c"}).ok());
    REQUIRE(w1.put_payload(random_bytes(30, 4), {"a"}).ok());
    REQUIRE(w1.put_payload(random_bytes(30, 5), {"d"}).ok());
    REQUIRE(w0.finish().ok());
    REQUIRE(w1.finish().ok());
    // Needs a and c (owner 0's first and third payload, owner 1's first), or everything.
    const std::set<std::string> need =
        everything ? std::set<std::string>{"a", "b", "c", "d"} : std::set<std::string>{"a", "c"};
    std::vector<std::string> want{payload_name(6, 0, 0), payload_name(6, 0, 2),
                                  payload_name(6, 1, 0)};
    if (everything)
      want = {payload_name(6, 0, 0), payload_name(6, 0, 1), payload_name(6, 0, 2),
              payload_name(6, 1, 0), payload_name(6, 1, 1)};
    s.release_after = everything ? 3 : 2;
    attempt_reader<late_owner_store> reader(s, 6, {0, 1});
    reader.need_only([&](std::string_view t) { return need.count(std::string(t)) > 0; });
    std::vector<std::string> got;
    std::atomic<bool> stop{false};
    // Owner 1's manifest is listed only after owner 0's payloads were
    // fetched; waiting for it first would run into the deadline (aborted).
    const auto st = reader.run(
        [&](std::string_view n, std::span<const std::byte>) {
          got.emplace_back(n);
          return status::success();
        },
        stop, std::chrono::steady_clock::now() + std::chrono::seconds(10));
    REQUIRE_MESSAGE(st.ok(), st.message);
    CHECK(s.revealed);
    // Each owner's payloads in its sequence order, owner 0's first; none twice.
    CHECK(got == want);
    CHECK(s.order == want);
    CHECK(reader.skipped() == (everything ? 0u : 2u));
    CHECK(reader.delivered() == want.size());
  }
}

TEST_CASE("attempt names sort numerically and parse back") {
  CHECK(attempt_prefix(1) < attempt_prefix(10));
  CHECK(payload_name(3, 1, 2) < payload_name(3, 1, 10));
  CHECK(attempt_of(payload_name(123456789, 4, 5)) == 123456789);
  CHECK(attempt_of(manifest_name(77, 4)) == 77);
  CHECK(attempt_of("attempt/x") == 0);
  CHECK(attempt_of("other/00000000000000000001/") == 0);
  CHECK(validate_object_name(payload_name(~0ull, ~0u, ~0u)).ok());
}

namespace {
struct read_result {
  status st;
  std::vector<std::pair<std::string, std::vector<std::byte>>> got;
};
template <class Store>
read_result read_attempt(Store& s, std::uint64_t tau, std::vector<std::uint32_t> owners,
                         std::chrono::milliseconds timeout = std::chrono::milliseconds(2000)) {
  read_result r;
  std::atomic<bool> stop{false};
  attempt_reader<Store> reader(s, tau, owners);
  r.st = reader.run(
      [&](std::string_view n, std::span<const std::byte> b) {
        r.got.emplace_back(std::string(n), std::vector<std::byte>(b.begin(), b.end()));
        return status::success();
      },
      stop, std::chrono::steady_clock::now() + timeout);
  return r;
}
} // namespace

TEST_CASE("attempt writer and reader: every listed payload is delivered exactly once") {
  memory_object_store s;
  std::map<std::string, std::vector<std::byte>> sent;
  for (std::uint32_t o = 0; o < 3; ++o) {
    attempt_writer w(s, 5, o);
    for (std::uint32_t i = 0; i < o + 2; ++i) {
      auto b = random_bytes(50 + i, o * 10 + i);
      REQUIRE(w.put_payload(b).ok());
      sent[payload_name(5, o, i)] = b;
    }
    REQUIRE(w.finish().ok());
  }
  // Objects of other attempts are not this attempt's business.
  attempt_writer other(s, 6, 0);
  REQUIRE(other.put_payload(random_bytes(5, 99)).ok());
  auto r = read_attempt(s, 5, {0, 1, 2});
  REQUIRE(r.st.ok());
  std::map<std::string, std::vector<std::byte>> got(r.got.begin(), r.got.end());
  CHECK(got.size() == r.got.size());
  CHECK(got == sent);
}

TEST_CASE("attempt reader: overlaps with the writer, fetching payloads before the manifest "
          "exists and delivering them only once it binds them") {
  memory_object_store s;
  std::atomic<int> delivered_before_manifest{0};
  std::atomic<bool> manifest_published{false};
  std::thread writer([&] {
    attempt_writer w(s, 1, 0);
    for (std::uint32_t i = 0; i < 4; ++i) {
      (void)w.put_payload(random_bytes(20, i));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    manifest_published = true;
    (void)w.finish();
  });
  std::atomic<bool> stop{false};
  attempt_reader<memory_object_store> reader(s, 1, {0});
  auto st = reader.run(
      [&](std::string_view, std::span<const std::byte>) {
        if (!manifest_published) ++delivered_before_manifest;
        return status::success();
      },
      stop, std::chrono::steady_clock::now() + std::chrono::seconds(10));
  writer.join();
  REQUIRE(st.ok());
  CHECK(reader.delivered() == 4);
  CHECK(reader.fetched_early() >= 1);
  CHECK(delivered_before_manifest == 0);
}

namespace {
/// A memory store that asks readers to list it at most every 40 ms.
struct slow_listing_store : memory_object_store {
  std::chrono::microseconds list_poll_max() const { return std::chrono::milliseconds(40); }
};
static_assert(object_store<slow_listing_store>);

/// Poll rounds a reader makes while the manifest of attempt 1 appears after 300 ms.
template <class Store>
std::size_t listings_while_waiting(Store& s, poll_policy* poll = nullptr) {
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    attempt_writer w(s, 1, 0);
    (void)w.put_payload(random_bytes(20, 1));
    (void)w.finish();
  });
  std::atomic<bool> stop{false};
  auto reader = poll ? attempt_reader<Store>(s, 1, {0}, *poll) : attempt_reader<Store>(s, 1, {0});
  auto st =
      reader.run([](std::string_view, std::span<const std::byte>) { return status::success(); },
                 stop, std::chrono::steady_clock::now() + std::chrono::seconds(20));
  writer.join();
  REQUIRE(st.ok());
  CHECK(reader.delivered() == 1);
  CHECK(reader.listings() == 2 * reader.polls()); // one owner: its payloads, then the manifests
  return reader.polls();
}
} // namespace

TEST_CASE("attempt reader: waiting readers back off to the store's list interval") {
  memory_object_store fast;
  slow_listing_store slow;
  CHECK(default_poll_policy(fast).max == std::chrono::milliseconds(5));
  CHECK(default_poll_policy(slow).max == std::chrono::milliseconds(40));
  const auto n_fast = listings_while_waiting(fast);
  const auto n_slow = listings_while_waiting(slow);
  INFO("listings: " << n_fast << " at 5 ms, " << n_slow << " at 40 ms");
  // 300 ms of waiting: at least 60 listings at 5 ms, and at 40 ms the ramp
  // (0.1 ms doubling to 40 ms, ~80 ms) plus ~6 full intervals.
  CHECK(n_fast >= 30);
  CHECK(n_fast > 2 * n_slow);
  CHECK(n_slow <= 25);
  poll_policy explicit_policy{std::chrono::milliseconds(1), std::chrono::milliseconds(100)};
  memory_object_store other;
  CHECK(listings_while_waiting(other, &explicit_policy) <= 12);
  CHECK_THROWS_AS(
      (attempt_reader<memory_object_store>(
          other, 1, {0}, poll_policy{std::chrono::microseconds(0), std::chrono::microseconds(1)})),
      dcr::error);
}

namespace {
/// Counts the names every listing returns; `with_after` says whether it
/// offers `list_after` (else the reader lists whole prefixes and filters).
template <bool with_after>
struct counting_store {
  memory_object_store inner;
  std::atomic<std::size_t> names_returned{0};
  status put(std::string_view n, std::span<const std::byte> b) { return inner.put(n, b); }
  status get(std::string_view n, std::vector<std::byte>& out) { return inner.get(n, out); }
  status remove(std::string_view n) { return inner.remove(n); }
  status list(std::string_view p, std::vector<std::string>& names) {
    DCR_TRY(inner.list(p, names));
    names_returned += names.size();
    return status::success();
  }
  status list_after(std::string_view p, std::string_view after,
                    std::vector<std::string>& names) requires with_after {
    DCR_TRY(inner.list_after(p, after, names));
    names_returned += names.size();
    return status::success();
  }
};
static_assert(lists_after<counting_store<true>> && !lists_after<counting_store<false>>);

/// Three owners publish 40 payloads each, slowly, while a reader polls.
template <class Store>
void read_slow_owners(Store& s, std::size_t& polls) {
  constexpr int per_owner = 40;
  std::vector<std::thread> writers;
  for (std::uint32_t o = 0; o < 3; ++o)
    writers.emplace_back([&s, o] {
      attempt_writer w(s, 7, o);
      for (int i = 0; i < per_owner; ++i) {
        REQUIRE(w.put_payload(random_bytes(16, o * 1000 + i)).ok());
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      REQUIRE(w.finish().ok());
    });
  // A stray object under an owner that is not required: never fetched.
  REQUIRE(s.put(payload_name(7, 9, 0), random_bytes(16, 99)).ok());
  std::atomic<bool> stop{false};
  attempt_reader<Store> reader(
      s, 7, {0, 1, 2}, poll_policy{std::chrono::microseconds(200), std::chrono::microseconds(500)});
  std::set<std::string> got;
  auto st = reader.run(
      [&](std::string_view n, std::span<const std::byte>) {
        got.insert(std::string(n));
        return status::success();
      },
      stop, std::chrono::steady_clock::now() + std::chrono::seconds(20));
  for (auto& w : writers) w.join();
  REQUIRE_MESSAGE(st.ok(), st.message);
  CHECK(got.size() == 3 * per_owner);
  CHECK(!got.count(payload_name(7, 9, 0)));
  polls = reader.polls();
}
} // namespace

TEST_CASE("attempt reader: polling lists only names it has not seen (start-after per owner)") {
  counting_store<true> incremental;
  counting_store<false> whole;
  std::size_t polls_inc = 0, polls_whole = 0;
  read_slow_owners(incremental, polls_inc);
  read_slow_owners(whole, polls_whole);
  INFO("polls " << polls_inc << " / " << polls_whole << ", names listed "
                << incremental.names_returned.load() << " / " << whole.names_returned.load());
  REQUIRE(polls_inc > 20); // the reader really waited on the writers
  // Every payload name is listed once, the manifests once per poll at most.
  CHECK(incremental.names_returned <= 3 * 40 + 3 * polls_inc);
  // Without start-after each poll lists every name seen so far again.
  CHECK(whole.names_returned > 4 * (3 * 40));
}

TEST_CASE("attempt reader: start-after listings through an incarnation scope") {
  memory_object_store inner;
  incarnation_scope scoped(inner, std::string(32, 'a'));
  attempt_writer w(scoped, 3, 1);
  for (int i = 0; i < 5; ++i) REQUIRE(w.put_payload(random_bytes(8, i)).ok());
  std::vector<std::string> names;
  REQUIRE(scoped.list_after("attempt/", payload_name(3, 1, 2), names).ok());
  CHECK(names == std::vector<std::string>{payload_name(3, 1, 3), payload_name(3, 1, 4)});
  REQUIRE(scoped.list_after(attempt_prefix(3) + "payload/", "", names).ok());
  CHECK(names.size() == 5);
  REQUIRE(list_names_after(inner, "incarnation/",
                           "incarnation/" + std::string(32, 'a') + "/" + payload_name(3, 1, 3),
                           names)
              .ok());
  CHECK(names.size() == 1);
}

TEST_CASE("attempt reader: failures are typed") {
  SUBCASE("a listed payload is missing") {
    memory_object_store s;
    attempt_writer w(s, 2, 0);
    REQUIRE(w.put_payload(random_bytes(10, 1)).ok());
    REQUIRE(w.put_payload(random_bytes(10, 2)).ok());
    REQUIRE(w.finish().ok());
    REQUIRE(s.remove(payload_name(2, 0, 1)).ok());
    CHECK(read_attempt(s, 2, {0}).st.code == errc::not_found);
  }
  SUBCASE("a payload differs from its manifest entry") {
    memory_object_store s;
    attempt_writer w(s, 2, 0);
    REQUIRE(w.put_payload(random_bytes(10, 1)).ok());
    REQUIRE(w.finish().ok());
    REQUIRE(s.put(payload_name(2, 0, 0), random_bytes(10, 2)).ok());
    CHECK(read_attempt(s, 2, {0}).st.code == errc::digest_mismatch);
  }
  SUBCASE("a damaged manifest") {
    memory_object_store s;
    attempt_writer w(s, 2, 0);
    REQUIRE(w.finish().ok());
    std::vector<std::byte> m;
    REQUIRE(s.get(manifest_name(2, 0), m).ok());
    m[3] ^= std::byte{1};
    REQUIRE(s.put(manifest_name(2, 0), m).ok());
    CHECK(read_attempt(s, 2, {0}).st.code == errc::digest_mismatch);
  }
  SUBCASE("a manifest of another attempt under this prefix") {
    memory_object_store s;
    attempt_writer w(s, 3, 0);
    REQUIRE(w.finish().ok());
    std::vector<std::byte> m;
    REQUIRE(s.get(manifest_name(3, 0), m).ok());
    REQUIRE(s.put(manifest_name(4, 0), m).ok());
    CHECK(read_attempt(s, 4, {0}).st.code == errc::stale_attempt);
  }
  SUBCASE("an object no manifest lists under the attempt prefix") {
    memory_object_store s;
    attempt_writer w(s, 2, 0);
    REQUIRE(w.put_payload(random_bytes(10, 1)).ok());
    REQUIRE(s.put(payload_name(2, 0, 9), random_bytes(10, 1)).ok()); // same bytes, unlisted name
    REQUIRE(w.finish().ok());
    auto r = read_attempt(s, 2, {0});
    CHECK(r.st.code == errc::verification);
    CHECK(r.st.message.find("no manifest lists") != std::string::npos);
  }
  SUBCASE("a manifest under another owner's name, or of an owner not required") {
    memory_object_store s;
    attempt_writer w(s, 2, 1);
    REQUIRE(w.finish().ok());
    std::vector<std::byte> m;
    REQUIRE(s.get(manifest_name(2, 1), m).ok());
    REQUIRE(s.put(manifest_name(2, 0), m).ok());
    CHECK(read_attempt(s, 2, {0}).st.code == errc::verification);
    memory_object_store s2;
    attempt_writer w2(s2, 2, 1);
    REQUIRE(w2.finish().ok());
    attempt_writer w3(s2, 2, 0);
    REQUIRE(w3.finish().ok());
    CHECK(read_attempt(s2, 2, {0}).st.code == errc::verification);
  }
  SUBCASE("an owner never finishes: deadline") {
    memory_object_store s;
    attempt_writer w(s, 2, 0);
    REQUIRE(w.finish().ok());
    auto r = read_attempt(s, 2, {0, 1}, std::chrono::milliseconds(30));
    CHECK(r.st.code == errc::aborted);
    CHECK(r.st.message.find("deadline") != std::string::npos);
  }
  SUBCASE("stopped") {
    memory_object_store s;
    std::atomic<bool> stop{true};
    attempt_reader<memory_object_store> reader(s, 2, {0});
    auto st =
        reader.run([](std::string_view, std::span<const std::byte>) { return status::success(); },
                   stop, std::chrono::steady_clock::now() + std::chrono::seconds(5));
    CHECK(st.code == errc::aborted);
  }
  SUBCASE("the delivery callback's error ends the read") {
    memory_object_store s;
    attempt_writer w(s, 2, 0);
    REQUIRE(w.put_payload(random_bytes(10, 1)).ok());
    REQUIRE(w.finish().ok());
    std::atomic<bool> stop{false};
    attempt_reader<memory_object_store> reader(s, 2, {0});
    auto st = reader.run(
        [](std::string_view, std::span<const std::byte>) { return fail(errc::truncated, "x"); },
        stop, std::chrono::steady_clock::now() + std::chrono::seconds(5));
    CHECK(st.code == errc::truncated);
  }
}

TEST_CASE("collect_attempts removes every object of attempts up to the committed one") {
  temp_dir d;
  fs_object_store s(d.path);
  for (std::uint64_t a = 1; a <= 4; ++a) {
    attempt_writer w(s, a, 0);
    REQUIRE(w.put_payload(random_bytes(8, a)).ok());
    REQUIRE(w.finish().ok());
  }
  REQUIRE(s.put("keep/me", bytes_of("k")).ok());
  std::size_t removed = 0;
  REQUIRE(collect_attempts(s, 3, &removed).ok());
  CHECK(removed == 9); // per attempt: the payload, its index object, the manifest
  std::vector<std::string> names;
  REQUIRE(s.list("", names).ok());
  CHECK(names == std::vector<std::string>{index_name(4, 0, 0), manifest_name(4, 0),
                                          payload_name(4, 0, 0), "keep/me"});
}

namespace {
/// A thread-safe memory store that counts payload GETs and PUTs in flight.
/// The first `target` concurrent payload requests wait for one another (up
/// to 10 s), so a window of `target` is seen full however loaded the
/// machine; afterwards requests pass at once. `peak` is the most payload
/// requests ever in flight together.
struct in_flight_store {
  memory_object_store inner;
  std::size_t target = 3, window = 0;
  std::mutex m;
  std::condition_variable cv;
  std::size_t now = 0, peak = 0;
  bool released = false;
  std::atomic<std::size_t> payload_gets{0};

  std::size_t requests_in_flight() const { return window; }
  template <class F>
  status counted(std::string_view n, F&& f) {
    if (n.find("/payload/") == std::string_view::npos) return f();
    {
      std::unique_lock l(m);
      peak = std::max(peak, ++now);
      if (now >= target) released = true;
      cv.notify_all();
      cv.wait_for(l, std::chrono::seconds(10), [&] { return released; });
    }
    auto s = f();
    std::lock_guard l(m);
    --now;
    return s;
  }
  status put(std::string_view n, std::span<const std::byte> b) {
    return counted(n, [&] { return inner.put(n, b); });
  }
  status get(std::string_view n, std::vector<std::byte>& out) {
    if (n.find("/payload/") != std::string_view::npos) ++payload_gets;
    return counted(n, [&] { return inner.get(n, out); });
  }
  status list(std::string_view p, std::vector<std::string>& names) { return inner.list(p, names); }
  status remove(std::string_view n) { return inner.remove(n); }
};
static_assert(object_store<in_flight_store>);

/// Runs `reader` to completion on a thread; `got` collects what it delivered.
struct reader_thread {
  std::mutex m;
  std::vector<std::pair<std::string, std::vector<std::byte>>> got;
  std::atomic<bool> stop{false};
  status st = status::success();
  std::thread t;
  template <class Reader>
  explicit reader_thread(Reader& r) {
    t = std::thread([this, &r] {
      st = r.run(
          [this](std::string_view n, std::span<const std::byte> b) {
            std::lock_guard l(m);
            got.emplace_back(std::string(n), std::vector(b.begin(), b.end()));
            return status::success();
          },
          stop, std::chrono::steady_clock::now() + std::chrono::seconds(20));
    });
  }
  std::size_t delivered() {
    std::lock_guard l(m);
    return got.size();
  }
  ~reader_thread() {
    if (t.joinable()) t.join();
  }
};

/// Waits (up to 20 s) until `cond` holds.
template <class F>
bool eventually(F&& cond) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}
} // namespace

TEST_CASE("early fetch: payloads durable before their manifest are fetched at once and "
          "delivered only after the manifest binds them, bit for bit") {
  for (const bool filtered : {false, true}) {
    CAPTURE(filtered);
    in_flight_store s;
    s.target = 1;
    attempt_writer w(s, 4, 0, 1);
    const auto a = random_bytes(40, 1), b = random_bytes(50, 2), c = random_bytes(60, 3);
    REQUIRE(w.put_payload(a, {"t.a"}).ok());
    REQUIRE(w.put_payload(b, {"t.b"}).ok());
    REQUIRE(w.put_payload(c, {"t.c"}).ok()); // not needed by the filtered reader
    attempt_reader<in_flight_store> r(s, 4, {0});
    if (filtered) r.need_only([](std::string_view t) { return t != "t.c"; });
    reader_thread rt(r);
    const std::size_t want = filtered ? 2 : 3;
    // Both needed payloads are fetched while no manifest exists...
    REQUIRE(eventually([&] { return s.payload_gets.load() == want; }));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    // ...and none is delivered before it.
    CHECK(rt.delivered() == 0);
    REQUIRE(w.finish().ok());
    rt.t.join();
    REQUIRE_MESSAGE(rt.st.ok(), rt.st.message);
    CHECK(r.fetched_early() == want);
    CHECK(s.payload_gets == want); // fetched once, never again after the manifest
    std::vector<std::pair<std::string, std::vector<std::byte>>> expect{{payload_name(4, 0, 0), a},
                                                                       {payload_name(4, 0, 1), b}};
    if (!filtered) expect.emplace_back(payload_name(4, 0, 2), c);
    CHECK(rt.got == expect);
  }
}

TEST_CASE("early fetch: a planted payload that no manifest binds is never delivered") {
  for (const bool filtered : {false, true}) {
    CAPTURE(filtered);
    in_flight_store s;
    s.target = 1;
    attempt_writer w(s, 5, 0);
    const auto real = random_bytes(30, 1), planted = random_bytes(30, 2);
    REQUIRE(w.put_payload(real, {"t.a"}).ok());
    // Planted under owner 0's next sequence number, with an index object
    // that names it (well-formed, as the owner would write it).
    REQUIRE(s.put(payload_name(5, 0, 1), planted).ok());
    const auto forged = serialize_manifest({"",
                                            5,
                                            0,
                                            {{payload_name(5, 0, 1), planted.size(),
                                              digest(planted), std::vector<std::string>{"t.a"}}}});
    REQUIRE(s.put(index_name(5, 0, 1), std::as_bytes(std::span(forged))).ok());
    attempt_reader<in_flight_store> r(s, 5, {0});
    if (filtered) r.need_only([](std::string_view) { return true; });
    reader_thread rt(r);
    // Both fetched while no manifest exists (the planted one by its index
    // object when filtered).
    REQUIRE(eventually([&] { return s.payload_gets.load() == 2; }));
    REQUIRE(w.finish().ok());
    rt.t.join();
    // Unfiltered, an object under the owner's payload names that its
    // manifest does not list fails the attempt; filtered it is dropped.
    // Either way only what the manifest binds was delivered.
    CHECK(rt.st.code == (filtered ? errc::ok : errc::verification));
    for (auto& [n, bytes] : rt.got) {
      CHECK(n == payload_name(5, 0, 0));
      CHECK(bytes == real);
    }
    if (filtered) CHECK(rt.got.size() == 1);
  }
}

TEST_CASE("early fetch: a payload fetched early whose bytes differ from the manifest entry "
          "fails the read and is never delivered") {
  in_flight_store s;
  s.target = 1;
  attempt_writer w(s, 6, 0);
  REQUIRE(w.put_payload(random_bytes(30, 1), {"t.a"}).ok());
  REQUIRE(s.inner.put(payload_name(6, 0, 0), random_bytes(30, 9)).ok()); // replaced
  attempt_reader<in_flight_store> r(s, 6, {0});
  r.need_only([](std::string_view) { return true; });
  reader_thread rt(r);
  REQUIRE(eventually([&] { return s.payload_gets.load() == 1; }));
  REQUIRE(w.finish().ok());
  rt.t.join();
  CHECK(rt.st.code == errc::digest_mismatch);
  CHECK(rt.got.empty());
}

TEST_CASE("request window: writers and readers keep at most the window's requests in flight") {
  for (const std::size_t window : {1u, 3u, 5u}) {
    CAPTURE(window);
    in_flight_store s;
    s.target = window;
    s.window = window;
    std::map<std::string, std::vector<std::byte>> sent;
    {
      attempt_writer w(s, 2, 0);
      CHECK(w.requests_in_flight() == window);
      for (std::uint32_t i = 0; i < 12; ++i) {
        auto b = random_bytes(20 + i, i);
        REQUIRE(w.put_payload(b, {"t." + std::to_string(i)}).ok());
        sent[payload_name(2, 0, i)] = std::move(b);
      }
      REQUIRE(w.finish().ok());
    }
    CHECK(s.peak == window); // filled, never exceeded
    // The manifest lists every payload in sequence order, each durable.
    std::vector<std::byte> m;
    REQUIRE(s.inner.get(manifest_name(2, 0), m).ok());
    manifest parsed;
    REQUIRE(parse_manifest({reinterpret_cast<const char*>(m.data()), m.size()}, parsed).ok());
    REQUIRE(parsed.payloads.size() == 12);
    for (std::uint32_t i = 0; i < 12; ++i) CHECK(parsed.payloads[i].name == payload_name(2, 0, i));

    s.peak = 0;
    s.released = false;
    attempt_reader<in_flight_store> r(s, 2, {0});
    CHECK(r.requests_in_flight() == window);
    std::map<std::string, std::vector<std::byte>> got;
    std::atomic<bool> stop{false};
    REQUIRE(r.run(
                 [&](std::string_view n, std::span<const std::byte> b) {
                   CHECK(got.emplace(std::string(n), std::vector(b.begin(), b.end())).second);
                   return status::success();
                 },
                 stop, std::chrono::steady_clock::now() + std::chrono::seconds(20))
                .ok());
    CHECK(s.peak == window);
    CHECK(got == sent); // bit for bit, each once
  }
}

TEST_CASE("request window: a failed upload is returned by finish, and no manifest is written") {
  struct failing_store : memory_object_store {
    std::atomic<int> puts{0};
    std::size_t requests_in_flight() const { return 4; }
    status put(std::string_view n, std::span<const std::byte> b) {
      if (n.find("/payload/") != std::string_view::npos && ++puts == 3)
        return fail(errc::unavailable, "store down");
      return memory_object_store::put(n, b);
    }
  } s;
  attempt_writer w(s, 3, 0);
  status st = status::success();
  for (int i = 0; i < 6 && st; ++i) st = w.put_payload(random_bytes(10, i));
  if (st) st = w.finish();
  CHECK(st.code == errc::unavailable);
  std::vector<std::byte> none;
  CHECK(s.get(manifest_name(3, 0), none).code == errc::not_found);
}
