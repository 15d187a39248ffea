#pragma once
/// \file
/// Payload wire format v1 (normative spec: docs/wire-format.md): the format
/// (`payload_format.hpp`), encoding (`payload_encode.hpp`) and decoding
/// (`payload_decode.hpp`). Include the part you need; code that must stay
/// free of zstd (CUDA, the relay tree) includes only the format.

#include "dcr/codec/payload_decode.hpp"
#include "dcr/codec/payload_encode.hpp"
#include "dcr/codec/payload_format.hpp"
