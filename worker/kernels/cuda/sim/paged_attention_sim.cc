// paged_attention.h's launchers on the simulated device: the GPU kernels' algorithm as plain
// loops (scores, per-chunk softmax of kAttentionChunk positions in position order, chunks merged
// in chunk order, per-position mass), so the result depends on positions only and never on
// where a page lives, as on the device. Not bit-equal to the GPU (its dot products reduce in a
// warp tree); equal to itself whatever the T0/T1 split.

#include <cmath>
#include <cstring>
#include <vector>

#include "worker/cuda/sim/kernel.h"
#include "worker/kernels/cuda/dtype.h"
#include "worker/kernels/cuda/kernel_checks.h"
#include "worker/kernels/cuda/paged_attention.h"

namespace kvtier::worker::kernels::cuda {
namespace {

using cudasim::Load;
using cudasim::Touch;

// One sequence's K/V rows through its page table; null rows for evicted pages.
class PageReader {
 public:
  // The pages covering [0, len). Only page_indptr[b] is read, as the kernel does (the CUDA
  // backend uploads [batch] offsets, not the [batch + 1] paged_attention.h describes).
  PageReader(const PagedDecodeParams& p, uint32_t b, uint32_t len, bool* ok) : p_(p) {
    const int32_t first = Load(p.page_indptr, b, "page_indptr", ok);
    const uint64_t block =
        2ull * p.page_tokens * p.num_kv_heads * p.head_dim * DtypeBytes(p.kv_dtype);
    const uint32_t n = (len + p.page_tokens - 1) / p.page_tokens;
    for (uint32_t i = 0; *ok && i < n; ++i) {
      const void* page = Load(p.pages, uint64_t(first) + i, "page table", ok);
      if (page != nullptr && !Touch(page, block, "KV page")) *ok = false;
      pages_.push_back(page);
    }
  }
  bool Present(uint32_t pos) const { return pages_[pos / p_.page_tokens] != nullptr; }
  // Element d of the K (value = false) or V row of position pos, kv head h.
  float At(uint32_t pos, uint32_t h, uint32_t d, bool value) const {
    const uint64_t row = uint64_t{pos % p_.page_tokens} * p_.num_kv_heads + h;
    const uint64_t i = (value ? uint64_t{p_.page_tokens} * p_.num_kv_heads * p_.head_dim : 0) +
                       row * p_.head_dim + d;
    const void* page = pages_[pos / p_.page_tokens];
    if (p_.kv_dtype == KvDtype::kF32) return static_cast<const float*>(page)[i];
    return Bf16BitsToF32(static_cast<const uint16_t*>(page)[i]);
  }

