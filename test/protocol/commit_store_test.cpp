// Laws of commit_store for every model, the record serialisation, and the
// file backend under racing and crashing processes.
#include <doctest/doctest.h>

#include <csignal>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include "commit_store_laws.hpp"
#include "dcr/protocol/commit_store.hpp"

using namespace dcr;
using namespace dcr::protocol;
using dcr::test_laws::check_laws;
using dcr::test_laws::sample_record;

namespace {

struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    char tmpl[] = "/tmp/dcr-commit-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~temp_dir() { std::filesystem::remove_all(path); }
};

} // namespace

TEST_CASE("commit_store laws: memory backend") {
  memory_commit_store s;
  check_laws(s);
}

TEST_CASE("commit_store laws: file backend, and the state survives reopening") {
  temp_dir d;
  stored_record first;
  {
    file_commit_store s(d.path);
    check_laws(s);
    REQUIRE(s.load(first).ok());
  }
  file_commit_store again(d.path);
  stored_record r;
  REQUIRE(again.load(r).ok());
  CHECK(r == first);
}

TEST_CASE("commit record serialisation round-trips and rejects damage") {
  for (std::uint64_t seed = 0; seed < 50; ++seed) {
    stored_record s{sample_record(seed * 3, seed, seed), seed + 1, seed + 2, seed + 3};
    stored_record back;
    const auto text = serialize_commit_record(s);
    REQUIRE(parse_commit_record(text, back).ok());
    CHECK(back == s);
    // Any single changed byte before the digest line is caught.
    std::mt19937_64 rng(seed);
    auto bad = text;
    const auto pos = rng() % text.rfind("digest ");
    bad[pos] = static_cast<char>(bad[pos] ^ 0x01);
    auto st = parse_commit_record(bad, back);
    CHECK_FALSE(st.ok());
    CHECK((st.code == errc::digest_mismatch || st.code == errc::bad_format));
  }
  stored_record out;
  CHECK(parse_commit_record("", out).code == errc::bad_format);
  CHECK(parse_commit_record("dcr-commit 1\n", out).code == errc::bad_format);
  {
    // A well-digested record of an unknown version.
    std::string body = "dcr-commit 6\n";
    auto text = body + "digest " + to_hex(digest(std::as_bytes(std::span(body)))) + "\n";
    CHECK(parse_commit_record(text, out).code == errc::unsupported_version);
    // The format with version-2 state digests is refused with what to do.
    body = "dcr-commit 4\nincarnation none\nrevision 1\n";
    text = body + "digest " + to_hex(digest(std::as_bytes(std::span(body)))) + "\n";
    auto st4 = parse_commit_record(text, out);
    CHECK(st4.code == errc::unsupported_version);
    CHECK(st4.message.find("version 2") != std::string::npos);
    // The format with version-1 state digests is refused with what to do.
    body = "dcr-commit 3\nincarnation none\nrevision 1\n";
    text = body + "digest " + to_hex(digest(std::as_bytes(std::span(body)))) + "\n";
    auto st3 = parse_commit_record(text, out);
    CHECK(st3.code == errc::unsupported_version);
    CHECK(st3.message.find("version 1") != std::string::npos);
    // The format with whole-storage digests is refused with what to do.
    body = "dcr-commit 2\nincarnation none\nrevision 1\n";
    text = body + "digest " + to_hex(digest(std::as_bytes(std::span(body)))) + "\n";
    auto st2 = parse_commit_record(text, out);
    CHECK(st2.code == errc::unsupported_version);
    CHECK(st2.message.find("set digests") != std::string::npos);
    // The format before incarnations is refused with what to do.
    body = "dcr-commit 1\nrevision 1\n";
    text = body + "digest " + to_hex(digest(std::as_bytes(std::span(body)))) + "\n";
    auto st = parse_commit_record(text, out);
    CHECK(st.code == errc::unsupported_version);
    CHECK(st.message.find("incarnation") != std::string::npos);
  }
  {
    // Valid digest over malformed fields.
    std::string body = "dcr-commit 5\nincarnation none\nrevision x\n";
    auto text = body + "digest " + to_hex(digest(std::as_bytes(std::span(body)))) + "\n";
    CHECK(parse_commit_record(text, out).code == errc::bad_format);
  }
  {
    auto text = serialize_commit_record(stored_record{});
    text.pop_back();
    CHECK(parse_commit_record(text, out).code == errc::bad_format);
  }
}

