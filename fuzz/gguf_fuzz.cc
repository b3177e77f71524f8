// libFuzzer target for the GGUF reader.
//
// Each input is parsed with GgufFile::FromMemory (libFuzzer hands us an exact-size heap buffer, so
// ASan flags any read past its end). When parsing succeeds, every tensor's byte range is read in
// full, every key is looked up and read with every typed getter, and the same bytes are parsed a
// second time through the pread path (GgufOpenOptions.mmap = false, via a memfd); both paths must
// agree, or the target aborts.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace {

using estream::GgufFile;
using estream::GgufTensorInfo;
using estream::GgufValue;

volatile uint64_t g_sink;

void TouchValue(const GgufValue& v, uint64_t* acc) {
  *acc += v.u + static_cast<uint64_t>(v.i) + v.str.size() + static_cast<uint64_t>(v.f != 0);
  for (const GgufValue& e : v.array) TouchValue(e, acc);
}

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "gguf_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

// Parses `data` from a memfd with pread; returns the status (and checks it agrees with `mem`).
void CheckPreadPath(const uint8_t* data, size_t size, const GgufFile* mem, const estream::Status& mem_status) {
  static int fd = -1;
  if (fd < 0) fd = ::memfd_create("gguf_fuzz", 0);
  if (fd < 0) return;  // no memfd: skip the differential check
  if (::ftruncate(fd, 0) != 0) return;
  size_t done = 0;
  while (done < size) {
    ssize_t r = ::pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    if (r <= 0) return;
    done += static_cast<size_t>(r);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  auto f = GgufFile::Open(path, {.mmap = false});
  if (f.ok() != (mem != nullptr))
    Fail("pread and memory parsers disagree", f.ok() ? "pread accepted: " + mem_status.ToString() : f.status().ToString());
  if (!f.ok()) {
    if (f.status().code() != mem_status.code()) Fail("status codes differ", f.status().ToString());
    return;
  }
  if ((*f)->tensors().size() != mem->tensors().size() || (*f)->kvs().size() != mem->kvs().size() ||
      (*f)->data_offset() != mem->data_offset())
    Fail("pread and memory parsers see different files", path);
  std::vector<uint8_t> buf;
  for (size_t k = 0; k < mem->tensors().size(); ++k) {
    const GgufTensorInfo& a = mem->tensors()[k];
    const GgufTensorInfo& b = (*f)->tensors()[k];
    if (a.offset != b.offset || a.n_bytes != b.n_bytes || a.name != b.name) Fail("tensor infos differ", a.name);
    buf.resize(b.n_bytes);
    estream::Status s = (*f)->ReadTensor(b, 0, buf.data(), b.n_bytes);
    if (!s.ok()) Fail("ReadTensor failed on a validated tensor", s.ToString());
    const uint8_t* p = mem->TensorData(a);
    for (uint64_t i = 0; i < a.n_bytes; ++i)
      if (p[i] != buf[i]) Fail("tensor bytes differ", a.name);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = GgufFile::FromMemory(data, size, "fuzz.gguf");
  if (!file.ok()) {
    const std::string& m = file.status().message();
    if (m.rfind("fuzz.gguf: ", 0) != 0) Fail("error message does not name the file", m);
    CheckPreadPath(data, size, nullptr, file.status());
    return 0;
  }
  const GgufFile& f = **file;
  uint64_t acc = 0;
  for (const estream::GgufKv& kv : f.kvs()) {
    if (f.Find(kv.key) != &kv.value) Fail("Find does not return the kv", kv.key);
    TouchValue(kv.value, &acc);
    // Every getter either succeeds or fails with a Status; none may crash.
    if (auto r = f.GetU64(kv.key); r.ok()) acc += *r;
    if (auto r = f.GetU32(kv.key); r.ok()) acc += *r;
    if (auto r = f.GetF32(kv.key); r.ok()) acc += static_cast<uint64_t>(*r != 0);
    if (auto r = f.GetBool(kv.key); r.ok()) acc += *r;
    if (auto r = f.GetString(kv.key); r.ok()) acc += r->size();
  }
  for (const GgufTensorInfo& t : f.tensors()) {
    if (f.FindTensor(t.name) != &t) Fail("FindTensor does not return the tensor", t.name);
    const uint8_t* p = f.TensorData(t);
    if (t.n_bytes > 0 && (p < data || p + t.n_bytes > data + size)) Fail("tensor outside the input", t.name);
    for (uint64_t i = 0; i < t.n_bytes; ++i) acc += p[i];
    acc += t.ShapeString().size();
  }
  g_sink = acc;
  CheckPreadPath(data, size, &f, estream::Status::Ok());
  return 0;
}
