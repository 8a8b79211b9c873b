#ifndef KVTIER_ENGINE_EVAL_RESULTS_CSV_H_
#define KVTIER_ENGINE_EVAL_RESULTS_CSV_H_

// Resuming an evaluation's results.csv (`eval --questions` and `eval --tasks`): rows are grouped
// by their first field (a question line, a task item); a group is kept only when it is complete,
// so the unit an interruption cut short is redone, never half counted.

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvtier::engine {

// Rewrites `results` (atomically, through a .tmp beside it) with its header and the groups
// `complete(key, rows)` accepts, and returns their keys. A line without `columns` fields (cut
// by an interruption) is dropped; `parse_key` turns the first field into a Key, whose order is
// the order groups are written in.
template <typename Key>
std::set<Key> KeepCompleteGroups(const std::filesystem::path& results, size_t columns,
                                 absl::FunctionRef<Key(const std::string&)> parse_key,
                                 absl::FunctionRef<bool(const Key&, size_t)> complete) {
  std::ifstream in(results);
  std::string header, line;
  std::getline(in, header);
  std::map<Key, std::vector<std::string>> groups;
  while (std::getline(in, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ',');
    if (f.size() != columns) continue;
    groups[parse_key(f[0])].push_back(line);
  }
  std::set<Key> done;
  std::string kept = header + "\n";
  for (const auto& [key, lines] : groups) {
    if (!complete(key, lines.size())) continue;
    done.insert(key);
    for (const std::string& l : lines) absl::StrAppend(&kept, l, "\n");
  }
  const std::filesystem::path tmp = results.string() + ".tmp";
  std::ofstream(tmp) << kept;
  std::filesystem::rename(tmp, results);
  return done;
}

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_EVAL_RESULTS_CSV_H_
