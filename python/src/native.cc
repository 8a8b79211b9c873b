// kvtier._native: the Python binding of libkvtier_worker (WorkerRuntime, TieredSequence) and
// libkvtier_client (WorkerClient). Arrays cross by DLPack or the buffer protocol without copies
// (numpy, torch); every check names the argument and what it got. absl errors become the
// exceptions of kvtier.errors, with the C++ message.

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <unistd.h>

#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "kvtier/client.h"
#include "python/src/block_binding.h"
#include "python/src/proto_dict.h"
#include "worker/kv_backend.h"
#include "worker/runtime/report_json.h"
#include "worker/runtime/worker_runtime.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace kvtier::python {
namespace {

// The exception classes, made at import (MakeErrors): one per absl code users act on.
struct Errors {
  PyObject* base = nullptr;  // kvtier.Error (RuntimeError)
  PyObject* invalid_argument = nullptr;
  PyObject* not_found = nullptr;
  PyObject* permission_denied = nullptr;
  PyObject* unavailable = nullptr;
  PyObject* resource_exhausted = nullptr;
  PyObject* failed_precondition = nullptr;
};
Errors errors;

struct StatusError {
  absl::Status status;
};

void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) throw StatusError{status};
}
template <typename T>
T ValueOrThrow(absl::StatusOr<T> v) {
  ThrowIfError(v.status());
  return *std::move(v);
}

// Every UnavailableError names the daemon it could not reach (a refused connect, a broken pipe
// and a deadline read alike otherwise).
absl::Status NamingDaemon(absl::Status s, const std::string& address) {
  const bool unreachable =
      s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kDeadlineExceeded;
  const absl::string_view path = absl::StripPrefix(address, "unix:");
  if (!unreachable || address.empty() || absl::StrContains(s.message(), path)) return s;
  return absl::Status(s.code(), absl::StrCat("kvtierd at ", address, ": ", s.message()));
}
void ThrowIfError(const absl::Status& status, const std::string& address) {
  if (!status.ok()) ThrowIfError(NamingDaemon(status, address));
}
template <typename T>
T ValueOrThrow(absl::StatusOr<T> v, const std::string& address) {
  ThrowIfError(v.status(), address);
  return *std::move(v);
}

PyObject* ErrorClassFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return errors.invalid_argument;
    case absl::StatusCode::kNotFound:
      return errors.not_found;
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
      return errors.permission_denied;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return errors.unavailable;
    case absl::StatusCode::kResourceExhausted:
      return errors.resource_exhausted;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAborted:
      return errors.failed_precondition;
    default:
      return errors.base;
  }
}

PyObject* NewError(nb::module_& m, const char* name, PyObject* also) {
  const std::string qualified = absl::StrCat("kvtier._native.", name);
  PyObject* bases = also != nullptr ? PyTuple_Pack(2, errors.base, also) : nullptr;
  PyObject* cls = PyErr_NewException(qualified.c_str(), bases ? bases : errors.base, nullptr);
  Py_XDECREF(bases);
  m.attr(name) = nb::handle(cls);
  return cls;
}

void MakeErrors(nb::module_& m) {
  errors.base = PyErr_NewException("kvtier._native.Error", PyExc_RuntimeError, nullptr);
  m.attr("Error") = nb::handle(errors.base);
  errors.invalid_argument = NewError(m, "InvalidArgumentError", PyExc_ValueError);
  errors.not_found = NewError(m, "NotFoundError", PyExc_LookupError);
  errors.permission_denied = NewError(m, "PermissionDeniedError", PyExc_PermissionError);
  errors.unavailable = NewError(m, "UnavailableError", PyExc_ConnectionError);
  errors.resource_exhausted = NewError(m, "ResourceExhaustedError", PyExc_MemoryError);
  errors.failed_precondition = NewError(m, "FailedPreconditionError", nullptr);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& e) {
      PyObject* cls = ErrorClassFor(e.status.code());
      nb::object value =
          nb::steal(PyObject_CallFunction(cls, "s", std::string(e.status.message()).c_str()));
      if (!value.is_valid()) return;  // the call set its own error
      PyObject_SetAttrString(value.ptr(), "code",
                             nb::str(absl::StatusCodeToString(e.status.code()).c_str()).ptr());
      PyErr_SetObject(cls, value.ptr());
    }
  });
}

