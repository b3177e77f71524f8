// estream._estream: the Python binding of the C++ API (include/estream/engine.h and
// include/estream/tokenizer.h); python/estream/__init__.py re-exports it, __init__.pyi types it.
//
// Every method that takes inputs accepts one input (a str, or token ids as a list of ints or a
// 1-D integer numpy array) and returns one result, or a list of inputs (a list/tuple of those, or
// a 2-D integer array) and returns a list (embed: an array). A list runs as ONE Engine::RunBatch.
//
// Threads and the GIL: inputs are converted to C++ values with the GIL held; the GIL is then
// released while texts are tokenized and the engine runs, and taken again to build the outputs.
// Engine::RunBatch serialises calls on one Engine, so Python threads sharing a Model take turns;
// the last call's statistics are guarded by a mutex. Model.close() frees the engine once the calls
// running on it have returned (each call holds a shared lock on it, close an exclusive one);
// later calls raise ValueError.
//
// Errors: the engine's Status becomes ValueError (InvalidArgument, OutOfRange, NotSupported),
// OSError (IOError, Corruption), MemoryError (ResourceExhausted) or RuntimeError (Internal), with
// the engine's one-line message; wrong Python types raise TypeError. A failed call leaves the
// model usable.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "batch/candidates.h"
#include "capi/frontend.h"
#include "estream/engine.h"
#include "estream/tokenizer.h"

namespace py = pybind11;

namespace estream::python {
namespace {

using frontend::CallStats;
using Clock = std::chrono::steady_clock;

// Ctrl-C while a call runs without the GIL: Engine::RunBatch asks before each pass and layer, and
// InterruptRequested takes the GIL for a moment to run Python's pending signal handlers. An
// exception one of them raises (KeyboardInterrupt) stops the batch; it waits here, per thread,
// until Raise raises it (the engine's Cancelled status stands for it).
struct PendingPyError {
  PyObject* type = nullptr;
  PyObject* value = nullptr;
  PyObject* traceback = nullptr;
};
thread_local PendingPyError tls_pending;

bool InterruptRequested() {
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() == 0) return false;
  PyErr_Fetch(&tls_pending.type, &tls_pending.value, &tls_pending.traceback);
  return true;
}

// Raises the Python exception for `st`. REQUIRES: the GIL is held.
[[noreturn]] void Raise(const Status& st) {
  if (st.code() == StatusCode::kCancelled && tls_pending.type != nullptr) {
    PyErr_Restore(tls_pending.type, tls_pending.value, tls_pending.traceback);
    tls_pending = {};
    throw py::error_already_set();
  }
  PyObject* type = PyExc_RuntimeError;
  switch (st.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kNotSupported:
      type = PyExc_ValueError;
      break;
    case StatusCode::kIOError:
    case StatusCode::kCorruption:
      type = PyExc_OSError;
      break;
    case StatusCode::kResourceExhausted:
      type = PyExc_MemoryError;
      break;
    default:
      break;
  }
  // A message may quote bytes of a file (a path, a tensor name) that are not UTF-8: replaced.
  const std::string& m = st.message();
  PyObject* text = PyUnicode_DecodeUTF8(m.data(), static_cast<Py_ssize_t>(m.size()), "replace");
  if (text == nullptr) throw py::error_already_set();
  PyErr_SetObject(type, text);
  Py_DECREF(text);
  throw py::error_already_set();
}

std::string TypeName(py::handle h) { return std::string(py::str(h.get_type().attr("__name__"))); }

// bytes, bytearray and memoryview are sequences of ints to Python, yet never token ids here: they
// are text not yet decoded (taking b"hi" as the ids 104, 105 would score the wrong input).
bool IsBytesLike(py::handle h) {
  return PyBytes_Check(h.ptr()) || PyByteArray_Check(h.ptr()) || PyMemoryView_Check(h.ptr());
}
[[noreturn]] void RaiseBytesLike(const std::string& what, py::handle h) {
  throw py::type_error(what + ": got " + TypeName(h) + ", which is not taken as token ids: decode it to a str " +
                       "(b.decode(\"utf-8\")) or give the ids as a list of ints");
}

// The UTF-8 of a str. A str without one (lone surrogates, as os.fsdecode or
// errors="surrogateescape" leave for undecodable bytes) raises Python's UnicodeEncodeError (a
// ValueError), its reason naming `what`.
std::string Utf8(py::handle s, const std::string& what) {
  Py_ssize_t n = 0;
  const char* p = PyUnicode_AsUTF8AndSize(s.ptr(), &n);
  if (p != nullptr) return std::string(p, static_cast<size_t>(n));
  if (PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) {
    PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    const std::string reason = what + ": surrogates are not text; replace them first, e.g. "
                                      "s.encode(\"utf-8\", \"replace\").decode()";
    if (value != nullptr) PyUnicodeEncodeError_SetReason(value, reason.c_str());  // else: Python's own
    PyErr_Restore(type, value, tb);
  }
  throw py::error_already_set();
}

// An int argument (a Python int or anything with __index__, not a bool) within [lo, hi]: TypeError
// for another type, ValueError naming it and the range otherwise.
int64_t IntArg(py::handle h, const char* name, int64_t lo, int64_t hi, const char* note) {
  if (PyBool_Check(h.ptr()) || !PyIndex_Check(h.ptr()))
    throw py::type_error(std::string(name) + ": expected an int, got " + TypeName(h));
  int overflow = 0;
  py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(h.ptr()));
  if (!i) throw py::error_already_set();
  const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  if (overflow != 0 || v < lo || v > hi)
    throw py::value_error(std::string(name) + " = " + std::string(py::str(i)) + " must be between " +
                          std::to_string(lo) + " and " + std::to_string(hi) + note);
  return v;
}

