// The block store's trust domains against a real kvtierd and real processes of other users
// (docs/vllm.md): a block one uid stored is a miss for another uid unless the operator put both
// in [blocks] shared_uids, and the shared table an engine maps cannot be written by it.

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "edge/memory_channel.h"
#include "gtest/gtest.h"
#include "kvtier/block_client.h"
#include "kvtier/v1/kvtier.pb.h"
#include "tests/integration/support/daemon_process.h"
#include "tests/integration/support/fork_as.h"
#include "tests/integration/support/http_get.h"

namespace kvtier::testing {
namespace {

constexpr uid_t kNobody = 65534;
constexpr uid_t kOther = 65533;
constexpr uint64_t kBlockBytes = 4096;
const std::string kKey(32, 'p');  // one prefix block's key, the same for every engine
const char kSpace[] = "model-a";

BlockClientOptions Options(const std::string& sock) {
  BlockClientOptions o;
  o.address = "unix:" + sock;
  o.space = kSpace;
  o.block_bytes = kBlockBytes;
  o.key_bytes = kKey.size();
  o.want_bytes = 1 << 20;
  return o;
}

// The bytes uid `uid` stores under kKey: another uid's can be told apart.
uint8_t Byte(uid_t uid, uint64_t i) { return static_cast<uint8_t>(uid * 31 + i * 7); }

// Stores kKey as this process's uid; reports "stored DOMAIN".
int Store(const std::string& sock, uid_t uid, FILE* report) {
  auto blocks = BlockClient::Open(Options(sock));
  if (!blocks.ok())
    return std::fprintf(report, "open: %s\n", blocks.status().ToString().c_str()), 2;
  auto grant = (*blocks)->BeginStore({kKey});
  if (!grant.ok() || grant->slots[0] < 0) return std::fprintf(report, "no grant\n"), 3;
  uint8_t* block = (*blocks)->block(grant->slots[0]);
  for (uint64_t i = 0; i < kBlockBytes; ++i) block[i] = Byte(uid, i);
  if (!(*blocks)->FinishStore(grant->ticket, true).ok()) return 4;
  std::fprintf(report, "stored %s\n", (*blocks)->stats().domain.c_str());
  return 0;
}

// Looks kKey up and acquires it as this process's uid; reports "hit DOMAIN" when it got a block
// holding exactly what `writer` stored, "miss DOMAIN" when the daemon had none, "wrong ..."
// otherwise.
int Load(const std::string& sock, uid_t writer, FILE* report) {
  auto blocks = BlockClient::Open(Options(sock));
  if (!blocks.ok())
    return std::fprintf(report, "open: %s\n", blocks.status().ToString().c_str()), 2;
  const bool listed = (*blocks)->Lookup(kKey);
  auto lease = (*blocks)->Acquire({kKey});
  if (!lease.ok())
    return std::fprintf(report, "acquire: %s\n", lease.status().ToString().c_str()), 3;
  const std::string domain = (*blocks)->stats().domain;
  if (lease->slots[0] < 0) {
    std::fprintf(report, "%s %s\n", listed ? "wrong listed-but-missing" : "miss", domain.c_str());
    return 0;
  }
  const uint8_t* block = (*blocks)->block(lease->slots[0]);
  uint64_t differ = 0;
  for (uint64_t i = 0; i < kBlockBytes; ++i) differ += block[i] != Byte(writer, i);
  std::fprintf(report, "%s %s\n", differ == 0 && listed ? "hit" : "wrong", domain.c_str());
  return (*blocks)->Release(lease->ticket).ok() ? 0 : 4;
}

// Runs `body` as `uid` and returns the first line of its report ("exit N: ..." when it failed).
std::string RunAs(uid_t uid, const std::function<int(FILE*)>& body) {
  Child child = ForkAs(uid, [&](int, FILE* report) { return body(report); });
  std::string report;
  const int code = Wait(child, &report);
  if (code != 0) return absl::StrCat("exit ", code, ": ", report);
  return report.substr(0, report.find('\n'));
}

struct Daemon {
  std::string sock;
  int metrics_port = 0;
  std::unique_ptr<DaemonProcess> process;
};

Daemon StartDaemon(const std::string& blocks_config) {
  Daemon d;
  d.sock = SharedSocket("blocks");
  absl::StatusOr<int> port = FreeLoopbackPort();
  EXPECT_TRUE(port.ok()) << port.status();
  d.metrics_port = port.value_or(0);
  auto daemon =
      DaemonProcess::Start({.config_text = "[blocks]\nmib = 8\nspace_mib = 1\n" + blocks_config,
                            .socket_path = d.sock,
                            .metrics_address = absl::StrCat("127.0.0.1:", d.metrics_port)});
  EXPECT_TRUE(daemon.ok()) << daemon.status();
  if (daemon.ok()) d.process = std::move(*daemon);
  return d;
}

TEST(BlockUidTest, ABlockOfOneUidIsAMissForAnotherByDefault) {
  if (getuid() != 0) GTEST_SKIP() << "needs root to run engines as other users";
  Daemon d = StartDaemon("");
  ASSERT_NE(d.process, nullptr);
  EXPECT_EQ(RunAs(kNobody, [&](FILE* r) { return Store(d.sock, kNobody, r); }), "stored uid:65534");
  EXPECT_EQ(RunAs(kOther, [&](FILE* r) { return Load(d.sock, kNobody, r); }), "miss uid:65533");
  // The control: another process of the writer's uid finds the block, so the miss above is the
  // domain's doing, not a store that never happened.
  EXPECT_EQ(RunAs(kNobody, [&](FILE* r) { return Load(d.sock, kNobody, r); }), "hit uid:65534");
  EXPECT_EQ(ScrapeMetric(d.metrics_port, "kvtier_blocks_stored_total"), 1);
  EXPECT_EQ(ScrapeMetric(d.metrics_port, "kvtier_blocks_misses_total"), 1);
  EXPECT_EQ(ScrapeMetric(d.metrics_port, "kvtier_blocks_hits_total"), 1);
}

TEST(BlockUidTest, UidsTheOperatorSharesHitEachOthersBlocks) {
  if (getuid() != 0) GTEST_SKIP() << "needs root to run engines as other users";
  Daemon d = StartDaemon("shared_uids = [65533, 65534]\n");
  ASSERT_NE(d.process, nullptr);
  EXPECT_EQ(RunAs(kNobody, [&](FILE* r) { return Store(d.sock, kNobody, r); }), "stored shared");
  EXPECT_EQ(RunAs(kOther, [&](FILE* r) { return Load(d.sock, kNobody, r); }), "hit shared");
  // A uid outside the list stays in a domain of its own.
  EXPECT_EQ(RunAs(65532, [&](FILE* r) { return Load(d.sock, kNobody, r); }), "miss uid:65532");
}

// What an engine can do with the descriptors BlockOpen hands it: report one line per attempt.
int TryToWriteTheTable(const std::string& sock, FILE* report) {
  v1::ChannelRequest request;
  request.mutable_block_open()->set_space(kSpace);
  request.mutable_block_open()->set_block_bytes(kBlockBytes);
  request.mutable_block_open()->set_key_bytes(kKey.size());
  std::vector<edge::UniqueFd> fds;
  auto reply = edge::ChannelCall(sock + ".mem", request, &fds);
  if (!reply.ok() || fds.size() != 2) return std::fprintf(report, "no descriptors\n"), 2;
  const int table = fds[0].get();
  const size_t bytes = reply->block().table_bytes();
  auto line = [&](const char* what, bool refused) {
    std::fprintf(report, "%s %s (%s)\n", refused ? "refused" : "ALLOWED", what,
                 refused ? std::strerror(errno) : "-");
  };
  line("mmap(table, PROT_WRITE, MAP_SHARED)",
       mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, table, 0) == MAP_FAILED);
  void* ro = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, table, 0);
  if (ro == MAP_FAILED) return std::fprintf(report, "no read-only map\n"), 3;
  line("mprotect(table map, PROT_WRITE)", mprotect(ro, bytes, PROT_READ | PROT_WRITE) != 0);
  munmap(ro, bytes);
  const char byte = 1;
  line("write(table fd)", write(table, &byte, 1) != 1);
  // Reopening the memfd read-write by its /proc path gets a descriptor the seal still refuses.
  edge::UniqueFd rw(open(absl::StrCat("/proc/self/fd/", table).c_str(), O_RDWR | O_CLOEXEC));
  if (rw.valid()) {
    line("write(reopened table)", pwrite(rw.get(), &byte, 1, 0) != 1);
    line("mmap(reopened table, PROT_WRITE, MAP_SHARED)",
         mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, rw.get(), 0) == MAP_FAILED);
  } else {
    line("open(/proc/self/fd/N, O_RDWR)", true);
  }
  // The control: the arena is the engine's to write.
  const size_t arena = reply->block().block_slots() * reply->block().block_bytes();
  void* a = mmap(nullptr, arena, PROT_READ | PROT_WRITE, MAP_SHARED, fds[1].get(), 0);
  std::fprintf(report, "arena %s\n", a != MAP_FAILED ? "writable" : "NOT WRITABLE");
  return 0;
}

TEST(BlockUidTest, TheEngineCannotWriteTheTable) {
  if (getuid() != 0) GTEST_SKIP() << "needs root to run engines as other users";
  Daemon d = StartDaemon("");
  ASSERT_NE(d.process, nullptr);
  Child child =
      ForkAs(kNobody, [&](int, FILE* report) { return TryToWriteTheTable(d.sock, report); });
  std::string report;
  ASSERT_EQ(Wait(child, &report), 0) << report;
  std::printf("what the engine tried:\n%s", report.c_str());
  EXPECT_EQ(report.find("ALLOWED"), std::string::npos) << report;
  EXPECT_GE(std::count(report.begin(), report.end(), '\n'), 5) << report;
  EXPECT_NE(report.find("arena writable"), std::string::npos) << report;
}

}  // namespace
}  // namespace kvtier::testing
