// kvtier-gpu-probe [--cuda-library=NAME]: the device facts a first GPU run needs, one
// `key=value` line each, then `probe=PASS` or `probe=FAIL` (exit 0 or 1): the driver's version
// and devices, device 0's VMM and host-NUMA attributes, the host allocation granularity, one
// pinned host-NUMA allocation created and exported here and imported, mapped and written by a
// child process (neither makes a CUDA context, as kvtierd and its workers do not), the pattern
// read back here through a mapping of its own; host NUMA nodes, `ulimit -l`, /dev/shm.

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "edge/cuda_driver.h"
#include "edge/cuda_vmm.h"

namespace kvtier::edge::cuda {
namespace {

constexpr uint64_t kPattern = 0x6b76746965720001;

void Fact(const std::string& key, const std::string& value) {
  std::printf("%s=%s\n", key.c_str(), value.c_str());
  std::fflush(stdout);
}

// Maps `bytes` of the exported allocation `fd` into a range of this process; writes the
// pattern (`write`) or checks it.
absl::Status MapAndTouch(const Driver& driver, int fd, uint64_t bytes, int numa, bool write) {
  absl::StatusOr<std::unique_ptr<VmmRange>> range = VmmRange::Reserve(&driver, bytes, bytes, numa);
  if (!range.ok()) return range.status();
  if (absl::Status s = (*range)->MapAt(fd, 0, bytes); !s.ok()) return s;
  auto* words = reinterpret_cast<volatile uint64_t*>((*range)->base());
  const uint64_t n = bytes / sizeof(uint64_t);
  for (uint64_t i = 0; i < n; i += 512) {
    if (write) {
      words[i] = kPattern ^ i;
    } else if (words[i] != (kPattern ^ i)) {
      return absl::DataLossError(absl::StrCat("word ", i, " reads ", words[i], " after the child"));
    }
  }
  return absl::OkStatus();
}

void HostFacts() {
  int nodes = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/sys/devices/system/node", ec)) {
    nodes += e.path().filename().string().rfind("node", 0) == 0;
  }
  Fact("host_numa_nodes", std::to_string(nodes));
  rlimit lim{};
  getrlimit(RLIMIT_MEMLOCK, &lim);
  Fact("ulimit_l_kib",
       lim.rlim_cur == RLIM_INFINITY ? "unlimited" : std::to_string(lim.rlim_cur >> 10));
  struct statvfs shm {};
  Fact("dev_shm_mib", statvfs("/dev/shm", &shm) == 0
                          ? std::to_string(uint64_t{shm.f_blocks} * shm.f_frsize >> 20)
                          : std::string("absent"));
}

int Child(const std::string& library, int fd, uint64_t bytes, int numa) {
  absl::StatusOr<std::unique_ptr<Driver>> driver = Driver::Load(library);
  absl::Status s = driver.ok() ? MapAndTouch(**driver, fd, bytes, numa, true) : driver.status();
  if (!s.ok()) std::fprintf(stderr, "child: %s\n", std::string(s.message()).c_str());
  return s.ok() ? 0 : 1;
}

int Probe(const char* self, const std::string& library) {
  HostFacts();
  absl::StatusOr<std::unique_ptr<Driver>> driver = Driver::Load(library);
  if (!driver.ok()) {
    Fact("driver", std::string(driver.status().message()));
    Fact("probe", "FAIL");
    return 1;
  }
  const Driver& d = **driver;
  Fact("driver_version", std::to_string(d.version()));
  Fact("devices", std::to_string(d.DeviceCount()));
  for (auto [name, attr] : {std::pair{"vmm_supported", kAttrVmmSupported},
                            {"host_numa_id", kAttrHostNumaId},
                            {"host_numa_vmm_supported", kAttrHostNumaVmmSupported}}) {
    int v = -1;
    const Result r = d.api().DeviceGetAttribute(&v, attr, 0);
    Fact(name, r == kSuccess ? std::to_string(v) : absl::StrCat("error ", r));
  }
  const int numa = d.NearestHostNumaNode();
  absl::StatusOr<uint64_t> granularity = d.HostGranularity(numa);
  Fact("host_granularity", granularity.ok() ? std::to_string(*granularity)
                                            : std::string(granularity.status().message()));
  absl::Status s = d.CheckHostNumaVmm();
  absl::StatusOr<UniqueFd> fd = s.ok() && granularity.ok()
                                    ? CreateExportedHostAllocation(d, *granularity, numa)
                                    : absl::StatusOr<UniqueFd>(s.ok() ? granularity.status() : s);
  if (fd.ok()) {
    const pid_t pid = fork();
    if (pid == 0) {
      fcntl(fd->get(), F_SETFD, 0);  // the child inherits the descriptor, as a worker receives it
      const std::string arg = absl::StrCat("--child=", fd->get(), ",", *granularity, ",", numa);
      execl(self, self, arg.c_str(), ("--cuda-library=" + library).c_str(), nullptr);
      _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    s = WIFEXITED(status) && WEXITSTATUS(status) == 0
            ? MapAndTouch(d, fd->get(), *granularity, numa, false)
            : absl::InternalError(absl::StrCat("the importing child ended with status ", status));
  } else {
    s = fd.status();
  }
  Fact("create_export_import_map_write", s.ok() ? "ok" : std::string(s.message()));
  Fact("probe", s.ok() ? "PASS" : "FAIL");
  return s.ok() ? 0 : 1;
}

}  // namespace
}  // namespace kvtier::edge::cuda

int main(int argc, char** argv) {
  std::string library = "libcuda.so.1", child;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--cuda-library=", 0) == 0) {
      library = a.substr(15);
    } else if (a.rfind("--child=", 0) == 0) {
      child = a.substr(8);
    } else {
      std::fprintf(stderr, "usage: kvtier-gpu-probe [--cuda-library=NAME]\n");
      return 2;
    }
  }
  if (!child.empty()) {  // --child=FD,BYTES,NUMA: the importing process
    int fd = -1, numa = 0;
    uint64_t bytes = 0;
    char comma1 = 0, comma2 = 0;
    std::sscanf(child.c_str(), "%d%c%" SCNu64 "%c%d", &fd, &comma1, &bytes, &comma2, &numa);
    return kvtier::edge::cuda::Child(library, fd, bytes, numa);
  }
  return kvtier::edge::cuda::Probe("/proc/self/exe", library);
}
