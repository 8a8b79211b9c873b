#include "worker/cuda/arena_buffers.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/cuda/cuda_api.h"
#include "worker/cuda/cuda_status.h"

namespace kvtier::worker::cuda {

ArenaBuffers::~ArenaBuffers() {
  std::vector<const void*> left;
  for (const auto& [p, n] : live_) left.push_back(p);
  for (const void* p : left) Free(p);
}

absl::Status ArenaBuffers::AllocateRaw(void** p, uint64_t bytes, std::string_view what) {
  *p = nullptr;
  if (bytes == 0) return absl::OkStatus();
  if (arena_ == nullptr) {
    KVTIER_CUDA_RETURN_IF_ERROR(cudaMalloc(p, bytes));
  } else {
    absl::StatusOr<uint8_t*> block = arena_->Allocate(bytes);
    if (!block.ok()) {
      return absl::ResourceExhaustedError(
          absl::StrCat(std::string(what), ": ", bytes,
                       " bytes of device memory do not fit the HBM budget (arena_bytes ",
                       arena_->capacity_bytes(), ", ", arena_->used_bytes(),
                       " in use by T0 pages and the stores' working memory)"));
    }
    *p = *block;
  }
  live_.emplace(*p, bytes);
  bytes_ += bytes;
  return absl::OkStatus();
}

void ArenaBuffers::Free(const void* p) {
  if (p == nullptr) return;
  auto it = live_.find(p);
  if (it == live_.end()) return;
  if (arena_ == nullptr) {
    cudaFree(const_cast<void*>(p));
  } else {
    arena_->Free(static_cast<uint8_t*>(const_cast<void*>(p)), it->second);
  }
  bytes_ -= it->second;
  live_.erase(it);
}

}  // namespace kvtier::worker::cuda