// ---- arrays: f32, CPU, C-contiguous, of the shape the kernel reads ----

using Array = nb::ndarray<nb::device::cpu>;

std::string ShapeString(const nb::ndarray<>& a) {
  std::vector<int64_t> dims;
  for (size_t i = 0; i < a.ndim(); ++i) dims.push_back(a.shape(i));
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

// Throws TypeError / ValueError naming `what` unless `a` is float32 on the CPU, C-contiguous,
// with `dims` (-1: any size). Returns its data.
float* CheckedFloats(const nb::ndarray<>& a, const char* what, std::vector<int64_t> dims) {
  if (a.device_type() != nb::device::cpu::value) {
    throw nb::type_error(
        absl::StrCat(what,
                     ": kvtier's kernel reads host memory; got a tensor on another "
                     "device (move it with .cpu(), or use the CUDA backend: docs/python.md)")
            .c_str());
  }
  if (a.dtype() != nb::dtype<float>()) {
    throw nb::type_error(absl::StrCat(what, ": needs float32, got dtype code ",
                                      static_cast<int>(a.dtype().code), " of ", a.dtype().bits,
                                      " bits")
                             .c_str());
  }
  bool ok = a.ndim() == dims.size();
  for (size_t i = 0; ok && i < dims.size(); ++i)
    ok = dims[i] < 0 || static_cast<int64_t>(a.shape(i)) == dims[i];
  if (!ok) {
    std::vector<std::string> want;
    for (int64_t d : dims) want.push_back(d < 0 ? "n" : absl::StrCat(d));
    throw nb::value_error(
        absl::StrCat(what, ": needs shape [", absl::StrJoin(want, ", "), "], got ", ShapeString(a))
            .c_str());
  }
  int64_t expect = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expect) {
      throw nb::value_error(
          absl::StrCat(what, ": needs a C-contiguous array (call .contiguous())").c_str());
    }
    expect *= a.shape(i);
  }
  return static_cast<float*>(a.data());
}

// A float32 CPU array of shape [heads, n, head_dim] (transformers' layout, one batch row) with
// any positive strides but contiguous head_dim values, as the kernel reads it in place.
struct HeadsFirst {
  const float* data = nullptr;
  uint32_t n = 0;
  worker::RowStrides strides;  // dense ({}) when the view is [n][heads][head_dim] in memory
};

HeadsFirst CheckedHeadsFirst(const nb::ndarray<>& a, const char* what, int64_t heads, int64_t d) {
  if (a.device_type() != nb::device::cpu::value || a.dtype() != nb::dtype<float>() ||
      a.ndim() != 3 || static_cast<int64_t>(a.shape(0)) != heads ||
      static_cast<int64_t>(a.shape(2)) != d) {
    throw nb::value_error(absl::StrCat(what, ": needs a float32 CPU array of shape [", heads,
                                       ", n, ", d, "] (heads first), got ", ShapeString(a))
                              .c_str());
  }
  // A zero stride (a broadcast view) of a dimension that has several entries is refused: the
  // kernel reads 0 as "dense".
  if ((d > 1 && a.stride(2) != 1) || (heads > 1 && a.stride(0) <= 0) ||
      (a.shape(1) > 1 && a.stride(1) <= 0)) {
    throw nb::value_error(absl::StrCat(what,
                                       ": head_dim must be contiguous and the other "
                                       "strides positive (call .contiguous()), got [",
                                       a.stride(0), ", ", a.stride(1), ", ", a.stride(2), "]")
                              .c_str());
  }
  HeadsFirst view{static_cast<const float*>(a.data()), static_cast<uint32_t>(a.shape(1)), {}};
  const uint64_t head = heads > 1 ? a.stride(0) : d, token = view.n > 1 ? a.stride(1) : heads * d;
  if (head != static_cast<uint64_t>(d) || token != static_cast<uint64_t>(heads * d)) {
    view.strides = {token, head};
  }
  return view;
}

