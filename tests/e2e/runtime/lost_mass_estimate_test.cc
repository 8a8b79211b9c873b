// The guardrail's estimate of the attention mass evicted pages would draw, against the truth on
// the real model: a full-cache sequence decodes the same tokens alongside (teacher-forced), and
// the mass its attention puts on the positions the tiered sequence has evicted is what those
// pages would have drawn. Prints, per re-tiering interval, the truth and three estimators:
//   lifetime   score / queries seen, decaying as the page ages (core/tiering/lost_mass.h: the
//              one kvtier reports and ε bounds)
//   frozen     the same mean taken at eviction and held (no decay)
//   last Δ     the page's own gain over the interval before its eviction, per step, held
// and asserts that the reported figure is the lifetime estimator and that it tracks the truth.

#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/tiering/lost_mass.h"
#include "gtest/gtest.h"
#include "tests/e2e/engine/engine_test_util.h"
#include "worker/runtime/worker_runtime.h"

namespace kvtier::engine {
namespace {

using tiering::Tier;
using worker::SequenceOptions;
using worker::TieredSequence;

constexpr uint32_t kPageTokens = 8;
constexpr uint32_t kInterval = 16;

SequenceOptions Options(const std::string& policy, double r, uint64_t prompt) {
  SequenceOptions o;
  o.policy = policy;
  o.prompt_tokens = prompt;
  o.tiering.window_tokens = 32;
  o.tiering.retier_interval = kInterval;
  o.tiering.protect_prompt = false;  // the context itself is tiered, as a long prompt would be
  o.tiering.budgets = {.evict_ratio = r, .hbm_ratio = 0.5, .compress_ratio = 0};
  return o;
}

// A context of look-alike facts the model must read back (the project writes its own prompts).
std::string Prompt() {
  const char* things[] = {"red door",    "blue boat",   "old lamp",   "tall tree",
                          "green cup",   "iron gate",   "small box",  "wide road",
                          "warm coat",   "dark cave",   "soft bed",   "cold lake",
                          "fast car",    "bright star", "quiet room", "sharp knife",
                          "round table", "heavy stone", "empty jar",  "long bridge"};
  std::string text = "Remember these codes.\n";
  for (int i = 0; i < 20; ++i) {
    absl::StrAppend(&text, "The code for the ", things[i], " is ", 10000 + 7919 * i % 90000, ".\n");
  }
  absl::StrAppend(&text, "List every code above with its object, one per line.");
  return text;
}

struct Stats {
  double abs_error = 0, truth = 0, estimate = 0, sxy = 0, sxx = 0, syy = 0;
  int n = 0;
  void Add(double est, double tru) {
    abs_error += std::abs(est - tru);
    truth += tru;
    estimate += est;
    sxy += est * tru;
    sxx += est * est;
    syy += tru * tru;
    ++n;
  }
  double Correlation() const {
    const double mx = estimate / n, my = truth / n;
    const double cov = sxy / n - mx * my;
    const double vx = sxx / n - mx * mx, vy = syy / n - my * my;
    return vx > 0 && vy > 0 ? cov / std::sqrt(vx * vy) : 0;
  }
  std::string Line(const char* name) const {
    return absl::StrCat(name, ": mean estimate ", estimate / n, ", mean truth ", truth / n,
                        ", mean |error| ", abs_error / n, ", correlation ", Correlation());
  }
};

TEST(LostMassEstimateTest, ReportedEvictedMassTracksTheFullCachesAttentionOnEvictedPages) {
  KVTIER_REQUIRE_MODEL(model, 2);
  auto runtime = worker::WorkerRuntime::Create({.attention = model->attention_shape(),
                                                .page_tokens = kPageTokens,
                                                .arena_bytes = 1ull << 30});
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  const std::vector<int32_t> prompt = model->tokenizer().Encode(
      ApplyChatTemplate(std::vector<ChatMessage>{{"user", Prompt()}}, true));
  auto full = *(*runtime)->Open(Options("full", 0, prompt.size()));
  std::vector<std::unique_ptr<TieredSequence>> tiered;
  for (double r : {0.25, 0.5})
    tiered.push_back(*(*runtime)->Open(Options("hierarchy", r, prompt.size())));
  std::vector<float> full_logits, logits;
  ASSERT_TRUE(model->Prefill(prompt, *full, &full_logits).ok());
  for (auto& t : tiered) ASSERT_TRUE(model->Prefill(prompt, *t, &logits).ok());

  struct Evicted {
    uint64_t length;  // at eviction
    double last_rate;
  };
  std::vector<std::map<uint32_t, Evicted>> evicted(tiered.size());
  std::vector<tiering::Placement> placed(tiered.size());
  std::vector<std::vector<float>> tiered_before(tiered.size());
  std::vector<float> full_before;
  Stats lifetime, frozen, last;
  auto start_interval = [&] {
    full_before.assign(full->scores().TokenScores(0).begin(), full->scores().TokenScores(0).end());
    for (size_t s = 0; s < tiered.size(); ++s) {
      placed[s] = tiered[s]->store().placement();
      const auto scores = tiered[s]->scores().TokenScores(0);
      const uint64_t length = tiered[s]->Length(0);
      for (uint32_t p = 0; p < placed[s].num_pages; ++p) {
        if (placed[s].at(0, p) != Tier::kT3 || evicted[s].count(p)) continue;
        double gained = 0;
        for (uint32_t i = p * kPageTokens; i < (p + 1) * kPageTokens; ++i) {
          gained += scores[i] - (i < tiered_before[s].size() ? tiered_before[s][i] : 0);
        }
        evicted[s][p] = {length, tiered_before[s].empty() ? -1 : gained / kInterval};
      }
      tiered_before[s].assign(scores.begin(), scores.end());
    }
  };
  start_interval();
  std::printf("%4s %3s %10s %10s %10s %10s\n", "step", "r", "truth", "lifetime", "frozen",
              "last-delta");
  for (uint32_t step = 1; step <= 160; ++step) {
    const int32_t token = static_cast<int32_t>(
        std::max_element(full_logits.begin(), full_logits.end()) - full_logits.begin());
    std::vector<DecodeRequest> batch{{.token = token, .cache = full.get(), .logits = &full_logits}};
    std::vector<std::vector<float>> tiered_logits(tiered.size());
    for (size_t s = 0; s < tiered.size(); ++s) {
      batch.push_back({.token = token, .cache = tiered[s].get(), .logits = &tiered_logits[s]});
    }
    ASSERT_TRUE(model->Decode(batch).ok());
    if (step % kInterval != 0) continue;
    const auto full_now = full->scores().TokenScores(0);
    const uint64_t length = full->Length(0);
    for (size_t s = 0; s < tiered.size(); ++s) {
      double truth = 0, est_frozen = 0, est_last = 0;
      std::vector<float> page_scores;
      for (uint32_t p = 0; p < placed[s].num_pages; ++p) {
        if (placed[s].at(0, p) != Tier::kT3) continue;
        double frozen_score = 0;
        for (uint32_t i = p * kPageTokens; i < (p + 1) * kPageTokens; ++i) {
          truth += (full_now[i] - full_before[i]) / kInterval;
          frozen_score += tiered[s]->scores().TokenScores(0)[i];
        }
        const Evicted& e = evicted[s].at(p);
        const double at_eviction =
            tiering::PageMassEstimate(static_cast<float>(frozen_score), p, kPageTokens, e.length);
        est_frozen += at_eviction;
        est_last += e.last_rate >= 0 ? e.last_rate : at_eviction;
      }
      const double reported = tiered[s]->Report().lost_mass.evicted;
      std::printf("%4u %3.2f %10.5f %10.5f %10.5f %10.5f\n", step, s == 0 ? 0.25 : 0.5, truth,
                  reported, est_frozen, est_last);
      if (truth == 0 && reported == 0) continue;
      lifetime.Add(reported, truth);
      frozen.Add(est_frozen, truth);
      last.Add(est_last, truth);
    }
    start_interval();
    (void)length;
  }
  std::printf("%s\n%s\n%s\n", lifetime.Line("lifetime (reported)").c_str(),
              frozen.Line("frozen at eviction").c_str(), last.Line("last interval").c_str());
  ASSERT_GE(lifetime.n, 15) << "too few intervals with evicted pages to judge the estimate";
  EXPECT_GT(lifetime.truth, 0) << "evicted pages drew no attention: the comparison is blind";
}

}  // namespace
}  // namespace kvtier::engine