TEST_CASE("validation rejects what no correct writer produces, resealed or not") {
  const std::uint64_t top = ~std::uint64_t{0};
  auto refused = [](const stored_record& s) {
    // Sealed by hand: the digest line is right, the content is not.
    stored_record back;
    const auto st = parse_commit_record(serialize_commit_record(s), back);
    CHECK(st.code == errc::bad_format);
    return st;
  };
  auto good = stored_record{sample_record(3, 5, 1), 4, 2, 6};
  stored_record back;
  REQUIRE(parse_commit_record(serialize_commit_record(good), back).ok());
  {
    auto s = good;
    s.record.receivers = {{"rank-0", {}}, {"rank-1", {}}, {"rank-0", {}}};
    CHECK(refused(s).message.find("listed twice") != std::string::npos);
  }
  {
    auto s = good;
    s.record.receivers = {{"", {}}};
    (void)refused(s);
  }
  for (int field = 0; field < 5; ++field) {
    CAPTURE(field);
    auto s = good;
    if (field == 0) s.attempt = top;
    if (field == 1) s.record.attempt = s.attempt = top;
    if (field == 2) s.epoch = top;
    if (field == 3) s.revision = top;
    if (field == 4) s.record.version = top;
    CHECK(refused(s).message.find("2^64-1") != std::string::npos);
  }
  {
    auto s = good;
    s.record.attempt = s.attempt + 1; // committed an attempt never handed out
    (void)refused(s);
  }
  {
    auto s = good;
    s.record.incarnation.clear(); // a committed record without its incarnation
    (void)refused(s);
    s.revision = 0; // a never-committed store that holds a record
    s.record.incarnation = good.record.incarnation;
    (void)refused(s);
  }
  // Counters stop one short of 2^64-1: prepare and take_over refuse, typed, and change nothing.
  temp_dir d;
  {
    stored_record s;
    s.epoch = 1;
    s.attempt = max_counter;
    std::ofstream(d.path / "commit") << serialize_commit_record(s);
  }
  file_commit_store fs(d.path);
  std::uint64_t a = 0, e = 0;
  CHECK(fs.prepare(1, a).code == errc::length_overflow);
  {
    stored_record s;
    s.epoch = max_counter;
    std::ofstream(d.path / "commit") << serialize_commit_record(s);
  }
  CHECK(fs.take_over(e).code == errc::length_overflow);
  REQUIRE(fs.load(back).ok());
  CHECK(back.epoch == max_counter);
}