template <typename T>
nb::ndarray<nb::numpy, T, nb::ndim<1>> NumpyOf(std::vector<T> values) {
  auto* owned = new std::vector<T>(std::move(values));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T, nb::ndim<1>>(owned->data(), {owned->size()}, owner);
}

// ---- the runtime and its sequences ----

class Sequence;

class Runtime {
 public:
  explicit Runtime(worker::RuntimeOptions options) : options_(std::move(options)) {
    nb::gil_scoped_release release;  // registering may wait for the daemon
    runtime_ = ValueOrThrow(worker::WorkerRuntime::Create(options_), options_.daemon_address);
  }
  std::unique_ptr<Sequence> Open(const worker::SequenceOptions& options);
  const worker::RuntimeOptions& options() const { return options_; }
  bool daemon_mode() const { return runtime_->daemon_mode(); }
  uint64_t worker_id() const { return daemon_mode() ? runtime_->client()->worker_id() : 0; }
  uint64_t arena_used_bytes() const { return runtime_->arena().used_bytes(); }

 private:
  worker::RuntimeOptions options_;
  std::unique_ptr<worker::WorkerRuntime> runtime_;
};

// Not thread-safe, like TieredSequence: the GIL is held across every call on it.
class Sequence {
 public:
  Sequence(std::unique_ptr<worker::TieredSequence> seq, const worker::AttentionShape& shape,
           std::string daemon)
      : seq_(std::move(seq)), shape_(shape), daemon_(std::move(daemon)) {}

  void Append(uint32_t layer, const nb::ndarray<>& k, const nb::ndarray<>& v) {
    const int64_t kvh = shape_.num_kv_heads, d = shape_.head_dim;
    const float* kp = CheckedFloats(k, "k", {-1, kvh, d});
    const float* vp = CheckedFloats(v, "v", {-1, kvh, d});
    if (k.shape(0) != v.shape(0)) {
      throw nb::value_error(
          absl::StrCat("k has ", k.shape(0), " tokens but v has ", v.shape(0)).c_str());
    }
    ThrowIfError(CheckLayer(layer));
    ThrowIfError(Live()->Append(layer, kp, vp, static_cast<uint32_t>(k.shape(0))));
  }

  void Attend(uint32_t layer, const nb::ndarray<>& q, const nb::ndarray<>& out,
              const std::optional<nb::ndarray<>>& mass, uint32_t window, float softcap) {
    const int64_t h = shape_.num_q_heads, d = shape_.head_dim;
    const float* qp = CheckedFloats(q, "q", {-1, h, d});
    float* op = CheckedFloats(out, "out", {static_cast<int64_t>(q.shape(0)), h, d});
    ThrowIfError(CheckLayer(layer));
    float* mp = nullptr;
    if (mass.has_value()) mp = CheckedFloats(*mass, "mass", {Live()->Length(layer)});
    ThrowIfError(Live()->Attend(layer, qp, static_cast<uint32_t>(q.shape(0)), op, mp,
                                worker::AttendMask{window, softcap}));
  }

  // Append and Attend on transformers' [heads, n, head_dim] views of one batch row, read
  // where they lie (RowStrides): the same results, bit for bit, as on contiguous copies.
  void AppendHeadsFirst(uint32_t layer, const nb::ndarray<>& k, const nb::ndarray<>& v) {
    const int64_t kvh = shape_.num_kv_heads, d = shape_.head_dim;
    const HeadsFirst kv = CheckedHeadsFirst(k, "k", kvh, d);
    const HeadsFirst vv = CheckedHeadsFirst(v, "v", kvh, d);
    if (kv.n != vv.n) {
      throw nb::value_error(absl::StrCat("k has ", kv.n, " tokens but v has ", vv.n).c_str());
    }
    ThrowIfError(CheckLayer(layer));
    ThrowIfError(Live()->Append(layer, kv.data, kv.strides, vv.data, vv.strides, kv.n));
  }

