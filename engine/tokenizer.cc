#include "engine/tokenizer.h"

#include <algorithm>
#include <array>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status/status_macros.h"
#include "engine/unicode.h"

namespace kvtier::engine {
namespace {

constexpr int32_t kTokenTypeNormal = 1;
constexpr int32_t kTokenTypeControl = 3;
constexpr int32_t kTokenTypeUserDefined = 4;

// GPT-2's reversible byte <-> printable code point map.
struct ByteMap {
  std::array<uint32_t, 256> to_cp;
  std::array<int16_t, 512> to_byte;  // -1 when the code point is not a mapped byte
  ByteMap() {
    to_byte.fill(-1);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      to_cp[b] = printable ? b : next++;
      to_byte[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};
const ByteMap& Bytes() {
  static const ByteMap* map = new ByteMap();
  return *map;
}

// Character classes as llama.cpp's gpt2 custom splitter sees them; out-of-range is "none".
struct Flags {
  bool letter = false, number = false, space = false, in_range = false;
};
Flags FlagsOf(const std::vector<Utf8Char>& cs, size_t pos, size_t end) {
  Flags f;
  if (pos >= end) return f;
  const uint32_t cp = cs[pos].cp;
  f.in_range = true;
  if (cp == kInvalidCodepoint) return f;
  f.letter = IsLetter(cp);
  f.number = IsNumber(cp);
  f.space = IsWhitespace(cp);
  return f;
}

// Splits chars [begin, end) by the GPT-2 pattern; appends the end index of each piece.
void SplitGpt2(const std::vector<Utf8Char>& cs, size_t begin, size_t end,
               std::vector<size_t>& ends) {
  auto cp_at = [&](size_t p) { return p < end ? cs[p].cp : kInvalidCodepoint; };
  size_t pos = begin;
  while (pos < end) {
    const uint32_t cp = cs[pos].cp;
    if (cp == '\'' && pos + 1 < end) {  // 's|'t|'re|'ve|'m|'ll|'d
      const uint32_t n1 = cp_at(pos + 1);
      if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') {
        ends.push_back(pos += 2);
        continue;
      }
      const uint32_t n2 = cp_at(pos + 2);
      if (pos + 2 < end &&
          ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l'))) {
        ends.push_back(pos += 3);
        continue;
      }
    }
    const Flags here = FlagsOf(cs, pos, end);
    const Flags f2 = cp == ' ' ? FlagsOf(cs, pos + 1, end) : here;
    const size_t skip = cp == ' ' ? 1 : 0;
    if (f2.letter) {  //  ?\p{L}+
      pos += skip;
      while (FlagsOf(cs, pos, end).letter) ++pos;
      ends.push_back(pos);
      continue;
    }
    if (f2.number) {  //  ?\p{N}+
      pos += skip;
      while (FlagsOf(cs, pos, end).number) ++pos;
      ends.push_back(pos);
      continue;
    }
    if (f2.in_range && !f2.space && !f2.letter && !f2.number) {  //  ?[^\s\p{L}\p{N}]+
      pos += skip;
      for (Flags f = FlagsOf(cs, pos, end); f.in_range && !f.space && !f.letter && !f.number;
           f = FlagsOf(cs, pos, end)) {
        ++pos;
      }
      ends.push_back(pos);
      continue;
    }
    size_t spaces = 0;
    while (FlagsOf(cs, pos + spaces, end).space) ++spaces;
    if (spaces > 1 && pos + spaces < end) {  // \s+(?!\S): leave the last space to the next word
      ends.push_back(pos += spaces - 1);
      continue;
    }
    if (spaces > 0) {
      ends.push_back(pos += spaces);
      continue;
    }
    ends.push_back(++pos);  // no match: a piece of its own
  }
}

// Byte ranges of the pre-tokenizer's words in `text`.
std::vector<std::pair<size_t, size_t>> Words(std::string_view text) {
  const std::vector<Utf8Char> cs = DecodeUtf8(text);
  std::vector<size_t> ends;
  // Stage 1, \p{N}: each number code point alone; stage 2 splits the runs between them.
  size_t run = 0;
  for (size_t i = 0; i <= cs.size(); ++i) {
    bool number = i < cs.size() && cs[i].cp != kInvalidCodepoint && IsNumber(cs[i].cp);
    if (i == cs.size() || number) {
      SplitGpt2(cs, run, i, ends);
      if (number) ends.push_back(i + 1);
      run = i + 1;
    }
  }
  std::vector<std::pair<size_t, size_t>> words;
  size_t prev = 0;
  for (size_t e : ends) {
    if (e == prev) continue;
    const size_t b0 = cs[prev].byte_begin;
    const size_t b1 = cs[e - 1].byte_begin + cs[e - 1].byte_len;
    words.emplace_back(b0, b1 - b0);
    prev = e;
  }
  return words;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& file) {
  ASSIGN_OR_RETURN(std::string model, file.GetString("tokenizer.ggml.model"));
  if (model != "gpt2") {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer.ggml.model = '", model, "' is not supported (expected 'gpt2' byte-level BPE)"));
  }
  // Pre-tokenizers that llama.cpp runs with exactly the split implemented here; absent = same.
  if (const GgufValue* pre = file.Find("tokenizer.ggml.pre")) {
    ASSIGN_OR_RETURN(std::string name, pre->AsString());
    static const char* kSupported[] = {"smollm", "starcoder", "refact", "command-r", "codeshell"};
    if (std::find(std::begin(kSupported), std::end(kSupported), name) == std::end(kSupported)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer.ggml.pre = '", name,
          "' is not supported (this tokenizer implements the 'smollm' pre-tokenizer)"));
    }
  }
  auto tok = std::unique_ptr<Tokenizer>(new Tokenizer());
  const GgufValue* tokens = file.Find("tokenizer.ggml.tokens");
  const GgufValue* merges = file.Find("tokenizer.ggml.merges");
  if (tokens == nullptr || merges == nullptr) {
    return absl::InvalidArgumentError("GGUF tokenizer needs tokenizer.ggml.tokens and .merges");
  }
  ASSIGN_OR_RETURN(const GgufArray* token_arr, tokens->AsArray());
  ASSIGN_OR_RETURN(const GgufArray* merge_arr, merges->AsArray());
  tok->tokens_.reserve(token_arr->size());
  for (const GgufValue& v : *token_arr) {
    ASSIGN_OR_RETURN(std::string s, v.AsString());
    tok->token_ids_.emplace(s, static_cast<int32_t>(tok->tokens_.size()));
    tok->tokens_.push_back(std::move(s));
  }
  tok->token_types_.assign(tok->tokens_.size(), kTokenTypeNormal);
  if (const GgufValue* types = file.Find("tokenizer.ggml.token_type")) {
    ASSIGN_OR_RETURN(const GgufArray* arr, types->AsArray());
    if (arr->size() != tok->tokens_.size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tokenizer.ggml.token_type has %d entries, tokens has %d", arr->size(),
                          tok->tokens_.size()));
    }
    for (size_t i = 0; i < arr->size(); ++i) {
      const auto* v = std::get_if<int64_t>(&(*arr)[i].value);
      const auto* u = std::get_if<uint64_t>(&(*arr)[i].value);
      tok->token_types_[i] = static_cast<int32_t>(v ? *v : u ? *u : kTokenTypeNormal);
    }
  }
  for (size_t i = 0; i < merge_arr->size(); ++i) {
    ASSIGN_OR_RETURN(std::string m, (*merge_arr)[i].AsString());
    if (m.find(' ') == std::string::npos || m.find(' ') != m.rfind(' ')) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tokenizer.ggml.merges[%d] = '%s' is not 'left right'", i, m));
    }
    tok->merge_ranks_.emplace(std::move(m), static_cast<int32_t>(i));
  }
  for (int32_t id = 0; id < tok->vocab_size(); ++id) {
    if (tok->IsControl(id) || tok->token_types_[id] == kTokenTypeUserDefined) {
      if (!tok->tokens_[id].empty()) tok->specials_.push_back(id);
    }
  }
  std::stable_sort(tok->specials_.begin(), tok->specials_.end(), [&](int32_t a, int32_t b) {
    return tok->tokens_[a].size() > tok->tokens_[b].size();
  });
  auto id_or = [&](const char* key, int32_t def) -> absl::StatusOr<int32_t> {
    if (file.Find(key) == nullptr) return def;
    ASSIGN_OR_RETURN(uint64_t v, file.GetUint(key));
    if (v >= tok->tokens_.size()) {
      return absl::InvalidArgumentError(absl::StrFormat("%s = %d out of vocabulary", key, v));
    }
    return static_cast<int32_t>(v);
  };
  ASSIGN_OR_RETURN(tok->bos_id_, id_or("tokenizer.ggml.bos_token_id", -1));
  ASSIGN_OR_RETURN(tok->eos_id_, id_or("tokenizer.ggml.eos_token_id", -1));
  tok->eot_id_ = tok->TokenId("<|endoftext|>").value_or(-1);
  if (const GgufValue* v = file.Find("tokenizer.ggml.add_bos_token")) {
    ASSIGN_OR_RETURN(tok->add_bos_, v->AsBool());
  }
  return tok;
}

