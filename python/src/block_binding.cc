// kvtier._native.BlockStore: the Python face of kvtier::BlockClient (docs/vllm.md). Copies take
// a 2-D buffer (rows of block_bytes, e.g. vLLM's primary_kv_view) and run without the GIL.

#include "python/src/block_binding.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvtier/block_client.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace kvtier::python {
namespace {

// A 2-D buffer whose rows are one block each (C-contiguous within a row). Releases on exit.
class Rows {
 public:
  Rows(nb::handle obj, bool writable, uint64_t block_bytes, const ThrowFn& fail) {
    const int flags = PyBUF_STRIDES | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj.ptr(), &view_, flags) != 0) throw nb::python_error();
    held_ = true;
    const bool ok = view_.ndim == 2 && view_.strides[1] == view_.itemsize &&
                    static_cast<uint64_t>(view_.shape[1] * view_.itemsize) >= block_bytes;
    if (!ok) {
      PyBuffer_Release(&view_);
      held_ = false;
      fail(absl::InvalidArgumentError(
          absl::StrCat("buffer must be 2-D with rows of at least block_bytes = ", block_bytes,
                       " contiguous bytes (ndim ", view_.ndim, ")")));
    }
  }
  ~Rows() {
    if (held_) PyBuffer_Release(&view_);
  }
  uint64_t rows() const { return static_cast<uint64_t>(view_.shape[0]); }
  uint8_t* row(uint64_t i) const {
    return static_cast<uint8_t*>(view_.buf) + static_cast<int64_t>(i) * view_.strides[0];
  }

 private:
  Py_buffer view_{};
  bool held_ = false;
};

struct BlockStore {
  std::unique_ptr<BlockClient> client;
  ThrowFn fail;

  // BeginStore or Acquire, without the GIL.
  std::tuple<uint64_t, std::vector<int64_t>> Call(
      const std::vector<nb::bytes>& keys,
      absl::StatusOr<BlockGrant> (BlockClient::*call)(absl::Span<const std::string>)) {
    std::vector<std::string> k;
    for (const nb::bytes& b : keys) k.emplace_back(b.c_str(), b.size());
    absl::StatusOr<BlockGrant> g;
    {
      nb::gil_scoped_release unlocked;
      g = (client.get()->*call)(k);
    }
    if (!g.ok()) fail(g.status());
    return {g->ticket, std::move(g->slots)};
  }

  // Copies between `rows[i]` of `buffer` and slot `slots[i]`, to the arena when `to_arena`.
  void Copy(const std::vector<int64_t>& slots, nb::handle buffer, const std::vector<int64_t>& rows,
            bool to_arena) {
    if (slots.size() != rows.size()) {
      fail(absl::InvalidArgumentError(
          absl::StrCat(slots.size(), " slots but ", rows.size(), " rows")));
    }
    const uint64_t n = client->block_bytes();
    Rows view(buffer, !to_arena, n, fail);
    std::vector<std::pair<uint8_t*, uint8_t*>> pairs;  // (arena, row), checked before copying
    pairs.reserve(slots.size());
    for (size_t i = 0; i < slots.size(); ++i) {
      uint8_t* block = client->block(slots[i]);
      if (block == nullptr || rows[i] < 0 || static_cast<uint64_t>(rows[i]) >= view.rows()) {
        fail(absl::InvalidArgumentError(absl::StrCat("slot ", slots[i], " or row ", rows[i],
                                                     " out of range (", view.rows(), " rows)")));
      }
      pairs.emplace_back(block, view.row(static_cast<uint64_t>(rows[i])));
    }
    nb::gil_scoped_release unlocked;
    for (auto [block, row] : pairs) {
      if (to_arena) {
        std::memcpy(block, row, n);
      } else {
        std::memcpy(row, block, n);
      }
    }
  }
};

}  // namespace

