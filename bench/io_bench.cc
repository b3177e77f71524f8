// io_bench: grouped-read bandwidth of the expert loader vs queue depth Q and group size G,
// io_uring vs pread, with O_DIRECT (page cache bypassed), through the real path
// (ResidencyTable::Reserve -> SubmitBankFill -> Loader -> Publish -> Release).
//
// It creates (or reuses, with --keep) a file of --file-gb GiB, reads randomly placed groups of
// G expert records (one contiguous range of G * W_e bytes per group, W_e a realistic expert
// size), and reports the bandwidth of each (backend, W_e, G, Q) as the median of --repeat runs
// (runs interleaved, so noise from other processes spreads over all points), plus
// Q0 = the smallest Q reaching 95% of the peak of its (backend, W_e, G) row.
//
//   io_bench --file /work/scratch/io_bench.bin --file-gb 4 [--keep] [--json out.json]
//
// Expert sizes (Q4_0, 18 bytes per 32 weights, gate+up+down): Qwen3-30B-A3B
// 3 x 2048 x 768 x 18/32 = 2,654,208 B (2.53 MiB); OLMoE-1B-7B 3 x 2048 x 1024 x 18/32 =
// 3,538,944 B (3.38 MiB). Both are multiples of 4 KiB.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "base/memory.h"
#include "base/stats.h"
#include "base/timer.h"
#include "io/file.h"
#include "io/loader.h"
#include "vmem/arena.h"
#include "vmem/bank_fill.h"
#include "vmem/residency.h"

namespace estream {
namespace {

constexpr uint64_t kMagic = 0x6573747265616d21ull;  // each 4 KiB block starts with index ^ kMagic

std::vector<size_t> ParseSizes(const std::string& list) {
  std::vector<size_t> out;
  size_t pos = 0;
  while (pos < list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    std::string tok = list.substr(pos, end - pos);
    double mult = 1;
    if (!tok.empty() && (tok.back() == 'K' || tok.back() == 'k')) mult = 1024, tok.pop_back();
    if (!tok.empty() && (tok.back() == 'M' || tok.back() == 'm')) mult = 1 << 20, tok.pop_back();
    out.push_back(static_cast<size_t>(std::stod(tok) * mult));
    pos = end + 1;
  }
  return out;
}

bool CreateFile(const std::string& path, uint64_t bytes) {
  std::printf("creating %s (%.2f GiB)...\n", path.c_str(), bytes / double(1ull << 30));
  std::fflush(stdout);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::perror(path.c_str());
    return false;
  }
  const size_t buf_bytes = 8 << 20;
  auto buf = AllocAligned<uint8_t>(buf_bytes, 4096);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i < buf_bytes / 8; ++i) reinterpret_cast<uint64_t*>(buf.get())[i] = rng();
  for (uint64_t off = 0; off < bytes; off += buf_bytes) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf_bytes, bytes - off));
    for (size_t b = 0; b < n; b += 4096) {
      const uint64_t tag = ((off + b) / 4096) ^ kMagic;
      std::memcpy(buf.get() + b, &tag, sizeof(tag));
    }
    if (::write(fd, buf.get(), n) != static_cast<ssize_t>(n)) {
      std::perror("write");
      ::close(fd);
      return false;
    }
  }
  ::fsync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // leave nothing in the page cache
  ::close(fd);
  return true;
}

struct Point {
  std::string backend;
  size_t expert_bytes = 0;
  int g = 0, q = 0;
  size_t chunk = 0;
  std::vector<double> gbps;       // one per repeat
  std::vector<double> cpu_per_gb;  // CPU seconds (user + sys, whole process) per GB read
  double Median() const { return estream::Median(gbps); }
};

double CpuSeconds() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + 1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

