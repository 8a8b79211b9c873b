#include "engine/model_path.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace kvtier::engine {

std::string DefaultModelPath() {
  if (const char* m = std::getenv("KVTIER_MODEL"); m != nullptr && *m != '\0') return m;
  if (const char* h = std::getenv("KVTIER_HOME"); h != nullptr && *h != '\0') {
    return absl::StrCat(h, "/", kDefaultModelFile);
  }
  const char* home = std::getenv("HOME");
  return absl::StrCat(home != nullptr ? home : ".", "/.cache/kvtier/", kDefaultModelFile);
}

std::string MissingModelHint(const std::string& path) {
  return absl::StrCat("model file '", path, "' not found: run scripts/install-deps (downloads ",
                      kDefaultModelFile,
                      " into $KVTIER_HOME, default ~/.cache/kvtier) or set KVTIER_MODEL");
}

}  // namespace kvtier::engine
