// Paged decode attention: chunk partials, chunk-ordered merge, per-position mass.
// See paged_attention.h for shapes and the determinism contract.

#include <cuda_bf16.h>

#include <cmath>

#include "worker/kernels/cuda/device_utils.cuh"
#include "worker/kernels/cuda/kernel_checks.h"
#include "worker/kernels/cuda/paged_attention.h"

namespace kvtier::worker::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMassThreads = 256;

__host__ __device__ inline uint32_t NumChunks(uint32_t max_length) {
  return (max_length + kAttentionChunk - 1) / kAttentionChunk;
}

// Workspace layout (all f32): scores [batch][q_heads][max_length], chunk max and sum
// [batch][q_heads][chunks] each, chunk accumulators [batch][q_heads][chunks][head_dim], final
// max and sum [batch][q_heads] each.
struct Workspace {
  float* scores;
  float* chunk_m;
  float* chunk_l;
  float* chunk_acc;
  float* final_m;
  float* final_l;
};

__host__ __device__ inline Workspace CarveWorkspace(void* base, uint32_t batch, uint32_t max_length,
                                                    uint32_t heads, uint32_t head_dim) {
  const uint64_t chunks = (max_length + kAttentionChunk - 1) / kAttentionChunk;
  const uint64_t rows = uint64_t{batch} * heads;
  float* f = static_cast<float*>(base);
  Workspace w;
  w.scores = f;
  w.chunk_m = w.scores + rows * max_length;
  w.chunk_l = w.chunk_m + rows * chunks;
  w.chunk_acc = w.chunk_l + rows * chunks;
  w.final_m = w.chunk_acc + rows * chunks * head_dim;
  w.final_l = w.final_m + rows;
  return w;
}

// Pointer to the K row of position p of sequence b and kv head `kvh`, or null when evicted.
template <typename T>
__device__ inline const T* KeyRow(const PagedDecodeParams& p, uint32_t b, uint32_t pos,
                                  uint32_t kvh) {
  const void* page = p.pages[p.page_indptr[b] + pos / p.page_tokens];
  if (page == nullptr) return nullptr;
  const uint64_t row = uint64_t{pos % p.page_tokens} * p.num_kv_heads + kvh;
  return static_cast<const T*>(page) + row * p.head_dim;
}

// V sits right after K in the page block.
template <typename T>
__device__ inline const T* ValueRow(const PagedDecodeParams& p, const T* key_row) {
  return key_row + uint64_t{p.page_tokens} * p.num_kv_heads * p.head_dim;
}

// Scores of the chunk's positions for every query head of the group, into s[g][i] (scaled).
// Warp w takes positions w, w + kWarps, ...; each lane a fixed contiguous slice of dims, reduced
// by a fixed xor-shuffle tree.
template <int kHeadDim, typename T>
__device__ void ChunkScores(const PagedDecodeParams& p, uint32_t b, uint32_t kvh, uint32_t begin,
                            uint32_t len, int group, const float (*qs)[kHeadDim],
                            float (*s)[kAttentionChunk]) {
  constexpr int kPerLane = kHeadDim / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = warp; i < static_cast<int>(kAttentionChunk); i += kWarps) {
    const uint32_t pos = begin + i;
    const T* k = pos < len ? KeyRow<T>(p, b, pos, kvh) : nullptr;
    if (k == nullptr) {  // uniform across the warp
      if (lane < group) s[lane][i] = -INFINITY;
      continue;
    }
    float kv[kPerLane];
    LoadRow<kPerLane>(k + lane * kPerLane, kv);
#pragma unroll
    for (int g = 0; g < static_cast<int>(kMaxGqaGroup); ++g) {
      if (g >= group) break;
      float dot = 0.f;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) dot = fmaf(qs[g][lane * kPerLane + j], kv[j], dot);
      dot = WarpSum(dot);
      if (lane == 0) s[g][i] = dot * p.scale;
    }
  }
}

