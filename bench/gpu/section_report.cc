#include "bench/gpu/section_report.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvtier::bench {

SectionReport::SectionReport(std::ostream* out, std::string markdown_path)
    : out_(out), markdown_path_(std::move(markdown_path)) {}

void SectionReport::Emit(const std::string& text) {
  text_ += text;
  *out_ << text << std::flush;
  if (!markdown_path_.empty()) std::ofstream(markdown_path_, std::ios::trunc) << text_;
}

void SectionReport::Preamble(const std::string& text) { Emit(text); }

bool SectionReport::Section(const std::string& title,
                            const std::function<absl::Status(std::ostream&)>& body) {
  ++sections_;
  std::ostringstream md;
  md << "### " << title << "\n\n";
  absl::Status s = body(md);
  if (!s.ok()) {
    md << "\n**FAILED**: " << s << "\n\n";
    failed_.push_back(title);
  }
  Emit(md.str());
  return s.ok();
}

int SectionReport::Finish() {
  Emit(failed_.empty() ? absl::StrCat("All ", sections_, " sections ran.\n")
                       : absl::StrCat(failed_.size(), " of ", sections_,
                                      " sections failed: ", absl::StrJoin(failed_, "; "), ".\n"));
  return failed_.empty() ? 0 : 1;
}

}  // namespace kvtier::bench