  void AttendHeadsFirst(uint32_t layer, const nb::ndarray<>& q, const nb::ndarray<>& out,
                        const std::optional<nb::ndarray<>>& mass, uint32_t window, float softcap) {
    const int64_t h = shape_.num_q_heads, d = shape_.head_dim;
    const HeadsFirst qv = CheckedHeadsFirst(q, "q", h, d);
    float* op = CheckedFloats(out, "out", {static_cast<int64_t>(qv.n), h, d});
    ThrowIfError(CheckLayer(layer));
    float* mp = nullptr;
    if (mass.has_value()) mp = CheckedFloats(*mass, "mass", {Live()->Length(layer)});
    ThrowIfError(Live()->Attend(layer, qv.data, qv.n, op, mp, worker::AttendMask{window, softcap},
                                qv.strides));
  }

  uint32_t Length(uint32_t layer) const {
    ThrowIfError(CheckLayer(layer));
    return Live()->Length(layer);
  }
  void Retier() { ThrowIfError(Live()->Retier()); }
  void Truncate(uint32_t length) {
    nb::gil_scoped_release release;  // a rollback below kvtierd's length re-opens: an RPC
    ThrowIfError(Live()->Truncate(length), daemon_);
  }
  nb::object Report() const {
    return JsonToPython(worker::SequenceReportJson(Live()->Report()).dump());
  }
  // Cumulative score per position of layer group `group` (frozen for evicted positions).
  nb::ndarray<nb::numpy, float, nb::ndim<1>> Scores(uint32_t group) const {
    const auto& scores = Live()->scores();
    if (group >= scores.layer_groups()) {
      ThrowIfError(absl::InvalidArgumentError(
          absl::StrCat("group ", group, " is out of range: ", scores.layer_groups(), " groups")));
    }
    auto span = scores.TokenScores(group);
    return NumpyOf(std::vector<float>(span.begin(), span.end()));
  }
  // The tier (0..3) of every position of layer group `group`, by its page.
  nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>> Tiers(uint32_t group) const {
    const worker::TieredKvStore& store = Live()->store();
    if (group >= store.geometry().layer_groups) {
      ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
          "group ", group, " is out of range: ", store.geometry().layer_groups, " groups")));
    }
    const uint32_t length = store.Length(0), page_tokens = store.geometry().page_tokens;
    std::vector<uint8_t> tiers(length);
    for (uint32_t p = 0; p < length; ++p) {
      tiers[p] = static_cast<uint8_t>(store.TierOf(group, p / page_tokens));
    }
    return NumpyOf(std::move(tiers));
  }
  bool daemon_backed() const { return Live()->daemon_backed(); }
  uint64_t rejoins() const { return Live()->rejoins(); }
  bool closed() const { return seq_ == nullptr; }
  // Frees the sequence's memory now (the daemon's slots included); later calls raise.
  void Close() {
    nb::gil_scoped_release release;
    seq_.reset();
  }

 private:
  worker::TieredSequence* Live() const {
    if (seq_ == nullptr) {
      ThrowIfError(absl::FailedPreconditionError("the sequence is closed"));
    }
    return seq_.get();
  }
  absl::Status CheckLayer(uint32_t layer) const {
    if (layer < shape_.num_layers) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " is out of range: the model has ", shape_.num_layers));
  }

  std::unique_ptr<worker::TieredSequence> seq_;
  worker::AttentionShape shape_;
  std::string daemon_;  // kvtierd's address, for errors ("" = local pools)
};

std::unique_ptr<Sequence> Runtime::Open(const worker::SequenceOptions& options) {
  std::unique_ptr<worker::TieredSequence> seq;
  {
    nb::gil_scoped_release release;  // opening in daemon mode is an RPC
    seq = ValueOrThrow(runtime_->Open(options), options_.daemon_address);
  }
  return std::make_unique<Sequence>(std::move(seq), options_.attention, options_.daemon_address);
}

// ---- the client of kvtierd, for engines that drive their own data plane ----