// For each head of the group: chunk max m, weights e = exp(s - m) written over s, sum l.
__device__ void ChunkSoftmax(int group, float (*s)[kAttentionChunk], float* m_out, float* l_out) {
  static_assert(kAttentionChunk == 64, "two positions per lane");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int g = warp; g < group; g += kWarps) {
    const float a = s[g][lane], c = s[g][lane + 32];
    const float m = WarpMax(fmaxf(a, c));
    float ea = 0.f, ec = 0.f;
    if (m != -INFINITY) {
      ea = expf(a - m);
      ec = expf(c - m);
    }
    s[g][lane] = ea;
    s[g][lane + 32] = ec;
    const float l = WarpSum(ea + ec);
    if (lane == 0) {
      m_out[g] = m;
      l_out[g] = l;
    }
  }
}

template <int kHeadDim, typename T>
__global__ void __launch_bounds__(kThreads) ChunkKernel(PagedDecodeParams p) {
  const uint32_t c = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const uint32_t len = p.lengths[b];
  const uint32_t begin = c * kAttentionChunk;
  if (begin >= len) return;
  const int group = p.num_q_heads / p.num_kv_heads;
  __shared__ float qs[kMaxGqaGroup][kHeadDim];
  __shared__ float s[kMaxGqaGroup][kAttentionChunk];
  __shared__ float m_sh[kMaxGqaGroup], l_sh[kMaxGqaGroup];
  const uint64_t q_row0 = uint64_t{b} * p.num_q_heads + uint64_t{kvh} * group;
  for (int t = threadIdx.x; t < group * kHeadDim; t += kThreads) {
    qs[t / kHeadDim][t % kHeadDim] = p.q[q_row0 * kHeadDim + t];
  }
  __syncthreads();
  ChunkScores<kHeadDim, T>(p, b, kvh, begin, len, group, qs, s);
  __syncthreads();
  const Workspace w = CarveWorkspace(p.workspace, p.batch, p.max_length, p.num_q_heads, kHeadDim);
  for (int t = threadIdx.x; t < group * static_cast<int>(kAttentionChunk); t += kThreads) {
    const int g = t / kAttentionChunk, i = t % kAttentionChunk;
    if (begin + i < len) w.scores[(q_row0 + g) * p.max_length + begin + i] = s[g][i];
  }
  __syncthreads();
  ChunkSoftmax(group, s, m_sh, l_sh);
  __syncthreads();
  const uint32_t chunks = NumChunks(p.max_length);
  if (threadIdx.x < group) {
    w.chunk_m[(q_row0 + threadIdx.x) * chunks + c] = m_sh[threadIdx.x];
    w.chunk_l[(q_row0 + threadIdx.x) * chunks + c] = l_sh[threadIdx.x];
  }
  if (threadIdx.x >= kHeadDim) return;
  const int d = threadIdx.x;
  float acc[kMaxGqaGroup] = {};
  const uint32_t end = min(len - begin, kAttentionChunk);
  for (uint32_t i = 0; i < end; ++i) {  // position order
    const T* k = KeyRow<T>(p, b, begin + i, kvh);
    if (k == nullptr) continue;
    const float v = ToFloat(ValueRow<T>(p, k)[d]);
#pragma unroll
    for (int g = 0; g < static_cast<int>(kMaxGqaGroup); ++g) {
      if (g < group) acc[g] = fmaf(s[g][i], v, acc[g]);
    }
  }
#pragma unroll
  for (int g = 0; g < static_cast<int>(kMaxGqaGroup); ++g) {
    if (g < group) w.chunk_acc[((q_row0 + g) * chunks + c) * kHeadDim + d] = acc[g];
  }
}

