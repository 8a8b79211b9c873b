#ifndef KVTIER_ENGINE_UNICODE_H_
#define KVTIER_ENGINE_UNICODE_H_

// Minimal Unicode support for the BPE pre-tokenizer: UTF-8 decoding and the three character
// classes the regexes use (\p{L}, \p{N}, \s). Tables: unicode_tables.inc (generated).
// Pure functions, thread-safe.

#include <cstdint>
#include <string_view>
#include <vector>

namespace kvtier::engine {

bool IsLetter(uint32_t cp);      // general category L*
bool IsNumber(uint32_t cp);      // general category N*
bool IsWhitespace(uint32_t cp);  // White_Space property (what \s matches in llama.cpp)

// One decoded code point and where its bytes are.
struct Utf8Char {
  uint32_t cp;          // kInvalidCodepoint for a byte that starts no valid sequence
  uint32_t byte_begin;  // offset in the input
  uint32_t byte_len;    // 1..4
};
inline constexpr uint32_t kInvalidCodepoint = 0xFFFFFFFE;

// Decodes `s`; malformed bytes become one kInvalidCodepoint char each (never dropped), so the
// chars always tile the input exactly.
std::vector<Utf8Char> DecodeUtf8(std::string_view s);

// Appends the UTF-8 encoding of `cp` (< 0x110000) to `out`.
void AppendUtf8(uint32_t cp, std::string& out);

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_UNICODE_H_
