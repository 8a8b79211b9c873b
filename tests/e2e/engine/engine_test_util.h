#ifndef KVTIER_TESTS_E2E_ENGINE_ENGINE_TEST_UTIL_H_
#define KVTIER_TESTS_E2E_ENGINE_ENGINE_TEST_UTIL_H_

// Shared by the engine's e2e tests: one lazily loaded real model per test binary; tests skip
// with a hint when the model file is absent.

#include <filesystem>
#include <memory>

#include "engine/model.h"
#include "engine/model_path.h"
#include "gtest/gtest.h"

namespace kvtier::engine {

// The model, loaded once with `threads` matmul threads (null when the file is missing).
inline Model* SharedModel(int threads = 2) {
  static std::unique_ptr<Model> models[3];
  if (threads < 1 || threads > 2) return nullptr;
  if (models[threads] == nullptr && std::filesystem::exists(DefaultModelPath())) {
    auto m = Model::Load(DefaultModelPath(), ModelOptions{threads});
    EXPECT_TRUE(m.ok()) << m.status();
    if (m.ok()) models[threads] = std::move(*m);
  }
  return models[threads].get();
}

#define KVTIER_REQUIRE_MODEL(var, threads) \
  Model* var = SharedModel(threads);       \
  if (var == nullptr) GTEST_SKIP() << MissingModelHint(DefaultModelPath())

}  // namespace kvtier::engine

#endif  // KVTIER_TESTS_E2E_ENGINE_ENGINE_TEST_UTIL_H_
