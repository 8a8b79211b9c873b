// Counts, on the simulated device, what one decode step of the synthetic decoder (GpuDecoder
// over the CUDA store) asks of the CUDA runtime: calls, kernel launches, copy calls and
// descriptors, host waits. These are host-side figures, the same on a device (the simulation
// implements the calls, not their speed), so a device run has a prediction to check.
//
// Usage: kvtier-cuda-step-counts [--quick]   (prints a markdown table; --quick: small shapes)

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "worker/cuda/gpu_decoder.h"
#include "worker/cuda/sim/counters.h"

namespace kvtier::worker::cuda {
namespace {

struct Shape {
  const char* name;
  SyntheticModelConfig model;
  uint32_t context_tokens;
};

// The KV geometry decides the copies; hidden, ffn and vocab are scaled down so the CPU runs it.
Shape Small() {
  SyntheticModelConfig m;
  m.num_layers = 3;
  m.num_q_heads = 8;
  m.num_kv_heads = 2;
  m.head_dim = 128;
  m.hidden = 256;
  m.ffn = 512;
  m.vocab = 1000;
  return {"small (3 layers, 8/2 heads)", m, 700};
}
Shape SevenBKv() {
  SyntheticModelConfig m = SyntheticModelConfig::SevenBClass();
  m.hidden = 256;
  m.ffn = 512;
  m.vocab = 1000;
  return {"7B KV (28 layers, 28/4 heads)", m, 2048};
}

int Run(bool quick) {
  std::vector<Shape> shapes = {Small()};
  if (!quick) shapes.push_back(SevenBKv());
  std::printf(
      "| shape | context | batch | mode | T1 pages | runtime calls | kernel launches | copy calls "
      "| copy descriptors | host waits | event polls | staged MiB |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Shape& shape : shapes) {
    absl::StatusOr<std::unique_ptr<SyntheticModel>> model = SyntheticModel::Create(shape.model);
    if (!model.ok()) {
      std::fprintf(stderr, "model: %s\n", std::string(model.status().message()).c_str());
      return 1;
    }
    for (uint32_t batch : {1u, 8u}) {
      for (KvMode mode : {KvMode::kFull, KvMode::kHierarchy}) {
        DecoderOptions o;
        o.batch = batch;
        o.context_tokens = shape.context_tokens;
        o.max_new_tokens = 4;
        o.mode = mode;  // hierarchy: beta 0.5, r 0.03 (the defaults)
        absl::StatusOr<std::unique_ptr<GpuDecoder>> d = GpuDecoder::Create(**model, o);
        if (!d.ok()) {
          std::fprintf(stderr, "decoder: %s\n", std::string(d.status().message()).c_str());
          return 1;
        }
        // Step 0 runs on T0 and re-tiers at its end; step 1 is the first with T1 pages staged
        // (and warms the stagers); step 2 is counted.
        absl::Status s = (*d)->Step();
        if (s.ok()) s = (*d)->Step();
        if (s.ok()) s = (*d)->Sync();
        cudasim::ResetCounters();
        if (s.ok()) s = (*d)->Step();
        const cudasim::Counters c = cudasim::ReadCounters();
        if (s.ok()) s = (*d)->Sync();
        if (!s.ok()) {
          std::fprintf(stderr, "step: %s\n", std::string(s.message()).c_str());
          return 1;
        }
        const DecoderStats st = (*d)->stats();
        std::printf("| %s | %u | %u | %s | %llu | %llu | %llu | %llu | %llu | %llu | %llu | %s |\n",
                    shape.name, shape.context_tokens, batch,
                    mode == KvMode::kFull ? "full" : "hierarchy", (unsigned long long)st.t1_pages,
                    (unsigned long long)c.runtime_calls, (unsigned long long)c.kernel_launches,
                    (unsigned long long)c.copy_calls, (unsigned long long)c.copy_descriptors,
                    (unsigned long long)c.host_waits, (unsigned long long)c.event_queries,
                    absl::StrFormat("%.1f", st.last_step_h2d_bytes / 1048576.0).c_str());
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace kvtier::worker::cuda

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  return kvtier::worker::cuda::Run(quick);
}
