// What the process does with its files when a signal ends it (docs/DESIGN.md section 11).
//
// Mapped model files. Dense weights are read through a read-only mapping of the model
// (GgufFile). When the file is truncated while mapped, or the disk fails a page-in (EIO), the
// access that faults gets SIGBUS, which by default kills the process with no message. Once
// InstallFileSignalHandlers ran, a SIGBUS whose faulting address (si_addr) lies inside a
// registered mapping instead writes one line to stderr,
//   "<prefix>PATH: the model file was truncated or could not be read (I/O error) while in use; ..."
// and ends the process with kMappedFileErrorExitCode. Any other SIGBUS keeps the behaviour it had
// (the handler gives back the disposition it found, the default action or a sanitizer's handler,
// and lets the fault recur: a core dump as before).
//
// Temporary files. A writer that creates a temporary file to rename into place later (GgufWriter)
// registers it; a process killed by SIGINT, SIGTERM or SIGHUP, or dying of SIGSEGV, SIGBUS or
// SIGABRT (a failed thread creation in OpenMP), or calling exit() while one is registered, removes
// it before it goes, so no full-size "<out>.tmp.<pid>" is left behind. The signal then ends the
// process as it would have (the previous disposition is given back and the signal re-raised).
//
// The registries are fixed arrays written before the handler can look at them (atomic slot
// states, release/acquire), and the handler uses only async-signal-safe calls (unlink, write,
// sigaction, raise, _exit). Registration is cheap and does nothing visible until a handler is
// installed: library code registers, and only programs that want the behaviour install it (the
// estream CLI and server at start; the C and Python APIs leave the host program's signals alone).
//
// Thread safety: every function may be called from any thread. Limits: kMaxMappedFiles mappings
// and kMaxTempFiles temporaries at once, paths up to kMaxSignalPath bytes; past them a
// registration returns -1 and the file simply keeps the default behaviour.
#pragma once

#include <cstddef>
#include <string>

namespace estream {

inline constexpr int kMaxMappedFiles = 64;
inline constexpr int kMaxTempFiles = 16;
inline constexpr size_t kMaxSignalPath = 4096;
// EX_IOERR of sysexits.h: distinct from the CLI's 1 for ordinary errors.
inline constexpr int kMappedFileErrorExitCode = 74;

// Registers [addr, addr + size) as a mapping of the file at `path`. Returns a slot for
// UnregisterMappedFile, or -1 when the table is full or the path too long.
int RegisterMappedFile(const void* addr, size_t size, const std::string& path);
void UnregisterMappedFile(int slot);  // -1: no-op

// Registers a temporary file to remove if the process is killed (see above). Returns a slot for
// UnregisterTempFile, or -1 when the table is full or the path too long.
int RegisterTempFile(const std::string& path);
void UnregisterTempFile(int slot);  // -1: no-op

// Installs the handlers of SIGBUS, SIGSEGV, SIGABRT, SIGINT, SIGTERM and SIGHUP and an atexit
// hook (once per process; later calls only change the prefix). `error_prefix` starts the line
// printed for a mapped file ("estream prefill: error: "); at most 255 bytes are kept.
void InstallFileSignalHandlers(const std::string& error_prefix);

}  // namespace estream
