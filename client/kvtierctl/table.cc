#include "client/kvtierctl/table.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/str_format.h"

namespace kvtier::ctl {
namespace {

bool LooksNumeric(const std::string& cell) {
  return !cell.empty() && (std::isdigit(static_cast<unsigned char>(cell[0])) || cell[0] == '-');
}

// Columns on a terminal: UTF-8 continuation bytes take none ("—" is one column, three bytes).
size_t DisplayWidth(const std::string& cell) {
  return static_cast<size_t>(std::count_if(cell.begin(), cell.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }));
}

}  // namespace

std::string Table::Render() const {
  std::vector<size_t> width(header_.size(), 0);
  auto widen = [&](const std::vector<std::string>& row) {
    for (size_t i = 0; i < row.size() && i < width.size(); ++i) {
      width[i] = std::max(width[i], DisplayWidth(row[i]));
    }
  };
  widen(header_);
  for (const auto& row : rows_) widen(row);
  std::string out;
  auto emit = [&](const std::vector<std::string>& row, bool header) {
    for (size_t i = 0; i < width.size(); ++i) {
      const std::string cell = i < row.size() ? row[i] : "";
      std::string pad(width[i] - DisplayWidth(cell), ' ');
      out += (!header && align_numbers_ && LooksNumeric(cell)) ? pad + cell : cell + pad;
      out += i + 1 < width.size() ? "  " : "";
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    out += '\n';
  };
  emit(header_, true);
  for (const auto& row : rows_) emit(row, false);
  return out;
}

std::string HumanBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return absl::StrFormat("%d B", bytes);
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024 && unit < 4) {
    v /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", v, kUnits[unit]);
}

std::string HumanDuration(uint64_t millis) {
  uint64_t s = millis / 1000;
  if (s < 60) return absl::StrFormat("%.1fs", millis / 1000.0);
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, (s / 60) % 60);
}

}  // namespace kvtier::ctl
