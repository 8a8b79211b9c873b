#include "python/src/proto_dict.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/json_util.h>
#include <nanobind/stl/string.h>

#include "absl/strings/str_cat.h"

namespace nb = nanobind;
namespace pb = google::protobuf;

namespace kvtier::python {
namespace {

nb::object Scalar(const pb::Message& m, const pb::FieldDescriptor* f, int index) {
  const pb::Reflection* r = m.GetReflection();
  const bool rep = index >= 0;
  using T = pb::FieldDescriptor;
  switch (f->cpp_type()) {
    case T::CPPTYPE_INT32:
      return nb::int_(rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f));
    case T::CPPTYPE_INT64:
      return nb::int_(rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f));
    case T::CPPTYPE_UINT32:
      return nb::int_(rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f));
    case T::CPPTYPE_UINT64:
      return nb::int_(rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f));
    case T::CPPTYPE_DOUBLE:
      return nb::float_(rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f));
    case T::CPPTYPE_FLOAT:
      return nb::float_(rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f));
    case T::CPPTYPE_BOOL:
      return nb::bool_(rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f));
    case T::CPPTYPE_ENUM:
      return nb::str((rep ? r->GetRepeatedEnum(m, f, index) : r->GetEnum(m, f))->name().c_str());
    case T::CPPTYPE_STRING: {
      const std::string s = rep ? r->GetRepeatedString(m, f, index) : r->GetString(m, f);
      if (f->type() == T::TYPE_BYTES) return nb::bytes(s.data(), s.size());
      return nb::str(s.data(), s.size());
    }
    case T::CPPTYPE_MESSAGE:
      return ProtoToPython(rep ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f));
  }
  return nb::none();
}

}  // namespace

nb::object ProtoToPython(const pb::Message& message) {
  const pb::Descriptor* d = message.GetDescriptor();
  const pb::Reflection* r = message.GetReflection();
  nb::dict out;
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    if (f->real_containing_oneof() != nullptr && !r->HasField(message, f)) continue;
    if (f->is_repeated()) {
      nb::list items;
      for (int j = 0; j < r->FieldSize(message, f); ++j) items.append(Scalar(message, f, j));
      out[f->name().c_str()] = items;
    } else {
      out[f->name().c_str()] = Scalar(message, f, -1);
    }
  }
  return out;
}

absl::Status PythonToProto(const nb::dict& dict, const char* what, pb::Message* message) {
  std::string json;
  try {
    // bytes fields travel as base64 in protobuf's JSON mapping.
    nb::object b64 = nb::module_::import_("base64");
    nb::object as_base64 = nb::cpp_function([b64](nb::handle o) -> nb::object {
      if (!PyBytes_Check(o.ptr())) {
        throw nb::type_error(
            absl::StrCat("a ", Py_TYPE(o.ptr())->tp_name, " is not a message value").c_str());
      }
      return b64.attr("b64encode")(o).attr("decode")("ascii");
    });
    json = nb::cast<std::string>(
        nb::module_::import_("json").attr("dumps")(dict, nb::arg("default") = as_base64));
  } catch (const nb::python_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", nb::cast<std::string>(nb::str(e.value()))));
  }
  pb::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status = pb::util::JsonStringToMessage(json, message, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", std::string(status.message().data(), status.message().size())));
  }
  return absl::OkStatus();
}

nb::object JsonToPython(const std::string& json) {
  return nb::module_::import_("json").attr("loads")(nb::str(json.data(), json.size()));
}

}  // namespace kvtier::python
