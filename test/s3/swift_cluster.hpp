#pragma once
// A throw-away Swift cluster with s3api for the S3 interop tests:
// start-swift.sh (DCR_START_SWIFT names it) run as a child process.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef DCR_START_SWIFT
#error "DCR_START_SWIFT must name test/s3/start-swift.sh"
#endif

namespace dcr::test_s3 {

/// start-swift.sh as a child: its stdin is our pipe, so it stops (and stops
/// the servers) when this process closes the pipe or dies.
struct swift_cluster {
  pid_t pid = -1;
  int to_child = -1;
  std::uint16_t port = 0;
  std::string access_key, secret_key, region;

  /// 0: ready; 77: the script found no swift; other: failed. `env` is added
  /// to the script's environment ("NAME=value").
  int start(const std::vector<std::string>& env = {}) {
    std::vector<std::string> vars;
    for (char** e = environ; *e; ++e) vars.emplace_back(*e);
    vars.insert(vars.end(), env.begin(), env.end());
    std::vector<char*> envp;
    for (auto& v : vars) envp.push_back(v.data());
    envp.push_back(nullptr);
    char script[] = DCR_START_SWIFT, bash[] = "bash";
    char* argv[] = {bash, script, nullptr};
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) return 1;
    pid = ::fork();
    if (pid < 0) return 1;
    if (pid == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::execve("/bin/bash", argv, envp.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    to_child = in[1];
    std::string line;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (line.find('\n') == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd p{out[0], POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
        std::fprintf(stderr, "start-swift.sh: no READY line within 120 s\n");
        ::close(out[0]);
        return 1;
      }
      char buf[256];
      auto n = ::read(out[0], buf, sizeof buf);
      if (n <= 0) { // the script exited
        ::close(out[0]);
        int st = 0;
        ::waitpid(pid, &st, 0);
        pid = -1;
        return WIFEXITED(st) ? (WEXITSTATUS(st) == 77 ? 77 : 1) : 1;
      }
      line.append(buf, static_cast<std::size_t>(n));
    }
    ::close(out[0]);
    char ak[128], sk[128], rg[64];
    unsigned p = 0;
    if (std::sscanf(line.c_str(), "READY %u %127s %127s %63s", &p, ak, sk, rg) != 4) {
      std::fprintf(stderr, "start-swift.sh said '%s'\n", line.c_str());
      return 1;
    }
    port = static_cast<std::uint16_t>(p);
    access_key = ak;
    secret_key = sk;
    region = rg;
    return 0;
  }
  void stop() {
    if (to_child >= 0) ::close(to_child);
    to_child = -1;
    if (pid > 0) {
      int st = 0;
      ::waitpid(pid, &st, 0);
      pid = -1;
    }
  }
  ~swift_cluster() { stop(); }
};
} // namespace dcr::test_s3