// One CTA per (query head, sequence), head_dim threads: merges chunks in chunk order.
template <int kHeadDim>
__global__ void __launch_bounds__(kHeadDim) MergeKernel(PagedDecodeParams p) {
  const uint32_t h = blockIdx.x, b = blockIdx.y, d = threadIdx.x;
  const uint32_t len = p.lengths[b];
  const uint32_t used = (len + kAttentionChunk - 1) / kAttentionChunk;
  const uint32_t chunks = NumChunks(p.max_length);
  const Workspace w = CarveWorkspace(p.workspace, p.batch, p.max_length, p.num_q_heads, kHeadDim);
  const uint64_t row = uint64_t{b} * p.num_q_heads + h;
  float m = -INFINITY;
  for (uint32_t c = 0; c < used; ++c) m = fmaxf(m, w.chunk_m[row * chunks + c]);
  float l = 0.f, acc = 0.f;
  if (m != -INFINITY) {
    for (uint32_t c = 0; c < used; ++c) {
      const float mc = w.chunk_m[row * chunks + c];
      if (mc == -INFINITY) continue;
      const float f = expf(mc - m);
      l = fmaf(f, w.chunk_l[row * chunks + c], l);
      acc = fmaf(f, w.chunk_acc[(row * chunks + c) * kHeadDim + d], acc);
    }
  }
  p.out[row * kHeadDim + d] = l > 0.f ? acc / l : 0.f;
  if (d == 0) {
    w.final_m[row] = m;
    w.final_l[row] = l;
    if (p.lse != nullptr) p.lse[row] = l > 0.f ? m + logf(l) : -INFINITY;
  }
}

// Mass of each position: sum over query heads, in head order, of exp(s - M) / L.
__global__ void __launch_bounds__(kMassThreads) MassKernel(PagedDecodeParams p) {
  const uint32_t b = blockIdx.y;
  const uint32_t pos = blockIdx.x * kMassThreads + threadIdx.x;
  const uint32_t len = p.lengths[b];
  if (pos >= len) return;
  const Workspace w = CarveWorkspace(p.workspace, p.batch, p.max_length, p.num_q_heads, p.head_dim);
  float mass = 0.f;
  const bool live = p.pages[p.page_indptr[b] + pos / p.page_tokens] != nullptr;
  for (uint32_t h = 0; h < p.num_q_heads; ++h) {
    const uint64_t row = uint64_t{b} * p.num_q_heads + h;
    const float l = w.final_l[row];
    const float e =
        live && l > 0.f ? expf(w.scores[row * p.max_length + pos] - w.final_m[row]) / l : 0.f;
    mass += e;
    if (p.head_mass != nullptr) p.head_mass[row * p.mass_stride + pos] = e;
  }
  if (p.position_mass == nullptr) return;
  float* dst = p.position_mass + uint64_t{b} * p.mass_stride + pos;
  *dst = p.accumulate_mass ? *dst + mass : mass;
}

// One CTA per query head, head_dim threads: the merged output (SplitMergeParams).
__global__ void SplitMergeOutKernel(SplitMergeParams p) {
  const uint32_t h = blockIdx.x, d = threadIdx.x;
  const float a = p.lse[0][h], c = p.lse[1][h];
  const float m = fmaxf(a, c);
  float o = 0.f;
  if (m != -INFINITY) {
    float wa = expf(a - m), wc = expf(c - m);
    const float z = __fadd_rn(wa, wc);
    wa = __fdiv_rn(wa, z);
    wc = __fdiv_rn(wc, z);
    const uint64_t i = uint64_t{h} * p.head_dim + d;
    o = __fadd_rn(o, __fmul_rn(wa, p.out[0][i]));
    o = __fadd_rn(o, __fmul_rn(wc, p.out[1][i]));
  }
  p.merged[uint64_t{h} * p.head_dim + d] = o;
}

// Mass of each position: the parts' per-head weights rescaled head by head, heads in order.
__global__ void __launch_bounds__(kMassThreads) SplitMergeMassKernel(SplitMergeParams p) {
  const uint32_t pos = blockIdx.x * kMassThreads + threadIdx.x;
  if (pos >= p.length) return;
  float mass = 0.f;
  for (uint32_t h = 0; h < p.num_q_heads; ++h) {
    const float a = p.lse[0][h], c = p.lse[1][h];
    const float m = fmaxf(a, c);
    if (m == -INFINITY) continue;
    float w[2] = {expf(a - m), expf(c - m)};
    const float z = __fadd_rn(w[0], w[1]);
    for (int i = 0; i < 2; ++i) {
      const float wi = __fdiv_rn(w[i], z);
      if (wi == 0.f) continue;
      mass = __fadd_rn(mass, __fmul_rn(wi, p.head_mass[i][uint64_t{h} * p.mass_stride + pos]));
    }
  }
  p.position_mass[pos] = mass;
}

