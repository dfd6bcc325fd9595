// llmcore._C.BlockPool and the block hash functions, over the C ABI only.
//
// The GIL stays held: every call is a few hundred nanoseconds of bookkeeping,
// and holding it serializes Python callers of a pool that is not thread-safe.
#include <algorithm>
#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "binding.h"

namespace lcpy {

namespace {

int32_t narrow(int64_t v, const char* name) {
    if (v < INT32_MIN || v > INT32_MAX)
        throw py::value_error(std::string(name) + " = " + std::to_string(v) +
                              " is out of int32 range");
    return int32_t(v);
}

// Ints from a sequence of ints or a 1-D integer numpy array. Floats are
// refused and values outside int32 raise instead of wrapping: a wrapped
// block id would name another block.
std::vector<int32_t> int32s(const py::handle& obj, const char* name) {
    std::vector<int32_t> out;
    if (py::isinstance<py::array>(obj)) {
        auto arr = py::reinterpret_borrow<py::array>(obj);
        if (arr.ndim() != 1) throw py::value_error(std::string(name) + " must be 1-D");
        if (arr.size() == 0) return out;
        const char kind = arr.dtype().kind();
        if (kind != 'i' && kind != 'u')
            throw py::type_error(std::string(name) + " must hold integers, got dtype " +
                                 std::string(py::str(arr.dtype())));
        out.reserve(size_t(arr.size()));
        if (kind == 'u') {
            auto a = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
            const uint64_t* p = a.data();
            for (py::ssize_t i = 0; i < a.size(); ++i)
                out.push_back(narrow(p[i] > uint64_t(INT32_MAX) ? INT64_MAX : int64_t(p[i]), name));
        } else {
            auto a = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
            const int64_t* p = a.data();
            for (py::ssize_t i = 0; i < a.size(); ++i) out.push_back(narrow(p[i], name));
        }
        return out;
    }
    if (py::isinstance<py::str>(obj) || py::isinstance<py::bytes>(obj) ||
        !PySequence_Check(obj.ptr()))
        throw py::type_error(std::string(name) + " must be a sequence of ints or an integer array");
    auto seq = py::reinterpret_borrow<py::sequence>(obj);
    out.reserve(size_t(py::len(seq)));
    for (py::handle item : seq) {
        PyObject* index = PyNumber_Index(item.ptr());  // refuses floats, accepts numpy ints
        if (!index) {
            PyErr_Clear();
            throw py::type_error(std::string(name) + " must hold ints, got " +
                                 std::string(py::str(py::type::of(item))));
        }
        int overflow = 0;
        const long long v = PyLong_AsLongLongAndOverflow(index, &overflow);
        Py_DECREF(index);
        if (overflow)
            throw py::value_error(std::string(name) + " holds a value out of int32 range");
        out.push_back(narrow(v, name));
    }
    return out;
}

py::list to_list(const std::vector<int32_t>& v) {
    py::list out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = py::int_(v[i]);
    return out;
}

// Owns one lc_block_pool.
class PyBlockPool {
   public:
    PyBlockPool(int64_t num_blocks, int64_t block_size)
        : num_blocks_(narrow(num_blocks, "num_blocks")),
          block_size_(narrow(block_size, "block_size")) {
        check(lc_block_pool_create(num_blocks_, block_size_, &pool_));
    }
    ~PyBlockPool() { lc_block_pool_destroy(pool_); }
    PyBlockPool(const PyBlockPool&) = delete;
    PyBlockPool& operator=(const PyBlockPool&) = delete;

    int32_t num_blocks() const { return num_blocks_; }
    int32_t block_size() const { return block_size_; }

    int32_t num_free() const {
        const int32_t n = lc_block_pool_num_free(pool_);
        if (n < 0) check(n);
        return n;
    }

    py::list allocate(int64_t n) {
        const int32_t count = narrow(n, "n");
        if (count < 0) throw py::value_error("n must be >= 0, got " + std::to_string(n));
        std::vector<int32_t> ids(static_cast<size_t>(count));
        check(lc_block_pool_allocate(pool_, count, ids.data()));
        return to_list(ids);
    }

    void fork(const py::handle& ids) {
        const auto v = int32s(ids, "ids");
        check(lc_block_pool_fork(pool_, v.data(), int32_t(v.size())));
    }

    void free(const py::handle& ids) {
        const auto v = int32s(ids, "ids");
        check(lc_block_pool_free(pool_, v.data(), int32_t(v.size())));
    }

    uint64_t commit(int64_t block_id, uint64_t parent, const py::handle& tokens) {
        const auto t = int32s(tokens, "tokens");
        uint64_t hash = 0;
        check(lc_block_pool_commit(pool_, narrow(block_id, "block_id"), parent, t.data(),
                                   int32_t(t.size()), &hash));
        return hash;
    }

    py::list match_prefix(const py::handle& tokens, uint64_t extra_key,
                                      const py::object& max_blocks) {
        const auto t = int32s(tokens, "tokens");
        const int32_t whole = int32_t(t.size()) / block_size_;
        int32_t limit = whole;
        if (!max_blocks.is_none()) {
            const int32_t m = narrow(max_blocks.cast<int64_t>(), "max_blocks");
            if (m < 0) throw py::value_error("max_blocks must be >= 0, got " + std::to_string(m));
            limit = std::min(whole, m);
        }
        std::vector<int32_t> ids(static_cast<size_t>(limit));
        int32_t found = 0;
        check(lc_block_pool_match_prefix(pool_, extra_key, t.data(), int32_t(t.size()), ids.data(),
                                         limit, &found));
        ids.resize(size_t(found));
        return to_list(ids);
    }