// Reads `target_bytes` worth of random groups; returns GB/s (1e9 bytes per second), or < 0 on
// error; *cpu_per_gb: CPU seconds the process used per GB read.
double RunPoint(io::File& file, IoBackend backend, size_t expert_bytes, int g, int q, size_t chunk,
                uint64_t target_bytes, uint64_t seed, std::atomic<uint64_t>* bad_blocks, double* cpu_per_gb) {
  auto loader = io::Loader::Create({.backend = backend, .queue_depth = q, .chunk_bytes = chunk});
  if (!loader.ok()) {
    std::fprintf(stderr, "%s\n", loader.status().ToString().c_str());
    return -1;
  }
  const size_t bank_bytes = static_cast<size_t>(g) * expert_bytes;
  const size_t chunks_per_bank = (bank_bytes + (*loader)->chunk_bytes() - 1) / (*loader)->chunk_bytes();
  // Enough banks that Q chunk reads can be in flight, plus one being recycled.
  const int n_banks = static_cast<int>((q + chunks_per_bank - 1) / chunks_per_bank) + 2;
  const int n_records = static_cast<int>(file.size() / expert_bytes);
  auto arena = vmem::Arena::Create({.n_banks = static_cast<size_t>(n_banks), .group_size = static_cast<size_t>(g),
                                    .slot_bytes = expert_bytes, .prefault = true});
  auto table = vmem::ResidencyTable::Create({.n_layers = 1, .n_expert = n_records, .group_size = g, .n_banks = n_banks});
  if (!arena.ok() || !table.ok()) {
    std::fprintf(stderr, "arena/table: %s %s\n", arena.status().ToString().c_str(), table.status().ToString().c_str());
    return -1;
  }
  vmem::ResidencyTable* t = table->get();
  vmem::Arena* a = arena->get();
  const int n_groups = n_records / g;  // whole groups only
  std::mt19937_64 rng(seed);
  std::atomic<bool> failed{false};
  uint64_t submitted = 0;
  const double t0 = NowSeconds(), cpu0 = CpuSeconds();
  while (submitted < target_bytes) {
    const int q_idx = static_cast<int>(rng() % n_groups);
    auto ticket = t->Reserve({0, q_idx}, 0, 60.0);
    if (!ticket.ok()) {
      if (ticket.status().code() == StatusCode::kInvalidArgument) continue;  // that group is in flight
      std::fprintf(stderr, "%s\n", ticket.status().ToString().c_str());
      return -1;
    }
    const uint64_t offset = static_cast<uint64_t>(q_idx) * bank_bytes;
    const vmem::BankTicket tk = *ticket;
    auto job = vmem::SubmitBankFill(
        {.loader = loader->get(), .table = t, .arena = a, .file = &file, .ticket = tk, .group = {0, q_idx},
         .offset = offset, .length = bank_bytes, .then = [t, a, tk, offset, bank_bytes, bad_blocks, &failed](const io::ReadResult& r) {
           if (r.outcome != io::ReadOutcome::kOk) {
             std::fprintf(stderr, "%s\n", r.status.ToString().c_str());
             failed = true;
             return;
           }
           // Spot check: the first word of the first and last blocks of the group.
           for (size_t b : {size_t{0}, bank_bytes - 4096}) {
             uint64_t tag;
             std::memcpy(&tag, a->Bank(tk.bank) + b, sizeof(tag));
             if (tag != (((offset + b) / 4096) ^ kMagic)) ++*bad_blocks;
           }
           (void)t->Release(tk);
         }});
    if (!job.ok()) {
      std::fprintf(stderr, "%s\n", job.status().ToString().c_str());
      return -1;
    }
    submitted += bank_bytes;
  }
  (*loader)->Drain();
  const double dt = NowSeconds() - t0;
  const double gb = static_cast<double>((*loader)->stats().bytes_read) / 1e9;
  *cpu_per_gb = (CpuSeconds() - cpu0) / gb;
  if (failed) return -1;
  return gb / dt;
}

