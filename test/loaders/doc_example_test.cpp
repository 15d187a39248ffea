// The worked example of docs/loaders.md ("How to add a loader"): the code
// between the markers is copied into the document verbatim, so it compiles
// and its claims are checked here.
#include <doctest/doctest.h>

#include "receiver/refit_check.hpp"

// [loader-example]
#include "dcr/loaders/views.hpp"
#include "dcr/receiver/loader.hpp"

/// A runtime that fuses gate and up projections into one `gate_up` parameter,
/// keeps norms in FP32 and stores everything else as the checkpoint does.
struct fused_mlp_loader {
  static bool ends_with(std::string_view s, std::string_view x) {
    return s.size() >= x.size() && s.substr(s.size() - x.size()) == x;
  }
  static std::string
  gate_up(std::string_view n) { // "...mlp.gate_proj.weight" -> "...mlp.gate_up.weight"
    return std::string(n.substr(0, n.rfind("mlp.") + 4)) + "gate_up.weight";
  }

  // 1. Declare this rank's parameters (zeroed by the store).
  void declare(dcr::parameter_store& s, std::span<const dcr::tensor_meta> canonical) {
    for (auto& m : canonical) {
      if (ends_with(m.name, "mlp.up_proj.weight")) continue; // lives in gate_up
      if (ends_with(m.name, "mlp.gate_proj.weight"))
        s.add(gate_up(m.name), {2 * m.shape[0], m.shape[1]}, m.dtype);
      else if (ends_with(m.name, "norm.weight"))
        s.add(m.name, m.shape, dcr::dtype_id::f32);
      else
        s.add(m.name, m.shape, m.dtype);
    }
  }

  // 2. Place one canonical tensor: views and copies only through the sink.
  dcr::load_report load(std::string_view name, const dcr::tensor_view& src, dcr::parameter_store& s,
                        dcr::copy_sink& sink) {
    if (ends_with(name, "gate_proj.weight") || ends_with(name, "up_proj.weight")) {
      const auto rows = src.layout.extents[0];
      const auto p = gate_up(name);
      const bool up = ends_with(name, "up_proj.weight");
      sink.copy(s.view(p).slice(0, up ? rows : 0, rows),
                src); // a slice of the scratch: XOR allowed
      return {{p}};
    }
    if (ends_with(name, "norm.weight")) {
      sink.copy(s.view(name), dcr::loaders::widen_bf16_to_f32(src, tmp_)); // a cast: overwrite only
      return {{std::string(name)}};
    }
    sink.copy(s.view(name), src);
    return {{std::string(name)}};
  }

  std::vector<std::uint32_t> tmp_; // the cast's temporary (O(tensor) per item)
};
static_assert(dcr::native_loader<fused_mlp_loader>);

// Use it:
//   dcr::receiver<fused_mlp_loader> rx(fused_mlp_loader{}, canonical_metas);  // prewarm
//   rx.dense_refit(checkpoint);                                              // restore
//   rx.stage(payload_bytes); rx.apply_staged();                               // delta
// [loader-example]

using namespace dcr;

TEST_CASE("docs/loaders.md example: plan and delta refit == dense refit") {
  auto c = tiny_llama();
  auto metas = canonical_tensors(c);
  receiver<fused_mlp_loader> rx(fused_mlp_loader{}, metas);
  CHECK(rx.xor_allowed(layer_name(0, "mlp.gate_proj.weight")));
  CHECK(rx.xor_allowed(layer_name(0, "mlp.up_proj.weight")));
  CHECK(!rx.xor_allowed(layer_name(0, "input_layernorm.weight")));
  CHECK(rx.storage().index_of(layer_name(1, "mlp.gate_up.weight")));
  auto v = test::random_model(metas, 3);
  auto v1 = test::clone(v);
  test::stress(v1, 0.05, 0.05, 4);
  for (auto mode :
       {test::delta_mode::mixed, test::delta_mode::xor_only, test::delta_mode::overwrite_only})
    CHECK(test::check_delta_equals_dense(std::vector{fused_mlp_loader{}}, metas, v, v1, mode, 5)
              .changed > 0);
}
