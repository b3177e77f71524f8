// Status and Result<T>: how estream reports expected failures (public; src/base/status.h
// forwards here).
//
// Expected failures (a bad file, an unknown architecture, an unsupported quant type, an I/O error,
// a budget too small) are returned as a Status or a Result<T>; both are [[nodiscard]]. The message
// is one line that names the thing at fault (file, field, byte offset) and, where it helps, what to
// do about it. Programmer errors are ESTREAM_CHECK (check.h), never a Status.
//
// Thread safety: Status and Result are values; distinct objects may be used from distinct threads.
#pragma once

#include <string>
#include <utility>
#include <variant>


namespace estream {

namespace internal {
// Aborts with file:line, the condition and the message (the same function as ESTREAM_CHECK's,
// src/base/check.h); Result::value() on an error calls it.
[[noreturn]] void CheckFailed(const char* file, int line, const char* cond, const char* msg);
}  // namespace internal

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // the caller passed something wrong (a flag, a token id, a shape)
  kCorruption,         // a file is malformed (bad magic, offset outside the file, checksum mismatch)
  kIOError,            // the OS failed a read, write, open or rename
  kNotSupported,       // well-formed but not handled (unknown architecture or quant type)
  kOutOfRange,         // a value is outside what is allowed (prompt longer than the context)
  kResourceExhausted,  // a memory budget or capacity is too small
  kInternal,           // an invariant failed in a way the caller can still recover from
  kCancelled,          // the caller asked to stop (Engine::RunBatch's interrupted) before it finished
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status Corruption(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
  static Status IOError(std::string m) { return {StatusCode::kIOError, std::move(m)}; }
  static Status NotSupported(std::string m) { return {StatusCode::kNotSupported, std::move(m)}; }
  static Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
  static Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
  static Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "Corruption: <message>", or "OK".
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Result<T> holds either a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(v_).ok())
      internal::CheckFailed(__FILE__, __LINE__, "!status.ok()", "Result constructed from an OK Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  // REQUIRES: ok() (else aborts with the Status's message).
  T& value() & { CheckOk(); return std::get<T>(v_); }
  const T& value() const& { CheckOk(); return std::get<T>(v_); }
  T&& value() && { CheckOk(); return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void CheckOk() const {
    if (!ok()) internal::CheckFailed(__FILE__, __LINE__, "ok()", status().ToString().c_str());
  }
  std::variant<T, Status> v_;
};

}  // namespace estream

#define ESTREAM_CONCAT_INNER_(a, b) a##b
#define ESTREAM_CONCAT_(a, b) ESTREAM_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define ESTREAM_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    ::estream::Status _es_status = (expr);             \
    if (!_es_status.ok()) return _es_status;           \
  } while (0)

// `lhs = value of expr` (a Result<T>), or returns its Status from the enclosing function.
#define ESTREAM_ASSIGN_OR_RETURN(lhs, expr) \
  ESTREAM_ASSIGN_OR_RETURN_IMPL_(ESTREAM_CONCAT_(_es_result_, __LINE__), lhs, expr)
#define ESTREAM_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return tmp.status();                  \
  lhs = std::move(tmp).value()
