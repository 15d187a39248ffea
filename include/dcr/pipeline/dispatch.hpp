#pragma once
/// \file
/// Runtime selection of a compile-time pipeline instantiation. Where the
/// policies of an item arrive as data (dtype and value encoding travel per
/// item on the wire), one lookup per item picks the instantiation for that
/// combination from a table built at compile time over the policy type lists:
///
/// ```cpp
/// struct apply_fn { template <class D, class E> static status call(receiver&, const item&); };
/// constexpr dispatch_table<apply_fn, status(receiver&, const item&), dtype_list, encoding_list> table;
/// table(position_of<dtype_list>(it.tensor.dtype), position_of<encoding_list>(it.encoding))(rx, it);
/// ```
/// The table holds one function pointer per element of the cartesian product
/// of the lists (only those lists: 5 dtypes x 2 encodings is 10 entries), so
/// the cost of an item's dispatch is one index computation and one indirect
/// call, and the per-item work inside is the statically composed pipeline.
/// An application that knows its configuration composes that pipeline
/// directly and instantiates nothing else.
///
/// Host only: Boost.Hana must not reach code compiled by nvcc, so no header
/// that a `.cu` file includes may include this one.

#include <array>
#include <cstddef>
#include <optional>

#include <boost/hana/cartesian_product.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/length.hpp>
#include <boost/hana/tuple.hpp>
#include <boost/hana/type.hpp>
#include <boost/hana/unpack.hpp>

#include "dcr/codec/values.hpp"
#include "dcr/core/dtype.hpp"

namespace dcr::pipeline {

namespace hana = boost::hana;

/// The policy type lists of the wire: every dtype and every value encoding.
using dtype_list = decltype(hana::tuple_t<bf16, f16, f32, f8e4m3fn, f8e5m2>);
using encoding_list = decltype(hana::tuple_t<codec::xor_mask, codec::overwrite>);

/// The runtime id of a policy: a dtype tag's `dtype_id`, else `T::id`.
template <class T> constexpr auto policy_id() noexcept {
  if constexpr (storage_dtype<T>) return dtype_traits<T>::id;
  else return T::id;
}

/// Position in type list `List` of the policy whose id is `id`, or the
/// list's length when none is (the table then returns nullptr).
template <class List, class Id> constexpr std::size_t position_of(Id id) noexcept {
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
template <class Fn, class Sig, class... Lists> class dispatch_table;

template <class Fn, class R, class... Args, class... Lists> class dispatch_table<Fn, R(Args...), Lists...> {
public:
  using fn_ptr = R (*)(Args...);
  static constexpr std::size_t dims[] = {decltype(hana::length(Lists{}))::value...};
  static constexpr std::size_t size = (decltype(hana::length(Lists{}))::value * ...);

  /// The instantiation for positions `pos` (one per list), or nullptr when
  /// a position is outside its list.
  template <class... P> constexpr fn_ptr operator()(P... pos) const noexcept {
    static_assert(sizeof...(P) == sizeof...(Lists));
    std::size_t i = 0, k = 0;
    bool inside = true;
    ((inside = inside && static_cast<std::size_t>(pos) < dims[k], i = i * dims[k++] + static_cast<std::size_t>(pos)),
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

} // namespace dcr::pipeline
