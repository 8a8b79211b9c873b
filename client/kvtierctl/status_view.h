#ifndef KVTIER_CLIENT_KVTIERCTL_STATUS_VIEW_H_
#define KVTIER_CLIENT_KVTIERCTL_STATUS_VIEW_H_

// The live view of a daemon's status, in one place for its two renderings: `kvtierctl top` (text,
// client/kvtierctl/top_command.h) and kvtierd's status page (HTML, daemon/kvtierd/status_page.h).
// Pure: a GetStatusResponse in, rows of display text out.

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kvtier/v1/kvtier.pb.h"

namespace kvtier::ctl {

// The columns of the worker/sequence table, in order.
inline constexpr std::array<const char*, 14> kViewColumns = {
    "ID", "NAME / TAG", "TOKENS",  "HBM SAVED", "T0",        "T1",        "T2",
    "T3", "DDR USED",   "PLANS/S", "DEGRADED",  "LOST MASS", "LEASE AGE", "LEASE LEFT"};

// One row: a worker, then each of its sequences beneath it.
struct ViewRow {
  bool worker = false;
  std::vector<std::string> cells;    // one per kViewColumns entry
  std::array<uint64_t, 4> tokens{};  // T0..T3, for the page's tier bar
  uint64_t hbm_saved = 0, full_bytes = 0;
};

// A pool's fill, for a bar: used and draining out of capacity.
struct PoolView {
  std::string name;  // "DDR (T1)" | "compressed (T2)"
  uint64_t capacity = 0, used = 0, draining = 0, reserved = 0, slots = 0;
  std::string text;  // "12.0 MiB / 1.0 GiB (1.2%)"
};

// A host link's grants, for a bar: granted out of what it carries.
struct LinkView {
  std::string link_id, scope;
  double bytes_per_second = 0, granted = 0;
  uint32_t workers = 0, numa_node = 0;
  std::string text;  // "1.2 GB/s of 25.0 GB/s granted to 2 workers"
};

struct StatusView {
  std::vector<std::pair<std::string, std::string>> summary;  // label, value
  std::vector<PoolView> pools;
  std::vector<LinkView> links;
  std::vector<ViewRow> rows;  // workers by id, each followed by its sequences by id
  std::string view;           // "all" | "own" | "none": what the lists cover
};

// `redact`: leave out what names a tenant's work (worker names, pids, sequence tags), for a page
// anyone who reaches the metrics address reads; ids, models, policies and figures stay.
StatusView BuildStatusView(const v1::GetStatusResponse& s, bool redact = false);

// A sequence's lost attention mass (the attention its T2/T3 positions did not get exactly) as its
// latest snapshot reported it, with the peak: "0.42% (peak 1.30%)"; "—" while it has sent none.
std::string LostMassCell(const v1::SequenceStatus& s);

// The status as JSON (proto field names, every field), for scripts.
std::string StatusJson(const v1::GetStatusResponse& s, bool multiline);

// "1.5 GB/s" (decimal, as links are rated).
std::string HumanRate(double bytes_per_second);

}  // namespace kvtier::ctl

#endif  // KVTIER_CLIENT_KVTIERCTL_STATUS_VIEW_H_
