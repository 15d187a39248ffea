#pragma once
/// \file
/// Vocabulary: `gpu/` (namespace `dcr::gpu`) holds CUDA kernels and their
/// launchers; each has a host twin in `include/dcr/twin/` (namespace
/// `dcr::twin`) with the same semantics, and the GPU tests compare them.
///
/// Device decode of an item's location bytes in every coding of the wire
/// format (docs/wire-format.md 4.3) — run, gap words, byte planes, varint
/// and escape_u8 — and `scatter_encoded`, which lands the item's value
/// bytes (plain or byte planes) at the decoded locations. A receiver that
/// holds weights in GPU memory uploads the decompressed location and value
/// bytes of an item and does everything else here. Host twin:
/// `dcr/twin/locations.hpp` (same phases over the same element functions,
/// same indices, same errors; both equal the reference decoder
/// `codec::decode_locations`).
///
/// The decode's kernels, scan functors and dispatch are templates on the
/// codec's location types (`codec::gap_u16`, `codec::planes_u32`,
/// `codec::varint_gaps`, `codec::escape_u8`, ...: `twin::gap_layout` reads
/// their form and width), as the scatter kernels are on the encoding types;
/// `decode_locations<Coding>` is the typed entry, and the entries that take
/// an item row's runtime `location_id` turn it into its type once
/// (`codec::visit_location`).
///
/// Layering: public entry (size checks shared with the twin, then pointer
/// checks) → dispatch (workspace layout, CUB sizes) → scans and short
/// grid-stride kernels. Variable-length codings take three CUB scans:
/// escape_u8 reader states (a scan over transition maps, `escape_then`),
/// value ends (an exclusive count whose output iterator records the last
/// byte of each value), and the indices (`gap + 1` summed). A check kernel
/// then keeps the first failing location with `atomicMin`, and the host
/// words the failure from a few words read back.

#include <cub/device/device_scan.cuh>
#include <cuda_runtime.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/tabulate_output_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "dcr/codec/locations.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/core/error.hpp"
#include "dcr/gpu/runtime.cuh"
#include "dcr/twin/element.hpp"
#include "dcr/twin/locations.hpp"

