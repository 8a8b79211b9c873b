#ifndef KVTIER_WORKER_RUNTIME_REPORT_JSON_H_
#define KVTIER_WORKER_RUNTIME_REPORT_JSON_H_

// A SequenceReport as the JSON object every front end prints: `kvtier-run generate --json`,
// the Python package's `TieredSequence.report()` and `TieredCache.report()`. One place names the
// keys, so scripts read the same figures whichever door produced them.

#include <nlohmann/json.hpp>

#include "worker/runtime/tiered_sequence.h"

namespace kvtier::worker {

nlohmann::json SequenceReportJson(const SequenceReport& report);

}  // namespace kvtier::worker

#endif  // KVTIER_WORKER_RUNTIME_REPORT_JSON_H_
