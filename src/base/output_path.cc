#include "base/output_path.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "base/file_type.h"

namespace estream {
Result<std::string> ResolveOutputPath(const std::string& path, const std::string& what) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return path;
    return Status::IOError(path + ": cannot examine " + what + "'s path: " + std::strerror(errno));
  }
  if (S_ISREG(st.st_mode)) return path;
  const std::string refuse = "; " + what + " is written to a temporary file and renamed over this path, which would "
                             "replace it: give the path of a regular file";
  if (!S_ISLNK(st.st_mode)) return Status::InvalidArgument(path + " is " + FileTypeName(st.st_mode) + refuse);
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT)
      return Status::InvalidArgument(path + " is a symbolic link to a file that does not exist; give another path "
                                     "or remove the link");
    return Status::IOError(path + ": cannot examine the target of the symbolic link: " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode))
    return Status::InvalidArgument(path + " is a symbolic link to " + FileTypeName(st.st_mode) + refuse);
  char* real = ::realpath(path.c_str(), nullptr);
  if (real == nullptr)
    return Status::IOError(path + ": cannot resolve the symbolic link: " + std::strerror(errno));
  std::string target(real);
  ::free(real);
  return target;
}

}  // namespace estream
