#ifndef KVTIER_CLIENT_RPC_RPC_STATUS_H_
#define KVTIER_CLIENT_RPC_RPC_STATUS_H_

// The one place where absl::Status and grpc::Status meet (gRPC 1.51 cannot convert them).

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace kvtier::rpc {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace kvtier::rpc

#endif  // KVTIER_CLIENT_RPC_RPC_STATUS_H_
