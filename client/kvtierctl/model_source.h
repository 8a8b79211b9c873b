#ifndef KVTIER_CLIENT_KVTIERCTL_MODEL_SOURCE_H_
#define KVTIER_CLIENT_KVTIERCTL_MODEL_SOURCE_H_

// Where `kvtierctl plan --model` finds a model's geometry: a GGUF file's metadata, a Hugging Face
// config.json (or a directory holding one), or a built-in name (core/planning/models.h).

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/planning/capacity.h"

namespace kvtier::ctl {

// NOT_FOUND for a path that cannot be read; INVALID_ARGUMENT naming the key (and the file) for a
// missing or out-of-range key, an unsupported layout (MLA), or an unknown name.
absl::StatusOr<planning::ModelGeometry> LoadModel(const std::string& spec);

// The geometry in a config.json's text; `name` is for messages. Weights in the config's
// torch_dtype (2 bytes when absent).
absl::StatusOr<planning::ModelGeometry> ParseHfConfig(const std::string& text,
                                                      const std::string& name);

// MemTotal and MemAvailable of /proc/meminfo's text, in bytes; INVALID_ARGUMENT when absent.
struct HostMemory {
  uint64_t total_bytes = 0;
  uint64_t available_bytes = 0;
};
absl::StatusOr<HostMemory> ParseMeminfo(const std::string& text);

}  // namespace kvtier::ctl

#endif  // KVTIER_CLIENT_KVTIERCTL_MODEL_SOURCE_H_
