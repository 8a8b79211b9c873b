#ifndef KVTIER_PYTHON_SRC_PROTO_DICT_H_
#define KVTIER_PYTHON_SRC_PROTO_DICT_H_

// kvtier.v1 messages as Python dicts, keyed by the proto's field names: integers stay ints
// (protobuf's JSON mapping would turn uint64 into strings), enums are their names, bytes are
// bytes. Dicts going in are parsed by protobuf's JSON parser, whose errors name the field.

#include <google/protobuf/message.h>
#include <nanobind/nanobind.h>

#include <string>

#include "absl/status/status.h"

namespace kvtier::python {

nanobind::object ProtoToPython(const google::protobuf::Message& message);
// INVALID_ARGUMENT "<what>: <the parser's message>" for an unknown field or a wrong type.
absl::Status PythonToProto(const nanobind::dict& dict, const char* what,
                           google::protobuf::Message* message);
nanobind::object JsonToPython(const std::string& json);

}  // namespace kvtier::python

#endif  // KVTIER_PYTHON_SRC_PROTO_DICT_H_
