// WorkerClient against an in-process daemon (real core, service, gRPC server and memory channel)
// whose pools are CUDA VMM through the fake driver: a worker that cannot load a CUDA driver
// falls back to memfd pools at registration, or fails when it required CUDA VMM.

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "daemon/service/service.h"
#include "gtest/gtest.h"
#include "kvtier/client.h"
#include "tests/unit/client/fake_vmm_daemon.h"

namespace kvtier {
namespace {

using ::kvtier::testing::FakeCudaDriver;
namespace dt = ::kvtier::daemon::testing;

class WorkerClientVmmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A directory of its own: the client refuses a socket in one others may write (/tmp).
    std::string dir = absl::StrCat(::testing::TempDir(), "/wc-XXXXXX");
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
    dir_ = dir;
    socket_ = dir_ + "/kvtierd.sock";
    ASSERT_NO_FATAL_FAILURE(daemon_.Start("cuda_vmm", edge::ChannelPathFor(socket_)));
    env_ = daemon_.env.get();
    service_ = std::make_unique<daemon::KvTierService>(env_->core.get(), daemon::PolicyDefaults{});
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_, grpc::InsecureServerCredentials());
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
    unlink(socket_.c_str());
    unlink(edge::ChannelPathFor(socket_).c_str());
    rmdir(dir_.c_str());
  }

  ClientOptions Client(v1::PoolMemory want) const {
    ClientOptions o;
    o.address = "unix:" + socket_;
    o.rpc_deadline = absl::Seconds(5);
    o.background_heartbeat = false;
    o.cuda_library = "libkvtier-no-such-cuda.so.1";  // this worker cannot load a driver
    o.registration = dt::WorkerRequest();
    o.registration.set_pool_memory(want);
    return o;
  }

  size_t Workers() {
    auto s = env_->core->GetStatus(v1::GetStatusRequest());
    return s.ok() ? s->workers() : 999;
  }

  FakeCudaDriver fake_;  // first: outlives the daemon
  testing::FakeVmmDaemon daemon_;
  dt::Env* env_ = nullptr;
  std::string dir_, socket_;
  std::unique_ptr<daemon::KvTierService> service_;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(WorkerClientVmmTest, AWorkerWithoutADriverRegistersAgainWithMemfdPools) {
  auto client = WorkerClient::Connect(Client(v1::POOL_MEMORY_UNSPECIFIED));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_NE((*client)->pool_fallback_reason().find("DDR pool is CUDA VMM memory: no CUDA driver"),
            std::string::npos)
      << (*client)->pool_fallback_reason();
  EXPECT_FALSE((*client)->pool(v1::POOL_KIND_DDR)->device_mapped());
  EXPECT_FALSE((*client)->pool(v1::POOL_KIND_COMPRESSED)->device_mapped());
  EXPECT_EQ(Workers(), 1u);  // the refused session was closed, not left to its lease
}

TEST_F(WorkerClientVmmTest, AWorkerThatRequiresCudaVmmGetsTheErrorInstead) {
  auto client = WorkerClient::Connect(Client(v1::POOL_MEMORY_CUDA_VMM));
  ASSERT_FALSE(client.ok());
  EXPECT_NE(client.status().message().find("no CUDA driver"), std::string::npos) << client.status();
  EXPECT_EQ(Workers(), 0u);
}

}  // namespace
}  // namespace kvtier
