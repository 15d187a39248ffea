#pragma once
/// \file
/// The native-loader model. A native loader is user code that knows how a
/// serving runtime places canonical (Hugging Face) tensors into its rank-local
/// parameters; dcr never knows those rules. Given a canonical tensor name and
/// a view of it, the loader performs `sink.copy(dst, src)` into parameter
/// storage (slicing, fusing, splitting, transposing, casting or scaling on the
/// way) or declares `sink.skip(name)`. The sink is where dcr intercepts every
/// final storage copy (dense refit, XOR or overwrite delta, dry-run recording).

#include <concepts>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/core/tensor.hpp"
#include "dcr/receiver/storage.hpp"

namespace dcr {

/// The interception point. `copy` stores `src` into the storage view `dst`
/// (equal extents, equal dtypes: conversions are the loader's job, done into a
/// temporary before the copy); `skip` declares that this rank holds nothing
/// of the canonical tensor (e.g. an expert held by another EP rank).
///
/// Loaders must treat `src` as read-only and must write storage only through
/// `copy`. Sinks never throw from `copy`: a copy that breaks a loader
/// condition is recorded and the receiver fails the attempt after the load.
class copy_sink {
public:
  virtual ~copy_sink() = default;
  virtual void copy(const tensor_view& dst, const tensor_view& src) = 0;
  virtual void skip(std::string_view canonical) = 0;
};

/// What a loader says it did for one canonical tensor: the names of the
/// parameters it loaded (like vLLM's `load_weights` return value). dcr checks
/// that this set equals the set of parameters its intercepted copies wrote.
struct load_report {
  std::vector<std::string> loaded;
};

/// A native loader.
///
/// Minimal complete definition:
/// - `declare(store, canonical)`: add this rank's parameters to `store` (they
///   start zeroed; padding stays zero because no copy writes it);
/// - `load(name, src, store, sink) -> load_report`: place canonical tensor
///   `name`, whose values `src` holds (row-major, canonical shape and dtype).
///
/// Laws (the loader conditions; checked by the receiver at prewarm and at
/// every apply): every storage write is a `sink.copy` into a view of one
/// parameter; the reported parameters equal those the copies wrote; a tensor
/// with no copy is skipped explicitly; the sequence of copies (destinations,
/// layouts, aliasing of `src`) depends only on the tensor's name and meta,
/// never on its values; each stored value depends only on the canonical value
/// at the same coordinate (elementwise, deterministic transforms).
template <class L>
concept native_loader = requires(L& l, parameter_store& store,
                                 std::span<const tensor_meta> canonical, std::string_view name,
                                 const tensor_view& src, copy_sink& sink) {
  {l.declare(store, canonical)};
  { l.load(name, src, store, sink) } -> std::same_as<load_report>;
};

/// `handle_loader::handle` of a name the loader does not know.
inline constexpr std::size_t no_handle = static_cast<std::size_t>(-1);

/// Optionally, a loader resolves a canonical name once to a handle and then
/// loads by handle: `l.handle(name) -> std::size_t` (`no_handle` for a name
/// it does not know) and `l.load_handle(h, name, src, store, sink)`, which
/// must do exactly what `l.load(name, src, store, sink)` does when `h ==
/// l.handle(name)`. A receiver asks for every canonical tensor's handle at
/// prewarm, so that applying an item looks up no name in the loader (on a
/// model of 100k tensors each such lookup is a cache miss or two).
template <class L>
concept handle_loader = native_loader<L> &&
    requires(const L& l, std::string_view name, std::size_t h, const tensor_view& src,
             parameter_store& store, copy_sink& sink) {
  { l.handle(name) } -> std::same_as<std::size_t>;
  { l.load_handle(h, name, src, store, sink) } -> std::same_as<load_report>;
};

/// Whether a receiver may call `l.load(...)` from several threads at once
/// (`receiver_options::apply_threads` above 1): `L` says so with
/// `static constexpr bool concurrent_load = true`. The receiver then calls
/// `load` concurrently on the one loader object, only for canonical tensors
/// whose copies write disjoint parameters (never two tensors that share a
/// parameter, never two items of one tensor), each call with its own scratch
/// view and sink. A loader may declare it when `load` keeps no mutable state
/// of its own, or synchronises what it keeps (a pool of temporaries); reads
/// of `store` (`view`, `index_of`) are safe to run concurrently. Without the
/// declaration a receiver refuses more than one apply thread.
template <class L>
inline constexpr bool concurrent_load_v = requires {
  requires L::concurrent_load;
};

/// Something that holds full canonical tensors by name (in-memory tensors, a
/// safetensors file). Views are read-only by contract.
template <class S>
concept canonical_source = requires(const S& s, std::string_view name) {
  { s.find(name) } -> std::same_as<std::optional<tensor_view>>;
};

} // namespace dcr
