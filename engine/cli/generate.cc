#include "engine/cli/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status/status_macros.h"
#include "engine/cli/open_device.h"
#include "engine/sampler.h"
#include "worker/runtime/report_json.h"
#include "worker/runtime/worker_runtime.h"

namespace kvtier::engine {
namespace {

constexpr int32_t kEndOfText = 0, kImEnd = 2;  // SmolLM2's end-of-generation ids

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

absl::Status CheckRatio(const char* flag, double value) {
  if (value >= 0 && value <= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(flag, " ", value, " is outside [0, 1]"));
}

absl::Status Validate(const GenerateOptions& o) {
  RETURN_IF_ERROR(CheckRatio("--hbm-ratio", o.hbm_ratio));
  RETURN_IF_ERROR(CheckRatio("--evict-ratio", o.evict_ratio));
  RETURN_IF_ERROR(CheckRatio("--compress-ratio", o.compress_ratio));
  if (o.evict_ratio + o.compress_ratio > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--evict-ratio + --compress-ratio = ", o.evict_ratio + o.compress_ratio, " exceeds 1"));
  }
  if (!(o.max_lost_mass >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-lost-mass ", o.max_lost_mass, " must be >= 0"));
  }
  if (o.page_tokens == 0) return absl::InvalidArgumentError("--page-tokens must be positive");
  if (o.retier_interval == 0) {
    return absl::InvalidArgumentError("--retier-interval must be positive");
  }
  if (o.protect_prompt != "all" && o.protect_prompt != "none" && o.protect_prompt != "last-turn") {
    return absl::InvalidArgumentError(
        absl::StrCat("--protect-prompt \"", o.protect_prompt, "\" is not all, none or last-turn"));
  }
  if (o.prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  return absl::OkStatus();
}

// Length of the longest prefix of `s` that does not end inside a UTF-8 sequence.
size_t CompleteUtf8Prefix(const std::string& s) {
  for (size_t back = 1; back <= 4 && back <= s.size(); ++back) {
    const unsigned char c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    const size_t need = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
    return need <= back ? s.size() : s.size() - back;
  }
  return s.size();
}

std::string MiB(double bytes) { return absl::StrFormat("%.2f MiB", bytes / (1 << 20)); }

}  // namespace

absl::StatusOr<DeviceSetup> SetUpDevice(Model& model, const GenerateOptions& options) {
  RETURN_IF_ERROR(Validate(options));
  DeviceSetup setup;
  ASSIGN_OR_RETURN(setup.forward, OpenForwardPass(model, options.device));
  const bool cuda = options.device == Device::kCuda;
  v1::HostLink link;
  link.set_link_id(options.link_id);
  link.set_link_bytes_per_second(options.link_gbps * 1e9);
  link.set_staging_bytes(options.staging_mib << 20);
  worker::RuntimeOptions runtime_options{.attention = model.attention_shape(),
                                         .page_tokens = options.page_tokens,
                                         .codec = options.codec,
                                         .daemon_address = options.daemon_address,
                                         .worker_name = "kvtier-run",
                                         .link = link};
  runtime_options.backend = cuda ? worker::StoreBackend::kCuda : worker::StoreBackend::kHost;
  runtime_options.cuda_stream = setup.forward->cuda_stream();
  absl::StatusOr<std::unique_ptr<worker::WorkerRuntime>> runtime =
      worker::WorkerRuntime::Create(runtime_options);
  if (cuda && runtime.status().code() == absl::StatusCode::kFailedPrecondition) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device cuda: ", runtime.status().message()));
  }
  if (!runtime.ok()) return runtime.status();
  setup.runtime = *std::move(runtime);
  return setup;
}

absl::StatusOr<GenerateResult> Generate(Model& model, const GenerateOptions& options,
                                        const std::function<void(const std::string&)>& on_text) {
  ASSIGN_OR_RETURN(DeviceSetup setup, SetUpDevice(model, options));
  return Generate(model, setup, options, on_text);
}

absl::StatusOr<GenerateResult> Generate(Model& model, DeviceSetup& setup,
                                        const GenerateOptions& options,
                                        const std::function<void(const std::string&)>& on_text) {
  RETURN_IF_ERROR(Validate(options));
  const Tokenizer& tokenizer = model.tokenizer();
  std::string text = options.prompt;
  if (options.chat) {
    std::vector<ChatMessage> messages = {{"user", options.prompt}};
    text = ApplyChatTemplate(messages, /*add_generation_prompt=*/true);
  }
  std::vector<int32_t> prompt = tokenizer.Encode(text);
  const uint32_t context = model.config().context_length;
  if (prompt.size() >= context) {
    return absl::InvalidArgumentError(
        absl::StrCat("the prompt is ", prompt.size(), " tokens; the model's context is ", context));
  }
  ForwardPass& forward = *setup.forward;
  worker::SequenceOptions seq_options;
  seq_options.policy = options.policy;
  seq_options.prompt_tokens = prompt.size();
  seq_options.tag = "kvtier-run";
  seq_options.tiering.sink_tokens = options.sink_tokens;
  seq_options.tiering.window_tokens = options.window_tokens;
  seq_options.tiering.retier_interval = options.retier_interval;
  seq_options.tiering.protect_prompt = options.protect_prompt != "none";
  if (options.protect_prompt == "last-turn") {
    // The last user turn starts at a special token, so its tokens begin a fresh encoding.
    const size_t at = text.rfind("<|im_start|>user");
    if (at != std::string::npos) {
      seq_options.protected_prompt_begin = tokenizer.Encode(text.substr(0, at)).size();
    }
  }
  seq_options.tiering.budgets = {.evict_ratio = options.evict_ratio,
                                 .hbm_ratio = options.hbm_ratio,
                                 .compress_ratio = options.compress_ratio,
                                 .max_lost_mass = options.max_lost_mass};
  ASSIGN_OR_RETURN(auto seq, setup.runtime->Open(seq_options));
  ASSIGN_OR_RETURN(Sampler sampler, Sampler::Create({.temperature = options.temperature,
                                                     .top_p = options.top_p,
                                                     .seed = options.seed}));
  GenerateResult result;
  result.prompt_tokens = prompt.size();
  std::vector<float> logits;
  auto t0 = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(forward.Prefill(prompt, *seq, &logits));
  result.prefill_seconds = Seconds(t0);

  auto t1 = std::chrono::steady_clock::now();
  std::string printed;
  std::vector<double> step_ms;
  result.stop_reason = "max_new_tokens";
  for (uint32_t i = 0; i < options.max_new_tokens; ++i) {
    const int32_t token = sampler.Sample(logits);
    if (token == kImEnd || token == kEndOfText) {
      result.stop_reason = "eos";
      break;
    }
    result.tokens.push_back(token);
    if (on_text) {
      // Print whole characters only: a byte-level token may end mid-UTF-8 sequence.
      std::string all = tokenizer.Decode(result.tokens, /*render_special=*/false);
      const size_t end = CompleteUtf8Prefix(all);
      if (end > printed.size()) {
        on_text(all.substr(printed.size(), end - printed.size()));
        printed = all.substr(0, end);
      }
    }
    if (prompt.size() + result.tokens.size() >= context) {
      result.stop_reason = "context";
      break;
    }
    DecodeRequest request{.token = token, .cache = seq.get(), .logits = &logits};
    const auto step_start = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(forward.Decode({&request, 1}));
    step_ms.push_back(1e3 * Seconds(step_start));
  }
  result.decode_seconds = Seconds(t1);
  if (!step_ms.empty()) {
    std::sort(step_ms.begin(), step_ms.end());
    result.step_p50_ms = step_ms[step_ms.size() / 2];
    result.step_p99_ms = step_ms[step_ms.size() * 99 / 100];
    result.step_max_ms = step_ms.back();
  }
  result.text = tokenizer.Decode(result.tokens, /*render_special=*/false);
  if (on_text && result.text.size() > printed.size()) on_text(result.text.substr(printed.size()));
  result.report = seq->Report();
  result.daemon_backed = seq->daemon_backed();
  return result;
}

std::string FormatReport(const GenerateResult& r, const GenerateOptions& o) {
  const worker::SequenceReport& s = r.report;
  const double steps = static_cast<double>(r.tokens.size());
  const double tier_share =
      r.decode_seconds > 0 ? s.tier_nanos / 1e9 / (r.decode_seconds + r.prefill_seconds) : 0;
  std::string out;
  absl::StrAppendFormat(
      &out, "── tier report: policy %s  β=%.2f  r=%.2f  γ=%.2f  page=%d  %s\n", o.policy,
      o.hbm_ratio, o.evict_ratio, o.compress_ratio, o.page_tokens,
      o.daemon_address.empty() ? "local pools" : absl::StrCat("kvtierd ", o.daemon_address));
  absl::StrAppendFormat(&out, "  tokens          prompt %d + generated %d (%s)\n", r.prompt_tokens,
                        r.tokens.size(), r.stop_reason);
  absl::StrAppendFormat(&out,
                        "  T0 (HBM)        peak %s, mean %s = %.1f%% of the full cache (%s)\n",
                        MiB(s.t0_peak_bytes), MiB(s.t0_mean_bytes),
                        s.full_mean_bytes > 0 ? 100 * s.t0_mean_bytes / s.full_mean_bytes : 100.0,
                        MiB(s.full_mean_bytes));
  absl::StrAppendFormat(&out, "  T1 (DDR)        %s now    T2 (8-bit) %s now\n", MiB(s.ddr_bytes),
                        MiB(s.compressed_bytes));
  absl::StrAppendFormat(&out, "  tokens by tier  T0 %d  T1 %d  T2 %d  T3 %d\n", s.tokens[0],
                        s.tokens[1], s.tokens[2], s.tokens[3]);
  absl::StrAppendFormat(&out, "  evicted         %.2f%% of generated tokens (cumulative)\n",
                        100 * s.evicted_generated_fraction);
  absl::StrAppendFormat(&out,
                        "  lost mass       %.4f of a step's attention (T2 x codec error %.4f, "
                        "evicted estimate %.4f; peak %.4f)\n",
                        s.lost_mass.total(), s.lost_mass.compressed, s.lost_mass.evicted,
                        s.lost_mass_peak);
  absl::StrAppendFormat(
      &out, "  moved           offload %s, compress %s, promote %s, decompress %s\n",
      MiB(s.offload_bytes), MiB(s.compress_bytes), MiB(s.promote_bytes), MiB(s.decompress_bytes));
  absl::StrAppendFormat(&out, "  plans           %d (%d degraded, %d local)\n", s.plans,
                        s.degraded_plans, s.local_plans);
  if (s.schedules + s.schedules_refused > 0) {
    absl::StrAppendFormat(&out,
                          "  schedules       %d followed, %d refused; now resident %s, staged %s a "
                          "step, in place %s (%d split attention calls)\n",
                          s.schedules, s.schedules_refused, MiB(s.resident_bytes),
                          MiB(s.stage_bytes), MiB(s.in_place_bytes), s.split_attends);
  }
  absl::StrAppendFormat(
      &out,
      "  speed           prefill %.1f tok/s, decode %.1f tok/s; tier work %.1f%% of the time\n",
      r.prefill_seconds > 0 ? r.prompt_tokens / r.prefill_seconds : 0.0,
      r.decode_seconds > 0 ? steps / r.decode_seconds : 0.0, 100 * tier_share);
  return out;
}

std::string ReportJson(const GenerateResult& r, const GenerateOptions& o) {
  nlohmann::json report = {
      {"policy", o.policy},
      {"hbm_ratio", o.hbm_ratio},
      {"evict_ratio", o.evict_ratio},
      {"compress_ratio", o.compress_ratio},
      {"max_lost_mass", std::isfinite(o.max_lost_mass) ? nlohmann::json(o.max_lost_mass) : nullptr},
      {"page_tokens", o.page_tokens},
      {"sink_tokens", o.sink_tokens},
      {"window_tokens", o.window_tokens},
      {"protect_prompt", o.protect_prompt},
      {"retier_interval", o.retier_interval},
      {"daemon", o.daemon_address},
      {"daemon_backed", r.daemon_backed},
      {"prompt_tokens", r.prompt_tokens},
      {"generated_tokens", r.tokens.size()},
      {"stop_reason", r.stop_reason},
      {"prefill_seconds", r.prefill_seconds},
      {"decode_seconds", r.decode_seconds},
      {"decode_tokens_per_second", r.decode_seconds > 0 ? r.tokens.size() / r.decode_seconds : 0.0},
      {"decode_step_p50_ms", r.step_p50_ms},
      {"decode_step_p99_ms", r.step_p99_ms},
      {"decode_step_max_ms", r.step_max_ms},
  };
  report.update(worker::SequenceReportJson(r.report));
  nlohmann::json out = {{"text", r.text}, {"tokens", r.tokens}, {"report", report}};
  return out.dump(2);
}

}  // namespace kvtier::engine