// A model path as open() takes it: a str, bytes or os.PathLike (pathlib.Path); a str is encoded as
// os.fsencode does (undecodable bytes of a file name, kept as surrogates by os.fsdecode, come back).
// TypeError for another type; ValueError for a NUL byte (the OS would open the file that the bytes
// before it name, a different model, without a word).
std::string PathArg(py::handle h) {
  py::object p = py::reinterpret_steal<py::object>(PyOS_FSPath(h.ptr()));
  if (!p) {
    PyErr_Clear();
    throw py::type_error("path: expected a str, bytes or os.PathLike (pathlib.Path), got " + TypeName(h));
  }
  py::object b = py::reinterpret_steal<py::object>(
      PyBytes_Check(p.ptr()) ? p.inc_ref().ptr() : PyUnicode_EncodeFSDefault(p.ptr()));
  if (!b) throw py::error_already_set();
  std::string s(PyBytes_AS_STRING(b.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(b.ptr())));
  if (s.find('\0') != std::string::npos)
    throw py::value_error("path: embedded null byte at position " + std::to_string(s.find('\0')) +
                          "; give the file's path without it");
  return s;
}

// A flag argument: a bool, an int or a NumPy bool; anything else (None above all, which pybind11
// would take as False) raises TypeError naming the argument.
bool BoolArg(py::handle h, const char* name) {
  if (PyBool_Check(h.ptr()) || PyLong_Check(h.ptr())) return PyObject_IsTrue(h.ptr()) == 1;
  const py::handle type = h.get_type();
  if (py::hasattr(type, "__module__") && std::string(py::str(type.attr("__module__"))) == "numpy" &&
      TypeName(h).rfind("bool", 0) == 0)
    return PyObject_IsTrue(h.ptr()) == 1;
  throw py::type_error(std::string(name) + ": expected a bool, got " + TypeName(h));
}

