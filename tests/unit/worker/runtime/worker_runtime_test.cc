#include "worker/runtime/worker_runtime.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::worker {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

RuntimeOptions Options(StoreBackend backend) {
  RuntimeOptions o;
  o.attention = {.num_layers = 2, .num_q_heads = 9, .num_kv_heads = 3, .head_dim = 64};
  o.arena_bytes = 64 << 20;
  o.local_ddr_bytes = 16 << 20;
  o.local_compressed_bytes = 16 << 20;
  o.backend = backend;
  return o;
}

TEST(WorkerRuntimeTest, CudaBackendWithoutCudaOrADeviceIsAFailedPreconditionNotACrash) {
  auto runtime = WorkerRuntime::Create(Options(StoreBackend::kCuda));
  if (runtime.ok()) GTEST_SKIP() << "this machine has a CUDA device (cuda_store_gpu_test runs)";
  EXPECT_EQ(runtime.status().code(), absl::StatusCode::kFailedPrecondition) << runtime.status();
  EXPECT_THAT(std::string(runtime.status().message()),
              AnyOf(HasSubstr("kvtier was built without CUDA"), HasSubstr("no CUDA device: ")));
}

TEST(WorkerRuntimeTest, HostBackendIsTheDefaultAndItsArenaIsHostMemory) {
  auto runtime = WorkerRuntime::Create(Options(RuntimeOptions{}.backend));
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  EXPECT_EQ((*runtime)->backend(), StoreBackend::kHost);
  EXPECT_TRUE((*runtime)->arena().host_accessible());
  EXPECT_EQ((*runtime)->arena().capacity_bytes(), uint64_t{64} << 20);
}

TEST(WorkerRuntimeTest, UnknownBackendIsRefusedNamingTheField) {
  auto runtime = WorkerRuntime::Create(Options(static_cast<StoreBackend>(7)));
  EXPECT_EQ(runtime.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(runtime.status().message()), HasSubstr("backend"));
}

}  // namespace
}  // namespace kvtier::worker
