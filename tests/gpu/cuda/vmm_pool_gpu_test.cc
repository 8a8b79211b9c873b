// CUDA VMM pools on a real GPU: a real kvtierd with pools.backend = "cuda_vmm" hands a worker
// its memory as exported pinned host allocations; the worker maps them (no cudaHostRegister),
// writes from the host and reads back through device copies. Also measures what mapping costs:
// import + map of a daemon allocation against cudaHostRegister of an equal memfd mapping
// (KVTIER_VMM_BENCH_MIB, default 256; the issue asks for 16384 on a GPU machine).

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <vector>

#include "absl/strings/str_format.h"
#include "edge/cuda_vmm.h"
#include "gtest/gtest.h"
#include "tests/gpu/cuda/gpu_test_util.h"
#include "tests/integration/support/daemon_process.h"
#include "tests/integration/support/sim_worker.h"

namespace kvtier::testing {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

uint64_t BenchBytes() {
  const char* mib = std::getenv("KVTIER_VMM_BENCH_MIB");
  return (mib != nullptr ? std::strtoull(mib, nullptr, 10) : 256) << 20;
}

// Host pattern -> device (D2D copy out of the pool, so the device reads it) -> host.
void ExpectDeviceRoundTrip(uint8_t* pool, uint64_t bytes) {
  std::vector<uint8_t> back(bytes);
  for (uint64_t i = 0; i < bytes; ++i) pool[i] = static_cast<uint8_t>(i * 7 + 3);
  DeviceBuffer<uint8_t> dev(bytes);
  ASSERT_CUDA_OK(cudaMemcpy(dev.get(), pool, bytes, cudaMemcpyDefault));
  ASSERT_CUDA_OK(cudaMemcpy(back.data(), dev.get(), bytes, cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::memcmp(back.data(), pool, bytes), 0);
  // And the device writes into the pool, the host reads it.
  ASSERT_CUDA_OK(cudaMemset(pool, 0xA5, 4096));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(pool[4095], 0xA5);
}

TEST(VmmPoolGpuTest, AWorkerOfACudaVmmDaemonMapsItsPoolForTheDeviceWithoutRegistering) {
  KVTIER_SKIP_WITHOUT_GPU();
  auto daemon = DaemonProcess::Start({.config_text = "backend = \"cuda_vmm\"\n"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  EXPECT_TRUE((*daemon)->WaitForLog("DDR CUDA VMM pinned")) << (*daemon)->Log();
  auto worker = SimWorker::Connect(
      {.address = (*daemon)->address(), .pool_memory = v1::POOL_MEMORY_CUDA_VMM});
  ASSERT_TRUE(worker.ok()) << worker.status();
  auto seq = (*worker)->Open();
  ASSERT_TRUE(seq.ok()) << seq.status();
  for (int step = 0; step < 4; ++step) ASSERT_TRUE((*worker)->Step(*seq, 256).ok());
  EXPECT_GT((*worker)->stats().verified_pages, 0u);  // host writes and reads of the pool's slots
  std::shared_ptr<PoolMapping> ddr = (*worker)->client().pool(v1::POOL_KIND_DDR);
  ASSERT_TRUE(ddr->device_mapped());
  ASSERT_GE(ddr->mapped_extents(), 1u);
  EXPECT_EQ((*worker)->client().pool_fallback_reason(), "");
  cudaPointerAttributes attr{};  // informational: what the runtime makes of a VMM host mapping
  const cudaError_t e = cudaPointerGetAttributes(&attr, ddr->data());
  std::cout << "pool pointer: cudaPointerGetAttributes " << cudaGetErrorName(e) << ", type "
            << attr.type << "\n";
  cudaGetLastError();
  ExpectDeviceRoundTrip(ddr->data(), 1 << 20);
}

TEST(VmmPoolGpuTest, ImportAndMapCostAgainstCudaHostRegisterOfAnEqualMemfd) {
  KVTIER_SKIP_WITHOUT_GPU();
  auto driver = edge::cuda::Driver::Load();
  ASSERT_TRUE(driver.ok()) << driver.status();
  ASSERT_TRUE((*driver)->CheckHostNumaVmm().ok()) << (*driver)->CheckHostNumaVmm();
  const int node = (*driver)->NearestHostNumaNode();
  const uint64_t g = *(*driver)->HostGranularity(node);
  const uint64_t bytes = (BenchBytes() + g - 1) / g * g;

  auto t0 = std::chrono::steady_clock::now();
  auto fd = edge::cuda::CreateExportedHostAllocation(**driver, bytes, node);
  ASSERT_TRUE(fd.ok()) << fd.status();
  const double create_s = Seconds(t0);
  t0 = std::chrono::steady_clock::now();
  auto range = edge::cuda::VmmRange::Reserve(driver->get(), bytes, g, node);
  ASSERT_TRUE(range.ok()) << range.status();
  ASSERT_TRUE((*range)->MapAt(fd->get(), 0, bytes).ok());
  const double import_s = Seconds(t0);
  ExpectDeviceRoundTrip((*range)->base(), 1 << 20);

  const int memfd = memfd_create("kvtier-bench", MFD_CLOEXEC);
  ASSERT_GE(memfd, 0);
  ASSERT_EQ(fallocate(memfd, 0, 0, static_cast<off_t>(bytes)), 0);
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  ASSERT_NE(m, MAP_FAILED);
  t0 = std::chrono::steady_clock::now();
  ASSERT_CUDA_OK(cudaHostRegister(m, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped));
  const double register_s = Seconds(t0);
  ASSERT_CUDA_OK(cudaHostUnregister(m));
  munmap(m, bytes);
  close(memfd);
  const std::string line = absl::StrFormat(
      "VMM pool of %.0f MiB on NUMA node %d: daemon create+export %.3f s; worker import+map+access "
      "%.3f s; cudaHostRegister of an equal memfd mapping %.3f s",
      bytes / 1048576.0, node, create_s, import_s, register_s);
  std::cout << line << "\n";
  RecordProperty("vmm_import_map_seconds", absl::StrFormat("%.4f", import_s));
  RecordProperty("memfd_host_register_seconds", absl::StrFormat("%.4f", register_s));
}

}  // namespace
}  // namespace kvtier::testing
