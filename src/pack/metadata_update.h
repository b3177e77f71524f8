// Changing the metadata of a GGUF file (a packed model) without rewriting its tensor data:
// `estream profile` stores estream.profile.* / estream.config.* into a 17 GB packed model in
// milliseconds.
//
// ---- The header reserve ---------------------------------------------------------------------
// A GGUF file's data section starts at the header's end rounded up to general.alignment (4096
// in packed models), and every tensor offset is relative to that start. `estream pack` writes one
// extra key as the LAST metadata key,
//   estream.header_reserve    u64 array of zeros, kHeaderReserveBytes (256 KiB) of payload,
// so the header has room to grow. (A u64 array rather than u8: the same bytes on disk, but the
// GGUF reader parses each array element into a ~96-byte GgufValue, so a 256 KiB u8 array would
// cost every process that opens the model 24 MiB of RSS; as u64 it is 3 MiB.) Nothing reads the
// key's value; readers that do not know it ignore it.
//
// ---- UpdateMetadata -------------------------------------------------------------------------
// new metadata = the file's keys, in their order,
//                minus every key starting with one of remove_prefixes,
//                minus estream.header_reserve,
//                with each key of `set` replacing the same-named key in place (new keys appended
//                in `set` order),
//                plus estream.header_reserve last, sized to fill the room.
// The tensor infos (names, types, shapes, offsets) are kept as they are.
//   In place (the common case): when the new header fits in front of the data section, the
//     reserve is sized so that the header ends in the last 8 bytes before the CURRENT data
//     offset (u64 granularity), so the data section starts at exactly the same byte and only the
//     bytes [0, data_offset) are rewritten (pwrite + fdatasync). Tensor data is never written.
//   Full rewrite (fallback): when the new header does not fit (a file packed before the reserve
//     existed, or an update larger than the room left), the whole file is rewritten through a
//     temporary next to it ("<path>.tmp.<pid>", GgufWriter): new header with a fresh
//     kHeaderReserveBytes reserve, then every tensor's bytes copied from the old file in 16 MiB
//     chunks (progress reported), fsync, rename over `path`, fsync of the directory. Checks the
//     free space of the file system first. The new file keeps the original's permission bits
//     (fchmod of the temporary before the rename) and, where this process may change it (root,
//     or a group it belongs to), its owner and group.
//
// ---- Crash safety ---------------------------------------------------------------------------
// Full rewrite: atomic. Until the rename the original file is untouched; on any failure the
//   temporary is removed and the original is left as it was; a crash leaves at most a stale
//   "<path>.tmp.<pid>" beside an intact original.
// In place: the tensor data (bytes >= data_offset) is never written, whatever happens. The header
//   is rewritten in three steps, each followed by fdatasync:
//     1. the magic (bytes 0..3) is zeroed;
//     2. bytes [4, data_offset) get the new header and its zero padding;
//     3. the magic "GGUF" is written back.
//   So a reader sees either the old header, a file whose magic is wrong (any GGUF reader refuses
//   it: never a half-old, half-new header taken for valid metadata), or the new header. A crash
//   (power loss) during steps 1-3, a window of milliseconds, leaves the file refused with "bad
//   magic" and its tensor data intact; repair by packing the source model again. An I/O error
//   during the steps is answered by writing the old header back (best effort) before returning
//   the error. Processes that already have the model open are not affected (they parsed the
//   header at open and only read tensor data).
// Concurrent updates of one file are excluded with flock(LOCK_EX) on it: a second UpdateMetadata
// fails at once ("being updated by another process") instead of interleaving.
// A symbolic link is resolved first: the file it names is updated (or replaced), the link stays.
//
// Thread safety: UpdateMetadata may run concurrently on different files.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"

namespace estream::io {

inline constexpr char kHeaderReserveKey[] = "estream.header_reserve";
constexpr uint64_t kHeaderReserveBytes = uint64_t{256} << 10;

// The reserve's value: a u64 array of zeros with ceil(payload_bytes / 8) elements.
GgufValue HeaderReserveValue(uint64_t payload_bytes = kHeaderReserveBytes);

// Progress of a full rewrite: tensor bytes copied so far and in all. Called on the calling thread
// after every chunk (and once at the end of an in-place update with done == total == header).
using ProgressFn = std::function<void(uint64_t bytes_done, uint64_t bytes_total)>;

// What UpdateMetadata did.
struct MetadataUpdateInfo {
  bool in_place = false;         // true: header rewritten in place; false: the whole file
  uint64_t data_offset = 0;      // of the updated file (unchanged when in_place)
  uint64_t header_bytes = 0;     // serialised header of the updated file, reserve included
  uint64_t reserve_bytes = 0;    // payload bytes of its estream.header_reserve (room left)
  uint64_t bytes_copied = 0;     // tensor bytes copied (full rewrite only)
  double seconds = 0;
};

// Sets and removes metadata keys of the GGUF file at `path` (see the top of this file).
// Errors (one line naming the path and what to do), with the file left as it was:
//   InvalidArgument  a `set` key that is empty, repeated, general.alignment or
//                    estream.header_reserve (both are managed here), an empty remove prefix, a
//                    value the GGUF writer refuses (inhomogeneous array);
//   IOError          open/read/write/fsync/rename failures, not enough free space for a full
//                    rewrite (the message gives both figures), the file locked by another update;
//   the reader's Corruption/NotSupported for a malformed file.
// general.alignment is never removed, whatever remove_prefixes say (it fixes every offset).
Status UpdateMetadata(const std::string& path, const std::vector<GgufKv>& set,
                      const std::vector<std::string>& remove_prefixes, ProgressFn progress = {},
                      MetadataUpdateInfo* info = nullptr);

// Whether UpdateMetadata could write `path`, found without changing it: it opens for writing and
// writes the first 4 bytes back as they are. IOError naming the path and the OS error (EACCES,
// EROFS, ENOSYS on a file system without write support, ...). For a caller that does long work
// before its update (estream profile measures first) and should fail at once instead.
Status CheckUpdatable(const std::string& path);

}  // namespace estream::io
