// The simulated CUDA device itself (worker/cuda/sim): it must catch what a device would, or the
// suites run over it prove less than they claim. Each test shows one check biting.

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "worker/cuda/cuda_api.h"
#include "worker/cuda/sim/counters.h"
#include "worker/cuda/sim/kernel.h"

namespace kvtier::cudasim {
namespace {

class CudaSimTest : public ::testing::Test {
 protected:
  // Death tests re-execute the binary: a forked child would lack the stream threads.
  static void SetUpTestSuite() { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
  void TearDown() override { EXPECT_EQ(cudaGetLastError(), cudaSuccess); }
};

TEST_F(CudaSimTest, DeviceMemoryIsPoisonedAndAlignedAndCopiesRoundTrip) {
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 1000), cudaSuccess);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(d) % 256, 0u);
  std::vector<uint8_t> back(1000);
  ASSERT_EQ(cudaMemcpy(back.data(), d, 1000, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back[0], 0xFF);  // never written: NaN as f32 and bf16
  EXPECT_EQ(back[999], 0xFF);
  std::vector<uint8_t> src(1000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7);
  ASSERT_EQ(cudaMemcpy(d, src.data(), 1000, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back.data(), d, 1000, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, src);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
}

TEST_F(CudaSimTest, CopiesThatRunOffAnAllocationOrNameTheWrongSideAreRefused) {
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 4096), cudaSuccess);
  std::vector<uint8_t> host(8192);
  EXPECT_EQ(cudaMemcpy(d, host.data(), 4097, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // cleared by the read
  EXPECT_EQ(cudaMemcpy(host.data(), host.data() + 4096, 16, cudaMemcpyDeviceToHost),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d, host.data(), 16, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  cudaGetLastError();
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(cudaFree(d), cudaErrorInvalidValue);  // double free
  cudaGetLastError();
}

TEST_F(CudaSimTest, AnUnclearedErrorIsWhatTheNextLauncherReports) {
  EXPECT_EQ(cudaFree(reinterpret_cast<void*>(0x1234)), cudaErrorInvalidValue);
  // A launch that is fine in itself returns the stale error, as cudaGetLastError() after a
  // real launch does: handled errors must be cleared.
  EXPECT_EQ(Launch(nullptr, "nothing", [] {}), cudaErrorInvalidValue);
  EXPECT_EQ(Launch(nullptr, "nothing", [] {}), cudaSuccess);
}

TEST_F(CudaSimTest, WritingPastAnAllocationFaultsOrIsCaughtAtFree) {
  EXPECT_DEATH(
      {
        void* d = nullptr;
        cudaMalloc(&d, 1000);
        static_cast<uint8_t*>(d)[1000] = 1;  // the red zone before the guard page
        cudaFree(d);
      },
      "written 0 bytes past its end");
  EXPECT_DEATH(
      {
        void* d = nullptr;
        cudaMalloc(&d, 1024);
        static_cast<volatile uint8_t*>(d)[1024] = 1;  // the guard page itself
      },
      "");
}

TEST_F(CudaSimTest, UseAfterFreeFaults) {
  EXPECT_DEATH(
      {
        void* d = nullptr;
        cudaMalloc(&d, 4096);
        cudaFree(d);
        static_cast<volatile uint8_t*>(d)[0] = 1;
      },
      "");
}

TEST_F(CudaSimTest, HostRegisterRefusesUnmappedAndProtNoneRangesAsTheDriverDoes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  // A reservation with only its first page mapped read-write: how a pool's extents look.
  void* r = mmap(nullptr, 4 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(r, MAP_FAILED);
  uint8_t* base = static_cast<uint8_t*>(r);
  ASSERT_EQ(mprotect(base, page, PROT_READ | PROT_WRITE), 0);
  EXPECT_EQ(cudaHostRegister(base, 4 * page, cudaHostRegisterPortable | cudaHostRegisterMapped),
            cudaErrorInvalidValue);
  cudaGetLastError();
  ASSERT_EQ(munmap(base + 3 * page, page), 0);  // a hole
  EXPECT_EQ(cudaHostRegister(base, 4 * page, 0), cudaErrorInvalidValue);
  cudaGetLastError();
  ASSERT_EQ(cudaHostRegister(base, page, cudaHostRegisterMapped), cudaSuccess);
  EXPECT_EQ(cudaHostRegister(base, page, 0), cudaErrorHostMemoryAlreadyRegistered);
  cudaGetLastError();
  EXPECT_EQ(cudaHostUnregister(base + 64), cudaErrorHostMemoryNotRegistered);
  cudaGetLastError();
  EXPECT_EQ(cudaHostUnregister(base), cudaSuccess);
  munmap(base, 3 * page);
}

// A kernel may touch device memory, pinned or registered host memory; a pageable host pointer
// is an illegal address, sticky for every later synchronizing call.
TEST_F(CudaSimTest, AKernelTouchingPageableMemoryIsAnIllegalAddress) {
  EXPECT_DEATH(
      {
        std::vector<float> host(16);
        Launch(nullptr, "Reads", [&] { Touch(host.data(), 64, "input"); });
        const cudaError_t e = cudaDeviceSynchronize();
        if (e == cudaErrorIllegalAddress &&
            cudaMemsetAsync(nullptr, 0, 0, nullptr) == cudaSuccess &&
            cudaDeviceSynchronize() == cudaErrorIllegalAddress) {
          std::abort();  // the expected outcome: sticky
        }
      },
      "illegal address in Reads: input");
}

// Two streams without an event between them run in either order; with the event, in order.
TEST_F(CudaSimTest, StreamsOverlapUnlessAnEventOrdersThem) {
  cudaStream_t a, b;
  cudaEvent_t e;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), sizeof(int)), cudaSuccess);
  int unordered_late = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const bool ordered = trial % 2 == 0;
    // Relaxed atomics: the unordered trials race on purpose (under ThreadSanitizer a plain
    // int here is reported, which is how a missing wait shows in a TSan build).
    Launch(a, "Write", [d] {
      usleep(200);
      __atomic_store_n(d, 1, __ATOMIC_RELAXED);
    });
    if (ordered) {
      ASSERT_EQ(cudaEventRecord(e, a), cudaSuccess);
      ASSERT_EQ(cudaStreamWaitEvent(b, e, 0), cudaSuccess);
    }
    int seen = -1;
    Launch(b, "Read", [d, &seen] { seen = __atomic_load_n(d, __ATOMIC_RELAXED); });
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (ordered) {
      ASSERT_EQ(seen, 1) << "the event did not order the streams";
    } else if (seen != 1) {
      ++unordered_late;
    }
    Launch(a, "Reset", [d] { __atomic_store_n(d, 0, __ATOMIC_RELAXED); });
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  EXPECT_GT(unordered_late, 0) << "unordered streams always ran in order: a missing wait "
                                  "would go unseen";
  EXPECT_EQ(cudaEventQuery(e), cudaSuccess);
  cudaFree(d);
  cudaEventDestroy(e);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

TEST_F(CudaSimTest, AsyncCopiesFromPinnedMemoryReadTheSourceWhenTheyRun) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  int* pinned = nullptr;
  int* d = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), sizeof(int)), cudaSuccess);
  Launch(s, "Slow", [] { usleep(20000); });
  *pinned = 1;
  ASSERT_EQ(cudaMemcpyAsync(d, pinned, sizeof(int), cudaMemcpyHostToDevice, s), cudaSuccess);
  *pinned = 2;  // before the copy ran: a real DMA reads 2, and so does the simulation
  int back = 0;
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(&back, d, sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, 2);
  // From pageable memory the source is staged at the call.
  int pageable = 3;
  Launch(s, "Slow", [] { usleep(20000); });
  ASSERT_EQ(cudaMemcpyAsync(d, &pageable, sizeof(int), cudaMemcpyHostToDevice, s), cudaSuccess);
  pageable = 4;
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(&back, d, sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, 3);
  cudaFree(d);
  cudaFreeHost(pinned);
  cudaStreamDestroy(s);
}

