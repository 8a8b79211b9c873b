#ifndef KVTIER_CORE_PLANNING_MODELS_H_
#define KVTIER_CORE_PLANNING_MODELS_H_

// Built-in geometries of common models for the capacity planner, from their published Hugging
// Face config.json files (each entry names its repository). Pure data; thread-safe.

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/planning/capacity.h"

namespace kvtier::planning {

// The geometry of the built-in model `name` (case-insensitive; e.g. "llama3-8b"), weights in
// bf16; nullopt when there is none.
std::optional<ModelGeometry> FindBuiltinModel(absl::string_view name);

// Every built-in name, in table order.
std::vector<std::string> BuiltinModelNames();

}  // namespace kvtier::planning

#endif  // KVTIER_CORE_PLANNING_MODELS_H_
