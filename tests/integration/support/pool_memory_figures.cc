#include "tests/integration/support/pool_memory_figures.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvtier::testing {
namespace {

// "/memfd:NAME (deleted)" as /proc shows a memfd; exact, so "X-ddr" is not "X-ddr-header".
bool IsMemfd(absl::string_view shown, const std::string& name) {
  const std::string memfd = absl::StrCat("/memfd:", name);
  return shown == memfd || shown == absl::StrCat(memfd, " (deleted)");
}

void AddOpen(pid_t pid, const std::string& name, std::map<uint64_t, uint64_t>& seen) {
  const std::string dir = absl::StrCat("/proc/", pid, "/fd");
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  while (dirent* e = readdir(d)) {
    const std::string fd = absl::StrCat(dir, "/", e->d_name);
    char target[512];
    const ssize_t n = readlink(fd.c_str(), target, sizeof(target) - 1);
    if (n <= 0 || !IsMemfd(absl::string_view(target, n), name)) continue;
    struct stat st {};
    if (stat(fd.c_str(), &st) == 0) seen[st.st_ino] = uint64_t{512} * st.st_blocks;
  }
  closedir(d);
}

void AddMapped(pid_t pid, const std::string& name, std::map<uint64_t, uint64_t>& seen) {
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  std::string line;
  while (std::getline(maps, line)) {
    // start-end perms offset dev inode path
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(' ', 5));
    if (f.size() < 6) continue;
    if (!IsMemfd(absl::StripLeadingAsciiWhitespace(f[5]), name)) continue;
    std::vector<absl::string_view> range = absl::StrSplit(f[0], '-');
    uint64_t start = 0, end = 0, inode = 0;
    if (range.size() != 2 || !absl::SimpleHexAtoi(range[0], &start) ||
        !absl::SimpleHexAtoi(range[1], &end) || !absl::SimpleAtoi(f[4], &inode)) {
      continue;
    }
    if (!seen.contains(inode)) seen[inode] = end - start;
  }
}

absl::StatusOr<std::string> MemoryCgroupOf(pid_t pid, std::string* root) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/cgroup"));
  std::string line, v2;
  while (std::getline(in, line)) {
    std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    for (absl::string_view c : absl::StrSplit(f[1], ',')) {
      if (c == "memory") {
        *root = "/sys/fs/cgroup/memory";
        return f[2];
      }
    }
    if (f[0] == "0") v2 = f[2];
  }
  struct stat st {};
  if (!v2.empty() && stat(absl::StrCat("/sys/fs/cgroup", v2, "/memory.stat").c_str(), &st) == 0) {
    *root = "/sys/fs/cgroup";
    return v2;
  }
  return absl::UnavailableError("no memory cgroup");
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.flush();
  if (!out) return absl::UnavailableError(absl::StrCat("write ", path, ": ", std::strerror(errno)));
  return absl::OkStatus();
}

}  // namespace

uint64_t MemfdBytesHeld(const std::vector<pid_t>& pids, const std::string& name) {
  std::map<uint64_t, uint64_t> seen;  // inode -> bytes
  for (pid_t pid : pids) AddOpen(pid, name, seen);
  for (pid_t pid : pids) AddMapped(pid, name, seen);
  uint64_t total = 0;
  for (const auto& [inode, bytes] : seen) total += bytes;
  return total;
}

absl::StatusOr<std::unique_ptr<ShmemCgroup>> ShmemCgroup::Create(const std::string& name) {
  std::string root;
  absl::StatusOr<std::string> mine = MemoryCgroupOf(getpid(), &root);
  if (!mine.ok()) return mine.status();
  const std::string parent = absl::StrCat(root, *mine == "/" ? "" : *mine);
  const std::string path = absl::StrCat(parent, "/", name);
  if (mkdir(path.c_str(), 0755) != 0) {
    return absl::UnavailableError(absl::StrCat("mkdir ", path, ": ", std::strerror(errno)));
  }
  return std::unique_ptr<ShmemCgroup>(new ShmemCgroup(path, parent));
}

ShmemCgroup::~ShmemCgroup() { rmdir(path_.c_str()); }

absl::Status ShmemCgroup::Enter() {
  return WriteFile(path_ + "/cgroup.procs", absl::StrCat(getpid()));
}

absl::Status ShmemCgroup::Leave() {
  return WriteFile(parent_ + "/cgroup.procs", absl::StrCat(getpid()));
}

uint64_t ShmemCgroup::ShmemBytes() const {
  std::ifstream in(path_ + "/memory.stat");
  std::string key;
  uint64_t value = 0;
  while (in >> key >> value) {
    if (key == "shmem") return value;
  }
  return 0;
}

}  // namespace kvtier::testing
