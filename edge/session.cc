#include "edge/session.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvtier::edge {

absl::StatusOr<std::string> NewSecret() {
  std::string secret(kSecretBytes, '\0');
  size_t filled = 0;
  while (filled < secret.size()) {
    ssize_t n = getrandom(secret.data() + filled, secret.size() - filled, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::InternalError(absl::StrCat("getrandom: ", std::strerror(errno)));
    filled += static_cast<size_t>(n);
  }
  return secret;
}

bool SecretsEqual(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

}  // namespace kvtier::edge