// A path (bytes from the OS) as a str, as os.fsdecode gives it.
py::str FsDecode(const std::string& path) {
  PyObject* u = PyUnicode_DecodeFSDefaultAndSize(path.data(), static_cast<Py_ssize_t>(path.size()));
  if (u == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(u);
}

// A str option (schedule, pooling): TypeError naming it and the choices for another type.
std::string StrArg(py::handle h, const char* name, const char* choices) {
  if (!py::isinstance<py::str>(h))
    throw py::type_error(std::string(name) + ": expected a str (" + choices + "), got " + TypeName(h));
  return Utf8(h, name);
}

// One input: a text or token ids.
struct Input {
  bool is_text = false;
  std::string text;
  std::vector<int32_t> ids;
};
struct Inputs {
  std::vector<Input> items;
  bool single = false;  // one input given (not a list): return one result
};

// A Python int or a numpy integer scalar (anything with __index__ but a bool).
bool IsIntLike(py::handle h) {
  return !PyBool_Check(h.ptr()) && (PyLong_Check(h.ptr()) || PyIndex_Check(h.ptr()));
}

// Token ids from a 1-D integer array or a sequence of ints; TypeError / ValueError otherwise.
std::vector<int32_t> ToIds(py::handle h, const char* what) {
  std::vector<int32_t> ids;
  // Ids beyond int32 (the engine checks the vocabulary's range), reported as given.
  auto out_of_range = [&](const std::string& v) {
    return py::value_error(std::string(what) + ": token id " + v + " is out of range");
  };
  if (py::isinstance<py::array>(h)) {
    py::array a = py::reinterpret_borrow<py::array>(h);
    const char kind = a.dtype().kind();
    if (kind != 'i' && kind != 'u')
      throw py::type_error(std::string(what) + ": token ids must be integers, got an array of dtype " +
                           std::string(py::str(a.dtype())));
    if (a.ndim() != 1) throw py::value_error(std::string(what) + ": token ids must be a 1-D array");
    ids.reserve(static_cast<size_t>(a.size()));
    if (kind == 'u') {  // as uint64: 2**64 - 1 is not -1
      auto u64 = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>::ensure(a);
      if (!u64) throw py::error_already_set();
      const uint64_t* p = u64.data();
      for (py::ssize_t i = 0; i < u64.size(); ++i) {
        if (p[i] > static_cast<uint64_t>(INT32_MAX)) throw out_of_range(std::to_string(p[i]));
        ids.push_back(static_cast<int32_t>(p[i]));
      }
      return ids;
    }
    auto a64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(a);
    if (!a64) throw py::error_already_set();
    const int64_t* p = a64.data();
    for (py::ssize_t i = 0; i < a64.size(); ++i) {
      if (p[i] < INT32_MIN || p[i] > INT32_MAX) throw out_of_range(std::to_string(p[i]));
      ids.push_back(static_cast<int32_t>(p[i]));
    }
    return ids;
  }
  if (IsBytesLike(h)) RaiseBytesLike(what, h);
  if (!py::isinstance<py::sequence>(h) || py::isinstance<py::str>(h))
    throw py::type_error(std::string(what) + ": expected a str or a list of token ids, got " + TypeName(h));
  py::sequence seq = py::reinterpret_borrow<py::sequence>(h);
  ids.reserve(seq.size());
  for (py::handle x : seq) {
    if (!IsIntLike(x)) throw py::type_error(std::string(what) + ": token ids must be ints, got " + TypeName(x));
    const long long v = PyLong_AsLongLong(x.ptr());
    if (v == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      throw out_of_range(std::string(py::str(x)));
    }
    if (v < INT32_MIN || v > INT32_MAX) throw out_of_range(std::to_string(v));
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

Input ToInput(py::handle h, const std::string& what) {
  Input in;
  if (py::isinstance<py::str>(h)) {
    in.is_text = true;
    in.text = Utf8(h, what);
  } else {
    in.ids = ToIds(h, what.c_str());
  }
  return in;
}

// str | ids -> one input; list/tuple of (str | ids) or a 2-D integer array -> a batch.
Inputs ToInputs(py::handle obj, const char* what) {
  Inputs out;
  if (py::isinstance<py::str>(obj)) {
    out.single = true;
    out.items.push_back(ToInput(obj, what));
    return out;
  }
  if (py::isinstance<py::array>(obj)) {
    py::array a = py::reinterpret_borrow<py::array>(obj);
    if (a.ndim() == 1) {
      out.single = true;
      out.items.push_back(ToInput(obj, what));
      return out;
    }
    if (a.ndim() != 2) throw py::value_error(std::string(what) + ": a token array must be 1-D (one input) or 2-D (a batch)");
    for (py::ssize_t i = 0; i < a.shape(0); ++i)
      out.items.push_back(ToInput(a[py::int_(i)], std::string(what) + "[" + std::to_string(i) + "]"));
    return out;
  }
  if (IsBytesLike(obj)) RaiseBytesLike(what, obj);
  if (!py::isinstance<py::sequence>(obj))
    throw py::type_error(std::string(what) + ": expected a str, a list of token ids, or a list of those; got " +
                         TypeName(obj));
  py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
  if (seq.size() > 0 && IsIntLike(seq[0])) {  // one list of token ids
    out.single = true;
    out.items.push_back(ToInput(obj, what));
    return out;
  }
  out.items.reserve(seq.size());
  size_t i = 0;
  for (py::handle x : seq) out.items.push_back(ToInput(x, std::string(what) + "[" + std::to_string(i++) + "]"));
  return out;
}

// Results as Python objects.
struct Score {
  py::array_t<int32_t> tokens;
  py::array_t<float> logprobs;
  double total = 0;
  double perplexity = 0;
};
struct Candidate {
  py::array_t<int32_t> tokens;
  py::array_t<float> logprobs;
  double total = 0;
  bool is_greedy = false;
};

template <typename T>
py::array_t<T> ToArray(const std::vector<T>& v) {
  py::array_t<T> a(static_cast<py::ssize_t>(v.size()));
  if (!v.empty()) std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(T));
  return a;
}

class Model {
 public:
  Model(py::object path_arg, py::object budget, py::object threads, py::object schedule_arg,
        py::object batch_tokens, py::object budget_tokens) {
    // path defaults to None only so that Model() raises PathArg's one-line TypeError rather than
    // pybind11's list of signatures.
    const std::string path = PathArg(path_arg);
    path_repr_ = py::repr(FsDecode(path));
    EngineOptions eo;
    // The CLI's range for -t (Engine::Load's kMaxThreads).
    eo.n_threads = static_cast<int>(IntArg(threads, "threads", 0, kMaxThreads, " (0 = one per CPU)"));
    constexpr int64_t kMaxTokens = std::numeric_limits<int64_t>::max();
    eo.batch_tokens = IntArg(batch_tokens, "batch_tokens", 0, kMaxTokens, " (0 = the engine's default)");
    eo.budget_tokens = IntArg(budget_tokens, "budget_tokens", 0, kMaxTokens, " (0 = the engine's default)");
    if (!budget.is_none()) {
      if (py::isinstance<py::str>(budget)) {
        Result<uint64_t> b = frontend::ParseSize(Utf8(budget, "budget"));
        if (!b.ok()) Raise(b.status());
        eo.budget_bytes = *b;
      } else if (IsIntLike(budget)) {
        py::object b = py::reinterpret_steal<py::object>(PyNumber_Index(budget.ptr()));
        if (!b) throw py::error_already_set();
        const unsigned long long v = PyLong_AsUnsignedLongLong(b.ptr());  // fails for < 0 and >= 2**64
        if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
          PyErr_Clear();
          throw py::value_error("budget = " + std::string(py::str(b)) +
                                " bytes is out of range: give 0 (none) to 2**64 - 1 bytes, or a size such as \"4G\"");
        }
        eo.budget_bytes = v;
      } else {
        throw py::type_error("budget: expected None, a number of bytes, or a size such as \"4G\"");
      }
    }
    const std::string schedule = StrArg(schedule_arg, "schedule", "\"early\", \"after-routing\" or \"on-demand\"");
    Result<EngineOptions::Schedule> sched = frontend::ParseSchedule(schedule);
    if (!sched.ok()) Raise(sched.status());
    eo.schedule = *sched;
    Status st;
    {
      py::gil_scoped_release nogil;
      Result<std::unique_ptr<Engine>> e = Engine::Load(path, eo);
      if (e.ok()) {
        engine_ = std::move(e).value();
        auto t = TextTokenizer::Load(path);
        if (t.ok()) tokenizer_ = std::move(t).value();
        else tokenizer_error_ = t.status().message();
      } else {
        st = e.status();
      }
    }
    if (!st.ok()) Raise(st);
  }

  const ModelInfo& info() const { return engine_->info(); }

  // Holds the engine for one call (close() waits for it); ValueError once the model is closed.
  // Taken without the GIL when it has to wait (close() runs without the GIL).
  class Use {
   public:
    explicit Use(const Model* m) : lock_(m->LockLife()) {
      if (m->engine_ == nullptr)
        throw py::value_error("the model is closed (Model.close() or the end of its with block); load it again "
                              "with estream.Model(path, ...)");
    }

   private:
    std::shared_lock<std::shared_mutex> lock_;
  };

  // Frees the engine and the vocabulary now (rather than when the last reference goes), once the
  // calls running on the model from other threads return. Idempotent.
  void Close() {
    std::unique_ptr<Engine> engine;
    std::unique_ptr<TextTokenizer> tokenizer;
    py::gil_scoped_release nogil;
    std::unique_lock<std::shared_mutex> lock(life_);
    engine = std::move(engine_);
    tokenizer = std::move(tokenizer_);
    lock.unlock();
    engine.reset();  // the model's memory goes back here, without the GIL
  }

  // A shared lock on the engine's life. With the GIL held it only tries: a call holding the lock
  // may need the GIL to return, so waiting happens without it.
  std::shared_lock<std::shared_mutex> LockLife() const {
    std::shared_lock<std::shared_mutex> lock(life_, std::try_to_lock);
    if (!lock.owns_lock()) {
      py::gil_scoped_release nogil;
      lock.lock();
    }
    return lock;
  }

  bool Closed() const {
    auto lock = LockLife();
    return engine_ == nullptr;
  }

  int N(int ModelInfo::* field) const {
    Use use(this);
    return info().*field;
  }

  py::dict InfoDict() const {
    Use use(this);
    const ModelInfo& i = info();
    py::dict d;
    d["path"] = FsDecode(i.path);
    d["architecture"] = i.architecture;
    d["name"] = i.name;
    d["n_layer"] = i.n_layer;
    d["n_embd"] = i.n_embd;
    d["n_head"] = i.n_head;
    d["n_head_kv"] = i.n_head_kv;
    d["n_expert"] = i.n_expert;
    d["n_expert_used"] = i.n_expert_used;
    d["n_vocab"] = i.n_vocab;
    d["n_ctx"] = i.n_ctx;
    d["weight_bytes"] = i.weight_bytes;
    d["threads"] = engine_->n_threads();
    d["pass_tokens"] = engine_->pass_tokens();
    d["has_tokenizer"] = tokenizer_ != nullptr;
    return d;
  }

  std::string Repr() const {
    auto lock = LockLife();
    if (engine_ == nullptr) return "estream.Model(" + path_repr_ + ", closed)";
    const ModelInfo& i = info();
    return "estream.Model(" + path_repr_ + ", " + i.architecture + ", " + std::to_string(i.n_layer) + " layers, n_embd " +
           std::to_string(i.n_embd) + ", n_vocab " + std::to_string(i.n_vocab) + ", threads " +
           std::to_string(engine_->n_threads()) + ")";
  }

  // ---- tokens ----

  py::object Tokenize(py::object text, py::object add_special_arg, py::object parse_special_arg) const {
    const bool add_special = BoolArg(add_special_arg, "add_special");
    const bool parse_special = BoolArg(parse_special_arg, "parse_special");
    Use use(this);
    RequireTokenizer();
    if (py::isinstance<py::str>(text)) {
      const std::string s = Utf8(text, "tokenize");
      std::vector<int32_t> ids;
      {
        py::gil_scoped_release nogil;
        ids = tokenizer_->Encode(s, add_special, parse_special);
      }
      return py::cast(ids);
    }
    if (IsBytesLike(text))
      throw py::type_error("tokenize: expected a str, got " + TypeName(text) +
                           "; decode it first (b.decode(\"utf-8\"))");
    if (!py::isinstance<py::sequence>(text))
      throw py::type_error("tokenize: expected a str or a list of str, got " + TypeName(text));
    std::vector<std::string> texts;
    size_t i = 0;
    for (py::handle x : py::reinterpret_borrow<py::sequence>(text)) {
      if (!py::isinstance<py::str>(x)) throw py::type_error("tokenize: item " + std::to_string(i) + " is not a str");
      texts.push_back(Utf8(x, "tokenize[" + std::to_string(i) + "]"));
      ++i;
    }
    std::vector<std::vector<int32_t>> out(texts.size());
    {
      py::gil_scoped_release nogil;
      for (size_t k = 0; k < texts.size(); ++k) out[k] = tokenizer_->Encode(texts[k], add_special, parse_special);
    }
    return py::cast(out);
  }

  py::object Detokenize(py::object tokens, py::object render_special_arg) const {
    const bool render_special = BoolArg(render_special_arg, "render_special");
    Use use(this);
    RequireTokenizer();
    // Ids the vocabulary has no text for are refused as score refuses them (Engine::Run), not
    // rendered as U+FFFD (what TextTokenizer::Decode does with them).
    const int32_t n_vocab = tokenizer_->n_vocab();
    auto decode = [&](const std::vector<int32_t>& ids, const std::string& what) {
      for (size_t i = 0; i < ids.size(); ++i)
        if (ids[i] < 0 || ids[i] >= n_vocab)
          throw py::value_error(what + ": token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                                " is out of range [0, " + std::to_string(n_vocab) + ")");
      const std::string s = tokenizer_->Decode(ids, render_special);
      // Tokens may cut a UTF-8 character: invalid bytes become U+FFFD, as bytes.decode(errors="replace").
      PyObject* u = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
      if (u == nullptr) throw py::error_already_set();
      return py::reinterpret_steal<py::str>(u);
    };
    if (py::isinstance<py::str>(tokens)) throw py::type_error("detokenize: expected token ids, got a str");
    if (IsBytesLike(tokens)) RaiseBytesLike("detokenize", tokens);
    if (!py::isinstance<py::array>(tokens) && py::isinstance<py::sequence>(tokens) && py::len(tokens) == 0)
      return py::str("");  // no ids: ""
    Inputs in = ToInputs(tokens, "detokenize");
    if (in.single) return decode(in.items[0].ids, "detokenize");
    py::list out;
    for (size_t i = 0; i < in.items.size(); ++i) {
      const Input& x = in.items[i];
      if (x.is_text) throw py::type_error("detokenize: expected lists of token ids, got a str");
      out.append(decode(x.ids, "detokenize[" + std::to_string(i) + "]"));
    }
    return out;
  }

  // ---- requests ----

  py::object ScoreTexts(py::object inputs) {
    Use use(this);
    Inputs in = ToInputs(inputs, "score");
    std::vector<Request> reqs;
    std::vector<Result<Response>> results = RunOrRaise(in, &reqs, [](Request* r) {
      r->top_k = 0;
      r->prompt_logprobs = true;
    });
    py::list out;
    for (size_t i = 0; i < reqs.size(); ++i) {
      Score s;
      s.tokens = ToArray(reqs[i].tokens);
      s.logprobs = ToArray(results[i]->prompt_logprobs);
      s.total = results[i]->log_likelihood;
      s.perplexity = results[i]->perplexity;
      out.append(py::cast(std::move(s)));
    }
    return in.single ? out[0] : py::object(out);
  }

  py::object NextToken(py::object inputs, py::object top_k_arg) {
    Use use(this);
    const int top_k = static_cast<int>(IntArg(top_k_arg, "top_k", 1, info().n_vocab, " (n_vocab)"));
    Inputs in = ToInputs(inputs, "next_token");
    std::vector<Request> reqs;
    std::vector<Result<Response>> results = RunOrRaise(in, &reqs, [&](Request* r) { r->top_k = top_k; });
    py::list out;
    for (size_t i = 0; i < reqs.size(); ++i) {
      py::list top;
      for (const TokenLogprob& t : results[i]->top) {
        std::string piece = tokenizer_ ? tokenizer_->Decode(std::span<const int32_t>(&t.token, 1)) : std::string();
        PyObject* u = PyUnicode_DecodeUTF8(piece.data(), static_cast<Py_ssize_t>(piece.size()), "replace");
        if (u == nullptr) throw py::error_already_set();
        top.append(py::make_tuple(t.token, t.logprob, py::reinterpret_steal<py::str>(u)));
      }
      out.append(std::move(top));
    }
    return in.single ? out[0] : py::object(out);
  }

  py::array_t<float> Embed(py::object inputs, py::object pooling_arg) {
    Use use(this);
    const std::string pooling = StrArg(pooling_arg, "pooling", "\"mean\" or \"last\"");
    Request::Pooling pool;
    if (pooling == "mean") pool = Request::Pooling::kMean;
    else if (pooling == "last") pool = Request::Pooling::kLast;
    else throw py::value_error("pooling = '" + pooling + "'; use \"mean\" or \"last\"");
    Inputs in = ToInputs(inputs, "embed");
    const auto t0 = Clock::now();
    const py::ssize_t n = static_cast<py::ssize_t>(in.items.size()), d = info().n_embd;
    // The output array is allocated before the run and filled in place, row by row.
    py::array_t<float> out = in.single ? py::array_t<float>(d) : py::array_t<float>({n, d});
    float* dst = out.mutable_data();
    Status st;
    {
      py::gil_scoped_release nogil;
      std::vector<Request> reqs;
      std::vector<Result<Response>> results;
      st = Build(&in, &reqs, [&](Request* r) {
        r->top_k = 0;
        r->embedding = pool;
      });
      if (st.ok()) st = RunBatch(reqs, t0, &results, "input");
      if (st.ok())
        for (py::ssize_t i = 0; i < n; ++i)
          std::memcpy(dst + i * d, results[i]->embedding.data(), static_cast<size_t>(d) * sizeof(float));
    }
    if (!st.ok()) Raise(st);
    return out;
  }

  py::object Classify(py::object prompt, py::object labels) {
    Use use(this);
    if (py::isinstance<py::str>(labels) || IsBytesLike(labels) || !py::isinstance<py::sequence>(labels))
      throw py::type_error("classify: labels must be a list of str (or of token-id lists)");
    py::sequence ls = py::reinterpret_borrow<py::sequence>(labels);
    if (ls.size() == 0) throw py::value_error("classify: labels is empty; give at least one label");
    std::vector<Input> label_inputs;
    size_t j = 0;
    for (py::handle x : ls) label_inputs.push_back(ToInput(x, "classify: labels[" + std::to_string(j++) + "]"));
    Inputs in = ToInputs(prompt, "classify");
    const auto t0 = Clock::now();
    std::vector<std::vector<int32_t>> label_ids(label_inputs.size());
    std::vector<Request> reqs;
    std::vector<double> probs;
    const size_t n_labels = label_inputs.size();
    Status st;
    {
      py::gil_scoped_release nogil;
      st = CheckTokenizer(label_inputs);
      if (st.ok()) {
        // Labels follow the prompt as they are: no BOS/EOS (a BPE vocabulary wants " yes").
        for (size_t k = 0; k < n_labels; ++k)
          label_ids[k] = label_inputs[k].is_text ? tokenizer_->Encode(label_inputs[k].text, false, false)
                                                 : label_inputs[k].ids;
        st = Build(&in, &reqs, [&](Request* r) {
          r->top_k = 0;
          r->continuations = label_ids;
        });
      }
      if (st.ok()) {
        std::vector<Result<Response>> results;
        st = RunBatch(reqs, t0, &results, "input");
        if (st.ok()) {
          probs.resize(reqs.size() * n_labels);
          std::vector<double> ll(n_labels);
          for (size_t i = 0; i < results.size(); ++i) {
            for (size_t k = 0; k < n_labels; ++k) ll[k] = results[i]->continuations[k].log_likelihood;
            const std::vector<double> p = batch::CandidateProbabilities(ll);
            std::copy(p.begin(), p.end(), probs.begin() + static_cast<std::ptrdiff_t>(i * n_labels));
          }
        }
      }
    }
    if (!st.ok()) Raise(st);
    const py::ssize_t n = static_cast<py::ssize_t>(reqs.size()), k = static_cast<py::ssize_t>(n_labels);
    py::array_t<double> out = in.single ? py::array_t<double>(k) : py::array_t<double>({n, k});
    if (!probs.empty()) std::memcpy(out.mutable_data(), probs.data(), probs.size() * sizeof(double));
    return out;
  }

  py::list ScoreCandidates(py::object context, py::object candidates) {
    Use use(this);
    if (py::isinstance<py::str>(candidates) || IsBytesLike(candidates) || !py::isinstance<py::sequence>(candidates))
      throw py::type_error("score_candidates: candidates must be a list of str (or of token-id lists)");
    Input ctx = ToInput(context, "score_candidates: context");
    std::vector<Input> cands;
    size_t j = 0;
    for (py::handle x : py::reinterpret_borrow<py::sequence>(candidates))
      cands.push_back(ToInput(x, "score_candidates: candidates[" + std::to_string(j++) + "]"));
    if (cands.empty()) throw py::value_error("score_candidates: candidates is empty");
    Inputs in;
    in.single = true;
    in.items.push_back(std::move(ctx));
    const auto t0 = Clock::now();
    std::vector<Request> reqs;
    std::vector<ContinuationScore> scores;
    Status st;
    {
      py::gil_scoped_release nogil;
      st = CheckTokenizer(cands);
      if (st.ok())
        st = Build(&in, &reqs, [&](Request* r) {
          r->top_k = 0;
          for (const Input& c : cands)
            r->continuations.push_back(c.is_text ? tokenizer_->Encode(c.text, false, false) : c.ids);
        });
      std::vector<Result<Response>> results;
      if (st.ok()) st = RunBatch(reqs, t0, &results, "context");
      if (st.ok()) scores = std::move(results[0].value().continuations);
    }
    if (!st.ok()) Raise(st);
    py::list out;
    for (size_t k = 0; k < scores.size(); ++k) {
      Candidate c;
      c.tokens = ToArray(reqs[0].continuations[k]);
      c.logprobs = ToArray(scores[k].logprobs);
      c.total = scores[k].log_likelihood;
      c.is_greedy = scores[k].is_greedy;
      out.append(py::cast(std::move(c)));
    }
    return out;
  }

  CallStats Stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }

  // Benchmark support (bench/python_overhead.py): times `reps` calls of the C++ API doing what
  // score(token_ids) does (build the Request, RunBatch of one, read the Response), in this
  // process, with the GIL released. Returns the seconds of each call.
  std::vector<double> TimeCppScore(std::vector<int32_t> tokens, int reps) {
    Use use(this);
    std::vector<double> times;
    py::gil_scoped_release nogil;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = Clock::now();
      std::vector<Request> reqs(1);
      reqs[0].tokens = tokens;
      reqs[0].top_k = 0;
      reqs[0].prompt_logprobs = true;
      std::vector<Result<Response>> results = engine_->RunBatch(reqs);
      volatile double sink = results[0].ok() ? results[0]->log_likelihood : 0;
      (void)sink;
      times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return times;
  }

 private:
  void RequireTokenizer() const {
    if (!tokenizer_) Raise(Status::NotSupported(tokenizer_error_ + " (this model takes token ids only)"));
  }

  Status CheckTokenizer(const std::vector<Input>& items) const {
    if (tokenizer_) return Status::Ok();
    for (const Input& x : items)
      if (x.is_text) return Status::NotSupported(tokenizer_error_ + " (give token ids instead of text)");
    return Status::Ok();
  }

  // Tokenizes the texts of `in` (BOS/EOS as the vocabulary asks) into requests. Runs without the
  // GIL.
  template <typename Fill>
  Status Build(Inputs* in, std::vector<Request>* reqs, Fill&& fill) const {
    ESTREAM_RETURN_IF_ERROR(CheckTokenizer(in->items));
    reqs->resize(in->items.size());
    for (size_t i = 0; i < in->items.size(); ++i) {
      Input& x = in->items[i];
      Request& r = (*reqs)[i];
      r.tokens = x.is_text ? tokenizer_->Encode(x.text, /*add_special=*/true, /*parse_special=*/false) : std::move(x.ids);
      fill(&r);
    }
    return Status::Ok();
  }

  // Runs the batch and records its statistics; the first failed request's Status (all results
  // are kept), or Cancelled when a signal handler raised (Ctrl-C: InterruptRequested). Runs
  // without the GIL.
  Status RunBatch(const std::vector<Request>& reqs, Clock::time_point t0, std::vector<Result<Response>>* results,
                  const char* what) {
    *results = engine_->RunBatch(reqs, 0, InterruptRequested);
    CallStats s = frontend::Summarize(*results, std::chrono::duration<double>(Clock::now() - t0).count());
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_ = std::move(s);
    }
    if (tls_pending.type != nullptr) return Status::Cancelled("interrupted");
    return frontend::FirstError(*results, what);
  }

  // Tokenize + run without the GIL, for the methods that build their outputs from the Responses
  // with the GIL; raises the first error.
  template <typename Fill>
  std::vector<Result<Response>> RunOrRaise(Inputs& in, std::vector<Request>* reqs, Fill&& fill) {
    const auto t0 = Clock::now();
    std::vector<Result<Response>> results;
    Status st;
    {
      py::gil_scoped_release nogil;
      st = Build(&in, reqs, fill);
      if (st.ok()) st = RunBatch(*reqs, t0, &results, "input");
    }
    if (!st.ok()) Raise(st);
    return results;
  }

  std::string path_repr_;  // repr() of the path as a str
  mutable std::shared_mutex life_;            // shared: a call using the engine; exclusive: close()
  std::unique_ptr<Engine> engine_;            // null once closed
  std::unique_ptr<TextTokenizer> tokenizer_;  // null: no vocabulary in the file (or closed)
  std::string tokenizer_error_;
  mutable std::mutex mu_;
  CallStats last_;  // GUARDED_BY(mu_)
};

