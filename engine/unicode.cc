#include "engine/unicode.h"

#include <algorithm>
#include <string>

namespace kvtier::engine {
namespace {

struct CodepointRange {
  uint32_t first;
  uint32_t last;
};

#include "engine/unicode_tables.inc"

template <size_t N>
bool InRanges(const CodepointRange (&ranges)[N], uint32_t cp) {
  const CodepointRange* it = std::upper_bound(
      ranges, ranges + N, cp, [](uint32_t v, const CodepointRange& r) { return v < r.first; });
  return it != ranges && cp <= (it - 1)->last;
}

}  // namespace

bool IsLetter(uint32_t cp) {
  return cp < 0x80 ? ((cp | 0x20) - 'a' < 26) : InRanges(kLetterRanges, cp);
}

bool IsNumber(uint32_t cp) { return cp < 0x80 ? (cp - '0' < 10) : InRanges(kNumberRanges, cp); }

bool IsWhitespace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

std::vector<Utf8Char> DecodeUtf8(std::string_view s) {
  std::vector<Utf8Char> out;
  out.reserve(s.size());
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  const uint32_t n = static_cast<uint32_t>(s.size());
  uint32_t i = 0;
  while (i < n) {
    const unsigned char c = b[i];
    uint32_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    uint32_t cp = kInvalidCodepoint;
    if (len == 1) {
      cp = c;
    } else if (len > 1 && i + len <= n) {
      cp = c & (0x7F >> len);
      for (uint32_t k = 1; k < len; ++k) {
        if ((b[i + k] & 0xC0) != 0x80) {
          cp = kInvalidCodepoint;
          break;
        }
        cp = (cp << 6) | (b[i + k] & 0x3F);
      }
      // Overlong forms, surrogates and out-of-range values are malformed too.
      static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
      if (cp != kInvalidCodepoint &&
          (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))) {
        cp = kInvalidCodepoint;
      }
    }
    if (cp == kInvalidCodepoint) len = 1;
    out.push_back({cp, i, len});
    i += len;
  }
  return out;
}

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace kvtier::engine
