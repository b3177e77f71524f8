// What a path names when it is not a regular file, and the check the model readers make on
// the descriptors they open.
//
// Thread safety: pure functions (RegularFileSize changes only its descriptor's flags).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "base/status.h"

namespace estream {

// "a directory", "a FIFO", "a character device", "a block device", "a socket", or "not a
// regular file" for a stat mode of another kind.
const char* FileTypeName(mode_t mode);

// For a model file opened with O_NONBLOCK (so that opening a FIFO does not wait for a writer):
// its size, or IOError naming `path` and what it is ("not a regular file (a FIFO); give the path
// of a model file") when it is not a regular file. O_NONBLOCK is then cleared (io_uring would
// answer uncached reads of a non-blocking descriptor with EAGAIN). The caller closes fd.
Result<uint64_t> RegularFileSize(int fd, const std::string& path);

}  // namespace estream
