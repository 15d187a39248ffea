// custom_pipeline: plug your own index map, native loader and transport into
// dcr's refit stages, composed at compile time for one configuration (BF16
// words, a transposed map, XOR masks, run/escape_u8 locations), so that only
// that code is compiled. The trainer keeps weight W transposed; the server
// splits W into two row halves; payloads travel through a byte-counting
// in-memory store; building, encoding and upload overlap in pipeline::run.
// Three steps, each checked byte for byte against a dense refit.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>

#include "dcr/codec/payload.hpp"
#include "dcr/pipeline/stage.hpp"
#include "dcr/receiver/receiver.hpp"
#include "dcr/receiver/stages.hpp"
#include "dcr/receiver/tensor_set.hpp"
#include "dcr/source/simulator.hpp"
#include "dcr/source/stages.hpp"
#include "dcr/transport/attempt_objects.hpp"
#include "dcr/transport/object_store.hpp"

using namespace dcr;

// 1. Your mapping: local index j of the transposed shard W^T [cols, rows]
//    to the canonical row-major index of W [rows, cols]. Injective (XOR-safe).
struct transpose {
  std::uint64_t rows, cols;
  std::uint64_t operator()(std::uint64_t j) const { return (j % rows) * cols + j / rows; }
};
using transposed_map = flat_map<transpose>;
static_assert(index_map<transposed_map>);

// The two pipelines, fixed at compile time: nothing for other dtypes,
// encodings or location codings is instantiated.
using trainer =
    stages::refit_pipeline<stages::compare<dcr::bf16>, stages::project<transposed_map>,
                           stages::encode<codec::xor_mask, codec::run_or<codec::escape_u8>>>;
using rollout =
    stages::receive_pipeline<stages::decode<codec::run_or<codec::escape_u8>>,
                             stages::scatter<dcr::bf16>, stages::apply<codec::xor_mask>>;

// 2. Your native loader: W lands in two row halves, the bias as is. Every
//    copy's source is a view of the canonical input, so XOR deltas apply.
struct split_loader {
  std::int64_t rows, cols;
  void declare(parameter_store& s, std::span<const tensor_meta>) const {
    s.add("w.top", {std::uint64_t(rows / 2), std::uint64_t(cols)}, dtype_id::bf16);
    s.add("w.bottom", {std::uint64_t(rows - rows / 2), std::uint64_t(cols)}, dtype_id::bf16);
    s.add("bias", {std::uint64_t(cols)}, dtype_id::bf16);
  }
  load_report load(std::string_view name, const tensor_view& src, parameter_store& s,
                   copy_sink& sink) const {
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
    return objects_.erase(std::string(n)) ? status::success()
                                          : fail(errc::not_found, std::string(n));
  }
  std::uint64_t uploaded = 0, downloaded = 0;

private:
  std::mutex m_;
  std::map<std::string, std::vector<std::byte>> objects_;
};
static_assert(transport::object_store<counting_store>);

