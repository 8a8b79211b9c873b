// int8 KIVI: keys per channel, values per token; asymmetric min-max uint8 with f32 scale + min.

#include <algorithm>
#include <vector>

#include "worker/codecs/codec.h"
#include "worker/codecs/codec_internal.h"

namespace kvtier::worker::codecs {
namespace {

using internal::LoadF32;
using internal::StoreF32;

uint64_t KiviBytes(TensorRole role, uint32_t rows, uint32_t cols) {
  const uint64_t groups = role == TensorRole::kKey ? cols : rows;
  return groups * 2 * sizeof(float) + uint64_t{rows} * cols;
}

KVTIER_CODEC_CLONES void ColumnRange(const float* src, uint32_t rows, uint32_t cols, float* lo,
                                     float* hi) {
  std::copy(src, src + cols, lo);
  std::copy(src, src + cols, hi);
  for (uint32_t r = 1; r < rows; ++r) {
    const float* row = src + uint64_t{r} * cols;
    for (uint32_t c = 0; c < cols; ++c) {
      lo[c] = std::min(lo[c], row[c]);
      hi[c] = std::max(hi[c], row[c]);
    }
  }
}

KVTIER_CODEC_CLONES void QuantizeRowPerColumn(const float* row, uint32_t cols, const float* lo,
                                              const float* inv, uint8_t* dst) {
  for (uint32_t c = 0; c < cols; ++c) dst[c] = internal::QuantizeU8(row[c], lo[c], inv[c]);
}

KVTIER_CODEC_CLONES void DequantizeRowPerColumn(const uint8_t* codes, uint32_t cols,
                                                const float* lo, const float* scale, float* dst) {
  for (uint32_t c = 0; c < cols; ++c) dst[c] = lo[c] + static_cast<float>(codes[c]) * scale[c];
}

KVTIER_CODEC_CLONES void RowRange(const float* row, uint32_t cols, float* lo, float* hi) {
  float l = row[0], h = row[0];
  for (uint32_t c = 1; c < cols; ++c) {
    l = std::min(l, row[c]);
    h = std::max(h, row[c]);
  }
  *lo = l;
  *hi = h;
}

KVTIER_CODEC_CLONES void QuantizeRow(const float* row, uint32_t cols, float lo, float inv,
                                     uint8_t* dst) {
  for (uint32_t c = 0; c < cols; ++c) dst[c] = internal::QuantizeU8(row[c], lo, inv);
}

KVTIER_CODEC_CLONES void DequantizeRow(const uint8_t* codes, uint32_t cols, float lo, float scale,
                                       float* dst) {
  for (uint32_t c = 0; c < cols; ++c) dst[c] = lo + static_cast<float>(codes[c]) * scale;
}

// Key layout: [cols] f32 scale, [cols] f32 min, [rows][cols] codes.
void EncodeKeys(const float* src, uint32_t rows, uint32_t cols, uint8_t* dst) {
  std::vector<float> lo(cols), hi(cols), inv(cols), scale(cols);
  if (rows > 0) ColumnRange(src, rows, cols, lo.data(), hi.data());
  for (uint32_t c = 0; c < cols; ++c) {
    const internal::Affine a = internal::MakeAffine(lo[c], hi[c]);
    scale[c] = a.scale;
    inv[c] = a.inv;
  }
  std::memcpy(dst, scale.data(), uint64_t{cols} * 4);
  std::memcpy(dst + uint64_t{cols} * 4, lo.data(), uint64_t{cols} * 4);
  uint8_t* codes = dst + uint64_t{cols} * 8;
  for (uint32_t r = 0; r < rows; ++r) {
    QuantizeRowPerColumn(src + uint64_t{r} * cols, cols, lo.data(), inv.data(),
                         codes + uint64_t{r} * cols);
  }
}

void DecodeKeys(const uint8_t* src, uint32_t rows, uint32_t cols, float* dst) {
  std::vector<float> scale(cols), lo(cols);
  std::memcpy(scale.data(), src, uint64_t{cols} * 4);
  std::memcpy(lo.data(), src + uint64_t{cols} * 4, uint64_t{cols} * 4);
  const uint8_t* codes = src + uint64_t{cols} * 8;
  for (uint32_t r = 0; r < rows; ++r) {
    DequantizeRowPerColumn(codes + uint64_t{r} * cols, cols, lo.data(), scale.data(),
                           dst + uint64_t{r} * cols);
  }
}

// Value layout: [rows] f32 scale, [rows] f32 min, [rows][cols] codes.
void EncodeValues(const float* src, uint32_t rows, uint32_t cols, uint8_t* dst) {
  uint8_t* codes = dst + uint64_t{rows} * 8;
  for (uint32_t r = 0; r < rows; ++r) {
    const float* row = src + uint64_t{r} * cols;
    float lo = 0.f, hi = 0.f;
    if (cols > 0) RowRange(row, cols, &lo, &hi);
    const internal::Affine a = internal::MakeAffine(lo, hi);
    StoreF32(dst + uint64_t{r} * 4, a.scale);
    StoreF32(dst + (uint64_t{rows} + r) * 4, lo);
    QuantizeRow(row, cols, lo, a.inv, codes + uint64_t{r} * cols);
  }
}

void DecodeValues(const uint8_t* src, uint32_t rows, uint32_t cols, float* dst) {
  const uint8_t* codes = src + uint64_t{rows} * 8;
  for (uint32_t r = 0; r < rows; ++r) {
    DequantizeRow(codes + uint64_t{r} * cols, cols, LoadF32(src + (uint64_t{rows} + r) * 4),
                  LoadF32(src + uint64_t{r} * 4), dst + uint64_t{r} * cols);
  }
}

void KiviEncode(TensorRole role, const float* src, uint32_t rows, uint32_t cols, uint8_t* dst) {
  if (role == TensorRole::kKey) {
    EncodeKeys(src, rows, cols, dst);
  } else {
    EncodeValues(src, rows, cols, dst);
  }
}

void KiviDecode(TensorRole role, const uint8_t* src, uint32_t rows, uint32_t cols, float* dst) {
  if (role == TensorRole::kKey) {
    DecodeKeys(src, rows, cols, dst);
  } else {
    DecodeValues(src, rows, cols, dst);
  }
}

}  // namespace

const Codec& Int8KiviCodec() {
  static constexpr Codec kCodec{"int8_kivi", &KiviBytes, &KiviEncode, &KiviDecode};
  return kCodec;
}

// The per-tensor scheme shares the row helpers: the whole tensor is one "row".
namespace {

uint64_t MinMaxBytes(TensorRole, uint32_t rows, uint32_t cols) {
  return 2 * sizeof(float) + uint64_t{rows} * cols;
}

// Layout: f32 scale, f32 min, [rows][cols] codes.
void MinMaxEncode(TensorRole, const float* src, uint32_t rows, uint32_t cols, uint8_t* dst) {
  const uint64_t n = uint64_t{rows} * cols;
  float lo = 0.f, hi = 0.f;
  if (n > 0) RowRange(src, static_cast<uint32_t>(n), &lo, &hi);
  const internal::Affine a = internal::MakeAffine(lo, hi);
  StoreF32(dst, a.scale);
  StoreF32(dst + 4, lo);
  QuantizeRow(src, static_cast<uint32_t>(n), lo, a.inv, dst + 8);
}

void MinMaxDecode(TensorRole, const uint8_t* src, uint32_t rows, uint32_t cols, float* dst) {
  DequantizeRow(src + 8, rows * cols, LoadF32(src + 4), LoadF32(src), dst);
}

}  // namespace

const Codec& MinMaxCodec() {
  static constexpr Codec kCodec{"minmax", &MinMaxBytes, &MinMaxEncode, &MinMaxDecode};
  return kCodec;
}

}  // namespace kvtier::worker::codecs
