#include "base/size.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace estream {

Result<uint64_t> ParseSize(std::string_view text) {
  const std::string s(text);
  const char* kForms = "give a decimal number of bytes, optionally with K, M, G or T (e.g. 4G, 1.5G, 600M)";
  if (s.empty()) return Status::InvalidArgument(std::string("empty size; ") + kForms);
  size_t n = 0, digits = 0;
  while (n < s.size() && s[n] >= '0' && s[n] <= '9') ++n, ++digits;
  if (n < s.size() && s[n] == '.') {
    ++n;
    while (n < s.size() && s[n] >= '0' && s[n] <= '9') ++n, ++digits;
  }
  std::string shown = s;
  std::replace(shown.begin(), shown.end(), '\0', ' ');
  if (digits == 0) return Status::InvalidArgument("bad size '" + shown + "'; " + kForms);
  const double v = std::strtod(s.substr(0, n).c_str(), nullptr);
  std::string suffix = s.substr(n);
  if (!suffix.empty() && (suffix.back() == 'B' || suffix.back() == 'b')) suffix.pop_back();
  if (!suffix.empty() && suffix.back() == 'i') suffix.pop_back();
  double mult = 1;
  if (suffix.empty()) mult = 1;
  else if (suffix == "K" || suffix == "k") mult = 1024.0;
  else if (suffix == "M" || suffix == "m") mult = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g") mult = 1024.0 * 1024 * 1024;
  else if (suffix == "T" || suffix == "t") mult = 1024.0 * 1024 * 1024 * 1024;
  else return Status::InvalidArgument("bad size '" + shown + "'; " + kForms);
  const double bytes = v * mult;
  if (bytes >= 0x1p63) return Status::InvalidArgument("size '" + shown + "' is too large (at most 2^63 bytes)");
  // A fraction of a byte ("0.4") would be 0, which means no budget at all.
  if (v > 0 && bytes < 1) return Status::InvalidArgument("size '" + shown + "' is less than one byte; " + kForms);
  return static_cast<uint64_t>(bytes);
}

}  // namespace estream