__global__ void __launch_bounds__(kMassThreads) AccumulateScoresKernel(ScoreAccumulateParams p) {
  const uint32_t i = blockIdx.x * kMassThreads + threadIdx.x;
  if (i >= p.first_length + p.rows - 1) return;
  float score = p.scores[i];
  for (uint32_t b = 0; b < p.rows; ++b) {
    if (i < p.first_length + b) {
      score = __fadd_rn(score, __fmul_rn(p.mass[uint64_t{b} * p.mass_stride + i], p.weight));
    }
  }
  p.scores[i] = score;
}

// Thread (i, b) serves the run of rows from b naming the same scores, when b starts one.
__global__ void __launch_bounds__(kMassThreads) AccumulateScoresBatchKernel(ScoreBatchParams p) {
  const uint32_t i = blockIdx.x * kMassThreads + threadIdx.x;
  const uint32_t b0 = blockIdx.y;
  float* const scores = p.scores[b0];
  if (i >= p.max_length || (b0 > 0 && p.scores[b0 - 1] == scores)) return;
  bool covered = false;
  float score = 0.f;
  for (uint32_t b = b0; b < p.rows && p.scores[b] == scores; ++b) {
    if (i >= static_cast<uint32_t>(p.lengths[b])) continue;
    if (!covered) score = scores[i];
    covered = true;
    score = __fadd_rn(score, __fmul_rn(p.mass[uint64_t{b} * p.mass_stride + i], p.weight));
  }
  if (covered) scores[i] = score;
}

template <int kHeadDim, typename T>
cudaError_t Launch(const PagedDecodeParams& p, cudaStream_t stream) {
  const dim3 chunk_grid(NumChunks(p.max_length), p.num_kv_heads, p.batch);
  ChunkKernel<kHeadDim, T><<<chunk_grid, kThreads, 0, stream>>>(p);
  MergeKernel<kHeadDim><<<dim3(p.num_q_heads, p.batch), kHeadDim, 0, stream>>>(p);
  if (p.position_mass != nullptr || p.head_mass != nullptr) {
    const dim3 mass_grid((p.max_length + kMassThreads - 1) / kMassThreads, p.batch);
    MassKernel<<<mass_grid, kMassThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t AccumulateScores(const ScoreAccumulateParams& p, cudaStream_t stream) {
  if (!ValidScoreAccumulate(p)) return cudaErrorInvalidValue;
  const uint32_t n = p.first_length + p.rows - 1;
  AccumulateScoresKernel<<<(n + kMassThreads - 1) / kMassThreads, kMassThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t MergeSplitAttention(const SplitMergeParams& p, cudaStream_t stream) {
  if (!ValidSplitMerge(p)) return cudaErrorInvalidValue;
  SplitMergeOutKernel<<<p.num_q_heads, p.head_dim, 0, stream>>>(p);
  if (p.position_mass != nullptr) {
    SplitMergeMassKernel<<<(p.length + kMassThreads - 1) / kMassThreads, kMassThreads, 0, stream>>>(
        p);
  }
  return cudaGetLastError();
}

cudaError_t AccumulateScoresBatch(const ScoreBatchParams& p, cudaStream_t stream) {
  if (!ValidScoreBatch(p)) return cudaErrorInvalidValue;
  const dim3 grid((p.max_length + kMassThreads - 1) / kMassThreads, p.rows);
  AccumulateScoresBatchKernel<<<grid, kMassThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t PagedDecodeAttention(const PagedDecodeParams& p, cudaStream_t stream) {
  if (!ValidPagedDecode(p)) return cudaErrorInvalidValue;
  const bool bf16 = p.kv_dtype == KvDtype::kBf16;
  if (p.head_dim == 64) {
    return bf16 ? Launch<64, __nv_bfloat16>(p, stream) : Launch<64, float>(p, stream);
  }
  return bf16 ? Launch<128, __nv_bfloat16>(p, stream) : Launch<128, float>(p, stream);
}

}  // namespace kvtier::worker::kernels::cuda
