// Where a file written through a temporary and rename(2) may go.
//
// rename(2) replaces whatever directory entry the destination names: a device node or a FIFO
// becomes a regular file (as root, `pack x.gguf -o /dev/null` turned /dev/null into a model), and
// a symbolic link is replaced by the file instead of the file it points to being updated. So a
// writer that renames into place first resolves its destination here:
//   - no such entry: the path itself (the new file is created there);
//   - a regular file: the path itself (it is replaced);
//   - a symbolic link to a regular file: that file (realpath), which is replaced while the link
//     stays, as a shell redirection through the link would write it;
//   - anything else (a directory, a device, a FIFO, a socket, a link to one of those or to
//     nothing): InvalidArgument naming the path and what it is, before anything is written.
#pragma once

#include <string>

#include "base/status.h"

namespace estream {

// The path to rename onto for an output given as `path` (see above). `what` names the output in
// messages ("the packed model"). IOError when the path cannot be examined (EACCES, ENOTDIR...).
Result<std::string> ResolveOutputPath(const std::string& path, const std::string& what = "the output");

}  // namespace estream
