#ifndef KVTIER_ENGINE_MODEL_PATH_H_
#define KVTIER_ENGINE_MODEL_PATH_H_

// Where the project's model lives: $KVTIER_MODEL, else
// $KVTIER_HOME/SmolLM2-135M-Instruct.Q4_1.gguf, else
// ~/.cache/kvtier/SmolLM2-135M-Instruct.Q4_1.gguf. scripts/install-deps downloads it there.

#include <string>

namespace kvtier::engine {

inline constexpr char kDefaultModelFile[] = "SmolLM2-135M-Instruct.Q4_1.gguf";

std::string DefaultModelPath();

// A one-line hint for error messages when the model file is missing.
std::string MissingModelHint(const std::string& path);

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_MODEL_PATH_H_
