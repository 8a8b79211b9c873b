#ifndef KVTIER_EDGE_RPC_STATUS_H_
#define KVTIER_EDGE_RPC_STATUS_H_

// The one place where absl::Status and grpc::Status meet (gRPC 1.51 cannot convert them).

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace kvtier::edge {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace kvtier::edge

#endif  // KVTIER_EDGE_RPC_STATUS_H_
