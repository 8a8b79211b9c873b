#include "client/kvtierctl/status_view.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/kvtierctl/table.h"

namespace kvtier::ctl {
namespace {

std::string Percent(uint64_t part, uint64_t whole) {
  return whole == 0 ? "-" : absl::StrFormat("%.1f%%", 100.0 * part / whole);
}

std::string Rate(double per_second) { return absl::StrFormat("%.2f", per_second); }

std::string Degraded(uint64_t degraded, uint64_t plans) {
  return absl::StrCat(degraded, "/", plans);
}

uint64_t Saved(const v1::PlacementReport& r) {
  return r.full_bytes() > r.t0_bytes() ? r.full_bytes() - r.t0_bytes() : 0;
}

ViewRow WorkerRow(const v1::WorkerStatus& w, const std::vector<const v1::SequenceStatus*>& seqs,
                  bool redact) {
  ViewRow row;
  row.worker = true;
  uint64_t length = 0;
  for (const v1::SequenceStatus* s : seqs) {
    const v1::PlacementReport& r = s->report();
    row.tokens[0] += r.tokens_t0();
    row.tokens[1] += r.tokens_t1();
    row.tokens[2] += r.tokens_t2();
    row.tokens[3] += r.tokens_t3();
    row.hbm_saved += Saved(r);
    row.full_bytes += r.full_bytes();
    length += s->length();
  }
  row.cells = {absl::StrCat("w", w.worker_id()),
               redact ? w.model_name()
                      : absl::StrCat(w.worker_name(), " (", w.model_name(), ", pid ", w.pid(), ")"),
               absl::StrCat(length),
               HumanBytes(row.hbm_saved),
               absl::StrCat(row.tokens[0]),
               absl::StrCat(row.tokens[1]),
               absl::StrCat(row.tokens[2]),
               absl::StrCat(row.tokens[3]),
               HumanBytes(w.ddr_bytes() + w.compressed_bytes()),
               Rate(w.plans_per_second()),
               Degraded(w.degraded_plans(), w.plans()),
               "",
               HumanDuration(w.lease_age_ms()),
               HumanDuration(w.lease_remaining_ms())};
  return row;
}

ViewRow SequenceRow(const v1::SequenceStatus& s, bool redact) {
  const v1::PlacementReport& r = s.report();
  ViewRow row;
  row.tokens = {r.tokens_t0(), r.tokens_t1(), r.tokens_t2(), r.tokens_t3()};
  row.hbm_saved = Saved(r);
  row.full_bytes = r.full_bytes();
  row.cells = {absl::StrCat("  s", s.sequence_id()),
               redact ? absl::StrCat("  ", s.policy())
                      : absl::StrCat("  ", s.tag().empty() ? "-" : s.tag(), " (", s.policy(), ")"),
               absl::StrCat(s.length()),
               HumanBytes(row.hbm_saved),
               absl::StrCat(r.tokens_t0()),
               absl::StrCat(r.tokens_t1()),
               absl::StrCat(r.tokens_t2()),
               absl::StrCat(r.tokens_t3()),
               HumanBytes(s.ddr_bytes() + s.compressed_bytes()),
               Rate(s.plans_per_second()),
               Degraded(s.degraded_plans(), s.plans()),
               LostMassCell(s),
               "",
               ""};
  return row;
}

}  // namespace

std::string LostMassCell(const v1::SequenceStatus& s) {
  if (!s.has_lost_mass()) return "\u2014";
  return absl::StrFormat("%.2f%% (peak %.2f%%)", 100 * s.lost_mass().total(),
                         100 * s.lost_mass().peak_total());
}

std::string StatusJson(const v1::GetStatusResponse& s, bool multiline) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = multiline;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(s, &out, options);
  return out;
}

std::string HumanRate(double bytes_per_second) {
  static const char* kUnits[] = {"B/s", "kB/s", "MB/s", "GB/s", "TB/s"};
  int unit = 0;
  while (bytes_per_second >= 1000 && unit < 4) {
    bytes_per_second /= 1000;
    ++unit;
  }
  return absl::StrFormat(unit == 0 ? "%.0f %s" : "%.1f %s", bytes_per_second, kUnits[unit]);
}

StatusView BuildStatusView(const v1::GetStatusResponse& s, bool redact) {
  StatusView v;
  v.view = s.view();
  v.summary = {{"version", s.version()},
               {"uptime", HumanDuration(s.uptime_ms())},
               {"workers", absl::StrCat(s.workers())},
               {"sequences", absl::StrCat(s.sequences())},
               {"HBM saved", HumanBytes(s.hbm_saved_bytes())}};
  for (const v1::PoolStatus& p : s.pools()) {
    PoolView pool;
    pool.name = p.kind() == v1::POOL_KIND_DDR ? "DDR (T1)" : "compressed (T2)";
    pool.capacity = p.capacity_bytes();
    pool.used = p.used_bytes();
    pool.draining = p.draining_bytes();
    pool.reserved = p.reserved_bytes();
    pool.slots = p.slots_used();
    pool.text = absl::StrCat(
        HumanBytes(p.used_bytes()), " / ", HumanBytes(p.capacity_bytes()), " (",
        Percent(p.used_bytes(), p.capacity_bytes()), ")",
        p.draining_bytes() == 0 ? "" : absl::StrCat(", draining ", HumanBytes(p.draining_bytes())));
    v.pools.push_back(std::move(pool));
  }
  for (const v1::LinkStatus& l : s.links()) {
    v.links.push_back({l.link_id(), l.scope(), l.bytes_per_second(), l.granted_bytes_per_second(),
                       l.workers(), l.numa_node(),
                       absl::StrCat(HumanRate(l.granted_bytes_per_second()), " of ",
                                    HumanRate(l.bytes_per_second()), " granted to ", l.workers(),
                                    l.workers() == 1 ? " worker" : " workers")});
  }
  std::map<uint64_t, std::vector<const v1::SequenceStatus*>> by_worker;
  for (const v1::SequenceStatus& q : s.sequence_list()) by_worker[q.worker_id()].push_back(&q);
  for (auto& [id, seqs] : by_worker) {
    std::sort(seqs.begin(), seqs.end(),
              [](auto* a, auto* b) { return a->sequence_id() < b->sequence_id(); });
  }
  std::vector<const v1::WorkerStatus*> workers;
  for (const v1::WorkerStatus& w : s.worker_list()) workers.push_back(&w);
  std::sort(workers.begin(), workers.end(),
            [](auto* a, auto* b) { return a->worker_id() < b->worker_id(); });
  for (const v1::WorkerStatus* w : workers) {
    const auto& seqs = by_worker[w->worker_id()];
    v.rows.push_back(WorkerRow(*w, seqs, redact));
    for (const v1::SequenceStatus* q : seqs) v.rows.push_back(SequenceRow(*q, redact));
  }
  return v;
}

}  // namespace kvtier::ctl
