#pragma once
/// \file
/// All dcr CUDA kernels: scatter (XOR / overwrite, decoded, run, fused gap
/// decode), location decode of every wire coding with scatter_encoded and
/// scatter_row, copy modes and masked overwrite with the device copy sink and
/// the loader-facing sink, and change detection.

#include "dcr/cuda/copy.cuh"
#include "dcr/cuda/detect.cuh"
#include "dcr/cuda/item.cuh"
#include "dcr/cuda/loader_sink.cuh"
#include "dcr/cuda/locations.cuh"
#include "dcr/cuda/row.cuh"
#include "dcr/cuda/runtime.cuh"
#include "dcr/cuda/scatter.cuh"
