#ifndef KVTIER_CLIENT_KVTIERCTL_TABLE_H_
#define KVTIER_CLIENT_KVTIERCTL_TABLE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace kvtier::ctl {

// A plain-text table with a header row, columns padded to their widest cell. Numbers read best
// right-aligned: cells that parse as numbers (with an optional unit suffix) are.
class Table {
 public:
  // `align_numbers`: right-align numeric cells (off for key/value listings).
  explicit Table(std::vector<std::string> header, bool align_numbers = true)
      : header_(std::move(header)), align_numbers_(align_numbers) {}
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string Render() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
  bool align_numbers_;
};

// 1536 -> "1.5 KiB"; exact below 1 KiB.
std::string HumanBytes(uint64_t bytes);
// 1234567 ms -> "20m34s".
std::string HumanDuration(uint64_t millis);

}  // namespace kvtier::ctl

#endif  // KVTIER_CLIENT_KVTIERCTL_TABLE_H_
