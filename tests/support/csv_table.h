// Reads a results CSV (the eval's results.csv: a header line, then one row per line, no quoting)
// into rows keyed by column name; a row with the wrong number of fields is a test failure.
#pragma once

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace kvtier::testing {

using CsvTable = std::vector<std::map<std::string, std::string>>;

inline CsvTable ReadCsv(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::string line;
  std::getline(in, line);
  std::vector<std::string> header = absl::StrSplit(line, ',');
  CsvTable rows;
  while (std::getline(in, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ',');
    EXPECT_EQ(f.size(), header.size()) << line;
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < header.size() && i < f.size(); ++i) row[header[i]] = f[i];
    rows.push_back(row);
  }
  return rows;
}

}  // namespace kvtier::testing
