#include "worker/kernels/copy_cpu.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvtier::worker::kernels {
namespace {

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) void StreamCopyAvx2(char* dst, const char* src, size_t bytes) {
  size_t i = 0;
  for (; i + 128 <= bytes; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 64));
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 96), d);
  }
  _mm_sfence();  // streaming stores are weakly ordered: publish before the page table changes
  std::memcpy(dst + i, src + i, bytes - i);
}

bool HaveAvx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}
#endif

}  // namespace

void CopyPage(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__) && defined(__GNUC__)
  // Small copies stay cached: streaming only pays off past a few cache lines.
  if (HaveAvx2() && bytes >= 4096 && reinterpret_cast<uintptr_t>(dst) % 32 == 0) {
    StreamCopyAvx2(static_cast<char*>(dst), static_cast<const char*>(src), bytes);
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

}  // namespace kvtier::worker::kernels
