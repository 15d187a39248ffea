#pragma once
/// \file
/// The library's coordinator (`protocol::coordinator`, coordinator.hpp) over
/// owners of this process (`training_round::member`, the `_dcr.Owner`s) and
/// Python receivers (`dcr.torch.Receiver` or anything with `begin_attempt`,
/// `stage`, `apply`), an object store and a commit store chosen by URL
/// (cluster.hpp). Each Python receiver is a `receiver_role` through
/// `py_receiver`, so the endpoint's fences and duplicate suppression, the
/// node's fetch/apply pipeline, the manifest binding, the overwrite retry
/// and the joint commit are the library's own code.
///
/// Threads: the coordinator runs owners and nodes on threads of its own.
/// Owners never enter Python (they read the candidate's tensors by
/// pointer); every call into a receiver takes the GIL, and the caller of
/// `transition` / `bootstrap` releases it for the whole call. A Python
/// exception never crosses a coordinator thread: it becomes the `status`
/// of the call (its `dcr.Error` code, else `errc::aborted`).

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "adapter.hpp"
#include "dcr/protocol/coordinator.hpp"
#include "dcr/transport/relay_tcp.hpp"
#include "dcr/transport/relay_tree.hpp"

namespace dcr_py {

namespace py = pybind11;

/// The `status` of the Python exception `e` (GIL held): a `dcr.Error` keeps
/// its code, anything else is `aborted`; the message names `where`.
inline dcr::status status_of(py::error_already_set& e, const std::string& where) {
  int code = static_cast<int>(dcr::errc::aborted);
  std::string text;
  try {
    py::object v = e.value();
    if (py::isinstance(v, py::module_::import("dcr.errors").attr("Error"))) {
      const int c = v.attr("code").cast<int>();
      if (c >= 1 && c <= static_cast<int>(dcr::errc::foreign_incarnation)) code = c;
    }
    text = py::str(py::handle(e.type()).attr("__name__")).cast<std::string>() + ": " +
           py::str(v).cast<std::string>();
  } catch (...) {
    text = "a Python exception";
  }
  return dcr::fail(static_cast<dcr::errc>(code), where + ": " + text);
}

/// A Python receiver as a `protocol::receiver_role`. `digest_parts(rx)`
/// returns the receiver's state as `(name, buffer)` pairs (CPU, contiguous;
/// python/dcr/cluster.py) whose BLAKE2b-128 is the ACK digest; it is taken
/// in `finish` (which returns a status) and kept for `state_digest`.
class py_receiver {
public:
  py_receiver(std::string id, py::object rx, py::object digest_parts)
      : id_(std::move(id)), rx_(std::move(rx)), parts_(std::move(digest_parts)) {}
  ~py_receiver() {
    py::gil_scoped_acquire gil; // dropped by a coordinator thread too (a distrusted receiver)
    rx_ = py::object();
    parts_ = py::object();
  }
  py_receiver(const py_receiver&) = delete;
  py_receiver& operator=(const py_receiver&) = delete;

  std::string receiver_id() const { return id_; }
  void begin_attempt(std::uint64_t attempt) {
    py::gil_scoped_acquire gil;
    try {
      rx_.attr("begin_attempt")(attempt);
      pending_ = dcr::status::success();
    } catch (py::error_already_set& e) {
      pending_ = status_of(e, "receiver " + id_ + ": begin_attempt");
    }
  }
  dcr::status stage(std::span<const std::byte> bytes) {
    if (!pending_) return pending_;
    py::gil_scoped_acquire gil;
    try {
      // A read-only view of the fetched bytes: the decoder copies what it keeps.
      rx_.attr("stage")(
          py::memoryview::from_memory(bytes.data(), static_cast<py::ssize_t>(bytes.size())));
      return dcr::status::success();
    } catch (py::error_already_set& e) {
      return status_of(e, "receiver " + id_ + ": stage");
    }
  }
  dcr::status apply_staged() {
    py::gil_scoped_acquire gil;
    try {
      rx_.attr("apply")();
      return dcr::status::success();
    } catch (py::error_already_set& e) {
      return status_of(e, "receiver " + id_ + ": apply");
    }
  }
  dcr::status finish() {
    if (!pending_) return pending_;
    return refresh();
  }
  dcr::digest128 state_digest() const { return digest_; }