// A Model method bound with its `self` checked: an object made by Model.__new__ without __init__
// has no C++ object (pybind11 would call the method on whatever its value pointer holds), so it
// raises TypeError, as does a `self` of another type (Model.score(5, ...)).
bool Initialised(py::handle h) {
  if (!py::isinstance<Model>(h)) throw py::type_error("expected an estream.Model as self, got " + TypeName(h));
  return reinterpret_cast<py::detail::instance*>(h.ptr())->get_value_and_holder().holder_constructed();
}
Model* Self(py::handle h) {
  const bool initialised = Initialised(h);
  py::detail::value_and_holder vh = reinterpret_cast<py::detail::instance*>(h.ptr())->get_value_and_holder();
  if (!initialised)
    throw py::type_error("this estream.Model was never initialised (Model.__new__ without __init__); create "
                         "models with estream.Model(path, ...)");
  return vh.value_ptr<Model>();
}
template <typename R, typename... A>
auto Checked(R (Model::*f)(A...)) {
  return [f](py::handle self, A... a) -> R { return (Self(self)->*f)(std::move(a)...); };
}
template <typename R, typename... A>
auto Checked(R (Model::*f)(A...) const) {
  return [f](py::handle self, A... a) -> R { return (Self(self)->*f)(std::move(a)...); };
}