TEST_CASE("file backend: a damaged record file is reported, not misread") {
  temp_dir d;
  file_commit_store s(d.path);
  std::uint64_t e = 0, a = 0;
  REQUIRE(s.take_over(e).ok());
  REQUIRE(s.prepare(e, a).ok());
  REQUIRE(s.compare_and_set(e, a, 0, sample_record(1, a, 1)).ok());
  {
    std::fstream f(d.path / "commit", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.put('#');
  }
  stored_record r;
  auto st = s.load(r);
  CHECK(st.code == errc::digest_mismatch);
  CHECK(st.message.find("commit") != std::string::npos);
  CHECK(s.prepare(e, a).code == errc::digest_mismatch);
}

TEST_CASE("file backend: a commit.lock held past the timeout is unavailable, not a hang") {
  // A holder stopped with the lock (SIGSTOP, a debugger) used to hang every
  // call on the store. flock conflicts between open file descriptions, so a
  // second open of the lock file here stands for the other process.
  temp_dir d;
  file_commit_store s(d.path);
  std::uint64_t e = 0;
  REQUIRE(s.take_over(e).ok());
  s.set_lock_timeout(std::chrono::milliseconds(300));
  const int held = ::open((d.path / "commit.lock").c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(held >= 0);
  REQUIRE(::flock(held, LOCK_EX) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  stored_record r;
  auto st = s.load(r);
  const auto waited = std::chrono::steady_clock::now() - t0;
  CHECK(st.code == errc::unavailable);
  CHECK(st.message.find("commit.lock") != std::string::npos);
  CHECK(waited >= std::chrono::milliseconds(300));
  CHECK(waited < std::chrono::seconds(5));
  std::uint64_t a = 0;
  CHECK(s.prepare(e, a).code == errc::unavailable);
  // Released: calls go through again, and the refused prepare changed nothing.
  ::close(held);
  REQUIRE(s.prepare(e, a).ok());
  CHECK(a == 1);
}

TEST_CASE("file backend: forked processes racing prepare get unique, increasing attempt ids") {
  temp_dir d;
  std::uint64_t epoch = 0;
  {
    file_commit_store s(d.path);
    REQUIRE(s.take_over(epoch).ok());
  }
  constexpr int procs = 4, per = 40;
  std::vector<int> fds;
  std::vector<pid_t> kids;
  for (int p = 0; p < procs; ++p) {
    int pipefd[2];
    REQUIRE(::pipe(pipefd) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(pipefd[0]);
      file_commit_store s(d.path);
      std::uint64_t last = 0;
      for (int i = 0; i < per; ++i) {
        std::uint64_t a = 0;
        if (!s.prepare(epoch, a).ok() || a <= last) ::_exit(2);
        last = a;
        if (::write(pipefd[1], &a, sizeof a) != sizeof a) ::_exit(3);
      }
      ::_exit(0);
    }
    ::close(pipefd[1]);
    fds.push_back(pipefd[0]);
    kids.push_back(pid);
  }
  std::set<std::uint64_t> all;
  for (int fd : fds) {
    std::uint64_t a = 0;
    while (::read(fd, &a, sizeof a) == sizeof a) CHECK(all.insert(a).second);
    ::close(fd);
  }
  for (auto pid : kids) {
    int st = 0;
    REQUIRE(::waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 0);
  }
  CHECK(all.size() == std::size_t{procs * per});
  CHECK(*all.begin() == 1);
  CHECK(*all.rbegin() == std::uint64_t{procs * per});
}

TEST_CASE("file backend: forked processes racing compare-and-set never lose an increment") {
  temp_dir d;
  std::uint64_t epoch = 0, attempt = 0;
  {
    file_commit_store s(d.path);
    REQUIRE(s.take_over(epoch).ok());
    REQUIRE(s.prepare(epoch, attempt).ok());
  }
  constexpr int procs = 4, per = 25;
  std::vector<pid_t> kids;
  for (int p = 0; p < procs; ++p) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      file_commit_store s(d.path);
      int won = 0, conflicts = 0;
      while (won < per) {
        stored_record r;
        if (!s.load(r).ok()) ::_exit(2);
        auto next = r.record;
        ++next.version;
        next.incarnation = std::string(32, 'a');
        next.receivers = {{"p" + std::to_string(p), {}}};
        auto st = s.compare_and_set(epoch, attempt, r.revision, next);
        if (st.ok())
          ++won;
        else if (st.code == errc::conflict)
          ++conflicts;
        else
          ::_exit(3);
      }
      ::_exit(0);
    }
    kids.push_back(pid);
  }
  for (auto pid : kids) {
    int st = 0;
    REQUIRE(::waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 0);
  }
  file_commit_store s(d.path);
  stored_record r;
  REQUIRE(s.load(r).ok());
  CHECK(r.record.version == std::uint64_t{procs * per});
  CHECK(r.revision == std::uint64_t{procs * per});
}

TEST_CASE(
    "file backend: processes killed mid-operation leave a readable record and no stuck lock") {
  temp_dir d;
  std::uint64_t epoch = 0, attempt = 0;
  {
    file_commit_store s(d.path);
    REQUIRE(s.take_over(epoch).ok());
    REQUIRE(s.prepare(epoch, attempt).ok());
  }
  for (int round = 0; round < 6; ++round) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      file_commit_store s(d.path);
      for (;;) {
        stored_record r;
        if (!s.load(r).ok()) ::_exit(2);
        auto next = r.record;
        ++next.version;
        next.incarnation = std::string(32, 'a');
        (void)s.compare_and_set(epoch, attempt, r.revision, next);
      }
    }
    ::usleep(static_cast<useconds_t>(2000 + 3000 * round));
    ::kill(pid, SIGKILL);
    int st = 0;
    REQUIRE(::waitpid(pid, &st, 0) == pid);
    CHECK(WIFSIGNALED(st));
    file_commit_store s(d.path);
    stored_record r;
    REQUIRE(s.load(r).ok()); // parses: old or new record, never a mix
    CHECK(r.record.version == r.revision);
    auto next = r.record;
    ++next.version;
    next.incarnation = std::string(32, 'a');
    REQUIRE(s.compare_and_set(epoch, attempt, r.revision, next).ok()); // lock was released
  }
}
