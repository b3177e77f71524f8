// Small statistics and formatting helpers shared by the library, the tools and the benchmarks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace estream {

// The median of `v` (the mean of the two middle values for an even count); 0 when empty.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// "12.3 MiB": bytes in MiB with one decimal, for messages.
inline std::string Mib(uint64_t bytes) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

// A memory budget in messages: Mib from 1 MiB up; below, in bytes with a note that a size without
// a suffix counts bytes ("--budget 600" is 600 bytes, not 600 MiB).
inline std::string BudgetText(uint64_t bytes) {
  if (bytes >= (uint64_t{1} << 20)) return Mib(bytes);
  return std::to_string(bytes) + " bytes (a size without a K/M/G/T suffix counts bytes: 600M is 600 MiB)";
}

// "1.23 GiB", "512.00 MiB", "17 B": bytes in the largest binary unit below them.
inline std::string FormatBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[64];
  if (u == 0) std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(bytes));
  else std::snprintf(buf, sizeof(buf), "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace estream
