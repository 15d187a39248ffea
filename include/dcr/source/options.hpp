#pragma once
/// \file
/// What a build of one owner's delta may be asked: chunk and bucket targets,
/// the encoding policy, threads and payload grouping (`builder_options`).

#include <cstddef>
#include <cstdint>

#include "dcr/codec/item.hpp"
#include "dcr/codec/payload_encode.hpp"

namespace dcr {

/// Which relative encoding `mixed` uses where one is exact.
enum class relative_choice : std::uint8_t {
  smallest, ///< per item, XOR or add, whichever codes smaller (add needs format v2)
  xor_only, ///< XOR masks (what format v1 readers understand)
  add_only, ///< zigzag integer differences
};

/// How a bucket's items are grouped into payloads.
enum class payload_grouping : std::uint8_t {
  none,      ///< one payload per bucket (the bytes of every earlier release)
  by_expert, ///< one payload per expert index of the bucket's tensors, plus one of the rest
};

/// Chunk and bucket targets (bytes; tasks and chunks are never split, so a
/// chunk or bucket can exceed its target) and the encoding policy.
struct builder_options {
  std::size_t chunk_bytes = std::size_t{64} << 20, bucket_bytes = std::size_t{512} << 20;
  refit_mode mode = refit_mode::mixed; ///< mixed: relative encodings for unique affine maps,
                                       ///< overwrite for residual items
  relative_choice relative = relative_choice::smallest; ///< (mixed only)
  /// In mixed mode, residual outputs become XOR masks too (old ^ new of the
  /// converted words against the residual baseline) instead of overwrites:
  /// for receivers whose paths for those tensors are XOR-allowed (an FP8
  /// rollout's codes and scales placed by plain copies). Off by default.
  bool residual_xor = false;
  encode_options encoding{};
  /// Threads that build chunks, the calling thread one of them (0:
  /// `std::thread::hardware_concurrency()`; 1, the default: the calling
  /// thread only). Payload bytes do not depend on it. One is the default
  /// because the merge into buckets and their encoding stay on the calling
  /// thread, and on the 2-core development machine 2 threads have not been
  /// measured reliably faster at 5 % change (docs/training-side.md,
  /// "Threads and memory"). With more than one, residual rules
  /// (`residual_rule::convert`) of different tasks run concurrently, so a
  /// rule must not share mutable state.
  std::size_t threads = 1;
  /// Memory bound of a parallel build: at most this many chunks are being
  /// built or wait, built, for their turn to be merged into a bucket (0:
  /// twice the threads). With the open bucket, what a build holds beyond its
  /// inputs is at most this many chunks' records plus one bucket.
  std::size_t chunks_in_flight = 0;
  /// `by_expert` splits each bucket into one payload per expert (and one of
  /// every other tensor), in group order: with a manifest index, a node
  /// that holds some experts only (expert parallelism) then fetches only
  /// their payloads and the dense one. More, smaller payloads; what the
  /// items say is the same, so every receiver ends in the same bytes.
  payload_grouping grouping = payload_grouping::none;
  /// With `by_expert`: 0, one payload per expert; N > 0, the experts in N
  /// contiguous blocks (expert E of X in block E·N/X), one payload per block.
  /// N = the expert-parallel nodes under vLLM's linear placement (node j
  /// holds block j) gives each node exactly its payloads with N + 1 payloads
  /// per bucket instead of X + 1: fewer, larger objects (each a request).
  std::uint32_t expert_blocks = 0;
};

} // namespace dcr
