// libFuzzer target: Hugging Face `config.json` models
// (`model_config_from_hf_json`). A config that is not valid JSON or not a
// supported model must be refused with a `dcr::error`; any other exception,
// a crash, a hang or an out-of-bounds read is a finding. A config that
// parses and is small enough to list must list its canonical tensors
// without failing.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "dcr/core/error.hpp"
#include "dcr/model/config.hpp"
#include "dcr/model/hf_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  dcr::model_config c;
  try {
    c = dcr::model_config_from_hf_json(text);
  } catch (const dcr::error&) {
    return 0;
  }
  // Listing the tensors of a model with millions of layers or experts is
  // slow, not wrong: only the small ones are listed.
  if (c.layers > 64 || c.experts > 64) return 0;
  try {
    (void)dcr::canonical_tensors(c);
  } catch (const dcr::error&) {
    // A shape whose element count overflows is refused, typed.
  }
  return 0;
}
