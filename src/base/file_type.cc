#include "base/file_type.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

namespace estream {

const char* FileTypeName(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

Result<uint64_t> RegularFileSize(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::IOError(path + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    return Status::IOError(path + ": not a regular file (" + FileTypeName(st.st_mode) +
                           "); give the path of a model file");
  if (const int flags = ::fcntl(fd, F_GETFL); flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0)
    return Status::IOError(path + ": cannot set up the descriptor: " + std::strerror(errno));
  return static_cast<uint64_t>(st.st_size);
}

}  // namespace estream