  /// Recompute the state digest (GIL taken here).
  dcr::status refresh() {
    py::gil_scoped_acquire gil;
    try {
      dcr::blake2b_128 h;
      for (auto item : parts_(rx_)) {
        auto pair = item.cast<py::tuple>();
        const auto name = pair[0].cast<std::string>();
        auto info = pair[1].cast<py::buffer>().request();
        const auto n = static_cast<std::uint64_t>(info.size * info.itemsize);
        h.update(std::as_bytes(std::span(name.data(), name.size() + 1))); // with its NUL
        h.update(std::as_bytes(std::span(&n, 1)));
        h.update({static_cast<const std::byte*>(info.ptr), static_cast<std::size_t>(n)});
      }
      digest_ = h.final();
      return dcr::status::success();
    } catch (py::error_already_set& e) {
      return status_of(e, "receiver " + id_ + ": state digest");
    } catch (const py::cast_error& e) {
      return dcr::fail(dcr::errc::invalid_argument,
                       "receiver " + id_ + ": state parts: " + std::string(e.what()));
    }
  }

private:
  std::string id_;
  py::object rx_, parts_;
  dcr::status pending_ = dcr::status::success();
  dcr::digest128 digest_{};
};
static_assert(dcr::protocol::receiver_role<py_receiver>);

/// Options of `py_coordinator` (coordinator_options' runtime knobs).
struct coordinator_args {
  int max_attempts = 4;
  double attempt_deadline_s = 120;
  bool collect_garbage = true;
  bool fetch_all = true;
};

/// A relay tree over this process's receivers (transport/relay_tree.hpp):
/// one node per `receivers_per_node` receivers, a k-ary tree rooted at node
/// 0, links through in-process pipes or loopback TCP. The coordinator's
/// owners stream payloads to the root instead of uploading objects.
struct relay_args {
  std::uint32_t receivers = 1, receivers_per_node = 1, fanout = 2;
  bool tcp = false;
};
inline std::shared_ptr<dcr::transport::relay_tree> make_relay_tree(const relay_args& a) {
  if (a.receivers == 0 || a.receivers_per_node == 0 || a.fanout == 0)
    throw dcr::error(dcr::errc::invalid_argument,
                     "relay tree: receivers, receivers per node and fanout must be positive");
  dcr::transport::relay_options o;
  o.receivers = a.receivers;
  o.receivers_per_node = a.receivers_per_node;
  o.nodes = (a.receivers + a.receivers_per_node - 1) / a.receivers_per_node;
  o.fanout = a.fanout;
  return a.tcp ? dcr::transport::make_tcp_relay_tree(o) : dcr::transport::make_inproc_relay_tree(o);
}

/// One endpoint per Python receiver (`(id, receiver)` at the committed
/// version), each adopting its receiver; `restore(id)` (may be None)
/// returns a new receiver of that id restored densely to the committed
/// version, for one the coordinator dropped. `gate`: the request gate the
/// endpoints close and open around applies (may be null). The coordinator
/// of this process and a node server of a serving process build them alike.
inline std::vector<std::unique_ptr<dcr::protocol::receiver_endpoint<py_receiver>>>
make_endpoints(std::vector<std::pair<std::string, py::object>> receivers, py::object digest_parts,
               py::object restore, dcr::protocol::request_gate* gate = nullptr) {
  using endpoint = dcr::protocol::receiver_endpoint<py_receiver>;
  std::vector<std::unique_ptr<endpoint>> out;
  for (auto& [id, rx] : receivers) {
    endpoint::factory make;
    if (!restore.is_none())
      make = [id = id, restore, digest_parts]() -> std::unique_ptr<py_receiver> {
        py::gil_scoped_acquire gil;
        py::object fresh;
        try {
          fresh = restore(id);
        } catch (py::error_already_set& e) {
          throw dcr::error(status_of(e, "restore of receiver " + id));
        }
        if (fresh.is_none()) return nullptr;
        auto r = std::make_unique<py_receiver>(id, fresh, digest_parts);
        dcr::throw_if_failed(r->refresh());
        return r;
      };
    out.push_back(std::make_unique<endpoint>(id, std::move(make), nullptr, gate));
    auto r = std::make_unique<py_receiver>(id, rx, digest_parts);
    dcr::throw_if_failed(r->refresh());
    out.back()->adopt(std::move(r));
  }
  return out;
}

/// The coordinator of one process's owners and Python receivers, over an
/// object store (`any_store`) or a relay tree.
class py_coordinator {
public:
  using owner_t = dcr::protocol::training_round::member;
  using endpoint = dcr::protocol::receiver_endpoint<py_receiver>;