bool Tokenizer::IsControl(int32_t id) const {
  return id >= 0 && id < vocab_size() && token_types_[id] == kTokenTypeControl;
}

std::optional<int32_t> Tokenizer::TokenId(std::string_view text) const {
  auto it = token_ids_.find(absl::string_view(text.data(), text.size()));
  if (it == token_ids_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> Tokenizer::PreTokenize(std::string_view text) const {
  std::vector<std::string> out;
  for (auto [b, n] : Words(text)) out.emplace_back(text.substr(b, n));
  return out;
}

void Tokenizer::EncodeWord(std::string_view word, std::vector<int32_t>& out) const {
  const ByteMap& bm = Bytes();
  std::vector<std::string> syms;
  syms.reserve(word.size());
  for (unsigned char c : word) {
    std::string s;
    AppendUtf8(bm.to_cp[c], s);
    syms.push_back(std::move(s));
  }
  std::string key;
  while (syms.size() > 1) {
    int32_t best_rank = std::numeric_limits<int32_t>::max();
    size_t best = 0;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      key.assign(syms[i]).append(" ").append(syms[i + 1]);
      auto it = merge_ranks_.find(key);
      if (it != merge_ranks_.end() && it->second < best_rank) {
        best_rank = it->second;
        best = i;
      }
    }
    if (best_rank == std::numeric_limits<int32_t>::max()) break;
    syms[best] += syms[best + 1];
    syms.erase(syms.begin() + best + 1);
  }
  for (const std::string& s : syms) {
    if (auto id = TokenId(s)) {
      out.push_back(*id);
      continue;
    }
    // Unknown merged symbol: fall back to its bytes, each of which is a vocabulary token.
    for (const Utf8Char& c : DecodeUtf8(s)) {
      std::string one;
      AppendUtf8(c.cp, one);
      if (auto id = TokenId(one)) out.push_back(*id);
    }
  }
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  if (add_bos_ && bos_id_ >= 0) out.push_back(bos_id_);
  auto encode_plain = [&](std::string_view plain) {
    for (auto [b, n] : Words(plain)) EncodeWord(plain.substr(b, n), out);
  };
  size_t start = 0, pos = 0;
  while (parse_special && pos < text.size()) {
    int32_t match = -1;
    for (int32_t id : specials_) {
      const std::string& s = tokens_[id];
      if (text.compare(pos, s.size(), s) == 0) {
        match = id;
        break;
      }
    }
    if (match < 0) {
      ++pos;
      continue;
    }
    encode_plain(text.substr(start, pos - start));
    out.push_back(match);
    pos += tokens_[match].size();
    start = pos;
  }
  encode_plain(text.substr(start));
  return out;
}

std::string Tokenizer::TokenToPiece(int32_t id, bool render_special) const {
  if (id < 0 || id >= vocab_size()) return "";
  const int32_t type = token_types_[id];
  if (type == kTokenTypeControl) return render_special ? tokens_[id] : "";
  if (type == kTokenTypeUserDefined) return tokens_[id];
  std::string out;
  const ByteMap& bm = Bytes();
  for (const Utf8Char& c : DecodeUtf8(tokens_[id])) {
    if (c.cp < bm.to_byte.size() && bm.to_byte[c.cp] >= 0) {
      out += static_cast<char>(bm.to_byte[c.cp]);
    } else if (c.cp != kInvalidCodepoint) {
      AppendUtf8(c.cp, out);  // not a byte-level symbol: keep as text
    }
  }
  return out;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool render_special) const {
  std::string out;
  for (int32_t id : ids) out += TokenToPiece(id, render_special);
  return out;
}

std::string ApplyChatTemplate(std::span<const ChatMessage> messages, bool add_generation_prompt) {
  std::string out;
  if (!messages.empty() && messages[0].role != "system") {
    out +=
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n";
  }
  for (const ChatMessage& m : messages) {
    absl::StrAppend(&out, "<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n");
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace kvtier::engine