int Main(int argc, char** argv) {
  CLI::App app{"grouped-read bandwidth of the expert loader (O_DIRECT)"};
  std::string path = "/work/scratch/io_bench.bin";
  double file_gb = 4;
  bool keep = false;
  std::string experts = "2654208,3538944", groups = "1,2,4,8", depths = "1,2,4,8,16,32", chunks = "1M";
  std::string backends = "io_uring,pread", json_path;
  double point_mb = 512;
  int repeat = 3;
  app.add_option("--file", path, "bench file (created if missing or of another size)");
  app.add_option("--file-gb", file_gb, "file size in GiB (make it larger than what the page cache could hold)");
  app.add_flag("--keep", keep, "keep the file afterwards (default: delete it)");
  app.add_option("--expert-bytes", experts, "comma-separated W_e values (bytes; K/M suffixes)");
  app.add_option("--groups", groups, "comma-separated group sizes G");
  app.add_option("--depths", depths, "comma-separated queue depths Q");
  app.add_option("--chunks", chunks, "comma-separated chunk sizes (K/M suffixes)");
  app.add_option("--backends", backends, "io_uring,pread");
  app.add_option("--point-mb", point_mb, "MiB read per point and run");
  app.add_option("--repeat", repeat, "runs per point (median reported)");
  app.add_option("--json", json_path, "write the points as JSON here");
  CLI11_PARSE(app, argc, argv);

  const uint64_t file_bytes = static_cast<uint64_t>(file_gb * (1ull << 30)) / (8 << 20) * (8 << 20);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || static_cast<uint64_t>(st.st_size) != file_bytes) {
    if (!CreateFile(path, file_bytes)) return 1;
  }
  auto file = io::PosixFile::Open(path, {.direct = true});
  if (!file.ok()) {
    std::fprintf(stderr, "%s\n", file.status().ToString().c_str());
    return 1;
  }
  if (!(*file)->direct()) std::fprintf(stderr, "warning: O_DIRECT refused on %s: page cache NOT bypassed\n", path.c_str());

  std::vector<Point> points;
  for (size_t we : ParseSizes(experts)) {
    for (size_t chunk : ParseSizes(chunks)) {
      for (const std::string& be : {std::string("io_uring"), std::string("pread")}) {
        if (backends.find(be) == std::string::npos) continue;
        for (size_t g : ParseSizes(groups)) {
          for (size_t q : ParseSizes(depths)) {
            points.push_back({be, we, static_cast<int>(g), static_cast<int>(q), chunk, {}, {}});
          }
        }
      }
    }
  }
  std::atomic<uint64_t> bad_blocks{0};
  const uint64_t target = static_cast<uint64_t>(point_mb * (1 << 20));
  for (int rep = 0; rep < repeat; ++rep) {
    for (size_t i = 0; i < points.size(); ++i) {
      Point& p = points[i];
      double cpu = 0;
      const double gbps = RunPoint(**file, p.backend == "io_uring" ? IoBackend::kIoUring : IoBackend::kPread,
                                   p.expert_bytes, p.g, p.q, p.chunk, target, 1000 * rep + i, &bad_blocks, &cpu);
      if (gbps < 0) return 1;
      p.gbps.push_back(gbps);
      p.cpu_per_gb.push_back(cpu);
      std::fprintf(stderr, "\rrun %d/%d point %zu/%zu", rep + 1, repeat, i + 1, points.size());
    }
  }
  std::fprintf(stderr, "\n");
  if (bad_blocks != 0) {
    std::fprintf(stderr, "error: %llu spot-checked blocks differ from the file\n", static_cast<unsigned long long>(bad_blocks.load()));
    return 1;
  }

  // Table: one row per (backend, W_e, chunk, G), one column per Q; then Q0.
  std::vector<size_t> qs = ParseSizes(depths);
  std::printf("\nGB/s (1e9 B/s), median of %d runs of %.0f MiB each; O_DIRECT %s\n", repeat, point_mb,
              (*file)->direct() ? "on" : "OFF");
  std::printf("| backend | W_e (B) | chunk | G |");
  for (size_t q : qs) std::printf(" Q=%zu |", q);
  std::printf(" peak | Q0 |\n|---|---|---|---|");
  for (size_t k = 0; k < qs.size() + 2; ++k) std::printf("---|");
  std::printf("\n");
  for (size_t i = 0; i < points.size(); i += qs.size()) {
    const Point& p0 = points[i];
    double peak = 0;
    for (size_t k = 0; k < qs.size(); ++k) peak = std::max(peak, points[i + k].Median());
    int q0 = -1;
    for (size_t k = 0; k < qs.size() && q0 < 0; ++k) {
      if (points[i + k].Median() >= 0.95 * peak) q0 = points[i + k].q;
    }
    std::printf("| %s | %zu | %zuK | %d |", p0.backend.c_str(), p0.expert_bytes, p0.chunk >> 10, p0.g);
    for (size_t k = 0; k < qs.size(); ++k) std::printf(" %.2f |", points[i + k].Median());
    std::printf(" %.2f | %d |\n", peak, q0);
  }
  // Pooled over W_e and G (every run of every row): one row per backend and chunk size.
  std::printf("\nPooled over W_e and G: median GB/s | median CPU ms per GB read\n| backend | chunk |");
  for (size_t q : qs) std::printf(" Q=%zu |", q);
  std::printf(" Q0 |\n|---|---|");
  for (size_t k = 0; k < qs.size() + 1; ++k) std::printf("---|");
  std::printf("\n");
  std::map<std::pair<std::string, size_t>, std::map<int, std::pair<std::vector<double>, std::vector<double>>>> pooled;
  for (const Point& p : points) {
    auto& cell = pooled[{p.backend, p.chunk}][p.q];
    cell.first.insert(cell.first.end(), p.gbps.begin(), p.gbps.end());
    cell.second.insert(cell.second.end(), p.cpu_per_gb.begin(), p.cpu_per_gb.end());
  }
  for (const auto& [key, by_q] : pooled) {
    double peak = 0;
    for (const auto& [q, cell] : by_q) peak = std::max(peak, estream::Median(cell.first));
    int q0 = -1;
    std::printf("| %s | %zuK |", key.first.c_str(), key.second >> 10);
    for (const auto& [q, cell] : by_q) {
      const double bw = estream::Median(cell.first);
      if (q0 < 0 && bw >= 0.95 * peak) q0 = q;
      std::printf(" %.2f \\| %.0f |", bw, 1e3 * estream::Median(cell.second));
    }
    std::printf(" %d |\n", q0);
  }
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << "[\n";
    for (size_t i = 0; i < points.size(); ++i) {
      const Point& p = points[i];
      out << "  {\"backend\": \"" << p.backend << "\", \"expert_bytes\": " << p.expert_bytes << ", \"group_size\": " << p.g
          << ", \"queue_depth\": " << p.q << ", \"chunk_bytes\": " << p.chunk << ", \"gbps_median\": " << p.Median()
          << ", \"gbps_runs\": [";
      for (size_t r = 0; r < p.gbps.size(); ++r) out << (r ? ", " : "") << p.gbps[r];
      out << "], \"cpu_s_per_gb_runs\": [";
      for (size_t r = 0; r < p.cpu_per_gb.size(); ++r) out << (r ? ", " : "") << p.cpu_per_gb[r];
      out << "]}" << (i + 1 < points.size() ? "," : "") << "\n";
    }
    out << "]\n";
  }
  if (!keep) std::remove(path.c_str());
  return 0;
}

}  // namespace
}  // namespace estream

int main(int argc, char** argv) { return estream::Main(argc, argv); }
