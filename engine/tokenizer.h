#ifndef KVTIER_ENGINE_TOKENIZER_H_
#define KVTIER_ENGINE_TOKENIZER_H_

// GPT-2 byte-level BPE tokenizer built from GGUF metadata (tokenizer.ggml.model = "gpt2"), with
// the "smollm" pre-tokenizer of llama.cpp: every \p{N} code point is split alone, then each
// fragment is split by the GPT-2 pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
// (implemented by hand, llama.cpp's custom-split semantics), then BPE merges by rank.
// Control tokens (e.g. <|im_start|>) written in the input become single tokens when
// `parse_special` is set.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/gguf.h"

namespace kvtier::engine {

// Immutable after construction: thread-safe.
class Tokenizer {
 public:
  // Reads tokenizer.ggml.{model,pre,tokens,token_type,merges,bos/eos_token_id,add_bos_token}.
  // INVALID_ARGUMENT for models other than gpt2, pre-tokenizers other than smollm (or its
  // llama.cpp aliases starcoder, refact, command-r, codeshell), or malformed tables.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& file);

  std::vector<int32_t> Encode(std::string_view text, bool parse_special = true) const;
  // Concatenated bytes of the tokens (may end inside a UTF-8 sequence). Control tokens are
  // rendered as their text when `render_special`, else skipped. Ids out of range are skipped.
  std::string Decode(std::span<const int32_t> ids, bool render_special = true) const;
  std::string TokenToPiece(int32_t id, bool render_special = true) const;

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  bool add_bos() const { return add_bos_; }
  // End of generation: eos, <|endoftext|> (id of that text when present).
  bool IsEndOfGeneration(int32_t id) const { return id == eos_id_ || id == eot_id_; }
  bool IsControl(int32_t id) const;
  // Id of a token whose vocabulary text is exactly `text`.
  std::optional<int32_t> TokenId(std::string_view text) const;

  // The pre-tokenizer's word boundaries for plain text (no special-token parsing); exposed
  // for tests.
  std::vector<std::string> PreTokenize(std::string_view text) const;

 private:
  Tokenizer() = default;
  void EncodeWord(std::string_view word, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;  // byte-level (GPT-2 mapped) text
  std::vector<int32_t> token_types_;
  absl::flat_hash_map<std::string, int32_t> token_ids_;
  absl::flat_hash_map<std::string, int32_t> merge_ranks_;  // "left right" -> rank
  std::vector<int32_t> specials_;  // control / user-defined ids, longest text first
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  int32_t eot_id_ = -1;
  bool add_bos_ = false;
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

// SmolLM2's ChatML template (the GGUF's tokenizer.chat_template): a default system message
// when the first message is not one, then "<|im_start|>{role}\n{content}<|im_end|>\n" per
// message, then "<|im_start|>assistant\n" when `add_generation_prompt`.
std::string ApplyChatTemplate(std::span<const ChatMessage> messages, bool add_generation_prompt);

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_TOKENIZER_H_
