#include "base/status.h"

namespace estream {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "Invalid argument";
    case StatusCode::kCorruption: return "Corruption";
    case StatusCode::kIOError: return "I/O error";
    case StatusCode::kNotSupported: return "Not supported";
    case StatusCode::kOutOfRange: return "Out of range";
    case StatusCode::kResourceExhausted: return "Resource exhausted";
    case StatusCode::kInternal: return "Internal";
    case StatusCode::kCancelled: return "Cancelled";
  }
  return "Unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

}  // namespace estream
