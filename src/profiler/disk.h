// Disk characterisation for the configurator (docs/DESIGN.md section 7, step 1):
// the grouped-read bandwidth of the device holding a packed model, vs queue depth, for each
// candidate group size, measured by reading REAL groups of the packed file with O_DIRECT
// through io::Loader (page cache bypassed), as the engine's streamer reads them.
//
// ---- What is measured -----------------------------------------------------------------------
// For each group size g (a group = g consecutive records of one MoE layer's region = one
// contiguous read of g * record_bytes) and each depth q (the loader's chunk reads in flight):
//   bandwidth[g][q] = bytes of the cell's reads / (last completion - first submission)
// over reads of whole groups spread over the file (a fixed stride through every layer's full
// groups, so consecutive reads never hit neighbouring ranges): at least DiskParams::cell_bytes,
// at least min_reads reads, and enough reads to keep q chunks in flight twice over. Cells of one
// g continue through the list, so they read different groups. Then per g, at Q0(g) (the smallest depth reaching 95% of the
// row's peak, config::DiskProfile::Q0), a few reads issued ONE AT A TIME give the per-read
// latency beyond the transfer: lat(g) = max(0, median(read time) - bytes / bw(g, Q0)).
// Group sizes larger than a layer's expert count are dropped (no such group exists).
//
// Cost: about cell_bytes x depths per g (default 48 MiB x 6), ~2 GB for OLMoE's five group
// sizes: 1-2 s on a 1.5 GB/s device. Memory: at most ceil(q * chunk / group bytes) + 1 group
// buffers at a time (the destinations of the reads in flight).
//
// ---- Cache ----------------------------------------------------------------------------------
// One JSON file per device: <dir>/disk-<major>:<minor>.json, <dir> = $XDG_CACHE_HOME/estream or
// ~/.cache/estream (DiskCacheDir), device = st_dev of the model file. It holds one entry per
// (loader chunk size, record bytes) measured on that device (a group of g records is a read of
// g * record_bytes bytes, so tables of models with different record sizes differ):
//   {"version": 1, "device": "259:1", "entries": [{"chunk_bytes": 1048576,
//    "record_bytes": 3538944, "measured_unix": 1700000000, "queue_depths": [1, ...],
//    "group_sizes": [1, ...], "bandwidth": [...], "latency_seconds": [...]}]}
// An entry is reused when it covers every requested group size and depth (the table is then
// cut to them). A cache file that does not parse or does not validate is re-measured and
// rewritten, with a warning (DiskResult::warning). Written through a temporary + rename.
//
// Thread safety: the functions are independent; MeasureDisk starts and stops its own loader
// threads. Two processes writing one cache file at once: the last rename wins (both valid).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "config/profile.h"
#include "io/loader.h"
#include "pack/packed_layout.h"

namespace estream::profiler {

// Progress lines for the long parts ("disk: g=4 q=8 1.52 GB/s"); may be empty.
using ProgressFn = std::function<void(const std::string& line)>;

struct DiskParams {
  std::vector<int> group_sizes{1, 2, 4, 8, 16};   // candidates (> n_expert dropped)
  std::vector<int> queue_depths{1, 2, 4, 8, 16, 32};
  size_t chunk_bytes = size_t{1} << 20;  // the loader's chunk: what the engine's streamer uses
  uint64_t cell_bytes = uint64_t{48} << 20;  // bytes read per (g, q) cell, at least
  int min_reads = 2;       // reads per cell, at least
  int latency_reads = 3;   // isolated reads per g for the latency (fewer when a group > cell_bytes)
  IoBackend backend = IoBackend::kAuto;
  ProgressFn progress{};
};

// Measures the table for the packed model whose layout is `layout` (its file is opened again
// with O_DIRECT; buffered when the file system refuses it, e.g. tmpfs). The result passes
// DiskProfile::Validate; its chunk_bytes is the loader's (rounded to 4 KiB). Errors: IOError
// (open or a read failed), InvalidArgument (no group size fits the model; bad parameters).
Result<config::DiskProfile> MeasureDisk(const io::PackedModelInfo& layout, const DiskParams& params);

// $XDG_CACHE_HOME/estream when XDG_CACHE_HOME is set and not empty, else $HOME/.cache/estream,
// else "" (no cache).
std::string DiskCacheDir();

struct DiskCacheKey {
  uint32_t major = 0, minor = 0;  // st_dev of the model file
  uint64_t chunk_bytes = 0;
  uint64_t record_bytes = 0;      // the layout's largest record stride
};
// The key of `model_path` (stat's st_dev). IOError naming the path.
Result<DiskCacheKey> DiskKeyOf(const std::string& model_path, uint64_t chunk_bytes, uint64_t record_bytes);
// <dir>/disk-<major>:<minor>.json
std::string DiskCachePath(const std::string& dir, const DiskCacheKey& key);

// The cached table for `key` covering `group_sizes` x `queue_depths` (cut to exactly them), or
// an empty optional-like result: found == false when the file or a matching entry is absent.
// Corruption (naming the file and what is wrong) when the file exists but is not a valid cache.
struct CachedDisk {
  bool found = false;
  config::DiskProfile profile;
};
Result<CachedDisk> LoadDiskCache(const std::string& path, const DiskCacheKey& key,
                                 const std::vector<int>& group_sizes, const std::vector<int>& queue_depths);
// Adds (or replaces) the entry of `key` in the cache file, keeping the valid entries of other
// keys (a corrupt file is replaced whole, a malformed entry dropped). Creates the directory.
// IOError naming the path.
Status StoreDiskCache(const std::string& path, const DiskCacheKey& key, const config::DiskProfile& profile);

struct DiskResult {
  config::DiskProfile profile;
  bool cached = false;     // from the cache file (nothing measured)
  double seconds = 0;      // wall time of this call (cache read or measurement)
  std::string cache_path;  // "" when there is no cache directory
  std::string warning;     // non-empty when the cache was corrupt or could not be written
};
// The table for `layout`: from the cache when present and `refresh` is false, else measured
// (and stored). `cache_dir` empty: DiskCacheDir(); "-": no cache at all.
Result<DiskResult> CharacteriseDisk(const io::PackedModelInfo& layout, const DiskParams& params, bool refresh,
                                    const std::string& cache_dir = "");

}  // namespace estream::profiler