namespace dcr::gpu {

namespace detail {

/// Words at the start of a decode's scratch: the fault key, the number of
/// values present, the byte after the last needed value, the escape run start.
enum : std::size_t { slot_key = 0, slot_present = 1, slot_used = 2, slot_escapes = 3 };

/// Byte `i`'s escape_u8 transition map.
struct escape_map_at {
  const std::uint8_t* bytes;
  __host__ __device__ twin::escape_map operator()(std::uint64_t i) const {
    return twin::escape_step(bytes[i]);
  }
};

/// Scan operator over transition maps.
struct escape_then_op {
  __host__ __device__ twin::escape_map operator()(twin::escape_map a, twin::escape_map b) const {
    return twin::escape_then(a, b);
  }
};

/// Records the reader state before byte `i` from the exclusive scan of maps.
struct state_writer {
  std::uint8_t* states;
  __host__ __device__ void operator()(std::ptrdiff_t i, twin::escape_map m) const {
    states[i] = twin::escape_apply(m, twin::escape_at_start);
  }
};

/// 1 when byte `i` ends a value of variable-length coding `Coding`.
template <class Coding>
struct end_flag {
  const std::uint8_t* bytes;
  const std::uint8_t* states; ///< null for varint
  __host__ __device__ std::uint64_t operator()(std::uint64_t i) const {
    return twin::ends_value(twin::gap_layout<Coding>::form, bytes[i],
                            states != nullptr ? states[i] : std::uint8_t{twin::escape_at_start})
               ? 1
               : 0;
  }
};

/// From the exclusive count `j` of value ends before byte `i`: the end of
/// value `j`, the byte after the last needed value, and (at the last byte)
/// the number of values present.
template <class Coding>
struct end_writer {
  end_flag<Coding> flag;
  std::uint64_t size, values;
  std::uint64_t* ends;
  std::uint64_t* slots;
  __host__ __device__ void operator()(std::ptrdiff_t at, unsigned long long j) const {
    const auto i = static_cast<std::uint64_t>(at);
    const std::uint64_t e = flag(i);
    if (e != 0 && j < values) ends[j] = i;
    if (e != 0 && j + 1 == values) slots[slot_used] = i + 1;
    if (i + 1 == size) slots[slot_present] = j + e;
  }
};

/// Scan input term k of the index decode.
template <class Coding>
struct coded_term {
  twin::coded_gaps<Coding> c;
  std::uint64_t first;
  __host__ __device__ std::uint64_t operator()(std::uint64_t k) const {
    return twin::coded_scan_term(c, first, k);
  }
};

/// Wrapping 64-bit sum (a wrap is reported by the check as a range failure).
struct wrap_add {
  __host__ __device__ std::uint64_t operator()(std::uint64_t a, std::uint64_t b) const {
    return a + b;
  }
};
struct count_add {
  __host__ __device__ unsigned long long operator()(unsigned long long a,
                                                    unsigned long long b) const {
    return a + b;
  }
};

/// Smallest `fault_key` over locations 1 .. count-1 of coding `Coding`.
template <class Coding, class Key = unsigned long long>
__global__ void coded_check_kernel(twin::coded_gaps<Coding> c,
                                   const std::uint64_t* DCR_RESTRICT idx, std::uint64_t count,
                                   std::uint64_t numel, Key* DCR_RESTRICT key) {
  for (std::uint64_t k = grid_first() + 1; k < count; k += grid_stride()) {
    const unsigned r = twin::coded_fault(c, idx, k, numel);
    if (r != twin::coded_ok) atomicMin(key, static_cast<Key>(twin::fault_key(k, r)));
  }
}

/// 1 + the last escape value before value `j` (0 when none); error path only.
template <class Coding, class Key = unsigned long long>
__global__ void escapes_before_kernel(twin::coded_gaps<Coding> c, std::uint64_t j,
                                      Key* DCR_RESTRICT out) {
  for (std::uint64_t v = grid_first(); v < j; v += grid_stride())
    if (c.ends[v] != twin::value_start(c, v)) atomicMax(out, static_cast<Key>(v + 1));
}

/// Indices `first + k` of a run (the decode of `codec::run`, and of a single
/// location of any coding). A template only so that the header can be
/// included by several translation units (templates have vague linkage).
template <class Unused = void>
__global__ void iota_kernel(std::uint64_t* DCR_RESTRICT out, std::uint64_t first, std::uint64_t n) {
  for (std::uint64_t k = grid_first(); k < n; k += grid_stride()) out[k] = first + k;
}

/// Record k: value word k of the value bytes (plain or byte planes) lands
/// at `loc[k]`, or at `start + k` when `loc` is null (a run).
/// The resident word becomes `E::apply(resident, value)` (`E`: the codec's
/// encoding type, the code the host apply runs).
template <codec::delta_encoding E, twin::word W>
__global__ void scatter_bytes_kernel(twin::view<W> dst, const std::uint64_t* DCR_RESTRICT loc,
                                     std::uint64_t start, const std::uint8_t* DCR_RESTRICT values,
                                     std::uint64_t n, bool planes) {
  for (std::uint64_t k = grid_first(); k < n; k += grid_stride()) {
    const std::uint64_t l = loc != nullptr ? loc[k] : start + k;
    W& d = dst.at(static_cast<std::int64_t>(l));
    d = E::apply(d, twin::load_value_word<W>(values, n, k, planes));
  }
}

/// Launch `scatter_bytes_kernel` for the runtime `op` (turned into its type once).
template <twin::word W>
status launch_scatter_bytes(twin::view<W> dst, const std::uint64_t* loc, std::uint64_t start,
                            const std::uint8_t* values, std::uint64_t n, bool planes,
                            twin::scatter_op op, const tuning& t, const device_facts& f,
                            cudaStream_t stream) {
  codec::visit_encoding(static_cast<value_encoding>(op), [&](auto e) {
    scatter_bytes_kernel<decltype(e), W>
        <<<grid_for(n, 1, t, f), t.block_threads, 0, stream>>>(dst, loc, start, values, n, planes);
  });
  return check_launch("scatter_bytes_kernel");
}

/// Where a decode keeps its scratch in the workspace (byte offsets).
struct decode_layout {
  std::size_t slots_at = 0, temp_at = 0, temp_bytes = 0, states_at = 0, ends_at = 0, idx_at = 0,
              total = 0;
};

/// Layout for decoding `c` (pointers unset) into `count` indices, starting
/// at byte `base` of the workspace; `own_idx` reserves room for the indices.
template <class Coding>
status plan_decode(const twin::coded_gaps<Coding>& c, std::uint64_t count, bool own_idx,
                   std::size_t base, decode_layout& L, cudaStream_t stream) {
  constexpr twin::gap_form form = twin::coded_gaps<Coding>::form;
  L.slots_at = base;
  L.temp_at = base + 256;
  std::size_t temp = 0, t = 0;
  if constexpr (form == twin::gap_form::escape) {
    auto in = thrust::make_transform_iterator(thrust::counting_iterator<std::uint64_t>(0),
                                              escape_map_at{nullptr});
    DCR_TRY(check(cub::DeviceScan::ExclusiveScan(
                      nullptr, t, in, thrust::make_tabulate_output_iterator(state_writer{nullptr}),
                      escape_then_op{}, twin::escape_identity, c.size, stream),
                  "cub::DeviceScan::ExclusiveScan(size, escape states)"));
    temp = t > temp ? t : temp;
  }
  if constexpr (twin::is_variable(form)) {
    auto in = thrust::make_transform_iterator(thrust::counting_iterator<std::uint64_t>(0),
                                              end_flag<Coding>{nullptr, nullptr});
    DCR_TRY(check(
        cub::DeviceScan::ExclusiveScan(nullptr, t, in,
                                       thrust::make_tabulate_output_iterator(end_writer<Coding>{
                                           {nullptr, nullptr}, 0, 0, nullptr, nullptr}),
                                       count_add{}, 0ull, c.size, stream),
        "cub::DeviceScan::ExclusiveScan(size, value ends)"));
    temp = t > temp ? t : temp;
  }
  {
    auto in = thrust::make_transform_iterator(thrust::counting_iterator<std::uint64_t>(0),
                                              coded_term<Coding>{c, 0});
    DCR_TRY(
        check(cub::DeviceScan::InclusiveScan(nullptr, t, in, static_cast<std::uint64_t*>(nullptr),
                                             wrap_add{}, count, stream),
              "cub::DeviceScan::InclusiveScan(size, indices)"));
    temp = t > temp ? t : temp;
  }
  L.temp_bytes = temp;
  L.states_at = L.temp_at + align256(temp);
  const std::size_t states = form == twin::gap_form::escape ? align256(c.size) : 0;
  L.ends_at = L.states_at + states;
  const std::size_t ends = twin::is_variable(form) ? align256(c.values * sizeof(std::uint64_t)) : 0;
  L.idx_at = L.ends_at + ends;
  L.total = L.idx_at + (own_idx ? align256(count * sizeof(std::uint64_t)) : 0);
  return status::success();
}

/// Reads back what `describe_fault` asks for (synchronous copies).
template <class Coding>
struct device_probe {
  const std::uint64_t* idx;
  twin::coded_gaps<Coding> c;
  unsigned long long* escapes;
  const device_facts* f;
  cudaStream_t stream;
  status io = status::success(); ///< first CUDA failure of a read; later reads return 0