  /// `receivers`: (id, Python receiver) pairs at the committed version.
  /// `restore(id)` (may be None) returns a new receiver of that id restored
  /// densely to the committed version, for one the coordinator dropped.
  template <class Store>
  py_coordinator(std::shared_ptr<any_commits> commits, std::shared_ptr<Store> store,
                 std::vector<owner_t*> owners,
                 std::vector<std::pair<std::string, py::object>> receivers, py::object digest_parts,
                 py::object restore, const coordinator_args& a) {
    if (owners.empty()) throw dcr::error(dcr::errc::invalid_argument, "coordinator: no owners");
    if (receivers.empty())
      throw dcr::error(dcr::errc::invalid_argument, "coordinator: no receivers");
    endpoints_ = make_endpoints(std::move(receivers), digest_parts, restore);
    std::vector<endpoint*> eps;
    for (auto& e : endpoints_) eps.push_back(e.get());
    dcr::protocol::coordinator_options o;
    o.max_attempts = a.max_attempts;
    o.attempt_deadline =
        std::chrono::milliseconds(static_cast<std::int64_t>(a.attempt_deadline_s * 1e3));
    o.collect_garbage = a.collect_garbage;
    auto e = std::make_unique<engine_of<Store>>(std::move(commits), std::move(store),
                                                std::move(owners), std::move(eps), o);
    if constexpr (dcr::transport::object_store<Store>)
      for (auto* n : e->run.node_links()) n->fetch_all(a.fetch_all);
    impl_ = std::move(e);
  }
  ~py_coordinator() {
    // The engine before the endpoints it points at; receivers hold Python
    // objects, dropped with the GIL (held by the caller).
    impl_.reset();
    endpoints_.clear();
  }

  std::uint64_t take_over() { return impl_->take_over(); }
  void bootstrap() { impl_->bootstrap(); }
  dcr::protocol::transition_report transition() { return impl_->transition(); }
  std::uint64_t epoch() const { return impl_->epoch(); }
  void kill(const std::string& id) { find(id).kill(); }
  dcr::protocol::endpoint_counters counters(const std::string& id) const {
    return find(id).counters();
  }

private:
  endpoint& find(const std::string& id) const {
    for (auto& e : endpoints_)
      if (e->id() == id) return *e;
    throw dcr::error(dcr::errc::not_found, "no receiver '" + id + "'");
  }
  struct base {
    virtual ~base() = default;
    virtual std::uint64_t take_over() = 0;
    virtual void bootstrap() = 0;
    virtual dcr::protocol::transition_report transition() = 0;
    virtual std::uint64_t epoch() const = 0;
  };
  template <class Store>
  struct engine_of : base {
    std::shared_ptr<any_commits> commits;
    std::shared_ptr<Store> store;
    dcr::protocol::coordinator<owner_t, py_receiver, Store, any_commits> run;
    engine_of(std::shared_ptr<any_commits> c, std::shared_ptr<Store> s,
              std::vector<owner_t*> owners, std::vector<endpoint*> eps,
              dcr::protocol::coordinator_options o)
        : commits(std::move(c)), store(std::move(s)),
          run(*commits, *store, std::move(owners), std::move(eps), std::move(o)) {}
    std::uint64_t take_over() override {
      dcr::throw_if_failed(run.take_over());
      return run.epoch();
    }
    void bootstrap() override { dcr::throw_if_failed(run.bootstrap()); }
    dcr::protocol::transition_report transition() override { return run.transition(); }
    std::uint64_t epoch() const override { return run.epoch(); }
  };
  std::vector<std::unique_ptr<endpoint>> endpoints_;
  std::unique_ptr<base> impl_;
};

} // namespace dcr_py
