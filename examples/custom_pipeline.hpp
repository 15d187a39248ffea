#pragma once
// A refit pipeline an application composes for one configuration from the
// library's own stage objects (see custom_pipeline.cpp): BF16 words, a
// row-split (row-parallel) shard map, XOR masks, gap-coded locations. Only
// this composition is compiled: no other dtype, map, encoding or location
// coding is instantiated on either side. Its payload bytes are those of the
// generic builder (`dcr::owner`) run with XOR items and the `gaps` location
// scheme on the same input (test/source/custom_pipeline_test.cpp checks it).

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/codec/payload.hpp"
#include "dcr/map/index_map.hpp"
#include "dcr/receiver/loader.hpp"
#include "dcr/receiver/stages.hpp"
#include "dcr/source/stages.hpp"

namespace custom {

using namespace dcr;

/// Locations as gaps in the smallest word that holds the largest (run for a
/// contiguous item): what `codec::by_scheme{location_scheme::gaps}` encodes,
/// with only the four gap codings and `run` instantiated.
struct gap_locations {
  codec::location_id operator()(std::span<const std::uint64_t> idx,
                                std::vector<std::byte>& out) const {
    const auto id = codec::choose_location(idx, codec::location_scheme::gaps);
    switch (id) {
    case codec::location_id::run:
      break;
    case codec::location_id::gap_u8:
      codec::gap_u8::encode(idx, out);
      break;
    case codec::location_id::gap_u16:
      codec::gap_u16::encode(idx, out);
      break;
    case codec::location_id::gap_u32:
      codec::gap_u32::encode(idx, out);
      break;
    default:
      codec::gap_u64::encode(idx, out);
      break;
    }
    return id;
  }
  static status decode(codec::location_id id, std::span<const std::byte> in, std::uint64_t first,
                       std::uint64_t numel, std::span<std::uint64_t> out) {
    switch (id) {
    case codec::location_id::run:
      return codec::run::decode(in, first, numel, out);
    case codec::location_id::gap_u8:
      return codec::gap_u8::decode(in, first, numel, out);
    case codec::location_id::gap_u16:
      return codec::gap_u16::decode(in, first, numel, out);
    case codec::location_id::gap_u32:
      return codec::gap_u32::decode(in, first, numel, out);
    case codec::location_id::gap_u64:
      return codec::gap_u64::decode(in, first, numel, out);
    default:
      return fail(errc::bad_location,
                  std::string(to_string(id)) + " locations, this pipeline decodes gaps only");
    }
  }
};
static_assert(codec::location_policy<gap_locations>);

/// The training side: compare -> project -> encode, as the library's builder
/// composes them (`stages::delta`), fixed at compile time.
using trainer =
    stages::refit_pipeline<stages::compare<dcr::bf16>, stages::project<row_parallel_map>,
                           stages::encode<codec::xor_mask, gap_locations>>;
/// The rollout side: decode -> scatter -> apply, fixed the same way.
using rollout = stages::receive_pipeline<stages::decode<gap_locations>, stages::scatter<dcr::bf16>,
                                         stages::apply<codec::xor_mask>>;

/// The encoding options of this pipeline's payloads (and of the generic
/// build it matches).
inline encode_options payload_options() {
  encode_options o;
  o.locations = codec::location_scheme::gaps;
  return o;
}

/// One payload `id` carrying the changes of one row-split BF16 shard
/// (`old_words` -> `new_words`, local words of `map`'s domain) of canonical
/// tensor `meta`: the `trainer` pipeline's stages, then the payload coder
/// with its location policy. Empty items are left out, as the builder does.
inline std::vector<std::byte> shard_payload(const payload_id& id, const tensor_meta& meta,
                                            const row_parallel_map& map,
                                            std::span<const std::uint16_t> old_words,
                                            std::span<const std::uint16_t> new_words) {
  stages::record_buffer records;
  const stages::delta<trainer::compare_stage, trainer::project_stage, trainer::encode_stage> run{
      trainer::project_stage{map}};
  run(old_words, new_words, [&](std::uint32_t) -> stages::record_buffer& { return records; });
  std::vector<item> items;
  if (!records.indices.empty()) items.push_back(stages::to_item<trainer>(meta, std::move(records)));
  std::vector<std::byte> bytes;
  throw_if_failed(codec::encode_payload_with(id, items, payload_options(), gap_locations{}, bytes));
  return bytes;
}

/// The serving side's native layout: W [rows, cols] lands in two row halves.
/// Every copy's source is a view of the canonical input, so XOR deltas apply.
struct split_loader {
  std::int64_t rows, cols;
  void declare(parameter_store& s, std::span<const tensor_meta>) const {
    s.add("w.top", {std::uint64_t(rows / 2), std::uint64_t(cols)}, dtype_id::bf16);
    s.add("w.bottom", {std::uint64_t(rows - rows / 2), std::uint64_t(cols)}, dtype_id::bf16);
  }
  load_report load(std::string_view, const tensor_view& src, parameter_store& s,
                   copy_sink& sink) const {
    sink.copy(s.view("w.top"), src.slice(0, 0, rows / 2));
    sink.copy(s.view("w.bottom"), src.slice(0, rows / 2, rows - rows / 2));
    return {{"w.top", "w.bottom"}};
  }
};
static_assert(native_loader<split_loader>);

} // namespace custom
