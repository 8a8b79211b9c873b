#include "bench/gpu/section_report.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace kvtier::bench {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(SectionReportTest, EverySectionIsWrittenAsSoonAsItEnds) {
  std::ostringstream out;
  const std::string path = ::testing::TempDir() + "/report-" + std::to_string(getpid()) + ".md";
  SectionReport report(&out, path);
  report.Preamble("## bench\n\n");
  report.Section("one", [&](std::ostream& md) {
    md << "figure 1\n";
    return absl::OkStatus();
  });
  // Before the second section starts, the first is out on both sinks.
  report.Section("two", [&](std::ostream&) {
    EXPECT_NE(out.str().find("figure 1"), std::string::npos);
    EXPECT_NE(ReadFile(path).find("figure 1"), std::string::npos);
    return absl::OkStatus();
  });
  EXPECT_EQ(report.Finish(), 0);
  EXPECT_EQ(ReadFile(path), out.str());
  EXPECT_NE(out.str().find("All 2 sections ran."), std::string::npos) << out.str();
  unlink(path.c_str());
}

TEST(SectionReportTest, AFailingSectionIsRecordedWithItsErrorAndTheRunGoesOn) {
  std::ostringstream out;
  SectionReport report(&out, "");
  bool later_ran = false;
  EXPECT_FALSE(report.Section("decode", [](std::ostream& md) {
    md << "| partial row |\n";
    return absl::InternalError("cudaMalloc: out of memory");
  }));
  EXPECT_TRUE(report.Section("targets", [&](std::ostream&) {
    later_ran = true;
    return absl::OkStatus();
  }));
  EXPECT_TRUE(later_ran);
  EXPECT_EQ(report.Finish(), 1);
  EXPECT_EQ(report.failed(), std::vector<std::string>{"decode"});
  EXPECT_NE(out.str().find("| partial row |\n\n**FAILED**: INTERNAL: cudaMalloc: out of memory"),
            std::string::npos)
      << out.str();
  EXPECT_NE(out.str().find("1 of 2 sections failed: decode."), std::string::npos) << out.str();
}

}  // namespace
}  // namespace kvtier::bench