TEST_F(CudaSimTest, BatchedCopiesAreValidatedAndRunInStreamOrder) {
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 64), cudaSuccess);
  std::vector<uint8_t> a(32, 1), b(32, 2), back(64);
  void* dsts[] = {d, static_cast<uint8_t*>(d) + 32};
  const void* srcs[] = {a.data(), b.data()};
  size_t sizes[] = {32, 32};
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t idx = 0;
  ASSERT_EQ(cudaMemcpyBatchAsync(dsts, srcs, sizes, 2, &attr, &idx, 1, nullptr), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back.data(), d, 64, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back[0], 1);
  EXPECT_EQ(back[63], 2);
  sizes[1] = 33;  // runs off the allocation
  EXPECT_EQ(cudaMemcpyBatchAsync(dsts, srcs, sizes, 2, &attr, &idx, 1, nullptr),
            cudaErrorInvalidValue);
  cudaGetLastError();
  cudaFree(d);
}

// The counters a device run's prediction comes from: each call once (a synchronous copy is one
// call, one copy and one wait, not the asynchronous copy and synchronization it is made of),
// a batch's entries and a pitched copy's one descriptor, host-to-device bytes, launches.
TEST_F(CudaSimTest, CountersCountCallsDescriptorsWaitsAndLaunches) {
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 4096), cudaSuccess);
  std::vector<uint8_t> host(4096, 3);
  ResetCounters();
  ASSERT_EQ(cudaMemcpy(d, host.data(), 100, cudaMemcpyHostToDevice), cudaSuccess);
  Counters c = ReadCounters();
  EXPECT_EQ(c.runtime_calls, 1u);
  EXPECT_EQ(c.copy_calls, 1u);
  EXPECT_EQ(c.copy_descriptors, 1u);
  EXPECT_EQ(c.host_waits, 1u);
  EXPECT_EQ(c.h2d_bytes, 100u);
  ResetCounters();
  void* dsts[] = {d, static_cast<uint8_t*>(d) + 1024, static_cast<uint8_t*>(d) + 2048};
  const void* srcs[] = {host.data(), host.data() + 8, host.data() + 16};
  size_t sizes[] = {8, 8, 8};
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t idx = 0;
  ASSERT_EQ(cudaMemcpyBatchAsync(dsts, srcs, sizes, 3, &attr, &idx, 1, nullptr), cudaSuccess);
  ASSERT_EQ(cudaMemcpy2DAsync(d, 64, host.data(), 128, 32, 10, cudaMemcpyHostToDevice, nullptr),
            cudaSuccess);
  ASSERT_EQ(Launch(nullptr, "nothing", [] {}), cudaSuccess);
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e, nullptr), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(e), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(e), cudaSuccess);
  c = ReadCounters();
  EXPECT_EQ(c.runtime_calls, 7u);
  EXPECT_EQ(c.copy_calls, 2u);
  EXPECT_EQ(c.copy_descriptors, 4u);  // three batched, one pitched
  EXPECT_EQ(c.h2d_bytes, 24u + 320u);
  EXPECT_EQ(c.kernel_launches, 1u);
  EXPECT_EQ(c.host_waits, 1u);
  EXPECT_EQ(c.event_queries, 1u);
  cudaEventDestroy(e);
  cudaFree(d);
}

}  // namespace
}  // namespace kvtier::cudasim
