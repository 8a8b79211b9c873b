#include "worker/cuda/staging_plan.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace kvtier::worker::cuda {

absl::StatusOr<StagingPlanner> StagingPlanner::Create(uint32_t num_slots,
                                                      uint32_t entries_per_slot) {
  if (num_slots == 0) return absl::InvalidArgumentError("num_slots must be > 0, got 0");
  if (entries_per_slot == 0) {
    return absl::InvalidArgumentError("entries_per_slot must be > 0, got 0");
  }
  return StagingPlanner(num_slots, entries_per_slot);
}

absl::StatusOr<LayerStagePlan> StagingPlanner::Plan(uint32_t layer,
                                                    absl::Span<const StageRequest> requests) {
  if (requests.size() > entries_per_slot_) {
    return absl::ResourceExhaustedError(absl::StrCat("layer ", layer, " needs ", requests.size(),
                                                     " staging entries; a slot has ",
                                                     entries_per_slot_));
  }
  absl::flat_hash_set<uint64_t> seen;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (!seen.insert(requests[i].page_id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("requests[", i, "].page_id ", requests[i].page_id, " is duplicated"));
    }
    if (requests[i].src_bytes == 0) {
      return absl::InvalidArgumentError(absl::StrCat("requests[", i, "].src_bytes is 0"));
    }
  }
  LayerStagePlan plan;
  plan.slot = SlotOfLayer(layer);
  Slot& slot = slots_[plan.slot];
  if (slot.layer != static_cast<int64_t>(layer)) slot.pages.clear();
  slot.layer = layer;
  // Keep what is still wanted and unchanged; everything else frees its entry.
  absl::flat_hash_map<uint64_t, Staged> kept;
  std::vector<bool> used(entries_per_slot_, false);
  for (const StageRequest& r : requests) {
    auto it = slot.pages.find(r.page_id);
    if (it != slot.pages.end() && it->second.version == r.version) {
      kept.emplace(r.page_id, it->second);
      used[it->second.entry] = true;
    }
  }
  plan.entry_of_request.resize(requests.size());
  std::vector<uint32_t> to_copy;
  for (uint32_t i = 0; i < requests.size(); ++i) {
    auto it = kept.find(requests[i].page_id);
    if (it != kept.end()) {
      plan.entry_of_request[i] = it->second.entry;
      ++plan.reused;
    } else {
      to_copy.push_back(i);
    }
  }
  // In source order, so that neighbours in the pool are neighbours in staging.
  std::stable_sort(to_copy.begin(), to_copy.end(), [&](uint32_t a, uint32_t b) {
    return std::make_pair(requests[a].source, requests[a].src_offset) <
           std::make_pair(requests[b].source, requests[b].src_offset);
  });
  uint32_t next_free = 0;
  for (uint32_t i : to_copy) {
    const StageRequest& r = requests[i];
    while (used[next_free]) ++next_free;  // fits: requests.size() <= entries
    used[next_free] = true;
    kept.emplace(r.page_id, Staged{next_free, r.version});
    plan.entry_of_request[i] = next_free;
    plan.copies.push_back({i, next_free, r.src_offset, r.src_bytes, r.source});
  }
  slot.pages = std::move(kept);
  return plan;
}

void StagingPlanner::Invalidate(uint64_t page_id) {
  for (Slot& slot : slots_) slot.pages.erase(page_id);
}

namespace {

// Appends [src, dst, bytes) to `out`, merging with the last run when contiguous on both sides,
// and cutting at multiples of `split` on the source side.
void Append(uint64_t src, uint64_t dst, uint64_t bytes, uint64_t split, std::vector<CopyRun>* out) {
  while (bytes > 0) {
    uint64_t n = bytes;
    if (split > 0) n = std::min(n, split - src % split);
    CopyRun* last = out->empty() ? nullptr : &out->back();
    const bool same_chunk =
        split == 0 || (last != nullptr && last->src_offset / split == src / split);
    if (last != nullptr && same_chunk && last->src_offset + last->bytes == src &&
        last->dst_offset + last->bytes == dst) {
      last->bytes += n;
    } else {
      out->push_back({src, dst, n});
    }
    src += n;
    dst += n;
    bytes -= n;
  }
}

}  // namespace

std::vector<CopyRun> CoalesceFullCopies(absl::Span<const StageCopy> copies, uint64_t entry_bytes,
                                        uint64_t src_split_bytes) {
  std::vector<CopyRun> out;
  for (const StageCopy& c : copies) {
    if (c.source != StageSource::kFull) continue;
    Append(c.src_offset, uint64_t{c.entry} * entry_bytes, c.bytes, src_split_bytes, &out);
  }
  return out;
}

std::vector<CopyRun> CoalesceRuns(absl::Span<const CopyRun> runs, uint64_t src_split_bytes) {
  std::vector<CopyRun> out;
  for (const CopyRun& r : runs) Append(r.src_offset, r.dst_offset, r.bytes, src_split_bytes, &out);
  return out;
}

namespace {

// Whether `r` is the next row of `g`: same size, both sides one pitch further, within the
// source chunk of g's first row.
bool ExtendsStrided(const StridedRun& g, const CopyRun& r, uint64_t split) {
  if (r.bytes != g.bytes || r.src_offset <= g.src_offset || r.dst_offset <= g.dst_offset) {
    return false;
  }
  if (split > 0 && g.src_offset / split != (r.src_offset + r.bytes - 1) / split) return false;
  const uint64_t src_pitch = g.rows == 1 ? r.src_offset - g.src_offset : g.src_pitch;
  const uint64_t dst_pitch = g.rows == 1 ? r.dst_offset - g.dst_offset : g.dst_pitch;
  if (src_pitch < g.bytes || dst_pitch < g.bytes || src_pitch > kMaxCopyPitch ||
      dst_pitch > kMaxCopyPitch) {
    return false;
  }
  return r.src_offset == g.src_offset + g.rows * src_pitch &&
         r.dst_offset == g.dst_offset + g.rows * dst_pitch;
}

}  // namespace

std::vector<StridedRun> GroupStrided(absl::Span<const CopyRun> runs, uint64_t src_split_bytes) {
  std::vector<StridedRun> out;
  for (const CopyRun& r : runs) {
    if (!out.empty() && ExtendsStrided(out.back(), r, src_split_bytes)) {
      StridedRun& g = out.back();
      if (g.rows == 1) {
        g.src_pitch = r.src_offset - g.src_offset;
        g.dst_pitch = r.dst_offset - g.dst_offset;
      }
      ++g.rows;
      continue;
    }
    out.push_back({r.src_offset, r.dst_offset, r.bytes, 1, 0, 0});
  }
  return out;
}

}  // namespace kvtier::worker::cuda