// Every figure of a Stats with its name, in to_dict's order: f(name, field) (to_dict and pickling).
template <typename S, typename F>
void VisitStats(S& s, F&& f) {
  f("wall_seconds", s.wall_seconds);
  f("seconds", s.seconds);
  f("requests", s.requests);
  f("passes", s.passes);
  f("tokens", s.tokens);
  f("embed_seconds", s.timing.embed);
  f("attention_seconds", s.timing.attention);
  f("attention_projections_seconds", s.timing.attention_projections);
  f("attention_kernel_seconds", s.timing.attention_kernel);
  f("router_seconds", s.timing.router);
  f("experts_seconds", s.timing.experts);
  f("dense_ffn_seconds", s.timing.dense_ffn);
  f("head_seconds", s.timing.head);
  f("expert_seconds", s.expert_seconds);
  f("nonexpert_seconds", s.nonexpert_seconds);
  f("bubble_seconds", s.bubble_seconds);
  f("bubble_rate", s.bubble_rate);
  f("bytes_read", s.bytes_read);
  f("read_gbps", s.read_gbps);
  f("peak_rss_bytes", s.peak_rss_bytes);
  f("streamed", s.streamed);
  f("group_size", s.group_size);
  f("banks", s.banks);
  f("queue_depth", s.queue_depth);
  f("schedule", s.schedule);
  f("io_backend", s.io_backend);
  f("arena_bytes", s.arena_bytes);
  f("budget_bytes", s.budget_bytes);
  f("groups_read", s.groups_read);
  f("groups_skipped", s.groups_skipped);
  f("groups_cancelled", s.groups_cancelled);
}