void BindBlocks(nb::module_& m, ThrowFn fail) {
  nb::class_<BlockStore>(m, "BlockStore",
                         "kvtierd's block store for one space (model and KV layout) of the "
                         "caller's trust domain: blocks by content key, shared node-wide.")
      .def(
          "__init__",
          [fail](BlockStore* self, const std::string& address, const std::string& space,
                 uint64_t block_bytes, uint32_t key_bytes, uint64_t want_bytes, double timeout_s) {
            BlockClientOptions o;
            o.address = address;
            o.space = space;
            o.block_bytes = block_bytes;
            o.key_bytes = key_bytes;
            o.want_bytes = want_bytes;
            o.timeout = absl::Seconds(timeout_s);
            absl::StatusOr<std::unique_ptr<BlockClient>> c;
            {
              nb::gil_scoped_release unlocked;
              c = BlockClient::Open(o);
            }
            if (!c.ok()) fail(c.status());
            new (self) BlockStore{*std::move(c), fail};
          },
          "address"_a, "space"_a, "block_bytes"_a, "key_bytes"_a, "want_bytes"_a = 0,
          "timeout_s"_a = 2.0)
      .def(
          "lookup",
          [](const BlockStore& s, nb::bytes key) {
            return s.client->Lookup(std::string_view(key.c_str(), key.size()));
          },
          "key"_a, "Whether the shared table names `key` (no call to kvtierd; a hint).")
      .def(
          "begin_store",
          [](BlockStore& s, const std::vector<nb::bytes>& keys) {
            return s.Call(keys, &BlockClient::BeginStore);
          },
          "keys"_a, "(ticket, slots): a slot per key, or -1 stored, -2 no room.")
      .def(
          "finish_store",
          [](BlockStore& s, uint64_t ticket, bool ok) {
            absl::Status st;
            {
              nb::gil_scoped_release unlocked;
              st = s.client->FinishStore(ticket, ok);
            }
            if (!st.ok()) s.fail(st);
          },
          "ticket"_a, "ok"_a)
      .def(
          "acquire",
          [](BlockStore& s, const std::vector<nb::bytes>& keys) {
            return s.Call(keys, &BlockClient::Acquire);
          },
          "keys"_a, "(ticket, slots): a leased slot per key, or -3 missing.")
      .def(
          "release",
          [](BlockStore& s, uint64_t ticket) {
            absl::Status st;
            {
              nb::gil_scoped_release unlocked;
              st = s.client->Release(ticket);
            }
            if (!st.ok()) s.fail(st);
          },
          "ticket"_a)
      .def(
          "write",
          [](BlockStore& s, const std::vector<int64_t>& slots, nb::handle src,
             const std::vector<int64_t>& rows) { s.Copy(slots, src, rows, /*to_arena=*/true); },
          "slots"_a, "src"_a, "rows"_a, "Copies src[rows[i]] into slot slots[i].")
      .def(
          "read",
          [](BlockStore& s, const std::vector<int64_t>& slots, nb::handle dst,
             const std::vector<int64_t>& rows) { s.Copy(slots, dst, rows, /*to_arena=*/false); },
          "slots"_a, "dst"_a, "rows"_a, "Copies slot slots[i] into dst[rows[i]].")
      .def("stats",
           [](const BlockStore& s) {
             BlockStats st = s.client->stats();
             nb::dict d;
             d["domain"] = st.domain;
             d["space_id"] = st.space_id;
             d["block_slots"] = st.block_slots;
             d["daemon_epoch"] = st.daemon_epoch;
             d["published"] = st.published;
             d["pending"] = st.pending;
             d["leased"] = st.leased;
             d["evictions"] = st.evictions;
             d["stores_no_room"] = st.stores_no_room;
             d["owners_dropped"] = st.owners_dropped;
             return d;
           })
      .def_prop_ro("block_bytes", [](const BlockStore& s) { return s.client->block_bytes(); })
      .def_prop_ro("key_bytes", [](const BlockStore& s) { return s.client->key_bytes(); });
}

}  // namespace kvtier::python
