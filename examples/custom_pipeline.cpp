// custom_pipeline: an application composes its own refit pipeline from the
// same stage objects the library's builder and receiver run, fixed at
// compile time for one configuration (custom_pipeline.hpp: BF16 words, a
// row-split shard map, XOR masks, gap-coded locations), so that only that
// code is compiled. The trainer holds W [rows, cols] split by columns over two
// ranks (row-parallel); the server holds W in two row halves; payloads travel
// through a byte-counting in-memory store; building, encoding and upload
// overlap in pipeline::run. Three steps, each checked byte for byte against a
// dense refit.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>

#include "dcr/pipeline/stage.hpp"
#include "dcr/receiver/receiver.hpp"
#include "dcr/receiver/tensor_set.hpp"
#include "dcr/transport/attempt_objects.hpp"
#include "dcr/transport/object_store.hpp"
#include "examples/common/simulator.hpp"
#include "examples/custom_pipeline.hpp"

using namespace dcr;
using custom::rollout;
using custom::split_loader;

// Your transport: any object store with atomic put (here: a map that
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
  constexpr std::uint64_t rows = 96, cols = 160, ranks = 2, kl = cols / ranks;
  const std::vector<tensor_meta> metas = {{"w", {rows, cols}, dtype_id::bf16}};
  // Trainer state: rank r holds columns [r kl, (r+1) kl) of W as a [rows, kl] shard.
  std::vector<std::vector<std::uint16_t>> shards;
  std::vector<row_parallel_map> maps;
  for (std::uint64_t r = 0; r < ranks; ++r) {
    shards.push_back(sim::normal_bf16(rows * kl, 0.02f, 1 + r));
    maps.emplace_back(0, rows, cols, ranks, r);
  }
  auto canonical = [&](const std::vector<std::vector<std::uint16_t>>& sh) {
    tensor_set s(metas);
    auto w = s.at("w").words<dcr::bf16>();
    for (std::uint64_t r = 0; r < ranks; ++r)
      for (std::uint64_t j = 0; j < sh[r].size(); ++j) w[maps[r](j).index] = sh[r][j];
    return s;
  };
  const split_loader loader{rows, cols};
  receiver<split_loader> server(loader, metas);
  server.dense_refit(canonical(shards));
  counting_store store;

  // What flows into the trainer pipeline: one shard, old and new words.
  struct shard {
    std::uint32_t rank;
    std::span<const std::uint16_t> old_words, new_words;
  };
  struct fetched {
    std::string name;
    std::vector<std::byte> bytes;
  };
  bool exact = true;
  for (std::uint64_t step = 1; step <= 3; ++step) {
    auto next = shards;
    for (std::uint64_t r = 0; r < ranks; ++r)
      sim::stress_update(next[r], 0.02, 0.01, 10 * step + r);
    const std::uint64_t attempt = step;
    transport::attempt_writer<counting_store> writer(store, attempt, 0);
    // compare -> project -> encode and payload coding, then upload: two
    // threads, so shard l+1 is built while payload l is sent.
    auto build = pipeline::stage{[&](shard s) {
      // One writer (owner 0) publishes both shards: sequence = rank.
      return custom::shard_payload(payload_id{attempt, step, 0, s.rank}, metas[0], maps[s.rank],
                                   s.old_words, s.new_words);
    }};
    auto upload = pipeline::stage{[&writer](std::vector<std::byte> bytes) {
      throw_if_failed(writer.put_payload(bytes));
      return writer.listed().payloads.back().name;
    }};
    pipeline::run<shard>(
        build | upload,
        [&](auto&& emit) {
          for (std::uint32_t r = 0; r < ranks; ++r)
            if (!emit(shard{r, shards[r], next[r]})) return;
        },
        [](const std::string& name) { std::printf("  sent %s\n", name.c_str()); });
    throw_if_failed(writer.finish());

    // Fetch as published -> decode (gap codings only) -> apply (XOR only).
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
    reference.dense_refit(canonical(next));
    const auto diff = first_difference(server.storage(), reference.storage());
    std::printf("step %llu: %s\n", static_cast<unsigned long long>(step),
                diff.empty() ? "server equals a dense refit byte for byte"
                             : ("DIFFERS: " + diff).c_str());
    exact = exact && diff.empty();
    throw_if_failed(transport::collect_attempts(store, attempt));
    shards = std::move(next);
  }
  std::printf("uploaded %llu bytes, downloaded %llu bytes (checkpoint: %llu bytes)\n",
              static_cast<unsigned long long>(store.uploaded),
              static_cast<unsigned long long>(store.downloaded),
              static_cast<unsigned long long>(rows * cols * 2));
  return exact ? 0 : 1;
}