int main() {
  constexpr std::uint64_t rows = 96, cols = 160;
  const std::vector<tensor_meta> metas = {{"w", {rows, cols}, dtype_id::bf16},
                                          {"bias", {cols}, dtype_id::bf16}};
  // Trainer state: W^T and the bias, as BF16 words.
  auto wt = sim::normal_bf16(rows * cols, 0.02f, 1), bias = sim::normal_bf16(cols, 0.02f, 2);
  auto canonical = [&](const std::vector<std::uint16_t>& t, const std::vector<std::uint16_t>& b) {
    tensor_set s(metas);
    auto w = s.at("w").words<dcr::bf16>();
    for (std::uint64_t j = 0; j < t.size(); ++j) w[transpose{rows, cols}(j)] = t[j];
    std::copy(b.begin(), b.end(), s.at("bias").words<dcr::bf16>().begin());
    return s;
  };
  const split_loader loader{rows, cols};
  receiver<split_loader> server(loader, metas);
  server.dense_refit(canonical(wt, bias));
  counting_store store;

  // What flows into the trainer pipeline: one shard, old and new words.
  struct shard {
    const tensor_meta* meta;
    transposed_map map;
    std::span<const std::uint16_t> old_words, new_words;
  };
  struct fetched {
    std::string name;
    std::vector<std::byte> bytes;
  };
  bool exact = true;
  for (std::uint64_t step = 1; step <= 3; ++step) {
    auto wt1 = wt, bias1 = bias;
    sim::stress_update(wt1, 0.02, 0.01, 10 + step);
    sim::stress_update(bias1, 0.02, 0.01, 20 + step);
    const std::uint64_t attempt = step;
    transport::attempt_writer<counting_store> writer(store, attempt, 0);
    payload_id id{attempt, step, 0, 0};
    // compare -> project -> encode, then payload coding, then upload: three
    // threads, so shard l+1 is built while payload l is coded and l-1 sent.
    auto build = pipeline::stage{[](shard s) {
      stages::record_buffer records;
      stages::shard_records<trainer>(
          s.map, s.old_words, s.new_words,
          [&](std::uint32_t) -> stages::record_buffer& { return records; });
      std::vector<item> items;
      if (!records.indices.empty())
        items.push_back(stages::to_item<trainer>(*s.meta, std::move(records)));
      return items;
    }};
    auto code = pipeline::stage{[&id](std::vector<item> items) {
      std::vector<std::byte> bytes;
      throw_if_failed(
          codec::encode_payload_with(id, items, encode_options{}, trainer::locations{}, bytes));
      ++id.sequence;
      return bytes;
    }};
    auto upload = pipeline::stage{[&writer](std::vector<std::byte> bytes) {
      throw_if_failed(writer.put_payload(bytes));
      return writer.listed().payloads.back().name;
    }};
    pipeline::run<shard>(
        build | code | upload,
        [&](auto&& emit) { // one shard per tensor: two payloads
          emit(shard{&metas[0], transposed_map(0, rows * cols, transpose{rows, cols}), wt, wt1}) &&
              emit(shard{&metas[1], transposed_map(1, cols, transpose{1, cols}), bias, bias1});
        },
        [](const std::string& name) { std::printf("  sent %s\n", name.c_str()); });
    throw_if_failed(writer.finish());

    // Fetch as published -> decode (run and escape_u8 only) -> apply (XOR only).
    auto decode = pipeline::stage{[&](fetched f) {
      decoded_payload d;
      if (auto s = server.decode<rollout::decode_stage>(f.bytes, d); !s)
        throw error(s.code, f.name + ": " + s.message);
      if (d.id.attempt != attempt)
        throw error(errc::stale_attempt, f.name + ": payload of another attempt");
      return d;
    }};
    pipeline::run<fetched>(
        pipeline::as_chain(decode),
        [&](auto&& emit) {
          std::atomic<bool> stop{false};
          transport::attempt_reader<counting_store> reader(store, attempt, {0});
          throw_if_failed(reader.run(
              [&](std::string_view name, std::span<const std::byte> b) {
                DCR_RETURN_ERROR_IF(!emit(fetched{std::string(name), {b.begin(), b.end()}}),
                                    aborted, "pipeline stopped");
                return status::success();
              },
              stop, std::chrono::steady_clock::now() + std::chrono::seconds(60)));
        },
        [&](decoded_payload d) {
          for (auto& it : d.items) throw_if_failed(server.apply_item<rollout>(it));
        });

    receiver<split_loader> reference(loader, metas);
    reference.dense_refit(canonical(wt1, bias1));
    const auto diff = first_difference(server.storage(), reference.storage());
    std::printf("step %llu: %s\n", static_cast<unsigned long long>(step),
                diff.empty() ? "server equals a dense refit byte for byte"
                             : ("DIFFERS: " + diff).c_str());
    exact = exact && diff.empty();
    throw_if_failed(transport::collect_attempts(store, attempt));
    wt = std::move(wt1);
    bias = std::move(bias1);
  }
  std::printf("uploaded %llu bytes, downloaded %llu bytes (checkpoint: %llu bytes)\n",
              static_cast<unsigned long long>(store.uploaded),
              static_cast<unsigned long long>(store.downloaded),
              static_cast<unsigned long long>((rows * cols + cols) * 2));
  return exact ? 0 : 1;
}
