#include "engine/cuda/host_weights.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/status/status_macros.h"
#include "engine/quant.h"

namespace kvtier::engine::cuda {
namespace {

constexpr float kHalfMax = 65504.f;

std::string TypeName(GgmlType type) {
  auto traits = GetGgmlTypeTraits(static_cast<uint32_t>(type));
  return traits.ok() ? traits->name : absl::StrCat("type ", static_cast<uint32_t>(type));
}

absl::StatusOr<const GgufTensorInfo*> Find(const GgufFile& file, const std::string& name) {
  const GgufTensorInfo* t = file.FindTensor(name);
  if (t == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("model '%s': tensor '%s' is missing", file.path(), name));
  }
  return t;
}

absl::StatusOr<HalfMatrix> Matrix(const GgufFile& file, const std::string& name) {
  ASSIGN_OR_RETURN(const GgufTensorInfo* t, Find(file, name));
  return DequantizeToHalf(*t);
}

absl::StatusOr<std::vector<float>> Norm(const GgufFile& file, const std::string& name) {
  ASSIGN_OR_RETURN(const GgufTensorInfo* t, Find(file, name));
  if (t->type != GgmlType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tensor '%s': type %s, expected f32", name, TypeName(t->type)));
  }
  std::vector<float> v(t->num_elements);
  std::memcpy(v.data(), t->data, v.size() * sizeof(float));
  return v;
}

// Rows of `parts` (same cols) one after another.
absl::StatusOr<HalfMatrix> Stack(std::vector<HalfMatrix> parts) {
  HalfMatrix out{0, parts.front().cols, {}};
  for (HalfMatrix& p : parts) {
    if (p.cols != out.cols) {
      return absl::InvalidArgumentError(
          absl::StrFormat("stacked matrices have %d and %d columns", out.cols, p.cols));
    }
    out.rows += p.rows;
    out.values.insert(out.values.end(), p.values.begin(), p.values.end());
  }
  return out;
}

uint64_t MatrixBytes(const HalfMatrix& m) { return m.values.size() * sizeof(uint16_t); }

}  // namespace

uint64_t HostWeights::Bytes() const {
  uint64_t bytes = MatrixBytes(token_embd) + MatrixBytes(output) + output_norm.size() * 4;
  for (const HostLayerWeights& l : layers) {
    bytes += (l.attn_norm.size() + l.ffn_norm.size()) * 4 + MatrixBytes(l.qkv) + MatrixBytes(l.wo) +
             MatrixBytes(l.gate_up) + MatrixBytes(l.down);
  }
  return bytes;
}

absl::StatusOr<HalfMatrix> DequantizeToHalf(const GgufTensorInfo& t) {
  if (t.ne.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tensor '%s' (%s): shape [%s] is not a matrix", t.name, TypeName(t.type),
                        absl::StrJoin(t.ne, ", ")));
  }
  HalfMatrix m{t.ne[1], t.ne[0], {}};
  m.values.resize(m.rows * m.cols);
  const size_t row_bytes = t.num_bytes / m.rows;
  std::vector<float> row(m.cols);
  for (size_t r = 0; r < m.rows; ++r) {
    DequantizeRow(t.type, t.data + r * row_bytes, row.data(), m.cols);
    for (size_t c = 0; c < m.cols; ++c) {
      if (!(std::fabs(row[c]) <= kHalfMax)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("tensor '%s' (%s): value %g at [%d, %d] does not fit f16", t.name,
                            TypeName(t.type), row[c], r, c));
      }
      m.values[r * m.cols + c] = Fp32ToFp16(row[c]);
    }
  }
  return m;
}

absl::StatusOr<HostWeights> DequantizeWeights(const Model& model) {
  const GgufFile& f = model.file();
  HostWeights w;
  ASSIGN_OR_RETURN(w.token_embd, Matrix(f, "token_embd.weight"));
  ASSIGN_OR_RETURN(w.output_norm, Norm(f, "output_norm.weight"));
  if (!model.config().tied_embeddings) {
    ASSIGN_OR_RETURN(w.output, Matrix(f, "output.weight"));
  }
  for (uint32_t l = 0; l < model.config().num_layers; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    HostLayerWeights L;
    ASSIGN_OR_RETURN(L.attn_norm, Norm(f, p + "attn_norm.weight"));
    ASSIGN_OR_RETURN(L.ffn_norm, Norm(f, p + "ffn_norm.weight"));
    ASSIGN_OR_RETURN(HalfMatrix q, Matrix(f, p + "attn_q.weight"));
    ASSIGN_OR_RETURN(HalfMatrix k, Matrix(f, p + "attn_k.weight"));
    ASSIGN_OR_RETURN(HalfMatrix v, Matrix(f, p + "attn_v.weight"));
    ASSIGN_OR_RETURN(L.qkv, Stack({std::move(q), std::move(k), std::move(v)}));
    ASSIGN_OR_RETURN(L.wo, Matrix(f, p + "attn_output.weight"));
    ASSIGN_OR_RETURN(HalfMatrix gate, Matrix(f, p + "ffn_gate.weight"));
    ASSIGN_OR_RETURN(HalfMatrix up, Matrix(f, p + "ffn_up.weight"));
    ASSIGN_OR_RETURN(L.gate_up, Stack({std::move(gate), std::move(up)}));
    ASSIGN_OR_RETURN(L.down, Matrix(f, p + "ffn_down.weight"));
    w.layers.push_back(std::move(L));
  }
  return w;
}

}  // namespace kvtier::engine::cuda
