// Host-side halves of the kernels' launchers: sizes and argument checks (kernel_checks.h), built
// into the CUDA kernels and into their simulated-device references alike.

#include "worker/kernels/cuda/kernel_checks.h"

#include <cmath>

namespace kvtier::worker::kernels::cuda {

uint64_t EncodedBytes(CodecKind codec, Role role, uint32_t rows, uint32_t cols) {
  const uint64_t codes = uint64_t{rows} * cols;
  switch (codec) {
    case CodecKind::kFp8E4m3:
      return uint64_t{rows} * 4 + codes;
    case CodecKind::kMinMax:
      return 8 + codes;
    case CodecKind::kInt8Kivi:
    default:
      return (role == Role::kKey ? cols : rows) * uint64_t{8} + codes;
  }
}

uint64_t PagedDecodeWorkspaceBytes(uint32_t batch, uint32_t max_length, uint32_t num_q_heads,
                                   uint32_t head_dim) {
  const uint64_t rows = uint64_t{batch} * num_q_heads;
  const uint64_t chunks = AttentionChunks(max_length);
  return 4 * (rows * max_length + rows * chunks * (2 + uint64_t{head_dim}) + 2 * rows);
}

namespace {

constexpr uint32_t kMaxBlocks = 1u << 31;

template <typename Params>
LaunchCheck CheckCodec(const Params& p) {
  if (p.src == nullptr || p.dst == nullptr || p.rows == 0 || p.cols == 0) {
    return LaunchCheck::kInvalid;
  }
  if (p.num_tensors == 0) return LaunchCheck::kNothing;
  if (p.num_tensors >= kMaxBlocks || static_cast<int>(p.codec) > 2) return LaunchCheck::kInvalid;
  return LaunchCheck::kLaunch;
}

}  // namespace

LaunchCheck CheckQuantize(const QuantizeParams& p) { return CheckCodec(p); }
LaunchCheck CheckDequantize(const DequantizeParams& p) { return CheckCodec(p); }

LaunchCheck CheckCopyPages(const PageCopyParams& p) {
  if (p.src == nullptr || p.dst == nullptr || p.block_bytes % 16 != 0) return LaunchCheck::kInvalid;
  if (p.num_blocks == 0 || p.block_bytes == 0) return LaunchCheck::kNothing;
  if (p.num_blocks >= kMaxBlocks) return LaunchCheck::kInvalid;
  return LaunchCheck::kLaunch;
}

bool ValidPagedDecode(const PagedDecodeParams& p) {
  if (p.q == nullptr || p.out == nullptr || p.pages == nullptr || p.page_indptr == nullptr ||
      p.lengths == nullptr || p.workspace == nullptr) {
    return false;
  }
  if (p.batch == 0 || p.max_length == 0 || p.num_kv_heads == 0 || p.page_tokens == 0) return false;
  if (p.num_q_heads % p.num_kv_heads != 0) return false;
  const uint32_t group = p.num_q_heads / p.num_kv_heads;
  if (group == 0 || group > kMaxGqaGroup) return false;
  if (p.head_dim != 64 && p.head_dim != 128) return false;
  if (!(p.scale > 0.f) || !std::isfinite(p.scale)) return false;
  if ((p.position_mass != nullptr || p.head_mass != nullptr) && p.mass_stride < p.max_length) {
    return false;
  }
  return p.batch <= 65535;
}

bool ValidRopeAppend(const RopeAppendParams& p) {
  const bool rows = p.k_out != nullptr;
  const bool table = p.pages != nullptr && p.page_indptr != nullptr && p.page_tokens != 0;
  return p.qkv != nullptr && p.positions != nullptr && p.q_out != nullptr &&
         (p.k_out == nullptr) == (p.v_out == nullptr) && (rows || table) && p.batch > 0 &&
         p.batch <= 65535 && p.num_kv_heads > 0 && p.head_dim > 0 && p.head_dim % 2 == 0 &&
         p.head_dim <= 2048 && p.rope_base > 0.f;
}

bool ValidScoreAccumulate(const ScoreAccumulateParams& p) {
  return p.mass != nullptr && p.scores != nullptr && p.rows > 0 && p.first_length > 0 &&
         p.mass_stride >= p.first_length + p.rows - 1 && std::isfinite(p.weight);
}

bool ValidSplitMerge(const SplitMergeParams& p) {
  for (int i = 0; i < 2; ++i) {
    if (p.out[i] == nullptr || p.lse[i] == nullptr) return false;
    if (p.position_mass != nullptr && p.head_mass[i] == nullptr) return false;
  }
  if (p.merged == nullptr || p.num_q_heads == 0 || p.num_q_heads > 65535) return false;
  if (p.head_dim == 0 || p.head_dim > 1024) return false;
  return p.position_mass == nullptr || (p.length > 0 && p.mass_stride >= p.length);
}

bool ValidScoreBatch(const ScoreBatchParams& p) {
  return p.mass != nullptr && p.lengths != nullptr && p.scores != nullptr && p.rows > 0 &&
         p.rows <= 65535 && p.max_length > 0 && p.mass_stride >= p.max_length &&
         std::isfinite(p.weight);
}

}  // namespace kvtier::worker::kernels::cuda
