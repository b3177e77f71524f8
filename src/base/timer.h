// Monotonic wall-clock timing.
#pragma once

#include <chrono>
#include <cstdint>

namespace estream {

// Seconds since an arbitrary fixed point (steady clock).
inline double NowSeconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

class Timer {
 public:
  Timer() : start_(NowSeconds()) {}
  void Reset() { start_ = NowSeconds(); }
  double Seconds() const { return NowSeconds() - start_; }

 private:
  double start_;
};

// Runs f() and adds its wall time to *seconds.
template <class F>
void AddTime(double* seconds, F&& f) {
  const double t0 = NowSeconds();
  f();
  *seconds += NowSeconds() - t0;
}

}  // namespace estream