py::dict StatsDict(const CallStats& s) {
  py::dict d;
  VisitStats(s, [&](const char* name, const auto& v) { d[name] = v; });
  return d;
}

// Pickling of the result types (plain values: they can go to another process, e.g. from a
// multiprocessing worker). A state that is not what __getstate__ gave raises ValueError.
CallStats StatsFromDict(const py::dict& d) {
  CallStats s;
  VisitStats(s, [&](const char* name, auto& v) {
    if (!d.contains(name)) throw py::value_error(std::string("Stats.__setstate__: no '") + name + "' in the state");
    v = d[name].cast<std::decay_t<decltype(v)>>();
  });
  return s;
}

void CheckState(const py::tuple& t, size_t n, const char* type) {
  if (t.size() != n)
    throw py::value_error(std::string(type) + ".__setstate__: a state of " + std::to_string(n) + " values, got " +
                          std::to_string(t.size()));
}

}  // namespace
}  // namespace estream::python

PYBIND11_MODULE(_estream, m) {
  using namespace estream;
  using namespace estream::python;
  m.doc() = "estream: prefill-only mixture-of-experts inference (scoring, classification, embeddings).";
  m.attr("__version__") = "0.1.0";

  py::class_<Score>(m, "Score", "The log-likelihood of one input (Model.score).")
      .def_readonly("tokens", &Score::tokens, "int32 [n_tokens]: the input's token ids")
      .def_readonly("logprobs", &Score::logprobs,
                    "float32 [n_tokens - 1]: logprobs[t] = log p(tokens[t+1] | tokens[0..t]) (natural log; the "
                    "first token is not scored)")
      .def_readonly("total", &Score::total, "sum of logprobs (computed in double)")
      .def_readonly("perplexity", &Score::perplexity, "exp(-total / (n_tokens - 1)); NaN for one token")
      .def(py::pickle([](const Score& s) { return py::make_tuple(s.tokens, s.logprobs, s.total, s.perplexity); },
                      [](const py::tuple& t) {
                        CheckState(t, 4, "Score");
                        return Score{t[0].cast<py::array_t<int32_t>>(), t[1].cast<py::array_t<float>>(),
                                     t[2].cast<double>(), t[3].cast<double>()};
                      }))
      .def("__repr__", [](const Score& s) {
        return "Score(n_tokens=" + std::to_string(s.tokens.size()) + ", total=" + std::to_string(s.total) +
               ", perplexity=" + std::to_string(s.perplexity) + ")";
      });

  py::class_<Candidate>(m, "Candidate", "The score of one candidate continuation (Model.score_candidates).")
      .def_readonly("tokens", &Candidate::tokens, "int32: the candidate's token ids")
      .def_readonly("logprobs", &Candidate::logprobs,
                    "float32: log p(token j | context, tokens[0..j-1]) for each candidate token")
      .def_readonly("total", &Candidate::total, "log p(candidate | context): the sum of logprobs")
      .def_readonly("is_greedy", &Candidate::is_greedy,
                    "True when every token is the most likely one at its position (greedy decoding gives it)")
      .def(py::pickle([](const Candidate& c) { return py::make_tuple(c.tokens, c.logprobs, c.total, c.is_greedy); },
                      [](const py::tuple& t) {
                        CheckState(t, 4, "Candidate");
                        return Candidate{t[0].cast<py::array_t<int32_t>>(), t[1].cast<py::array_t<float>>(),
                                         t[2].cast<double>(), t[3].cast<bool>()};
                      }))
      .def("__repr__", [](const Candidate& c) {
        return "Candidate(n_tokens=" + std::to_string(c.tokens.size()) + ", total=" + std::to_string(c.total) +
               ", is_greedy=" + (c.is_greedy ? "True" : "False") + ")";
      });

  py::class_<frontend::CallStats>(m, "Stats",
                                  "Where the last call's time and memory went (Model.stats). Times in seconds.")
      .def_readonly("wall_seconds", &frontend::CallStats::wall_seconds, "the whole call, tokenizing included")
      .def_readonly("seconds", &frontend::CallStats::seconds, "the forward passes, summed")
      .def_readonly("requests", &frontend::CallStats::requests, "inputs of the call")
      .def_readonly("passes", &frontend::CallStats::passes, "forward passes that ran them")
      .def_readonly("tokens", &frontend::CallStats::tokens, "tokens of those passes")
      .def_readonly("bubble_seconds", &frontend::CallStats::bubble_seconds,
                    "compute threads waiting for expert data (streamed runs)")
      .def_readonly("bubble_rate", &frontend::CallStats::bubble_rate, "bubble_seconds / seconds")
      .def_readonly("bytes_read", &frontend::CallStats::bytes_read, "expert bytes read from the file")
      .def_readonly("read_gbps", &frontend::CallStats::read_gbps, "bytes_read / loader busy time, GB/s")
      .def_readonly("peak_rss_bytes", &frontend::CallStats::peak_rss_bytes, "the process's peak RSS (VmHWM)")
      .def_readonly("streamed", &frontend::CallStats::streamed, "experts streamed through the arena")
      .def("to_dict", &StatsDict, "every figure (the above, per-part timings, streaming configuration) as a dict")
      .def(py::pickle([](const frontend::CallStats& s) { return StatsDict(s); },
                      [](const py::dict& d) { return StatsFromDict(d); }))
      .def("__repr__", [](const frontend::CallStats& s) {
        char buf[256];
        std::snprintf(buf, sizeof(buf),
                      "Stats(requests=%d, passes=%d, tokens=%lld, seconds=%.6f, wall_seconds=%.6f, bubble_rate=%.4f, "
                      "bytes_read=%llu, peak_rss_bytes=%llu)",
                      s.requests, s.passes, static_cast<long long>(s.tokens), s.seconds, s.wall_seconds, s.bubble_rate,
                      static_cast<unsigned long long>(s.bytes_read), static_cast<unsigned long long>(s.peak_rss_bytes));
        return std::string(buf);
      });

  py::class_<Model>(m, "Model", R"doc(A loaded model. Load once, then call its methods from any thread.

Model(path, budget=None, threads=0, schedule="early", batch_tokens=0, budget_tokens=0)

path: a GGUF file (or one packed by `estream pack`): a str, bytes or pathlib.Path.
budget: None, bytes, or a size such as "4G" (a number is bytes): the model must be packed
  (`estream pack`; an unpacked GGUF with a budget raises ValueError); its experts are then
  streamed and the process's peak RSS stays within the budget.
threads: compute threads, 0 (one per CPU) to 1024.
schedule: "early" (default), "after-routing" or "on-demand" (streamed runs).
batch_tokens: most tokens of one forward pass (0 = the engine's default).
budget_tokens: longest input (forward pass) the budget plans activations for. 0 = the engine's
  default: up to 16384 tokens where the budget holds them beside the full streaming arena, else
  4096 (at most the context), or for a smaller budget the longest of 2048, 1024, 512, 256 and
  128 that fits beside two banks of experts. info["pass_tokens"] says what was chosen; a longer
  input raises ValueError naming budget_tokens.

Raises OSError (cannot open, malformed file), ValueError (unsupported model, bad option, a
budget on an unpacked model), MemoryError (budget too small even for a 128-token pass).)doc")
      .def(py::init<py::object, py::object, py::object, py::object, py::object, py::object>(),
           py::arg("path") = py::none(),
           py::arg("budget") = py::none(), py::arg("threads") = 0, py::arg("schedule") = "early",
           py::arg("batch_tokens") = 0, py::arg("budget_tokens") = 0)
      .def("tokenize", Checked(&Model::Tokenize), py::arg("text"), py::arg("add_special") = true,
           py::arg("parse_special") = false,
           "Token ids of a str (a list of int), or of each str of a list. add_special: BOS/EOS as the vocabulary "
           "asks (what score/embed/next_token do with text); parse_special: recognise control tokens such as "
           "\"<|im_start|>\" in the text.")
      .def("detokenize", Checked(&Model::Detokenize), py::arg("tokens"), py::arg("render_special") = false,
           "The text of token ids (a str), or of each list of a list. Bytes that do not form UTF-8 (tokens cutting "
           "a character) become U+FFFD; an id outside the vocabulary raises ValueError.")
      .def("score", Checked(&Model::ScoreTexts), py::arg("inputs"),
           "Log-likelihood of each input under the model: a Score (tokens, logprobs, total, perplexity) for one "
           "input (a str or a list of token ids), a list of Score for a list of inputs (one batch). Text is "
           "tokenized with BOS/EOS as the vocabulary asks.")
      .def("next_token", Checked(&Model::NextToken), py::arg("inputs"), py::arg("top_k") = 5,
           "The top_k most likely next tokens after each input, most likely first: a list of (token_id, logprob, "
           "text) for one input, a list of those for a list of inputs (one batch).")
      .def("embed", Checked(&Model::Embed), py::arg("inputs"), py::arg("pooling") = "mean",
           "Embeddings: the final hidden states (after the final norm), averaged over the tokens (pooling=\"mean\") "
           "or of the last token (\"last\"). numpy float32 [n_embd] for one input, [n, n_embd] for a list (one "
           "batch, filled in place).")
      .def("classify", Checked(&Model::Classify), py::arg("prompt"), py::arg("labels"),
           "Probabilities of the labels as continuations of the prompt: softmax over log p(label | prompt) (each "
           "label's summed log-probability). Labels are appended as they are, without BOS (a BPE vocabulary wants "
           "\" yes\" with the space). numpy float64 [n_labels] for one prompt, [n_prompts, n_labels] for a list.")
      .def("score_candidates", Checked(&Model::ScoreCandidates), py::arg("context"), py::arg("candidates"),
           "log p(candidate | context) for each candidate (multiple choice, reranking), the context computed once: a "
           "list of Candidate (tokens, logprobs, total, is_greedy).")
      .def_property_readonly("stats", Checked(&Model::Stats),
                             "Stats of the last call that ran the model (score, next_token, embed, classify, "
                             "score_candidates), from any thread.")
      .def_property_readonly("info", Checked(&Model::InfoDict), "Facts about the model (architecture, n_layer, n_embd, ...).")
      .def_property_readonly("n_embd", [](py::handle self) { return Self(self)->N(&ModelInfo::n_embd); },
                             "embedding width: the length of embed()'s vectors")
      .def_property_readonly("n_vocab", [](py::handle self) { return Self(self)->N(&ModelInfo::n_vocab); },
                             "vocabulary size: token ids are 0 to n_vocab - 1")
      .def_property_readonly("n_ctx", [](py::handle self) { return Self(self)->N(&ModelInfo::n_ctx); },
                             "context length: the longest input accepted")
      .def("close", Checked(&Model::Close),
           "Frees the model's memory now, once the calls running on it (from other threads) return; later "
           "calls raise ValueError. Idempotent; `with estream.Model(...) as m:` closes at the end of the block.")
      .def_property_readonly("closed", Checked(&Model::Closed), "True after close()")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](py::handle self, py::args) { Self(self)->Close(); })
      .def("__reduce__", [](const Model&) -> py::object {
        throw py::type_error("an estream.Model cannot be pickled or copied (it holds a loaded model); load the "
                             "model in each process with estream.Model(path, ...)");
      })
      .def("_time_cpp_score", Checked(&Model::TimeCppScore), py::arg("tokens"), py::arg("reps"),
           "benchmark support: seconds of each of `reps` C++ API calls equivalent to score(tokens)")
      .def("__repr__", [](py::handle self) {
        return Initialised(self) ? Self(self)->Repr() : std::string("estream.Model(not initialised)");
      });
}
