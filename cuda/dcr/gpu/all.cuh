#pragma once
/// \file
/// Vocabulary: `gpu/` (namespace `dcr::gpu`) holds CUDA kernels and their
/// launchers; each has a host twin in `include/dcr/twin/` (namespace
/// `dcr::twin`) with the same semantics, and the GPU tests compare them.
///
/// All dcr CUDA kernels: scatter (XOR / overwrite, decoded, run, fused gap
/// decode), location decode of every wire coding with scatter_encoded and
/// scatter_row, copy modes and masked overwrite with the device copy sink and
/// the loader-facing sink, and change detection.

#include "dcr/gpu/copy.cuh"
#include "dcr/gpu/detect.cuh"
#include "dcr/gpu/item.cuh"
#include "dcr/gpu/loader_sink.cuh"
#include "dcr/gpu/locations.cuh"
#include "dcr/gpu/row.cuh"
#include "dcr/gpu/runtime.cuh"
#include "dcr/gpu/scatter.cuh"
