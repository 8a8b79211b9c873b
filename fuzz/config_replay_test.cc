// The config fuzz target without libFuzzer: the packaged config mutated line by line (values
// swapped for others of every type, lines dropped, duplicated or cut, bytes flipped). Counts how
// many inputs parsed, so the test fails if the mutations never produce a valid config either.

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "daemon/config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

TEST(ConfigFuzzReplay, MutatedConfigsParseOrNameTheirError) {
  const std::vector<std::string> base =
      absl::StrSplit(std::string(kvtier::daemon::DefaultConfigText()), '\n');
  const std::vector<std::string> values = {
      "0",      "-1",        "1",        "99999999999999999999",
      "\"\"",   "\"0777\"",  "\"0660\"", "[]",
      "[0, 1]", "[\"x\"]",   "1.5",      "true",
      "\"/x\"", "{ a = 1 }", "0.9",      "2000",
      "100",    "\"debug\"", "\"a/b\"",  "[-5]"};
  std::mt19937_64 rng(20261201);
  int parsed = 0, refused = 0;
  for (int i = 0; i < 5000; ++i) {
    std::vector<std::string> lines = base;
    for (int k = 1 + static_cast<int>(rng() % 4); k > 0; --k) {
      std::string& line = lines[rng() % lines.size()];
      const size_t eq = line.find(" = ");
      switch (rng() % 5) {
        case 0:
          if (eq != std::string::npos)
            line = line.substr(0, eq + 3) + values[rng() % values.size()];
          break;
        case 1:
          line.clear();
          break;
        case 2:
          lines.push_back(line);  // a duplicate key, or a second table header
          break;
        case 3:
          line = line.substr(0, rng() % (line.size() + 1));
          break;
        default:
          if (!line.empty()) line[rng() % line.size()] = static_cast<char>(rng());
      }
    }
    const std::string text = absl::StrJoin(lines, "\n");
    ASSERT_EQ(LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(text.data()), text.size()),
              0);
    (kvtier::daemon::ParseConfig(text, "fuzz.toml").ok() ? parsed : refused)++;
  }
  std::printf("configs parsed %d, refused with a named error %d\n", parsed, refused);
  EXPECT_GT(parsed, 200);
  EXPECT_GT(refused, 200);
}

}  // namespace
