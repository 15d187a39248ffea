// custom_pipeline: plug your own index map, native loader and transport into
// dcr's compile-time stages. The trainer keeps weight W transposed; the
// server splits W into two row halves; payloads travel through a byte-counting
// in-memory store. Three steps, each checked byte for byte against a dense refit.
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>

#include "dcr/pipeline/stages.hpp"
#include "dcr/receiver/receiver.hpp"
#include "dcr/receiver/tensor_set.hpp"
#include "dcr/source/simulator.hpp"

using namespace dcr;
using namespace dcr::pipeline;

// 1. Your mapping: local index j of the transposed shard W^T [cols, rows]
//    to the canonical row-major index of W [rows, cols]. Injective (XOR-safe).
struct transposed_map {
  std::uint64_t rows, cols;
  std::uint64_t operator()(std::uint64_t j) const { return (j % rows) * cols + j / rows; }
};
static_assert(flat_index_map<transposed_map>);

// 2. Your native loader: W lands in two row halves, the bias as is. Every
//    copy's source is a view of the canonical input, so XOR deltas apply.
struct split_loader {
  std::int64_t rows, cols;
  void declare(parameter_store& s, std::span<const tensor_meta>) const {
    s.add("w.top", {std::uint64_t(rows / 2), std::uint64_t(cols)}, dtype_id::bf16);
    s.add("w.bottom", {std::uint64_t(rows - rows / 2), std::uint64_t(cols)}, dtype_id::bf16);
    s.add("bias", {std::uint64_t(cols)}, dtype_id::bf16);
  }
  load_report load(std::string_view name, const tensor_view& src, parameter_store& s, copy_sink& sink) const {
    if (name == "bias") {
      sink.copy(s.view("bias"), src);
      return {{"bias"}};
    }
    sink.copy(s.view("w.top"), src.slice(0, 0, rows / 2));
    sink.copy(s.view("w.bottom"), src.slice(0, rows / 2, rows - rows / 2));
    return {{"w.top", "w.bottom"}};
  }
};
static_assert(native_loader<split_loader>);

// 3. Your transport: any object store with atomic put (here: a map that
//    counts the bytes crossing it).
class counting_store {
public:
  status put(std::string_view n, std::span<const std::byte> b) {
    DCR_TRY(transport::validate_object_name(n));
    std::lock_guard l(m_);
    objects_[std::string(n)].assign(b.begin(), b.end());
    uploaded += b.size();
    return status::success();
  }
  status get(std::string_view n, std::vector<std::byte>& out) {
    std::lock_guard l(m_);
    auto it = objects_.find(std::string(n));
    DCR_RETURN_ERROR_IF(it == objects_.end(), not_found, "no object " + std::string(n));
    out = it->second;
    downloaded += out.size();
    return status::success();
  }
  status list(std::string_view prefix, std::vector<std::string>& names) {
    std::lock_guard l(m_);
    names.clear();
    for (auto& [n, b] : objects_)
      if (n.rfind(prefix, 0) == 0) names.push_back(n);
    return status::success();
  }
  status remove(std::string_view n) {
    std::lock_guard l(m_);
    return objects_.erase(std::string(n)) ? status::success() : fail(errc::not_found, std::string(n));
  }
  std::uint64_t uploaded = 0, downloaded = 0;

private:
  std::mutex m_;
  std::map<std::string, std::vector<std::byte>> objects_;
};
static_assert(transport::object_store<counting_store>);

int main() {
  constexpr std::uint64_t rows = 96, cols = 160;
  const std::vector<tensor_meta> metas = {{"w", {rows, cols}, dtype_id::bf16}, {"bias", {cols}, dtype_id::bf16}};
  // Trainer state: W^T and the bias, as BF16 words.
  auto wt = sim::normal_bf16(rows * cols, 0.02f, 1), bias = sim::normal_bf16(cols, 0.02f, 2);
  auto canonical = [&](const std::vector<std::uint16_t>& t, const std::vector<std::uint16_t>& b) {
    tensor_set s(metas);
    auto w = s.at("w").words<dcr::bf16>();
    for (std::uint64_t j = 0; j < t.size(); ++j) w[transposed_map{rows, cols}(j)] = t[j];
    std::copy(b.begin(), b.end(), s.at("bias").words<dcr::bf16>().begin());
    return s;
  };
  const split_loader loader{rows, cols};
  receiver<split_loader> server(loader, metas);
  server.dense_refit(canonical(wt, bias));
  counting_store store;

  // The trainer pipeline and the rollout pipeline, fixed at compile time.
  using shard = shard_update<dcr::bf16, transposed_map>;
  bool exact = true;
  for (std::uint64_t step = 1; step <= 3; ++step) {
    auto wt1 = wt, bias1 = bias;
    sim::stress_update(wt1, 0.02, 0.01, 10 + step);
    sim::stress_update(bias1, 0.02, 0.01, 20 + step);
    const std::uint64_t attempt = step;
    auto writer = std::make_shared<transport::attempt_writer<counting_store>>(store, attempt, 0);
    auto trainer = compare<dcr::bf16>() | project<transposed_map>() | encode<value_encoding::xor_mask>() |
                   compress(payload_id{attempt, step, 0, 0}, zstd{1}) | send(writer);
    run<bucket<dcr::bf16, transposed_map>>(
        trainer,
        [&](auto&& emit) { // one bucket per tensor: two payloads
          emit(bucket<dcr::bf16, transposed_map>{shard{metas[0], {rows, cols}, wt, wt1, {}}});
          emit(bucket<dcr::bf16, transposed_map>{shard{metas[1], {1, cols}, bias, bias1, {}}});
        },
        [](const std::string& name) { std::printf("  sent %s\n", name.c_str()); });
    throw_if_failed(writer->finish());

    run<fetched>(as_chain(decode(attempt)), receive(store, attempt, {0}), apply(server));

    receiver<split_loader> reference(loader, metas);
    reference.dense_refit(canonical(wt1, bias1));
    const auto diff = first_difference(server.storage(), reference.storage());
    std::printf("step %llu: %s\n", static_cast<unsigned long long>(step),
                diff.empty() ? "server equals a dense refit byte for byte" : ("DIFFERS: " + diff).c_str());
    exact = exact && diff.empty();
    throw_if_failed(transport::collect_attempts(store, attempt));
    wt = std::move(wt1);
    bias = std::move(bias1);
  }
  std::printf("uploaded %llu bytes, downloaded %llu bytes (checkpoint: %llu bytes)\n",
              static_cast<unsigned long long>(store.uploaded), static_cast<unsigned long long>(store.downloaded),
              static_cast<unsigned long long>((rows * cols + cols) * 2));
  return exact ? 0 : 1;
}
