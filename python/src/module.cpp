/// \file
/// `dcr._dcr`: the Python extension. Binds the plain types of adapter.hpp
/// only. Weight bytes cross by pointer and length (`(address, nbytes)` pairs
/// the Python side takes from CPU tensors after checking dtype, device,
/// contiguity and size), never copied; the objects that own them are held
/// for as long as C++ reads them. Results the library allocates (payloads,
/// decoded indices and values) come back as NumPy arrays that own the C++
/// vectors, again without a copy. `dcr::error` becomes the `dcr.Error`
/// subclass of its `errc` (registered by `dcr/errors.py`).

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>

#include "adapter.hpp"
#include "coordinator.hpp"
#include "remote.hpp"

namespace py = pybind11;

namespace {

/// `dcr.errors` classes by errc value, set once at import.
py::dict& error_classes() {
  static py::dict* d = new py::dict(); // leaked: outlives interpreter teardown order issues
  return *d;
}

/// The job key of a shared secret (a key file's bytes; `seal_key::from_secret`);
/// empty bytes: no key (unkeyed seals, an unauthenticated control channel).
dcr::seal_key key_of(const py::bytes& secret) {
  const std::string text = secret;
  dcr::seal_key k;
  if (!text.empty()) dcr::throw_if_failed(dcr::seal_key::from_secret(text, k));
  return k;
}

/// A span over `(address, nbytes)`; the caller holds the owner alive.
dcr_py::bytes_view span_of(const py::tuple& ptr_len) {
  if (ptr_len.size() != 2)
    throw dcr::error(dcr::errc::invalid_argument, "expected an (address, nbytes) pair");
  const auto addr = ptr_len[0].cast<std::uintptr_t>();
  const auto n = ptr_len[1].cast<std::size_t>();
  if (n != 0 && addr == 0) throw dcr::error(dcr::errc::invalid_argument, "null address");
  return {reinterpret_cast<const std::byte*>(addr), n};
}

/// A NumPy array owning `v` (moved, no copy).
template <class T, class U = T>
py::array owned_array(std::vector<T>&& v) {
  auto* heap = new std::vector<T>(std::move(v));
  py::capsule owner(heap, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<U>({static_cast<py::ssize_t>(heap->size())},
                        reinterpret_cast<const U*>(heap->data()), owner);
}

std::map<std::uint32_t, dcr_py::bytes_view> shard_map(const py::dict& d) {
  std::map<std::uint32_t, dcr_py::bytes_view> m;
  for (auto [k, v] : d) m[k.cast<std::uint32_t>()] = span_of(v.cast<py::tuple>());
  return m;
}

/// Owner with the candidate's Python owners held until the next candidate.
struct py_owner {
  dcr_py::owner inner;
  py::object held; ///< the tensors behind the current candidate's spans
};

py::dict id_dict(const dcr_py::payload_id& id) {
  py::dict d;
  d["attempt"] = id.attempt;
  d["source_version"] = id.source_version;
  d["owner"] = id.owner;
  d["sequence"] = id.sequence;
  return d;
}

py::dict tensor_dict(const dcr_py::tensor_info& t) {
  py::dict d;
  d["name"] = t.name;
  d["shape"] = py::tuple(py::cast(t.shape));
  d["dtype"] = t.dtype;
  return d;
}

/// Calls `f(W{})` with the unsigned word type of `width` bytes.
template <class F>
decltype(auto) with_word(unsigned width, F&& f) {
  switch (width) {
  case 1:
    return f(std::uint8_t{});
  case 2:
    return f(std::uint16_t{});
  case 4:
    return f(std::uint32_t{});
  case 8:
    return f(std::uint64_t{});
  }
  throw dcr::error(dcr::errc::bad_dtype, "word width " + std::to_string(width));
}

/// A uint64 index array as a span (the decoder's arrays: no copy).
using index_array = py::array_t<std::uint64_t, py::array::c_style | py::array::forcecast>;
std::span<const std::uint64_t> index_span(const index_array& a) {
  return {a.data(), static_cast<std::size_t>(a.size())};
}

/// Value bytes as words of `W`: `n` words expected; copied only when the
/// bytes are not aligned for `W`.
template <class W>
std::span<const W> word_span(const py::buffer_info& b, std::size_t n, std::vector<W>& tmp) {
  const auto bytes = static_cast<std::size_t>(b.size * b.itemsize);
  if (bytes != n * sizeof(W))
    throw dcr::error(dcr::errc::length_overflow, std::to_string(bytes) + " value bytes for " +
                                                     std::to_string(n) + " words of " +
                                                     std::to_string(sizeof(W)) + " bytes");
  if (reinterpret_cast<std::uintptr_t>(b.ptr) % alignof(W) == 0)
    return {static_cast<const W*>(b.ptr), n};
  tmp.resize(n);
  std::memcpy(tmp.data(), b.ptr, bytes);
  return tmp;
}

/// A transition's report as a dict; `ok` False with `error` (code, message)
/// when it failed (the Python side raises the typed error).
py::dict report_dict(const dcr::protocol::transition_report& rep) {
  auto st = [](const dcr::status& s) {
    return s ? py::object(py::none())
             : py::object(py::make_tuple(static_cast<int>(s.code), s.message));
  };
  py::dict d;
  d["error"] = st(rep.result);
  d["committed_version"] = rep.committed_version;
  d["rolled_forward"] = rep.rolled_forward;
  py::list atts;
  for (auto& a : rep.attempts) {
    py::dict x;
    x["attempt"] = a.attempt;
    x["mode"] = a.mode == dcr::refit_mode::overwrite_all ? "overwrite_all" : "mixed";
    x["error"] = st(a.result);
    x["payloads"] = a.payloads;
    x["payload_bytes"] = a.payload_bytes;
    x["construct_seconds"] = a.construct_seconds;
    x["upload_seconds"] = a.upload_seconds;
    x["fetch_seconds"] = a.fetch_seconds;
    x["apply_seconds"] = a.apply_seconds;
    x["wall_seconds"] = a.wall_seconds;
    atts.append(x);
  }
  d["attempts"] = atts;
  d["restore_seconds"] = rep.restore_seconds;
  d["commit_seconds"] = rep.commit_seconds;
  d["wall_seconds"] = rep.wall_seconds;
  d["collected_objects"] = rep.collected_objects;
  py::list be;
  for (auto& b : rep.best_effort) be.append(b.text());
  d["best_effort"] = be;
  return d;
}

} // namespace

PYBIND11_MODULE(_dcr, m) {
  m.doc() = "dcr: bit-exact delta-compressed refit (C++ core)";

  m.def("_register_errors", [](py::dict classes) { error_classes() = classes; });
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const dcr::error& e) {
      auto& classes = error_classes();
      py::int_ code(static_cast<int>(e.code()));
      if (classes.contains(code)) {
        py::object cls = classes[code];
        PyErr_SetObject(cls.ptr(), py::make_tuple(e.what(), code).ptr());
      } else {
        PyErr_SetString(PyExc_RuntimeError, e.what());
      }
    }
  });

  py::class_<dcr_py::plan>(m, "Plan")
      .def(py::init([](const std::string& config_json, std::uint64_t tp, std::uint64_t pp,
                       std::uint64_t ep, std::uint64_t etp, std::uint64_t dp,
                       std::uint64_t vocab_block) {
             return dcr_py::plan(config_json, {tp, pp, ep, etp, dp, vocab_block});
           }),
           py::arg("config_json"), py::arg("tp") = 1, py::arg("pp") = 1, py::arg("ep") = 1,
           py::arg("etp") = 1, py::arg("dp") = 1, py::arg("vocab_block") = 0)
      .def_static("row_split_checkpoint", &dcr_py::plan::row_split_checkpoint, py::arg("path"),
                  py::arg("tp") = 2, py::arg("dp") = 1)
      .def_property_readonly("world", &dcr_py::plan::world)
      .def_property_readonly("residual_tasks", &dcr_py::plan::residual_tasks)
      // FSDP2-style plan: `tensors` as (name, shape, dtype name) in canonical
      // order, `rows[i]` the (rank, begin, end) dim-0 ranges of tensor i.
      .def_static(
          "dim0_shards",
          [](const std::vector<std::tuple<std::string, std::vector<std::uint64_t>, std::string>>&
                 tensors,
             const std::vector<
                 std::vector<std::tuple<std::uint32_t, std::uint64_t, std::uint64_t>>>& rows,
             std::uint32_t world) {
            std::vector<dcr_py::tensor_info> ts;
            for (auto& [n, s, d] : tensors) ts.push_back({n, s, d});
            std::vector<std::vector<dcr::dim0_rows>> rs;
            for (auto& per : rows) {
              auto& out = rs.emplace_back();
              for (auto& [r, b, e] : per) out.push_back({r, b, e});
            }
            return dcr_py::plan::dim0_shards(ts, rs, world);
          },
          py::arg("tensors"), py::arg("rows"), py::arg("world"))
      .def("canonical",
           [](const dcr_py::plan& p) {
             py::list l;
             for (auto& t : p.canonical()) l.append(tensor_dict(t));
             return l;
           })
      .def("shards",
           [](const dcr_py::plan& p) {
             py::list l;
             for (auto& s : p.shards()) {
               py::dict d;
               d["id"] = s.id;
               d["key"] = s.key;
               d["param"] = s.param;
               d["shape"] = py::tuple(py::cast(s.shape));
               d["dtype"] = s.dtype;
               d["replicas"] = s.replicas;
               d["owner"] = s.owner;
               d["nbytes"] = s.nbytes;
               l.append(d);
             }
             return l;
           })
      .def("rank_shards", &dcr_py::plan::rank_shards, py::arg("rank"))
      // Projects shard `shard` from canonical tensors: `tensors` maps a plan
      // tensor id to (address, nbytes); `out` is (address, nbytes) of the
      // caller's shard buffer. Only the tensors the shard reads are looked up.
      .def(
          "project",
          [](const dcr_py::plan& p, std::uint32_t shard, py::dict tensors, py::tuple out) {
            auto o = span_of(out);
            std::span<std::byte> dst(const_cast<std::byte*>(o.data()), o.size());
            p.project(
                shard,
                [&](std::uint32_t t) -> dcr_py::bytes_view {
                  py::int_ key(t);
                  if (!tensors.contains(key))
                    throw dcr::error(dcr::errc::not_found,
                                     "canonical tensor " + p.canonical().at(t).name + " not given");
                  return span_of(tensors[key].cast<py::tuple>());
                },
                dst);
          },
          py::arg("shard"), py::arg("tensors"), py::arg("out"));

  py::class_<py_owner>(m, "Owner")
      .def(py::init([](const dcr_py::plan& p, std::uint32_t rank, py::dict committed,
                       py::object keep, const py::bytes& job_key) {
             // The baseline copies the committed shards: `keep` is only
             // needed during construction.
             (void)keep;
             return new py_owner{dcr_py::owner(p, rank, shard_map(committed), key_of(job_key)),
                                 py::none()};
           }),
           py::arg("plan"), py::arg("rank"), py::arg("committed"), py::arg("keep"),
           py::arg("job_key") = py::bytes())
      .def("owned_shards", [](const py_owner& o) { return o.inner.owned_shards(); })
      .def(
          "set_candidate",
          [](py_owner& o, py::dict candidate, py::object keep) {
            o.inner.set_candidate(shard_map(candidate));
            o.held = std::move(keep);
          },
          py::arg("candidate"), py::arg("keep"))
      .def(
          "build",
          [](py_owner& o, std::uint64_t attempt, std::uint64_t target_version, bool overwrite_all) {
            if (o.held.is_none())
              throw dcr::error(dcr::errc::invalid_argument, "build: no candidate set");
            std::vector<std::vector<std::byte>> payloads;
            {
              py::gil_scoped_release nogil;
              payloads = o.inner.build(attempt, target_version, overwrite_all);
            }
            py::list l;
            for (auto& b : payloads) l.append(owned_array<std::byte, std::uint8_t>(std::move(b)));
            return l;
          },
          py::arg("attempt"), py::arg("target_version"), py::arg("overwrite_all") = false)
      .def_property_readonly("has_candidate", [](const py_owner& o) { return !o.held.is_none(); })
      .def_property_readonly("changed_words",
                             [](const py_owner& o) { return o.inner.changed_words(); })
      .def("commit",
           [](py_owner& o) {
             if (o.held.is_none())
               throw dcr::error(dcr::errc::invalid_argument, "commit: no candidate set");
             o.inner.commit();
           })
      .def_property_readonly("baseline_digest",
                             [](const py_owner& o) { return o.inner.baseline_digest(); })
      .def_property_readonly("candidate_digest",
                             [](const py_owner& o) { return o.inner.candidate_digest(); });

  // Object store by URL (cluster.hpp); S3 credentials and region come from
  // the Python side (dcr/cluster.py reads a file or the environment).
  py::class_<dcr_py::object_store>(m, "ObjectStore")
      .def(py::init([](const std::string& url, std::string incarnation, std::string region,
                       std::string access_key, std::string secret_key, const py::bytes& job_key) {
             return new dcr_py::object_store(
                 url, std::move(incarnation),
                 {std::move(access_key), std::move(secret_key), std::move(region)},
                 key_of(job_key));
           }),
           py::arg("url"), py::arg("incarnation") = std::string(),
           py::arg("region") = std::string("us-east-1"), py::arg("access_key") = std::string(),
           py::arg("secret_key") = std::string(), py::arg("job_key") = py::bytes())
      .def_property_readonly("incarnation", &dcr_py::object_store::incarnation)
      .def_property_readonly("is_s3",
                             [](const dcr_py::object_store& s) { return s.store()->is_s3(); })
      .def("create_bucket",
           [](dcr_py::object_store& s) {
             py::gil_scoped_release nogil;
             s.store()->create_bucket();
           })
      .def(
          "publish",
          [](dcr_py::object_store& s, std::uint64_t attempt, std::uint32_t owner,
             py::list payloads) {
            std::vector<py::buffer_info> infos; // the buffers stay exported while C++ reads
            std::vector<dcr_py::bytes_view> views;
            for (auto p : payloads) {
              infos.push_back(p.cast<py::buffer>().request());
              auto& i = infos.back();
              views.emplace_back(static_cast<const std::byte*>(i.ptr),
                                 static_cast<std::size_t>(i.size * i.itemsize));
            }
            py::gil_scoped_release nogil;
            return s.publish(attempt, owner, views);
          },
          py::arg("attempt"), py::arg("owner"), py::arg("payloads"))
      .def(
          "fetch",
          [](dcr_py::object_store& s, std::uint64_t attempt) {
            std::vector<std::uint32_t> owners;
            std::vector<std::vector<std::byte>> payloads;
            {
              py::gil_scoped_release nogil;
              payloads = s.fetch(attempt, owners);
            }
            py::list l;
            for (auto& b : payloads) l.append(owned_array<std::byte, std::uint8_t>(std::move(b)));
            return py::make_tuple(l, owners);
          },
          py::arg("attempt"))
      .def(
          "collect",
          [](dcr_py::object_store& s, std::uint64_t attempt) {
            py::gil_scoped_release nogil;
            return s.collect(attempt);
          },
          py::arg("attempt"));

  // Commit store by URL: file:<dir> or etcd://host:port[,...][/prefix].
  py::class_<dcr_py::any_commits, std::shared_ptr<dcr_py::any_commits>>(m, "CommitStore")
      .def(py::init([](const std::string& url, std::string ca, std::string cert, std::string key,
                       const py::bytes& job_key) {
             return std::make_shared<dcr_py::any_commits>(
                 url, dcr_py::etcd_args{std::move(ca), std::move(cert), std::move(key)},
                 key_of(job_key));
           }),
           py::arg("url"), py::arg("ca_file") = std::string(), py::arg("cert_file") = std::string(),
           py::arg("key_file") = std::string(), py::arg("job_key") = py::bytes())
      .def("load",
           [](dcr_py::any_commits& c) {
             dcr::protocol::stored_record r;
             {
               py::gil_scoped_release nogil;
               dcr::throw_if_failed(c.load(r));
             }
             py::dict d;
             d["version"] = r.record.version;
             d["revision"] = r.revision;
             d["epoch"] = r.epoch;
             d["attempt"] = r.attempt;
             d["committed_attempt"] = r.record.attempt;
             d["incarnation"] = r.record.incarnation;
             d["source_baseline"] = dcr_py::hex(r.record.source_baseline);
             py::list rx;
             for (auto& a : r.record.receivers)
               rx.append(py::make_tuple(a.receiver, dcr_py::hex(a.state)));
             d["receivers"] = rx;
             return d;
           })
      .def("take_over",
           [](dcr_py::any_commits& c) {
             std::uint64_t e = 0;
             py::gil_scoped_release nogil;
             dcr::throw_if_failed(c.take_over(e));
             return e;
           })
      .def(
          "prepare",
          [](dcr_py::any_commits& c, std::uint64_t epoch) {
            std::uint64_t a = 0;
            py::gil_scoped_release nogil;
            dcr::throw_if_failed(c.prepare(epoch, a));
            return a;
          },
          py::arg("epoch"));

  // The library's coordinator over owners of this process and Python
  // receivers (coordinator.hpp). Holds the stores and owners it drives.
  py::class_<dcr_py::relay_args>(m, "RelayTree")
      .def(py::init([](std::uint32_t per_node, std::uint32_t fanout, bool tcp) {
             return dcr_py::relay_args{0, per_node, fanout, tcp};
           }),
           py::arg("receivers_per_node") = 1, py::arg("fanout") = 2, py::arg("tcp") = false)
      .def_readonly("receivers_per_node", &dcr_py::relay_args::receivers_per_node)
      .def_readonly("fanout", &dcr_py::relay_args::fanout)
      .def_readonly("tcp", &dcr_py::relay_args::tcp);

  // The library's coordinator over owners of this process and Python
  // receivers (coordinator.hpp), over an object store or a relay tree of
  // its receivers (built here, sized by them). Holds what it drives.
  py::class_<dcr_py::py_coordinator>(m, "Coordinator")
      .def(py::init([](std::shared_ptr<dcr_py::any_commits> commits, py::object medium,
                       py::list owners, py::list receivers, py::object digest_parts,
                       py::object restore, int max_attempts, double deadline_s,
                       bool collect_garbage, bool fetch_all) {
             std::vector<dcr_py::py_coordinator::owner_t*> os;
             for (auto o : owners) os.push_back(&o.cast<py_owner&>().inner.member());
             std::vector<std::pair<std::string, py::object>> rs;
             for (auto r : receivers) {
               auto t = r.cast<py::tuple>();
               rs.emplace_back(t[0].cast<std::string>(), t[1]);
             }
             const dcr_py::coordinator_args a{max_attempts, deadline_s, collect_garbage, fetch_all};
             if (py::isinstance<dcr_py::relay_args>(medium)) {
               auto ra = medium.cast<dcr_py::relay_args>();
               ra.receivers = static_cast<std::uint32_t>(rs.size());
               return new dcr_py::py_coordinator(std::move(commits), dcr_py::make_relay_tree(ra),
                                                 std::move(os), std::move(rs), digest_parts,
                                                 restore, a);
             }
             return new dcr_py::py_coordinator(
                 std::move(commits), medium.cast<dcr_py::object_store&>().store(), std::move(os),
                 std::move(rs), digest_parts, restore, a);
           }),
           py::arg("commits"), py::arg("medium"), py::arg("owners"), py::arg("receivers"),
           py::arg("digest_parts"), py::arg("restore") = py::none(), py::arg("max_attempts") = 4,
           py::arg("deadline_s") = 120.0, py::arg("collect_garbage") = true,
           py::arg("fetch_all") = true,
           // The owners live while the coordinator drives them.
           py::keep_alive<1, 4>())
      .def_property_readonly("epoch", &dcr_py::py_coordinator::epoch)
      .def("take_over",
           [](dcr_py::py_coordinator& c) {
             py::gil_scoped_release nogil;
             return c.take_over();
           })
      .def("bootstrap",
           [](dcr_py::py_coordinator& c) {
             py::gil_scoped_release nogil;
             c.bootstrap();
           })
      .def("transition",
           [](dcr_py::py_coordinator& c) {
             dcr::protocol::transition_report rep;
             {
               py::gil_scoped_release nogil;
               rep = c.transition();
             }
             return report_dict(rep);
           })
      .def("kill", &dcr_py::py_coordinator::kill, py::arg("receiver"))
      .def(
          "counters",
          [](const dcr_py::py_coordinator& c, const std::string& id) {
            auto k = c.counters(id);
            py::dict d;
            d["staged"] = k.staged;
            d["applied_calls"] = k.applied_calls;
            d["duplicates"] = k.duplicates;
            d["stale"] = k.stale;
            d["restores"] = k.restores;
            return d;
          },
          py::arg("receiver"));

  // The distributed roles (remote.hpp): an owner served from a trainer rank's
  // process, a node of Python receivers served from a serving process, and
  // the coordinator of such processes over the control channel.
  py::class_<dcr::protocol::request_gate::ticket>(m, "GateTicket")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](dcr::protocol::request_gate::ticket& t, py::args) {
             t = dcr::protocol::request_gate::ticket();
             return false;
           })
      .def(
          "release",
          [](dcr::protocol::request_gate::ticket& t) { t = dcr::protocol::request_gate::ticket(); })
      .def("__bool__", [](const dcr::protocol::request_gate::ticket& t) { return bool(t); });

  py::class_<dcr_py::py_owner_server>(m, "OwnerServer")
      .def(py::init([](py_owner& o, dcr_py::object_store& store,
                       std::shared_ptr<dcr_py::any_commits> commits, std::uint64_t version,
                       const std::string& host, unsigned short port, const py::bytes& job_key,
                       bool lease, double lease_ttl_s, double lease_wait_s,
                       py::object next_candidate, std::vector<std::string> relay_nodes,
                       std::uint32_t relay_fanout) {
             const auto key = key_of(job_key);
             std::function<dcr::status(std::uint64_t)> next;
             if (!next_candidate.is_none()) {
               // Called on the server's thread inside a call (which holds the
               // server's call lock): the candidate is set directly. The
               // hook object is released under the GIL, wherever the last
               // copy of the function dies.
               auto hook = std::shared_ptr<py::object>(new py::object(std::move(next_candidate)),
                                                       [](py::object* h) {
                                                         py::gil_scoped_acquire gil;
                                                         delete h;
                                                       });
               py_owner* op = &o;
               next = [hook, op](std::uint64_t v) -> dcr::status {
                 py::gil_scoped_acquire gil;
                 try {
                   py::object r = (*hook)(v);
                   if (r.is_none()) return dcr::status::success();
                   auto pair = r.cast<py::tuple>();
                   if (pair.size() != 2)
                     return dcr::fail(dcr::errc::invalid_argument,
                                      "next_candidate hook: expected (spans, keep) or None");
                   op->inner.set_candidate(shard_map(pair[0].cast<py::dict>()));
                   op->held = pair[1];
                   return dcr::status::success();
                 } catch (py::error_already_set& e) {
                   return dcr::fail(dcr::errc::invalid_argument, e.what());
                 } catch (const std::exception& e) {
                   return dcr::fail(dcr::errc::invalid_argument, e.what());
                 }
               };
             }
             py::gil_scoped_release nogil; // a lease claim may wait
             return new dcr_py::py_owner_server(
                 o.inner, store.store(), std::move(commits), version, host, port, key,
                 {lease, lease_ttl_s, lease_wait_s}, std::move(next),
                 dcr_py::process_relay_args{std::move(relay_nodes), relay_fanout});
           }),
           py::arg("owner"), py::arg("store"), py::arg("commits"), py::arg("version"),
           py::arg("host"), py::arg("port"), py::arg("job_key") = py::bytes(),
           py::arg("lease") = false, py::arg("lease_ttl_s") = 10.0, py::arg("lease_wait_s") = -1.0,
           py::arg("next_candidate") = py::none(),
           py::arg("relay_nodes") = std::vector<std::string>{}, py::arg("relay_fanout") = 2,
           // The owner and its stores live while the server reads them.
           py::keep_alive<1, 2>(), py::keep_alive<1, 3>())
      .def_property_readonly("port", &dcr_py::py_owner_server::port)
      .def_property_readonly("version", &dcr_py::py_owner_server::version_now)
      .def_property_readonly("lease_token", &dcr_py::py_owner_server::lease_token)
      .def(
          "set_candidate",
          [](dcr_py::py_owner_server& srv, py_owner& o, py::dict candidate, py::object keep) {
            auto spans = shard_map(candidate);
            {
              py::gil_scoped_release nogil; // waits for a running call to end
              srv.between_calls([&] { o.inner.set_candidate(spans); });
            }
            o.held = std::move(keep);
          },
          py::arg("owner"), py::arg("candidate"), py::arg("keep"))
      .def("wait_committed", &dcr_py::py_owner_server::wait_committed, py::arg("version"),
           py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>())
      .def("close", &dcr_py::py_owner_server::close, py::call_guard<py::gil_scoped_release>());

  py::class_<dcr_py::py_node_server>(m, "NodeServer")
      .def(py::init([](py::list receivers, py::object digest_parts, py::object restore,
                       py::object verify, dcr_py::object_store& store, bool fetch_all, bool gate,
                       const std::string& host, unsigned short port, const py::bytes& job_key,
                       std::vector<std::string> relay_nodes, std::uint32_t relay_fanout,
                       std::uint32_t relay_node) {
             std::vector<std::pair<std::string, py::object>> rs;
             for (auto r : receivers) {
               auto t = r.cast<py::tuple>();
               rs.emplace_back(t[0].cast<std::string>(), t[1]);
             }
             return new dcr_py::py_node_server(
                 std::move(rs), digest_parts, restore, verify, store.store(), fetch_all, gate, host,
                 port, key_of(job_key),
                 dcr_py::process_relay_args{std::move(relay_nodes), relay_fanout}, relay_node);
           }),
           py::arg("receivers"), py::arg("digest_parts"), py::arg("restore"), py::arg("verify"),
           py::arg("store"), py::arg("fetch_all"), py::arg("gate"), py::arg("host"),
           py::arg("port"), py::arg("job_key") = py::bytes(),
           py::arg("relay_nodes") = std::vector<std::string>{}, py::arg("relay_fanout") = 2,
           py::arg("relay_node") = 0, py::keep_alive<1, 6>())
      .def_property_readonly("port", &dcr_py::py_node_server::port)
      .def_property_readonly("ids", &dcr_py::py_node_server::ids)
      .def_property_readonly("has_gate",
                             [](const dcr_py::py_node_server& n) { return n.gate() != nullptr; })
      .def("admit",
           [](dcr_py::py_node_server& n) {
             if (!n.gate())
               throw dcr::error(dcr::errc::invalid_argument, "node server: started without a gate");
             py::gil_scoped_release nogil; // blocks while a transition applies
             return n.gate()->admit();
           })
      .def("try_admit",
           [](dcr_py::py_node_server& n) {
             if (!n.gate())
               throw dcr::error(dcr::errc::invalid_argument, "node server: started without a gate");
             return n.gate()->try_admit();
           })
      .def(
          "counters",
          [](const dcr_py::py_node_server& n, const std::string& id) {
            auto k = n.counters(id);
            py::dict d;
            d["staged"] = k.staged;
            d["applied_calls"] = k.applied_calls;
            d["duplicates"] = k.duplicates;
            d["stale"] = k.stale;
            d["restores"] = k.restores;
            return d;
          },
          py::arg("receiver"))
      .def("close", &dcr_py::py_node_server::close, py::call_guard<py::gil_scoped_release>());

  py::class_<dcr_py::py_cluster_coordinator>(m, "ClusterCoordinator")
      .def(py::init([](std::shared_ptr<dcr_py::any_commits> commits, dcr_py::object_store& store,
                       std::vector<std::string> owners, std::vector<std::string> nodes,
                       int max_attempts, double deadline_s, bool collect_garbage, bool asynchronous,
                       const py::bytes& job_key, double connect_wait_s) {
             const auto key = key_of(job_key);
             const dcr_py::coordinator_args a{max_attempts, deadline_s, collect_garbage, true};
             py::gil_scoped_release nogil; // connects, waiting for peers still starting
             return new dcr_py::py_cluster_coordinator(std::move(commits), store.store(), owners,
                                                       nodes, a, asynchronous, key, connect_wait_s);
           }),
           py::arg("commits"), py::arg("store"), py::arg("owners"), py::arg("nodes"),
           py::arg("max_attempts") = 4, py::arg("deadline_s") = 120.0,
           py::arg("collect_garbage") = true, py::arg("asynchronous") = false,
           py::arg("job_key") = py::bytes(), py::arg("connect_wait_s") = 60.0,
           py::keep_alive<1, 3>())
      .def_property_readonly("epoch", &dcr_py::py_cluster_coordinator::epoch)
      .def_property_readonly("node_ids", &dcr_py::py_cluster_coordinator::node_ids)
      .def("take_over", &dcr_py::py_cluster_coordinator::take_over,
           py::call_guard<py::gil_scoped_release>())
      .def("bootstrap", &dcr_py::py_cluster_coordinator::bootstrap,
           py::call_guard<py::gil_scoped_release>())
      .def("transition",
           [](dcr_py::py_cluster_coordinator& c) {
             dcr::protocol::transition_report rep;
             {
               py::gil_scoped_release nogil;
               rep = c.transition();
             }
             return report_dict(rep);
           })
      .def("verify", &dcr_py::py_cluster_coordinator::verify,
           py::call_guard<py::gil_scoped_release>())
      .def("kill", &dcr_py::py_cluster_coordinator::kill, py::arg("receiver"),
           py::call_guard<py::gil_scoped_release>());

  m.def(
      "read_payload_id",
      [](py::buffer b, const py::bytes& job_key) {
        auto info = b.request();
        return id_dict(dcr_py::read_id(
            {static_cast<const std::byte*>(info.ptr), static_cast<std::size_t>(info.size)},
            key_of(job_key)));
      },
      py::arg("payload"), py::arg("job_key") = py::bytes());

  // Decodes and validates every byte; returns (id, [item dicts]) with
  // indices as uint64 and values as uint8 arrays that own the decoded vectors.
  m.def(
      "decode_payload",
      [](py::buffer b, const py::bytes& job_key) {
        const auto key = key_of(job_key);
        auto info = b.request();
        if (info.itemsize != 1 && info.ndim != 1)
          throw dcr::error(dcr::errc::invalid_argument, "payload: expected a flat byte buffer");
        dcr_py::payload_id id;
        std::vector<dcr_py::decoded_item> items;
        {
          dcr_py::bytes_view v{static_cast<const std::byte*>(info.ptr),
                               static_cast<std::size_t>(info.size * info.itemsize)};
          py::gil_scoped_release nogil;
          items = dcr_py::decode(v, id, key);
        }
        py::list l;
        for (auto& it : items) {
          py::dict d;
          d["tensor"] = tensor_dict(it.tensor);
          d["encoding"] = it.encoding;
          d["indices"] = owned_array(std::move(it.indices));
          d["values"] = owned_array<std::byte, std::uint8_t>(std::move(it.values));
          l.append(d);
        }
        return py::make_tuple(id_dict(id), l);
      },
      py::arg("payload"), py::arg("job_key") = py::bytes());
  // Hook apply (dcr.torch.Receiver): per-entry work of an item on raw
  // pointers of CPU tensors the caller holds and checked (address, number
  // of words, word width); the GIL is released while the words move.
  m.def(
      "scatter_words",
      [](std::uintptr_t data, std::uint64_t numel, unsigned width, const index_array& idx,
         py::buffer values) {
        auto info = values.request();
        with_word(width, [&](auto w) {
          using W = decltype(w);
          std::vector<W> tmp;
          auto words = word_span<W>(info, static_cast<std::size_t>(idx.size()), tmp);
          py::gil_scoped_release nogil;
          dcr_py::scatter_words<W>(reinterpret_cast<W*>(data), numel, index_span(idx), words);
        });
      },
      py::arg("data"), py::arg("numel"), py::arg("width"), py::arg("indices"), py::arg("values"));
  m.def(
      "zero_words",
      [](std::uintptr_t data, std::uint64_t numel, unsigned width, const index_array& idx) {
        with_word(width, [&](auto w) {
          using W = decltype(w);
          py::gil_scoped_release nogil;
          dcr_py::zero_words<W>(reinterpret_cast<W*>(data), numel, index_span(idx));
        });
      },
      py::arg("data"), py::arg("numel"), py::arg("width"), py::arg("indices"));
  py::class_<dcr_py::mapped_copy>(m, "MappedCopy")
      .def(
          py::init<std::int64_t, const std::vector<std::int64_t>&, const std::vector<std::int64_t>&,
                   std::int64_t, const std::vector<std::int64_t>&>(),
          py::arg("src_offset"), py::arg("shape"), py::arg("src_strides"), py::arg("dst_offset"),
          py::arg("dst_strides"))
      // op: 1 XOR, 2 overwrite, 3 add (twin::scatter_op); returns entries written.
      .def(
          "apply",
          [](const dcr_py::mapped_copy& c, std::uintptr_t storage, std::uint64_t numel,
             unsigned width, const index_array& idx, py::buffer values, int op) {
            if (op < 1 || op > 3)
              throw dcr::error(dcr::errc::bad_encoding, "scatter op " + std::to_string(op));
            auto info = values.request();
            return with_word(width, [&](auto w) {
              using W = decltype(w);
              std::vector<W> tmp;
              auto words = word_span<W>(info, static_cast<std::size_t>(idx.size()), tmp);
              py::gil_scoped_release nogil;
              return c.apply<W>(reinterpret_cast<W*>(storage), numel, index_span(idx), words,
                                static_cast<dcr::twin::scatter_op>(op));
            });
          },
          py::arg("storage"), py::arg("numel"), py::arg("width"), py::arg("indices"),
          py::arg("values"), py::arg("op"));
}