class Client {
 public:
  Client(const std::string& address, const nb::dict& registration, double rpc_deadline_ms,
         bool background_heartbeat, int heartbeat_priority, int64_t daemon_uid) {
    ClientOptions options;
    options.daemon_uid = daemon_uid;
    options.address = address;
    address_ = address;
    options.rpc_deadline = absl::Milliseconds(rpc_deadline_ms);
    options.background_heartbeat = background_heartbeat;
    options.heartbeat_priority = heartbeat_priority;
    ThrowIfError(PythonToProto(registration, "registration", &options.registration));
    nb::gil_scoped_release release;
    client_ = ValueOrThrow(WorkerClient::Connect(options), address_);
  }
  uint64_t worker_id() const { return client_->worker_id(); }
  uint64_t generation() const { return client_->generation(); }
  bool connected() const { return client_->connected(); }
  bool heartbeat_realtime() const { return client_->heartbeat_realtime(); }
  double lease_ttl_s() const { return absl::ToDoubleSeconds(client_->lease_ttl()); }

  uint64_t OpenSequence(uint64_t prompt_tokens, const nb::dict& policy, const std::string& tag) {
    v1::PolicyConfig config;
    ThrowIfError(PythonToProto(policy, "policy", &config));
    nb::gil_scoped_release release;
    return ValueOrThrow(client_->OpenSequence(prompt_tokens, config, tag), address_);
  }
  nb::object SubmitSnapshot(const nb::dict& snapshot) {
    v1::SubmitSnapshotRequest request;
    ThrowIfError(PythonToProto(snapshot, "snapshot", &request));
    v1::TierPlan plan;
    {
      nb::gil_scoped_release release;
      plan = ValueOrThrow(client_->SubmitSnapshot(std::move(request)), address_);
    }
    return ProtoToPython(plan);
  }
  void AckPlan(uint64_t sequence_id, uint64_t plan_version, bool applied,
               const std::string& error) {
    nb::gil_scoped_release release;
    ThrowIfError(client_->AckPlan(sequence_id, plan_version, applied, error), address_);
  }
  void CloseSequence(uint64_t sequence_id) {
    nb::gil_scoped_release release;
    ThrowIfError(client_->CloseSequence(sequence_id), address_);
  }
  nb::object Status(bool workers, bool sequences) {
    v1::GetStatusResponse status;
    {
      nb::gil_scoped_release release;
      status = ValueOrThrow(client_->GetStatus(workers, sequences), address_);
    }
    return ProtoToPython(status);
  }
  void Heartbeat() {
    nb::gil_scoped_release release;
    ThrowIfError(client_->HeartbeatOnce(), address_);
  }
  void Close() {
    nb::gil_scoped_release release;
    client_.reset();  // CloseWorker: the daemon frees this worker's memory now
  }

 private:
  std::string address_;
  std::unique_ptr<WorkerClient> client_;
};

}  // namespace
}  // namespace kvtier::python

using namespace kvtier::python;  // NOLINT: the module's definitions below

