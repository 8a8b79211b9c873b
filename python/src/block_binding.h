#ifndef KVTIER_PYTHON_SRC_BLOCK_BINDING_H_
#define KVTIER_PYTHON_SRC_BLOCK_BINDING_H_

#include <nanobind/nanobind.h>

#include <functional>

#include "absl/status/status.h"

namespace kvtier::python {

// Raises the kvtier exception for a status that is not OK (native.cc's translation); never
// returns then.
using ThrowFn = std::function<void(const absl::Status&)>;

// Adds kvtier._native.BlockStore.
void BindBlocks(nanobind::module_& m, ThrowFn fail);

}  // namespace kvtier::python

#endif  // KVTIER_PYTHON_SRC_BLOCK_BINDING_H_
