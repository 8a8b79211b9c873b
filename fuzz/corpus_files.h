#ifndef KVTIER_FUZZ_CORPUS_FILES_H_
#define KVTIER_FUZZ_CORPUS_FILES_H_

// The committed inputs of a fuzz target (fuzz/corpus/TARGET/: seeds and regression inputs of
// crashes once found), for the replay tests to run first.

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace kvtier::fuzz {

inline std::vector<std::string> CorpusFiles(const std::string& target) {
  std::vector<std::string> out;
  const std::filesystem::path dir = std::filesystem::path(KVTIER_FUZZ_CORPUS_DIR) / target;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    out.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return out;
}

}  // namespace kvtier::fuzz

#endif  // KVTIER_FUZZ_CORPUS_FILES_H_
