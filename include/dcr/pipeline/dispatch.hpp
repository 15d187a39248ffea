#pragma once
/// \file
/// Runtime selection of a compile-time pipeline instantiation. Where the
/// policies of an item arrive as data (dtype and value encoding travel per
/// item on the wire), one lookup per item picks the instantiation for that
/// combination from a table built at compile time over the policy type lists:
///
/// ```cpp
/// struct apply_fn { template <class D, class E> static status call(receiver&, const item&); };
/// constexpr dispatch_table<apply_fn, status(receiver&, const item&), dtype_list, encoding_list>
/// table; table(position_of<dtype_list>(it.tensor.dtype),
/// position_of<encoding_list>(it.encoding))(rx, it);
/// ```
/// The table holds one function pointer per element of the cartesian product
/// of the lists (only those lists: 5 dtypes x 3 encodings is 15 entries), so
/// the cost of an item's dispatch is one index computation and one indirect
/// call, and the per-item work inside is the statically composed pipeline.
/// An application that knows its configuration composes that pipeline
/// directly and instantiates nothing else.
///
/// Host only: Boost.Hana must not reach code compiled by nvcc, so no header
/// that a `.cu` file includes may include this one.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <boost/hana/cartesian_product.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/length.hpp>
#include <boost/hana/tuple.hpp>
#include <boost/hana/type.hpp>
#include <boost/hana/unpack.hpp>

#include "dcr/codec/locations.hpp"
#include "dcr/codec/values.hpp"
#include "dcr/core/dtype.hpp"

namespace dcr::pipeline {

namespace hana = boost::hana;

/// The policy type lists of the wire: every dtype, value encoding and
/// location coding.
using dtype_list = decltype(hana::tuple_t<bf16, f16, f32, f8e4m3fn, f8e5m2>);
using encoding_list = decltype(hana::tuple_t<codec::xor_mask, codec::overwrite, codec::add>);
using location_list =
    decltype(hana::tuple_t<codec::run, codec::gap_u8, codec::gap_u16, codec::gap_u32,
                           codec::gap_u64, codec::planes_u16, codec::planes_u32, codec::planes_u64,
                           codec::varint_gaps, codec::escape_u8>);

/// The runtime id of a policy: a dtype tag's `dtype_id`, else `T::id`.
template <class T>
constexpr auto policy_id() noexcept {
  if constexpr (storage_dtype<T>)
    return dtype_traits<T>::id;
  else
    return T::id;
}

/// Position in type list `List` of the policy whose id is `id`, or the
/// list's length when none is (the table then returns nullptr).
template <class List, class Id>
constexpr std::size_t position_of(Id id) noexcept {
  std::size_t at = decltype(hana::length(List{}))::value, k = 0;
  hana::for_each(List{}, [&](auto t) {
    if (policy_id<typename decltype(t)::type>() == id) at = k;
    ++k;
  });
  return at;
}

/// `Fn::template call<Ts...>` for every tuple `Ts...` of the cartesian
/// product of the type lists, as a flat array indexed in row-major order of
/// the lists' positions (the last list varies fastest).
template <class Fn, class Sig, class... Lists>
class dispatch_table;

template <class Fn, class R, class... Args, class... Lists>
class dispatch_table<Fn, R(Args...), Lists...> {
public:
  using fn_ptr = R (*)(Args...);
  static constexpr std::size_t dims[] = {decltype(hana::length(Lists{}))::value...};
  static constexpr std::size_t size = (decltype(hana::length(Lists{}))::value * ...);

  /// The instantiation for positions `pos` (one per list), or nullptr when
  /// a position is outside its list.
  template <class... P>
  constexpr fn_ptr operator()(P... pos) const noexcept {
    static_assert(sizeof...(P) == sizeof...(Lists));
    std::size_t i = 0, k = 0;
    bool inside = true;
    ((inside = inside && static_cast<std::size_t>(pos) < dims[k],
      i = i * dims[k++] + static_cast<std::size_t>(pos)),
     ...);
    return inside ? table_[i] : nullptr;
  }

private:
  static constexpr std::array<fn_ptr, size> make() {
    constexpr auto product = hana::cartesian_product(hana::make_tuple(Lists{}...));
    return hana::unpack(product, [](auto... combos) {
      return std::array<fn_ptr, size>{hana::unpack(combos, [](auto... types) -> fn_ptr {
        return &Fn::template call<typename decltype(types)::type...>;
      })...};
    });
  }
  static constexpr std::array<fn_ptr, size> table_ = make();
};

namespace detail {
struct encode_locations_fn {
  template <class C>
  static void call(std::span<const std::uint64_t> idx, std::vector<std::byte>& out) {
    C::encode(idx, out);
  }
};
struct decode_locations_fn {
  template <class C>
  static status call(std::span<const std::byte> in, std::uint64_t first, std::uint64_t numel,
                     std::span<std::uint64_t> out) {
    return C::decode(in, first, numel, out);
  }
};
} // namespace detail

/// The general location policy of host code: the coding `choose_location`
/// picks under `scheme`, and every coding on decode, each selected from a
/// table over `location_list` (what `codec::by_scheme` does with a switch,
/// for code that CUDA compiles too).
struct dispatched_locations {
  codec::location_scheme scheme = codec::location_scheme::escape_u8;
  codec::location_id operator()(std::span<const std::uint64_t> idx,
                                std::vector<std::byte>& out) const {
    static constexpr dispatch_table<detail::encode_locations_fn,
                                    void(std::span<const std::uint64_t>, std::vector<std::byte>&),
                                    location_list>
        table{};
    const codec::location_id id = codec::choose_location(idx, scheme);
    table(position_of<location_list>(id))(idx, out); // choose_location names a coding of the list
    return id;
  }
  static status decode(codec::location_id id, std::span<const std::byte> in, std::uint64_t first,
                       std::uint64_t numel, std::span<std::uint64_t> out) {
    static constexpr dispatch_table<detail::decode_locations_fn,
                                    status(std::span<const std::byte>, std::uint64_t, std::uint64_t,
                                           std::span<std::uint64_t>),
                                    location_list>
        table{};
    auto* f = table(position_of<location_list>(id));
    DCR_RETURN_ERROR_IF(!f, bad_location,
                        "unknown location coding " + std::to_string(static_cast<int>(id)));
    return f(in, first, numel, out);
  }
};
static_assert(codec::location_policy<dispatched_locations>);

} // namespace dcr::pipeline
