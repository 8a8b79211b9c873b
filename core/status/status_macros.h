#ifndef KVTIER_CORE_STATUS_STATUS_MACROS_H_
#define KVTIER_CORE_STATUS_STATUS_MACROS_H_

// Status propagation helpers. Debian's Abseil (20220623) has no public versions of these.

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define KVTIER_STATUS_CONCAT_INNER_(a, b) a##b
#define KVTIER_STATUS_CONCAT_(a, b) KVTIER_STATUS_CONCAT_INNER_(a, b)

// RETURN_IF_ERROR(expr): returns the status of `expr` from the enclosing function when not OK.
#define RETURN_IF_ERROR(expr)                        \
  do {                                               \
    ::absl::Status kvtier_status_ = (expr);          \
    if (!kvtier_status_.ok()) return kvtier_status_; \
  } while (false)

// ASSIGN_OR_RETURN(lhs, expr): evaluates the StatusOr `expr`; on error returns its status,
// otherwise moves the value into `lhs` (which may be a declaration: `auto x`).
#define ASSIGN_OR_RETURN(lhs, expr) \
  KVTIER_ASSIGN_OR_RETURN_IMPL_(KVTIER_STATUS_CONCAT_(kvtier_statusor_, __LINE__), lhs, expr)

#define KVTIER_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // KVTIER_CORE_STATUS_STATUS_MACROS_H_
