// kvtier's side of bench/engine/llama_cpp_long_context.py: one prefill of a synthetic prompt
// and a fixed number of greedy decode steps that never stop at end-of-sequence, through the
// worker runtime (local pools) with the policy given, as kvtier-run generate does. Prints one
// JSON line: prefill and decode tokens/s (wall clock) and the tier report's headline.
//
//   build/bin/long_context_run --threads 2 --prompt-tokens 2048 --decode 256 --policy hierarchy
//       --hbm-ratio 0.5 --evict-ratio 0.03
//
// The prompt is token i = 100 + (i * 7919) % 40000 (engine_bench's Tokens(n)); the Python
// side feeds llama.cpp the same ids.

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "engine/model.h"
#include "engine/model_path.h"
#include "engine/sampler.h"
#include "worker/runtime/worker_runtime.h"

namespace kvtier::engine {
namespace {

struct Options {
  std::string model = DefaultModelPath();
  int threads = 1;
  uint32_t prompt_tokens = 512;
  uint32_t decode = 256;
  std::string policy = "full";
  double hbm_ratio = 1.0;
  double evict_ratio = 0.0;
};

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "long_context_run: %s\n", s.ToString().c_str());
  return 1;
}

int Run(const Options& o) {
  auto model = Model::Load(o.model, ModelOptions{o.threads});
  if (!model.ok()) return Fail(model.status());
  Model& m = **model;
  if (o.prompt_tokens + o.decode > m.config().context_length) {
    return Fail(absl::InvalidArgumentError("prompt + decode exceed the model's context"));
  }
  auto runtime = worker::WorkerRuntime::Create(
      {.attention = m.attention_shape(), .worker_name = "long_context_run"});
  if (!runtime.ok()) return Fail(runtime.status());
  worker::SequenceOptions so;
  so.policy = o.policy;
  so.prompt_tokens = o.prompt_tokens;
  so.tiering.budgets = {.evict_ratio = o.evict_ratio, .hbm_ratio = o.hbm_ratio};
  auto seq = (*runtime)->Open(so);
  if (!seq.ok()) return Fail(seq.status());
  std::vector<int32_t> prompt(o.prompt_tokens);
  for (uint32_t i = 0; i < o.prompt_tokens; ++i) {
    prompt[i] = 100 + static_cast<int32_t>(uint64_t{i} * 7919 % 40000);
  }
  std::vector<float> logits;
  const auto t0 = std::chrono::steady_clock::now();
  if (absl::Status s = m.Prefill(prompt, **seq, &logits); !s.ok()) return Fail(s);
  const double prefill_s = Since(t0);
  std::vector<int32_t> tokens;
  const auto t1 = std::chrono::steady_clock::now();
  for (uint32_t i = 0; i < o.decode; ++i) {
    tokens.push_back(Sampler::Argmax(logits));  // end-of-sequence ids are fed back like others
    DecodeRequest r{.token = tokens.back(), .cache = seq->get(), .logits = &logits};
    if (absl::Status s = m.Decode({&r, 1}); !s.ok()) return Fail(s);
  }
  const double decode_s = Since(t1);
  const worker::SequenceReport rep = (*seq)->Report();
  nlohmann::json j = {
      {"policy", o.policy},
      {"threads", o.threads},
      {"prompt_tokens", o.prompt_tokens},
      {"decode_tokens", o.decode},
      {"prefill_tok_s", o.prompt_tokens / prefill_s},
      {"decode_tok_s", o.decode / decode_s},
      {"t0_mean_share", rep.full_mean_bytes > 0 ? rep.t0_mean_bytes / rep.full_mean_bytes : 1.0},
      {"evicted_generated_fraction", rep.evicted_generated_fraction},
      {"tokens", tokens}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace kvtier::engine

int main(int argc, char** argv) {
  kvtier::engine::Options o;
  CLI::App app{"kvtier side of the long-context side-by-side benchmark"};
  app.add_option("--model", o.model, "GGUF model file")->capture_default_str();
  app.add_option("--threads", o.threads, "Compute threads")->capture_default_str();
  app.add_option("--prompt-tokens", o.prompt_tokens, "Synthetic prompt length")
      ->capture_default_str();
  app.add_option("--decode", o.decode, "Greedy decode steps (never stop at EOS)")
      ->capture_default_str();
  app.add_option("--policy", o.policy, "full | hierarchy | ...")->capture_default_str();
  app.add_option("--hbm-ratio", o.hbm_ratio, "β")->capture_default_str();
  app.add_option("--evict-ratio", o.evict_ratio, "r")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return kvtier::engine::Run(o);
}
