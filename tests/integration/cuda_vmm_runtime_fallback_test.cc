// The plan-time CUDA VMM fallback under the real runtime: a WorkerRuntime through kvtierd whose
// pools are CUDA VMM (both over the fake driver library, loaded by name), decoding a synthetic
// model; its driver imports the first extent and fails every import after. The sequence's pages
// in the imported extent come home, it re-opens under memfd pools and goes on tiering, and every
// step's attention output stays bit-identical to a full cache. One test per process: this
// process's fake is configured from KVTIER_FAKE_CUDA before anything loads it.

#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvtier/client.h"
#include "tests/integration/support/daemon_process.h"
#include "tests/support/fake_cuda_driver.h"
#include "tests/support/lossless_runtime.h"
#include "tests/support/synthetic_engine.h"
#include "worker/runtime/worker_runtime.h"

namespace kvtier::worker {
namespace {

using kvtier::testing::BuiltProgram;
using kvtier::testing::DaemonProcess;
using kvtier::testing::Lossless;
using kvtier::testing::SyntheticEngine;

// Pages of 64 KiB (4 layers x 2 KV heads x 64 x f32 x 16 tokens x K,V): 16 per 1 MiB extent.
AttentionShape Shape() {
  return {.num_layers = 4, .num_q_heads = 4, .num_kv_heads = 2, .head_dim = 64, .scale = 0};
}

TEST(CudaVmmRuntimeFallbackTest, ASequenceKeepsItsBytesAcrossAnImportFailingAtPlanTime) {
  const std::string fake = BuiltProgram("libkvtier_fake_cuda.so");
  setenv("KVTIER_FAKE_CUDA", "cuMemImportFromShareableHandle:after=1", 1);
  auto daemon = DaemonProcess::Start(
      {.config_text =
           absl::StrCat("extent_mib = 1\nbackend = \"cuda_vmm\"\ncuda_library = \"", fake, "\"\n"),
       .env = {"KVTIER_FAKE_CUDA=granularity=1048576"}});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const RuntimeOptions base{.attention = Shape(), .arena_bytes = 1 << 28};
  RuntimeOptions remote_options = base;
  remote_options.daemon_address = (*daemon)->address();
  remote_options.cuda_library = fake;
  auto local = WorkerRuntime::Create(base);
  auto remote = WorkerRuntime::Create(remote_options);
  ASSERT_TRUE(local.ok()) << local.status();
  ASSERT_TRUE(remote.ok()) << remote.status();
  WorkerClient& client = *(*remote)->client();
  ASSERT_TRUE(client.pool(v1::POOL_KIND_DDR)->device_mapped());
  auto full = (*local)->Open(Lossless(1));
  auto tiered = (*remote)->Open(Lossless(0.3));
  ASSERT_TRUE(full.ok() && tiered.ok());

  SyntheticEngine engine(Shape(), 5);
  std::vector<float> a, b;
  ASSERT_TRUE(engine.Forward(**full, 24, &a).ok());
  ASSERT_TRUE(engine.Forward(**tiered, 24, &b).ok());
  ASSERT_EQ(a, b);
  const uint64_t generation = client.generation();
  uint64_t t1_tokens_in_vmm = 0;  // most DDR tokens held in the imported extent
  int fell_back_at = -1;
  for (int step = 0; step < 1200; ++step) {
    ASSERT_TRUE(engine.Forward(**full, 1, &a).ok());
    ASSERT_TRUE(engine.Forward(**tiered, 1, &b).ok()) << step;
    ASSERT_EQ(a.size(), b.size());
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "step " << step;
    if (fell_back_at < 0 && client.generation() != generation) fell_back_at = step;
    if (fell_back_at < 0) {
      t1_tokens_in_vmm = std::max<uint64_t>(t1_tokens_in_vmm, (*tiered)->Report().tokens[1]);
    }
    if (fell_back_at >= 0 && (*tiered)->rejoins() > 0 && (*tiered)->Report().tokens[1] > 0 &&
        step > fell_back_at + 64) {
      break;  // tiering again, on memfd pools, for a few re-tierings
    }
  }
  ASSERT_GE(fell_back_at, 0) << "the pool never grew past its first extent";
  std::printf("fell back at step %d, %llu DDR tokens in CUDA VMM before, %llu in memfd after\n",
              fell_back_at, static_cast<unsigned long long>(t1_tokens_in_vmm),
              static_cast<unsigned long long>((*tiered)->Report().tokens[1]));
  EXPECT_GT(t1_tokens_in_vmm, 0u);  // pages lived in CUDA VMM memory before the fallback
  EXPECT_NE(client.pool_fallback_reason().find(
                "DDR pool extent 1: cuMemImportFromShareableHandle(POSIX_FILE_DESCRIPTOR)"),
            std::string::npos)
      << client.pool_fallback_reason();
  EXPECT_FALSE(client.pool(v1::POOL_KIND_DDR)->device_mapped());
  EXPECT_EQ((*tiered)->rejoins(), 1u);
  EXPECT_TRUE((*tiered)->daemon_backed());
  EXPECT_GT((*tiered)->Report().tokens[1], 0u);  // offloading again, into memfd pools
  // The old pools were unmapped once the sequence had brought its pages home.
  EXPECT_EQ(kvtier::testing::LiveInLoadedFakeLibrary(fake), (std::vector<int>{0, 0, 0}));
}

}  // namespace
}  // namespace kvtier::worker
