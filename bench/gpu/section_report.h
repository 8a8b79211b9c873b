#ifndef KVTIER_BENCH_GPU_SECTION_REPORT_H_
#define KVTIER_BENCH_GPU_SECTION_REPORT_H_

// A markdown report written one section at a time: each section is printed and flushed (to the
// stream and the --markdown file) as soon as it ends, and a section that fails is recorded with
// its error instead of ending the run, so a run on a device machine that dies or times out half
// way still leaves every finished figure behind. Not thread-safe.

#include <functional>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace kvtier::bench {

class SectionReport {
 public:
  // `out` must outlive the report; `markdown_path` "" = no file (else rewritten per section).
  SectionReport(std::ostream* out, std::string markdown_path);

  // Text before the first section (title, device line), written at once.
  void Preamble(const std::string& text);
  // Runs `body`, which writes the section's markdown to the stream it is given; on an error the
  // section is kept as far as it got, followed by the error, and counted as failed.
  bool Section(const std::string& title, const std::function<absl::Status(std::ostream&)>& body);
  // The closing summary (which sections failed), written at once; the exit status of the run:
  // 0 when every section passed, 1 otherwise.
  int Finish();

  const std::vector<std::string>& failed() const { return failed_; }
  const std::string& text() const { return text_; }

 private:
  void Emit(const std::string& text);

  std::ostream* const out_;
  const std::string markdown_path_;
  std::string text_;
  int sections_ = 0;
  std::vector<std::string> failed_;
};

}  // namespace kvtier::bench

#endif  // KVTIER_BENCH_GPU_SECTION_REPORT_H_
