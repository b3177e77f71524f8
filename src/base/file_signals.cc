#include "base/file_signals.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>

namespace estream {
namespace {

// A slot is claimed (kFilling) by compare-and-swap, filled, then published (kReady, release);
// the handler reads only kReady slots (acquire). Freeing is one store of kFree.
enum SlotState : int { kFree = 0, kFilling = 1, kReady = 2 };

struct MappedSlot {
  std::atomic<int> state{kFree};
  uintptr_t begin = 0, end = 0;
  char path[kMaxSignalPath] = {};
};

struct TempSlot {
  std::atomic<int> state{kFree};
  char path[kMaxSignalPath] = {};
};

MappedSlot g_mapped[kMaxMappedFiles];
TempSlot g_temps[kMaxTempFiles];
char g_prefix[256] = {};
std::atomic<bool> g_installed{false};

constexpr int kSignals[] = {SIGBUS, SIGSEGV, SIGABRT, SIGINT, SIGTERM, SIGHUP};
// The dispositions found at installation, given back before a signal is passed on.
struct sigaction g_previous[std::size(kSignals)];

template <typename Slot, int N>
int Claim(Slot (&slots)[N]) {
  for (int i = 0; i < N; ++i) {
    int expected = kFree;
    if (slots[i].state.compare_exchange_strong(expected, kFilling, std::memory_order_acquire)) return i;
  }
  return -1;
}

constexpr char kMappedFileError[] =
    ": the model file was truncated or could not be read (I/O error) while in use; check the disk and the file "
    "(estream inspect), and do not change or replace a model file in place while estream uses it\n";

// Appends the NUL-terminated s to buf[*n..cap), as much as fits.
void Append(char* buf, size_t cap, size_t* n, const char* s) {
  const size_t k = std::min(std::strlen(s), cap - *n);
  std::memcpy(buf + *n, s, k);
  *n += k;
}

// write(2) of n bytes, resumed after short writes; errors are ignored (there is nothing left to
// tell them to).
void WriteAll(const char* s, size_t n) {
  while (n > 0) {
    const ssize_t r = ::write(STDERR_FILENO, s, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return;
    s += r;
    n -= static_cast<size_t>(r);
  }
}

void RemoveTempFiles() {
  for (TempSlot& t : g_temps)
    if (t.state.load(std::memory_order_acquire) == kReady) ::unlink(t.path);
}

// The model file whose mapping holds `addr`, or nullptr.
const char* MappedFileAt(uintptr_t addr) {
  for (const MappedSlot& m : g_mapped)
    if (m.state.load(std::memory_order_acquire) == kReady && addr >= m.begin && addr < m.end) return m.path;
  return nullptr;
}

void OnSignal(int sig, siginfo_t* info, void*) {
  const int saved_errno = errno;
  RemoveTempFiles();
  if (sig == SIGBUS && info != nullptr) {
    if (const char* path = MappedFileAt(reinterpret_cast<uintptr_t>(info->si_addr))) {
      // Several compute threads may fault at once: the first reports (in one write, so the
      // line stays whole) and ends the process; the others wait for that.
      static std::atomic<bool> reporting{false};
      if (reporting.exchange(true)) {
        for (;;) ::pause();
      }
      char line[sizeof(g_prefix) + kMaxSignalPath + sizeof(kMappedFileError)];
      size_t n = 0;
      Append(line, sizeof(line), &n, g_prefix);
      Append(line, sizeof(line), &n, path);
      Append(line, sizeof(line), &n, kMappedFileError);
      WriteAll(line, n);
      _exit(kMappedFileErrorExitCode);
    }
  }
  // Passed on as if this handler had not been installed: the disposition found before it (the
  // default action, or a sanitizer's or host program's handler) is given back; a fault (si_code
  // > 0: SIGBUS, SIGSEGV from an access) then recurs when this handler returns and reaches it
  // with its own siginfo, a sent signal (kill, raise, abort) is raised again.
  for (size_t i = 0; i < std::size(kSignals); ++i)
    if (kSignals[i] == sig) ::sigaction(sig, &g_previous[i], nullptr);
  if (info == nullptr || info->si_code <= 0) ::raise(sig);
  errno = saved_errno;
}

}  // namespace

int RegisterMappedFile(const void* addr, size_t size, const std::string& path) {
  if (path.size() >= kMaxSignalPath || size == 0) return -1;
  const int i = Claim(g_mapped);
  if (i < 0) return -1;
  MappedSlot& m = g_mapped[i];
  std::memcpy(m.path, path.c_str(), path.size() + 1);
  m.begin = reinterpret_cast<uintptr_t>(addr);
  m.end = m.begin + size;
  m.state.store(kReady, std::memory_order_release);
  return i;
}

void UnregisterMappedFile(int slot) {
  if (slot >= 0 && slot < kMaxMappedFiles) g_mapped[slot].state.store(kFree, std::memory_order_release);
}

int RegisterTempFile(const std::string& path) {
  if (path.size() >= kMaxSignalPath) return -1;
  const int i = Claim(g_temps);
  if (i < 0) return -1;
  std::memcpy(g_temps[i].path, path.c_str(), path.size() + 1);
  g_temps[i].state.store(kReady, std::memory_order_release);
  return i;
}

void UnregisterTempFile(int slot) {
  if (slot >= 0 && slot < kMaxTempFiles) g_temps[slot].state.store(kFree, std::memory_order_release);
}

void InstallFileSignalHandlers(const std::string& error_prefix) {
  const size_t n = std::min(error_prefix.size(), sizeof(g_prefix) - 1);
  std::memcpy(g_prefix, error_prefix.data(), n);
  g_prefix[n] = '\0';
  if (g_installed.exchange(true)) return;
  std::atexit(RemoveTempFiles);
  for (size_t i = 0; i < std::size(kSignals); ++i) {
    const int sig = kSignals[i];
    struct sigaction& old = g_previous[i];
    if (::sigaction(sig, nullptr, &old) != 0) continue;
    // A signal the process was started to ignore (nohup, a background job of a script) stays
    // ignored.
    if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_IGN) continue;
    struct sigaction sa {};
    sa.sa_sigaction = OnSignal;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, nullptr);
  }
}

}  // namespace estream
