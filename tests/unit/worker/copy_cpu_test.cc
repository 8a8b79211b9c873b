#include "worker/kernels/copy_cpu.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier::worker::kernels {
namespace {

TEST(CopyPageTest, CopiesExactlyTheBytesForAnySizeAndAlignment) {
  std::vector<uint8_t> src(70000), dst(70000 + 64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t bytes : {0ul, 1ul, 100ul, 4096ul, 4097ul, 5000ul, 65536ul, 69999ul}) {
    for (size_t dst_off : {0ul, 1ul, 32ul}) {
      std::fill(dst.begin(), dst.end(), 0xEE);
      uint8_t* d = dst.data() + dst_off;
      CopyPage(d, src.data() + 3, std::min(bytes, src.size() - 3));
      const size_t n = std::min(bytes, src.size() - 3);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(d[i], src[3 + i]) << bytes << " " << i;
      ASSERT_EQ(d[n], 0xEE) << "wrote past the end";
      if (dst_off > 0) {
        ASSERT_EQ(dst[dst_off - 1], 0xEE) << "wrote before the start";
      }
    }
  }
}

}  // namespace
}  // namespace kvtier::worker::kernels
