#ifndef KVTIER_CORE_TIERING_TYPES_H_
#define KVTIER_CORE_TIERING_TYPES_H_

// Vocabulary shared by the daemon, the worker and the evaluation: tiers, placements, moves.
// Pages are indexed per layer group; a placement of G groups × N pages is stored group-major
// (index = group * N + page), the same order the wire format uses.

#include <cstdint>
#include <string_view>
#include <vector>

namespace kvtier::tiering {

enum class Tier : uint8_t {
  kT0 = 0,  // device arena (HBM), full precision
  kT1 = 1,  // host DDR pool, full precision: exact after prefetch
  kT2 = 2,  // compressed host pool, 8-bit: approximate
  kT3 = 3,  // evicted: gone for good
};
inline constexpr int kNumTiers = 4;

constexpr std::string_view TierName(Tier t) {
  switch (t) {
    case Tier::kT0:
      return "T0";
    case Tier::kT1:
      return "T1";
    case Tier::kT2:
      return "T2";
    case Tier::kT3:
      return "T3";
  }
  return "T?";
}

// What a move does, from its source and destination tiers.
enum class MoveKind : uint8_t {
  kOffload,     // T0 -> T1
  kCompress,    // T0 or T1 -> T2
  kPromote,     // T1 or T2 -> T0 (lossy when from T2)
  kDecompress,  // T2 -> T1 (lossy: the page carries 8-bit error from now on)
  kEvict,       // any -> T3
};

constexpr MoveKind KindOf(Tier from, Tier to) {
  if (to == Tier::kT3) return MoveKind::kEvict;
  if (to == Tier::kT2) return MoveKind::kCompress;
  if (to == Tier::kT0) return MoveKind::kPromote;
  return from == Tier::kT0 ? MoveKind::kOffload : MoveKind::kDecompress;
}

// One page changing tier.
struct Move {
  uint32_t group = 0;
  uint32_t page = 0;
  Tier from = Tier::kT0;
  Tier to = Tier::kT0;
  // True when the page leaves T2 for T0 or T1: its contents carry 8-bit error from now on.
  bool lossy = false;
  friend bool operator==(const Move&, const Move&) = default;
};

// What the daemon knows of a sequence: token positions [0, length); prompt [0, prompt_tokens);
// generated [prompt_tokens, length).
struct SequenceState {
  uint64_t prompt_tokens = 0;
  uint64_t length = 0;  // tokens written
  // With protect_prompt, the prompt is protected from here on: 0 = the whole prompt, the start
  // of the last user turn = "protect the last user turn only".
  uint64_t protected_prompt_begin = 0;
};

// Where every page of one sequence lives: tiers[group * num_pages + page].
struct Placement {
  uint32_t num_groups = 1;
  uint32_t num_pages = 0;
  std::vector<Tier> tiers;

  Tier at(uint32_t group, uint32_t page) const { return tiers[size_t{group} * num_pages + page]; }
  Tier& at(uint32_t group, uint32_t page) { return tiers[size_t{group} * num_pages + page]; }
  friend bool operator==(const Placement&, const Placement&) = default;
};

}  // namespace kvtier::tiering

#endif  // KVTIER_CORE_TIERING_TYPES_H_