NB_MODULE(_native, m) {
  m.doc() = "kvtier's C++ libraries: the worker runtime (tiered sequences) and kvtierd's client";
  MakeErrors(m);
  BindBlocks(m, [](const absl::Status& status) { ThrowIfError(status); });

  nb::class_<Runtime>(m, "Runtime",
                      "The memory every sequence of this process shares: a T0 arena and the "
                      "daemon's pools (daemon='unix:...') or local ones (daemon='').")
      .def(
          "__init__",
          [](Runtime* self, uint32_t num_layers, uint32_t num_q_heads, uint32_t num_kv_heads,
             uint32_t head_dim, float scale, uint32_t page_tokens, const std::string& codec,
             const std::string& daemon, const std::string& worker_name, uint64_t arena_bytes,
             uint64_t ddr_bytes, uint64_t compressed_bytes, const nb::dict& link) {
            if (num_q_heads == 0 || num_kv_heads == 0 || num_q_heads % num_kv_heads != 0) {
              ThrowIfError(absl::InvalidArgumentError(
                  absl::StrCat("num_q_heads ", num_q_heads, " must be a positive multiple of ",
                               "num_kv_heads ", num_kv_heads)));
            }
            kvtier::worker::RuntimeOptions o;
            o.attention = {.num_layers = num_layers,
                           .num_q_heads = num_q_heads,
                           .num_kv_heads = num_kv_heads,
                           .head_dim = head_dim,
                           .scale = scale};
            o.page_tokens = page_tokens;
            o.codec = codec;
            o.daemon_address = daemon;
            o.worker_name = worker_name;
            o.arena_bytes = arena_bytes;
            o.local_ddr_bytes = ddr_bytes;
            o.local_compressed_bytes = compressed_bytes;
            ThrowIfError(PythonToProto(link, "link", &o.link));
            new (self) Runtime(std::move(o));
          },
          "num_layers"_a, "num_q_heads"_a, "num_kv_heads"_a, "head_dim"_a, "scale"_a, nb::kw_only(),
          "page_tokens"_a = 16, "codec"_a = "int8_kivi", "daemon"_a = "",
          "worker_name"_a = "kvtier-python", "arena_bytes"_a = 8ull << 30,
          "ddr_bytes"_a = 2ull << 30, "compressed_bytes"_a = 1ull << 30, "link"_a = nb::dict(),
          "link: the host link to declare to kvtierd for prefetch schedules, a kvtier.v1.HostLink "
          "as a dict ({'link_id': 'sw0', 'link_bytes_per_second': 25e9, 'staging_bytes': ...}); "
          "empty = none")
      .def(
          "open",
          [](Runtime& r, const std::string& policy, uint64_t prompt_tokens, double hbm_ratio,
             double evict_ratio, double compress_ratio, uint32_t sink_tokens,
             uint32_t window_tokens, bool protect_prompt, uint32_t retier_interval,
             const std::string& tag, uint64_t protected_prompt_begin, double max_lost_mass,
             bool wait_for_plans) {
            kvtier::worker::SequenceOptions o;
            o.policy = policy;
            o.prompt_tokens = prompt_tokens;
            o.protected_prompt_begin = protected_prompt_begin;
            o.tag = tag;
            o.wait_for_plans = wait_for_plans;
            o.tiering.page_tokens = r.options().page_tokens;
            o.tiering.sink_tokens = sink_tokens;
            o.tiering.window_tokens = window_tokens;
            o.tiering.protect_prompt = protect_prompt;
            o.tiering.retier_interval = retier_interval;
            o.tiering.budgets = {.evict_ratio = evict_ratio,
                                 .hbm_ratio = hbm_ratio,
                                 .compress_ratio = compress_ratio,
                                 .max_lost_mass = max_lost_mass};
            return r.Open(o);
          },
          nb::kw_only(), "policy"_a = "hierarchy", "prompt_tokens"_a, "hbm_ratio"_a = 1.0,
          "evict_ratio"_a = 0.0, "compress_ratio"_a = 0.0, "sink_tokens"_a = 4,
          "window_tokens"_a = 128, "protect_prompt"_a = true, "retier_interval"_a = 64,
          "tag"_a = "", "protected_prompt_begin"_a = 0,
          "max_lost_mass"_a = std::numeric_limits<double>::infinity(), "wait_for_plans"_a = false,
          nb::keep_alive<0, 1>(),
          "A new tiered sequence; its prompt is [0, prompt_tokens). With protect_prompt, the "
          "prompt from protected_prompt_begin on stays in T0 (the start of the last user turn "
          "protects that turn only). max_lost_mass: ε, evict only while the evicted pages' "
          "estimated attention mass per step stays at most this (inf = no limit, 0 = no "
          "eviction). wait_for_plans (daemon mode): each plan is applied at its re-tiering step, "
          "as local pools do (one round trip there), so placement and tokens do not depend on "
          "the daemon's timing.")
      .def_prop_ro("daemon_mode", &Runtime::daemon_mode)
      .def_prop_ro("worker_id", &Runtime::worker_id)
      .def_prop_ro("arena_used_bytes", &Runtime::arena_used_bytes);

  nb::class_<Sequence>(m, "TieredSequence",
                       "One sequence's KV over the tiers: append a layer's K/V, attend (which "
                       "accumulates the cumulative attention score), re-tier, report.")
      .def("append", &Sequence::Append, "layer"_a, "k"_a, "v"_a,
           "Stores post-RoPE K and V of n new tokens: float32 [n, kv_heads, head_dim].")
      .def("attend", &Sequence::Attend, "layer"_a, "q"_a, "out"_a, "mass"_a = nb::none(),
           nb::kw_only(), "window"_a = 0, "softcap"_a = 0.f,
           "Causal attention of the last n appended positions of `layer` over every live "
           "position: q, out float32 [n, q_heads, head_dim]; mass, when given, float32 "
           "[length] receives each position's softmax weight summed over heads and queries. "
           "window > 0: the query at position P attends only positions > P - window; "
           "softcap > 0: scores become softcap * tanh(score / softcap) before the softmax. "
           "After the last layer the step ends (and re-tiers on a re-tiering step).")
      .def("append_heads_first", &Sequence::AppendHeadsFirst, "layer"_a, "k"_a, "v"_a,
           "append() on float32 [kv_heads, n, head_dim] views (transformers' layout of one "
           "batch row: key[row]), any strides with contiguous head_dim: read in place, no copy.")
      .def("attend_heads_first", &Sequence::AttendHeadsFirst, "layer"_a, "q"_a, "out"_a,
           "mass"_a = nb::none(), nb::kw_only(), "window"_a = 0, "softcap"_a = 0.f,
           "attend() with q a float32 [q_heads, n, head_dim] view (query[row]), any strides "
           "with contiguous head_dim, read in place; out stays [n, q_heads, head_dim] "
           "C-contiguous (what transformers' attention returns). Bit-identical to attend() on "
           "a contiguous copy.")
      .def("length", &Sequence::Length, "layer"_a = 0)
      .def("retier", &Sequence::Retier, "Re-tiers now, whatever the step.")
      .def("truncate", &Sequence::Truncate, "length"_a,
           "Rolls back to the first `length` positions of every layer (speculative decoding, "
           "a crop), whatever tier their pages are in; refused (FailedPreconditionError) when "
           "the page that keeps some rows was evicted.")
      .def("report", &Sequence::Report,
           "The figures of `kvtier-run generate --json`'s report for this sequence.")
      .def("scores", &Sequence::Scores, "group"_a = 0)
      .def("tiers", &Sequence::Tiers, "group"_a = 0)
      .def("close", &Sequence::Close)
      .def_prop_ro("closed", &Sequence::closed)
      .def_prop_ro("daemon_backed", &Sequence::daemon_backed)
      .def_prop_ro("rejoins", &Sequence::rejoins);

  nb::class_<Client>(m, "Client",
                     "A worker's session with kvtierd (register, sequences, snapshots, plans, "
                     "status); messages are dicts in the protobuf JSON field names.")
      .def(nb::init<const std::string&, const nb::dict&, double, bool, int, int64_t>(), "address"_a,
           "registration"_a, nb::kw_only(), "rpc_deadline_ms"_a = 200.0,
           "background_heartbeat"_a = true, "heartbeat_priority"_a = 0, "daemon_uid"_a = -1)
      .def_prop_ro("worker_id", &Client::worker_id)
      .def_prop_ro("generation", &Client::generation)
      .def_prop_ro("connected", &Client::connected)
      .def_prop_ro("heartbeat_realtime", &Client::heartbeat_realtime,
                   "True while the heartbeat thread runs at heartbeat_priority (SCHED_FIFO).")
      .def_prop_ro("lease_ttl_s", &Client::lease_ttl_s)
      .def("open_sequence", &Client::OpenSequence, "prompt_tokens"_a, "policy"_a, "tag"_a = "")
      .def("submit_snapshot", &Client::SubmitSnapshot, "snapshot"_a)
      .def("ack_plan", &Client::AckPlan, "sequence_id"_a, "plan_version"_a, "applied"_a = true,
           "error"_a = "")
      .def("close_sequence", &Client::CloseSequence, "sequence_id"_a)
      .def("status", &Client::Status, nb::kw_only(), "workers"_a = true, "sequences"_a = true)
      .def("heartbeat", &Client::Heartbeat)
      .def("close", &Client::Close);
}