 private:
  const PagedDecodeParams& p_;
  std::vector<const void*> pages_;
};

// Attention of one query head over positions [0, len): out[head_dim], and (m, l) of the softmax.
void AttendHead(const PagedDecodeParams& p, const PageReader& kv, const float* q, uint32_t kvh,
                uint32_t len, float* out, std::vector<float>* scores, float* m_out, float* l_out) {
  const uint32_t hd = p.head_dim;
  scores->assign(len, -INFINITY);
  for (uint32_t pos = 0; pos < len; ++pos) {
    if (!kv.Present(pos)) continue;
    float dot = 0.f;
    for (uint32_t d = 0; d < hd; ++d) dot = std::fma(q[d], kv.At(pos, kvh, d, false), dot);
    (*scores)[pos] = dot * p.scale;
  }
  std::vector<float> acc(hd, 0.f), chunk(hd);
  float m = -INFINITY, l = 0.f;
  std::vector<float> cm, cl;
  std::vector<std::vector<float>> cacc;
  for (uint32_t begin = 0; begin < len; begin += kAttentionChunk) {
    const uint32_t end = std::min(len, begin + kAttentionChunk);
    float mc = -INFINITY;
    for (uint32_t i = begin; i < end; ++i) mc = std::fmax(mc, (*scores)[i]);
    float lc = 0.f;
    std::fill(chunk.begin(), chunk.end(), 0.f);
    for (uint32_t i = begin; i < end && mc != -INFINITY; ++i) {
      if (!kv.Present(i)) continue;
      const float e = std::exp((*scores)[i] - mc);
      lc += e;
      for (uint32_t d = 0; d < hd; ++d) chunk[d] = std::fma(e, kv.At(i, kvh, d, true), chunk[d]);
    }
    cm.push_back(mc);
    cl.push_back(lc);
    cacc.push_back(chunk);
    m = std::fmax(m, mc);
  }
  for (size_t c = 0; c < cm.size() && m != -INFINITY; ++c) {
    if (cm[c] == -INFINITY) continue;
    const float f = std::exp(cm[c] - m);
    l = std::fma(f, cl[c], l);
    for (uint32_t d = 0; d < hd; ++d) acc[d] = std::fma(f, cacc[c][d], acc[d]);
  }
  for (uint32_t d = 0; d < hd; ++d) out[d] = l > 0.f ? acc[d] / l : 0.f;
  *m_out = m;
  *l_out = l;
}

void RunPagedDecode(const PagedDecodeParams& p) {
  const uint32_t hq = p.num_q_heads, hd = p.head_dim, group = hq / p.num_kv_heads;
  if (!Touch(p.workspace, PagedDecodeWorkspaceBytes(p.batch, p.max_length, hq, hd), "workspace") ||
      !Touch(p.q, uint64_t{p.batch} * hq * hd * 4, "q") ||
      !Touch(p.out, uint64_t{p.batch} * hq * hd * 4, "out") ||
      !Touch(p.lengths, uint64_t{p.batch} * 4, "lengths") ||
      !Touch(p.page_indptr, uint64_t{p.batch} * 4, "page_indptr")) {
    return;
  }
  std::vector<float> scores;
  std::vector<std::vector<float>> head_scores(hq);
  std::vector<float> ms(hq), ls(hq);
  for (uint32_t b = 0; b < p.batch; ++b) {
    const uint32_t len = static_cast<uint32_t>(p.lengths[b]);
    if (len > p.max_length) {
      cudasim::Touch(nullptr, 1, "lengths[b] beyond max_length (the grid and workspace)");
      return;
    }
    bool ok = true;
    const PageReader kv(p, b, len, &ok);
    if (!ok) return;
    for (uint32_t h = 0; h < hq; ++h) {
      const uint64_t row = uint64_t{b} * hq + h;
      AttendHead(p, kv, p.q + row * hd, h / group, len, p.out + row * hd, &head_scores[h], &ms[h],
                 &ls[h]);
    }
    if (p.lse != nullptr) {
      if (!Touch(p.lse + uint64_t{b} * hq, uint64_t{hq} * 4, "lse")) return;
      for (uint32_t h = 0; h < hq; ++h) {
        p.lse[uint64_t{b} * hq + h] = ls[h] > 0.f ? ms[h] + std::log(ls[h]) : -INFINITY;
      }
    }
    if (p.head_mass != nullptr &&
        !Touch(p.head_mass + uint64_t{b} * hq * p.mass_stride,
               (uint64_t{hq - 1} * p.mass_stride + len) * 4, "head_mass rows")) {
      return;
    }
    float* mass_row =
        p.position_mass == nullptr ? nullptr : p.position_mass + uint64_t{b} * p.mass_stride;
    if (mass_row != nullptr && !Touch(mass_row, uint64_t{len} * 4, "position_mass row")) return;
    for (uint32_t pos = 0; pos < len; ++pos) {
      float mass = 0.f;
      for (uint32_t h = 0; h < hq; ++h) {
        const float e =
            kv.Present(pos) && ls[h] > 0.f ? std::exp(head_scores[h][pos] - ms[h]) / ls[h] : 0.f;
        mass += e;
        if (p.head_mass != nullptr) p.head_mass[(uint64_t{b} * hq + h) * p.mass_stride + pos] = e;
      }
      if (mass_row != nullptr) mass_row[pos] = p.accumulate_mass ? mass_row[pos] + mass : mass;
    }
  }
}

// The two parts' weights of head h (zero when neither attended anything), as the kernel and
// MergeAttentionPartials compute them.
void SplitWeights(const SplitMergeParams& p, uint32_t h, float w[2]) {
  const float a = p.lse[0][h], c = p.lse[1][h];
  const float m = std::fmax(a, c);
  w[0] = w[1] = 0.f;
  if (m == -INFINITY) return;
  const float ea = std::exp(a - m), ec = std::exp(c - m);
  const float z = ea + ec;
  w[0] = ea / z;
  w[1] = ec / z;
}

void RunSplitMerge(const SplitMergeParams& p) {
  const uint64_t row = uint64_t{p.num_q_heads} * p.head_dim;
  for (int i = 0; i < 2; ++i) {
    if (!Touch(p.out[i], row * 4, "out") || !Touch(p.lse[i], uint64_t{p.num_q_heads} * 4, "lse")) {
      return;
    }
    if (p.position_mass != nullptr &&
        !Touch(p.head_mass[i], (uint64_t{p.num_q_heads - 1} * p.mass_stride + p.length) * 4,
               "head_mass")) {
      return;
    }
  }
  if (!Touch(p.merged, row * 4, "merged") ||
      (p.position_mass != nullptr && !Touch(p.position_mass, uint64_t{p.length} * 4, "mass"))) {
    return;
  }
  // One f32 multiply and one f32 add per term (the kernel's __fmul_rn / __fadd_rn).
  for (uint32_t h = 0; h < p.num_q_heads; ++h) {
    float w[2];
    SplitWeights(p, h, w);
    for (uint32_t d = 0; d < p.head_dim; ++d) {
      const uint64_t i = uint64_t{h} * p.head_dim + d;
      float o = 0.f;
      if (w[0] != 0.f || w[1] != 0.f) {
        const volatile float t0 = w[0] * p.out[0][i];
        o = o + t0;
        const volatile float t1 = w[1] * p.out[1][i];
        o = o + t1;
      }
      p.merged[i] = o;
    }
  }
  if (p.position_mass == nullptr) return;
  std::vector<float> weights(2 * size_t{p.num_q_heads});
  for (uint32_t h = 0; h < p.num_q_heads; ++h) SplitWeights(p, h, &weights[2 * h]);
  for (uint32_t pos = 0; pos < p.length; ++pos) {
    float mass = 0.f;
    for (uint32_t h = 0; h < p.num_q_heads; ++h) {
      for (int i = 0; i < 2; ++i) {
        const float wi = weights[2 * h + i];
        if (wi == 0.f) continue;
        const volatile float t = wi * p.head_mass[i][uint64_t{h} * p.mass_stride + pos];
        mass = mass + t;
      }
    }
    p.position_mass[pos] = mass;
  }
}

}  // namespace

cudaError_t PagedDecodeAttention(const PagedDecodeParams& p, cudaStream_t stream) {
  if (!ValidPagedDecode(p)) return cudaErrorInvalidValue;
  return cudasim::Launch(stream, "PagedDecodeAttention", [p] { RunPagedDecode(p); });
}

cudaError_t MergeSplitAttention(const SplitMergeParams& p, cudaStream_t stream) {
  if (!ValidSplitMerge(p)) return cudaErrorInvalidValue;
  return cudasim::Launch(stream, "MergeSplitAttention", [p] { RunSplitMerge(p); });
}

cudaError_t AccumulateScores(const ScoreAccumulateParams& p, cudaStream_t stream) {
  if (!ValidScoreAccumulate(p)) return cudaErrorInvalidValue;
  return cudasim::Launch(stream, "AccumulateScores", [p] {
    const uint32_t n = p.first_length + p.rows - 1;
    if (!Touch(p.scores, uint64_t{n} * 4, "scores") ||
        !Touch(p.mass, (uint64_t{p.rows - 1} * p.mass_stride + n) * 4, "mass")) {
      return;
    }
    // One f32 multiply and one f32 add per term, rows in order (the kernel's __fmul_rn/__fadd_rn).
    for (uint32_t i = 0; i < n; ++i) {
      float score = p.scores[i];
      for (uint32_t b = 0; b < p.rows; ++b) {
        if (i < p.first_length + b) {
          const volatile float term = p.mass[uint64_t{b} * p.mass_stride + i] * p.weight;
          score = score + term;
        }
      }
      p.scores[i] = score;
    }
  });
}

cudaError_t AccumulateScoresBatch(const ScoreBatchParams& p, cudaStream_t stream) {
  if (!ValidScoreBatch(p)) return cudaErrorInvalidValue;
  return cudasim::Launch(stream, "AccumulateScoresBatch", [p] {
    if (!Touch(p.lengths, uint64_t{p.rows} * 4, "lengths") ||
        !Touch(p.scores, uint64_t{p.rows} * sizeof(float*), "scores")) {
      return;
    }
    // Row by row, in order (the kernel serves each run of rows naming the same scores in row
    // order too): one f32 multiply and one f32 add per term.
    for (uint32_t b = 0; b < p.rows; ++b) {
      const uint32_t n = static_cast<uint32_t>(p.lengths[b]);
      if (n == 0 || n > p.max_length) {
        Touch(nullptr, 1, "lengths[b] outside [1, max_length]");
        return;
      }
      float* scores = p.scores[b];
      const float* mass = p.mass + uint64_t{b} * p.mass_stride;
      if (!Touch(scores, uint64_t{n} * 4, "scores[b]") || !Touch(mass, uint64_t{n} * 4, "mass")) {
        return;
      }
      for (uint32_t i = 0; i < n; ++i) {
        const volatile float term = mass[i] * p.weight;
        scores[i] = scores[i] + term;
      }
    }
  });
}

}  // namespace kvtier::worker::kernels::cuda
