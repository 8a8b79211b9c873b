#ifndef KVTIER_EDGE_SESSION_H_
#define KVTIER_EDGE_SESSION_H_

// Session secrets and channel tickets: random bytes from the kernel's CSPRNG, compared in
// constant time. Neither is ever logged, shown in status or put in a metric.

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvtier::edge {

// 128 bits: a session secret and a channel ticket alike.
inline constexpr size_t kSecretBytes = 16;

// kSecretBytes from getrandom(2); INTERNAL if the kernel cannot supply them.
absl::StatusOr<std::string> NewSecret();

// True iff a and b are equal; the time taken depends on the lengths only.
bool SecretsEqual(absl::string_view a, absl::string_view b);

}  // namespace kvtier::edge

#endif  // KVTIER_EDGE_SESSION_H_