    int32_t ref_count(int64_t block_id) const {
        const int32_t r = lc_block_pool_ref_count(pool_, narrow(block_id, "block_id"));
        if (r < 0) check(r);
        return r;
    }

    void reset_cache() { lc_block_pool_reset_cache(pool_); }

    lc_block_pool_stats stats() const {
        lc_block_pool_stats s{};
        check(lc_block_pool_stats_get(pool_, &s));
        return s;
    }

    void check_invariants() const { check(lc_block_pool_check(pool_)); }

   private:
    lc_block_pool* pool_ = nullptr;
    int32_t num_blocks_;
    int32_t block_size_;
};

py::dict stats_dict(const lc_block_pool_stats& s) {
    py::dict d;
    d["num_blocks"] = s.num_blocks;
    d["block_size"] = s.block_size;
    d["num_free"] = s.num_free;
    d["num_used"] = s.num_used;
    d["num_cached"] = s.num_cached;
    d["num_free_cached"] = s.num_free_cached;
    d["queries"] = s.queries;
    d["hits"] = s.hits;
    d["evictions"] = s.evictions;
    return d;
}

}  // namespace

void bind_block_pool(py::module_& m) {
    using S = lc_block_pool_stats;
    py::class_<S>(m, "BlockPoolStats", "A snapshot of a BlockPool's counters (read-only).")
        .def_readonly("num_blocks", &S::num_blocks)
        .def_readonly("block_size", &S::block_size)
        .def_readonly("num_free", &S::num_free, "Blocks with ref count 0 (incl. free cached ones).")
        .def_readonly("num_used", &S::num_used, "Blocks with ref count >= 1.")
        .def_readonly("num_cached", &S::num_cached, "Blocks carrying a hash, free or used.")
        .def_readonly("num_free_cached", &S::num_free_cached,
                      "Free blocks a prefix hit can revive.")
        .def_readonly("queries", &S::queries, "Tokens looked up by match_prefix, cumulative.")
        .def_readonly("hits", &S::hits, "Tokens found by match_prefix, cumulative.")
        .def_readonly("evictions", &S::evictions, "Cached blocks whose hash was dropped for reuse.")
        .def("as_dict", &stats_dict, "The counters as a dict.")
        .def("__eq__", [](const S& a, const S& b) { return std::memcmp(&a, &b, sizeof(S)) == 0; })
        .def("__repr__", [](const S& s) {
            return "BlockPoolStats(" + std::string(py::str(stats_dict(s))) + ")";
        });

    py::class_<PyBlockPool>(m, "BlockPool",
                            "A fixed pool of KV blocks with ref counts and a prefix cache.\n\n"
                            "Not thread-safe: one owner calls it.")
        .def(py::init<int64_t, int64_t>(), py::arg("num_blocks"), py::arg("block_size"))
        .def_property_readonly("num_blocks", &PyBlockPool::num_blocks)
        .def_property_readonly("block_size", &PyBlockPool::block_size)
        .def("num_free", &PyBlockPool::num_free,
             "Blocks an allocation could take now (free blocks, cached or not).")
        .def("allocate", &PyBlockPool::allocate, py::arg("n"),
             "Takes n blocks (ref count 1), all or nothing; evicts cached free blocks in\n"
             "least-recently-freed order. Raises OutOfBlocksError when fewer are free.")
        .def("fork", &PyBlockPool::fork, py::arg("ids"),
             "Adds one reference to each (in-use) block; all or nothing.")
        .def("free", &PyBlockPool::free, py::arg("ids"),
             "Drops one reference from each block; all or nothing. Pass a sequence's blocks\n"
             "tail-first so its last blocks are evicted before its shared prefix.")
        .def("commit", &PyBlockPool::commit, py::arg("block_id"), py::arg("parent_hash"),
             py::arg("tokens"),
             "Registers an in-use full block under block_hash(parent_hash, tokens) and returns\n"
             "that hash. An identical entry already held elsewhere wins (this block stays\n"
             "unregistered).")
        .def("match_prefix", &PyBlockPool::match_prefix, py::arg("tokens"),
             py::arg("extra_key") = 0, py::arg("max_blocks") = py::none(),
             "Ids of the longest chain of cached full blocks holding a prefix of tokens,\n"
             "each gaining one reference (free ones are revived).")
        .def("ref_count", &PyBlockPool::ref_count, py::arg("block_id"))
        .def("reset_cache", &PyBlockPool::reset_cache, "Drops every cached hash.")
        .def("stats", &PyBlockPool::stats)
        .def("check", &PyBlockPool::check_invariants,
             "Verifies every internal invariant; raises RuntimeError naming a broken one.")
        .def("__repr__", [](const PyBlockPool& p) {
            return "BlockPool(num_blocks=" + std::to_string(p.num_blocks()) +
                   ", block_size=" + std::to_string(p.block_size()) +
                   ", num_free=" + std::to_string(p.num_free()) + ")";
        });

    m.def("hash_root", &lc_block_hash_root, py::arg("extra_key") = 0,
          "Root of a hash chain; extra_key separates caches (adapter, salt).");
    m.def(
        "block_hash",
        [](uint64_t parent, const py::handle& tokens) {
            const auto t = int32s(tokens, "tokens");
            return lc_block_hash(parent, t.data(), int32_t(t.size()));
        },
        py::arg("parent"), py::arg("tokens"), "Hash of one block of tokens chained on parent.");
}

}  // namespace lcpy