  /// Keep `s` when it is the first failure.
  void note(status s) {
    if (io && !s) std::swap(io, s);
  }
  std::uint64_t read(const std::uint64_t* p) {
    std::uint64_t v = 0;
    if (!io) return 0;
    note(check(cudaMemcpyAsync(&v, p, sizeof v, cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync(fault probe)"));
    if (io) note(synchronize(stream));
    return v;
  }
  std::uint64_t index(std::uint64_t k) { return read(idx + k); }
  std::uint64_t end(std::uint64_t j) { return read(c.ends + j); }
  std::uint64_t escapes_before(std::uint64_t j) {
    if (!io) return 0;
    note(
        check(cudaMemsetAsync(escapes, 0, sizeof *escapes, stream), "cudaMemsetAsync(escape run)"));
    if (!io || j == 0) return 0;
    const tuning t = select_tuning(kernel_kind::check, f->cc_major);
    escapes_before_kernel<Coding, unsigned long long>
        <<<grid_for(j, 1, t, *f), t.block_threads, 0, stream>>>(c, j, escapes);
    note(check_launch("escapes_before_kernel"));
    return read(reinterpret_cast<const std::uint64_t*>(escapes));
  }
};

/// Decode `count >= 2` indices of gap coding `Coding` into `idx` (device),
/// with scratch laid out by `plan_decode` in `ws`; synchronises `stream`.
template <class Coding>
status run_decode(twin::coded_gaps<Coding> c, std::uint64_t first, std::uint64_t numel,
                  std::uint64_t count, std::uint64_t* idx, const decode_layout& L,
                  const device_facts& f, workspace& ws, cudaStream_t stream) {
  constexpr twin::gap_form form = twin::coded_gaps<Coding>::form;
  std::byte* base = ws.data();
  auto* slots = reinterpret_cast<std::uint64_t*>(base + L.slots_at);
  void* temp = base + L.temp_at;
  std::size_t temp_bytes = L.temp_bytes;
  // key = no failure, present = used = escapes = 0.
  DCR_TRY(check(cudaMemsetAsync(slots, 0, 4 * sizeof(std::uint64_t), stream),
                "cudaMemsetAsync(decode slots)"));
  DCR_TRY(check(cudaMemsetAsync(slots + slot_key, 0xFF, sizeof(std::uint64_t), stream),
                "cudaMemsetAsync(fault key)"));
  if constexpr (twin::is_variable(form)) {
    c.ends = reinterpret_cast<std::uint64_t*>(base + L.ends_at);
    c.present = slots + slot_present;
    std::uint8_t* states = nullptr;
    if (form == twin::gap_form::escape && c.size > 0) {
      states = reinterpret_cast<std::uint8_t*>(base + L.states_at);
      auto in = thrust::make_transform_iterator(thrust::counting_iterator<std::uint64_t>(0),
                                                escape_map_at{c.bytes});
      DCR_TRY(check(cub::DeviceScan::ExclusiveScan(
                        temp, temp_bytes, in,
                        thrust::make_tabulate_output_iterator(state_writer{states}),
                        escape_then_op{}, twin::escape_identity, c.size, stream),
                    "cub::DeviceScan::ExclusiveScan(escape states)"));
    }
    if (c.size > 0) {
      const end_flag<Coding> flag{c.bytes, states};
      auto in = thrust::make_transform_iterator(thrust::counting_iterator<std::uint64_t>(0), flag);
      auto out = thrust::make_tabulate_output_iterator(
          end_writer<Coding>{flag, c.size, c.values, const_cast<std::uint64_t*>(c.ends), slots});
      temp_bytes = L.temp_bytes;
      DCR_TRY(check(cub::DeviceScan::ExclusiveScan(temp, temp_bytes, in, out, count_add{}, 0ull,
                                                   c.size, stream),
                    "cub::DeviceScan::ExclusiveScan(value ends)"));
    }
  }
  auto in = thrust::make_transform_iterator(thrust::counting_iterator<std::uint64_t>(0),
                                            coded_term<Coding>{c, first});
  temp_bytes = L.temp_bytes;
  DCR_TRY(
      check(cub::DeviceScan::InclusiveScan(temp, temp_bytes, in, idx, wrap_add{}, count, stream),
            "cub::DeviceScan::InclusiveScan(indices)"));
  const tuning t = select_tuning(kernel_kind::check, f.cc_major);
  auto* key = reinterpret_cast<unsigned long long*>(slots + slot_key);
  coded_check_kernel<Coding, unsigned long long>
      <<<grid_for(count - 1, 1, t, f), t.block_threads, 0, stream>>>(c, idx, count, numel, key);
  DCR_TRY(check_launch("coded_check_kernel"));
  std::uint64_t host[3] = {};
  DCR_TRY(check(cudaMemcpyAsync(host, slots, sizeof host, cudaMemcpyDeviceToHost, stream),
                "cudaMemcpyAsync(decode slots)"));
  DCR_TRY(synchronize(stream));
  if (host[slot_key] != twin::no_failure) {
    device_probe<Coding> probe{idx, c, reinterpret_cast<unsigned long long*>(slots + slot_escapes),
                               &f, stream};
    status s = twin::describe_fault(c, host[slot_present], host[slot_key], numel, probe);
    if (!probe.io) return probe.io;
    return s;
  }
  return twin::check_coded_length(c, host[slot_used]);
}

/// Coded view of the location bytes (device pointers unset for variable forms).
template <class Coding>
twin::coded_gaps<Coding> coded_of(const std::uint8_t* bytes, std::uint64_t size,
                                  std::uint64_t count) {
  twin::coded_gaps<Coding> c;
  c.bytes = bytes;
  c.size = size;
  c.values = count - 1;
  return c;
}

/// Launch the run decode (`first + k`).
inline status launch_iota(std::uint64_t* out, std::uint64_t first, std::uint64_t n,
                          const device_facts& f, cudaStream_t stream) {
  const tuning t = select_tuning(kernel_kind::scatter, f.cc_major);
  iota_kernel<void><<<grid_for(n, 1, t, f), t.block_threads, 0, stream>>>(out, first, n);
  return check_launch("iota_kernel");
}

} // namespace detail

/// Decode `count` locations of coding `Coding` (a codec location type:
/// `codec::run`, `codec::gap_u16`, `codec::varint_gaps`, ...) from `size`
/// location bytes at `d_bytes` (device memory) with first index `first`,
/// each `< numel`, into `d_out` (device memory, `count` words). Same checks,
/// indices, codes and messages as the twin `twin::decode_locations<Coding>`
/// and the reference `Coding::decode`; `d_out` is unspecified on failure.
/// Synchronises `stream` (the result of the checks is read back).
template <codec::location_coding Coding>
status decode_locations(const std::uint8_t* d_bytes, std::uint64_t size, std::uint64_t first,
                        std::uint64_t numel, std::uint64_t count, std::uint64_t* d_out,
                        workspace& ws, cudaStream_t stream = 0) {
  bool done = false;
  DCR_TRY(twin::precheck_locations<Coding>(size, first, numel, count, done));
  DCR_RETURN_ERROR_IF(d_out == nullptr, invalid_argument, "decode_locations: null output");
  DCR_RETURN_ERROR_IF(size > 0 && d_bytes == nullptr, invalid_argument,
                      "decode_locations: null location bytes");
  detail::device_facts f;
  DCR_TRY(detail::prepare(d_bytes, d_out, nullptr, f));
  if constexpr (twin::gap_coding<Coding>) {
    if (!done) {
      const auto c = detail::coded_of<Coding>(d_bytes, size, count);
      detail::decode_layout L;
      DCR_TRY(detail::plan_decode(c, count, false, 0, L, stream));
      DCR_TRY(ws.reserve(L.total));
      return detail::run_decode(c, first, numel, count, d_out, L, f, ws, stream);
    }
  }
  // A run, or a single location: the prechecks validated the whole range.
  DCR_TRY(detail::launch_iota(d_out, first, count, f, stream));
  return synchronize(stream);
}

/// `decode_locations<Coding>` for the runtime coding `id` of an item row,
/// turned into its type once (an unknown id fails with `bad_location`).
inline status decode_locations(codec::location_id id, const std::uint8_t* d_bytes,
                               std::uint64_t size, std::uint64_t first, std::uint64_t numel,
                               std::uint64_t count, std::uint64_t* d_out, workspace& ws,
                               cudaStream_t stream = 0) {
  DCR_TRY(twin::check_location_id(id));
  return codec::visit_location(id, [&](auto coding) {
    return decode_locations<decltype(coding)>(d_bytes, size, first, numel, count, d_out, ws,
                                              stream);
  });
}

namespace detail {

/// Workspace bytes `scatter_encoded` needs from byte `base` on.
/// Precondition: `id` is known.
inline status plan_encoded(codec::location_id id, std::uint64_t size, std::uint64_t count,
                           std::size_t base, decode_layout& L, cudaStream_t stream) {
  L = decode_layout{};
  L.total = base;
  return codec::visit_location(id, [&](auto coding) -> status {
    using Coding = decltype(coding);
    if constexpr (twin::gap_coding<Coding>) {
      if (count >= 2)
        return plan_decode(coded_of<Coding>(nullptr, size, count), count, true, base, L, stream);
    }
    return status::success();
  });
}

/// `scatter_encoded` after its checks (`done` from `precheck_locations`),
/// with the workspace already holding `L.total` bytes (callers that upload
/// into the workspace plan first).
template <twin::word W>
status scatter_encoded_planned(twin::view<W> dst, std::uint64_t first, std::uint64_t count,
                               codec::location_id id, const std::uint8_t* d_locations,
                               std::uint64_t location_bytes, const std::uint8_t* d_values,
                               bool planes, twin::scatter_op op, bool done, const decode_layout& L,
                               const device_facts& f, workspace& ws, cudaStream_t stream) {
  const auto numel = static_cast<std::uint64_t>(dst.size());
  const tuning t = select_tuning(kernel_kind::scatter, f.cc_major);
  // The coding becomes its type once: the decode runs as `Coding`'s kernels.
  return codec::visit_location(id, [&](auto coding) -> status {
    using Coding = decltype(coding);
    if constexpr (twin::gap_coding<Coding>) {
      if (!done) {
        auto* idx = reinterpret_cast<std::uint64_t*>(ws.data() + L.idx_at);
        DCR_TRY(run_decode(coded_of<Coding>(d_locations, location_bytes, count), first, numel,
                           count, idx, L, f, ws, stream));
        return launch_scatter_bytes<W>(dst, idx, 0, d_values, count, planes, op, t, f, stream);
      }
    }
    // A run, or a single record: the prechecks validated the whole range.
    return launch_scatter_bytes<W>(dst, nullptr, first, d_values, count, planes, op, t, f, stream);
  });
}

} // namespace detail

/// An item's records in their wire form onto `dst` (device memory
/// everywhere): `count` locations of coding `id` from `location_bytes` bytes
/// at `d_locations`, first index `first`, checked against `dst.size()`
/// exactly as the reference decoder checks `numel`; `count` words of `W` at
/// `d_values` (`value_bytes` long), plain little-endian or byte planes
/// (`planes`), XORed in or written by `op`. Same checks and errors as the
/// twin `twin::scatter_encoded`; on any failure nothing is written.
/// Count 0 is an empty item (no location bytes allowed). Returns after the
/// scatter launch (the decode's checks synchronise); call
/// `synchronize(stream)` before reading `dst`.
template <twin::word W>
status scatter_encoded(twin::view<W> dst, std::uint64_t first, std::uint64_t count,
                       codec::location_id id, const std::uint8_t* d_locations,
                       std::uint64_t location_bytes, const std::uint8_t* d_values,
                       std::uint64_t value_bytes, bool planes, twin::scatter_op op, workspace& ws,
                       cudaStream_t stream = 0) {
  DCR_TRY(twin::check_encoded_args(dst, d_values, value_bytes, count));
  if (count == 0) {
    if (location_bytes != 0)
      return codec::detail::length_error(codec::to_string(id), location_bytes, 0);
    return status::success();
  }
  bool done = false;
  DCR_TRY(twin::precheck_locations(id, location_bytes, first,
                                   static_cast<std::uint64_t>(dst.size()), count, done));
  DCR_RETURN_ERROR_IF(location_bytes > 0 && d_locations == nullptr, invalid_argument,
                      "scatter_encoded: null locations");
  detail::device_facts f;
  DCR_TRY(detail::prepare(dst.data, d_locations, d_values, f));
  detail::decode_layout L;
  DCR_TRY(detail::plan_encoded(id, location_bytes, count, 0, L, stream));
  DCR_TRY(ws.reserve(L.total));
  return detail::scatter_encoded_planned(dst, first, count, id, d_locations, location_bytes,
                                         d_values, planes, op, done, L, f, ws, stream);
}

} // namespace dcr::gpu
