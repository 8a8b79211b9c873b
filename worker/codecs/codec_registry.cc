#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/codecs/codec.h"

namespace kvtier::worker::codecs {

std::vector<std::string_view> CodecNames() {
  return {Int8KiviCodec().name, Fp8E4m3Codec().name, MinMaxCodec().name};
}

absl::StatusOr<const Codec*> FindCodec(std::string_view name) {
  for (const Codec* c : {&Int8KiviCodec(), &Fp8E4m3Codec(), &MinMaxCodec()}) {
    if (c->name == name) return c;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("codec must be one of [",
                   absl::StrJoin(CodecNames(), ", ",
                                 [](std::string* out, std::string_view n) { out->append(n); }),
                   "], got '", std::string(name), "'"));
}

}  // namespace kvtier::worker::codecs
