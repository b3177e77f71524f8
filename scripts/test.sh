#!/usr/bin/env bash
# Builds estream and runs the whole test suite, as CI does:
#   0. the layering check (scripts/layer_deps.py: every #include between layers is one that
#      docs/DESIGN.md section 1 allows);
#   1. Release build, every ctest test (kernels compare each ISA path with the scalar reference);
#   2. the whole-model tests again with the kernels forced to avx2 and to scalar (ESTREAM_ISA), and
#      the low-precision attention's wiring tests with it switched off (ESTREAM_ATTN_LOWP=0);
#   3. the tests labelled `sanitize` (parsers, formats, loader, pipeline) under AddressSanitizer +
#      UndefinedBehaviorSanitizer;
#   4. the concurrency tests under ThreadSanitizer (where present);
#   5. the fuzz targets (the GGUF reader; the server's request bodies, score lines, eval task files
#      and the tokenizer) for FUZZ_SECONDS (default 60) each, side by side (scripts/ci_fuzz.sh);
#   6. sharded scoring on a single-node Slurm cluster started here (tests/slurm/run_slurm_test.sh;
#      skipped with a message where Slurm/munge are not installed: scripts/setup_slurm.sh); then
#      HAProxy in front of two `estream serve` instances, one stopped and restarted under load
#      (tests/haproxy/run_haproxy_test.sh; skipped where haproxy is not: scripts/setup_haproxy.sh).
#   7. ARM64 (ARM64=0 skips it; ARM64=only runs it alone): the tests labelled `arm` cross-built for
#      aarch64 (scripts/build_arm64.sh, target estream_tests_arm) and run under qemu-aarch64, the
#      whole-model ones at each forced level neon, dotprod, i8mm (see arm64_stage below; skipped
#      with a message where the cross toolchain or qemu-user is missing).
# Set QUICK=1 to run step 1 only.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
export CTEST_OUTPUT_ON_FAILURE=1
# ctest runs tests side by side on few cores; spinning OpenMP workers would then steal the cores
# their own team waits on (a 20 ms test can take seconds). Tests assert results, never times.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}

# Sanitizer builds: -O1 with line tables only (the AVX-512 GEMM unit compiles in 9 s instead of
# 137 s at -O2 -g under ASan+UBSan; reports keep
# file:line), tests and benchmarks of other labels not built.
SAN_FLAGS=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
           "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" -DESTREAM_BUILD_BENCH=OFF)

step() { echo; echo "==== $* ==== (at ${SECONDS}s)"; }

# The ARM64 stage (on by default; ARM64=0 skips it, ARM64=only runs it alone). A cross build
# (scripts/build_arm64.sh) of the target estream_tests_arm only: the test binaries labelled `arm`
# (tests/cmake/*.cmake; `ctest -N -L arm` lists them) and the libraries they link; no CLI, no
# benchmarks, no Python module. Each binary runs under qemu-aarch64 (~20-50x slower than native)
# with OMP_NUM_THREADS=2 (the thread-count tests set 2 threads themselves; Threads.TeamOfTwo...
# checks that a team of two really runs two threads under qemu-user):
#   base_cpu_test          detection and forcing of the levels, under three emulated CPUs:
#                          cortex-a53 (neon), cortex-a76 (dotprod), max (i8mm);
#   kernels_*_test         every ARM kernel against the scalar reference (each test loops over
#                          every level the CPU has, so one run on "max" covers neon, dotprod, i8mm),
#                          the attention and GEMM thread-count tests with 2 threads;
#   moe_expert_op_test     the fused expert operator and its scatter-add on every level, 1 and 2
#                          threads;
#   model_golden_test      the five tiny models' golden logits (F32 weights: fp32 GEMMs),
#   model_lfm2moe_test     a packed model, resident and streamed under every schedule, vs golden,
#   model_synth_test       synthetic models of every architecture in F32, Q8_0, Q4_0 and eight
#                          llama-quantize mixes vs the fp64 reference, and the Q4_0 golden top-5
#                          (the quantised ones run the int8 GEMM of the level: sdot, smmla):
#                          the three (label model) once per level, the emulated CPU matching the
#                          forced level (cortex-a53 + ESTREAM_ISA=neon, cortex-a76 + dotprod,
#                          max + i8mm), ESTREAM_EXPECT_ISA making every test process check the level
#                          its kernels run at (tests/expect_isa.h); the three levels run side by side.
#                          dotprod and i8mm replace only the quantised GEMM entries of the neon
#                          table (kernels/dispatch.cc), so at those two levels the F32 models (which
#                          run the neon table's fp32 code at every level) and the fp64 reference
#                          are left out (ARM_F32_ONCE below): ~84 s of qemu time per level.
# Kernel tests run with ESTREAM_TEST_QUICK=1 (a few awkward shapes each, tests/test_quick.h).
# Measured cold (fresh build directory, no ccache, JOBS=2) on the shared 2-vCPU development VM with
# other builds running, 2026-12-02: 473 s (cross build 275 s, Cpu.* 1 s, kernel tests 61 s, the
# three levels' model tests side by side 136 s); 603 s of CPU in all, so ~5 min or more on two
# dedicated cores (docs/PERFORMANCE.md, "ARM64 CI stage").
# (Binaries that start threads hung under qemu when -L pointed at the cross sysroot's loader with
# the multiarch libc; cmake/aarch64-linux-gnu.cmake uses -L / where libc6:arm64 is installed.)
arm64_stage() {
  step "ARM64: cross-build of the arm-labelled tests (scripts/build_arm64.sh), run under qemu-aarch64"
  if ! command -v aarch64-linux-gnu-g++ >/dev/null || ! command -v qemu-aarch64-static >/dev/null; then
    echo "ARM64 stage skipped: aarch64-linux-gnu-g++ or qemu-aarch64-static not installed (scripts/setup.sh installs both)"
    return 0
  fi
  local t0=$SECONDS dir=${ARM64_BUILD_DIR:-build-arm64}
  BUILD_DIR=$dir TARGET=estream_tests_arm scripts/build_arm64.sh
  echo "ARM64 cross-build: $((SECONDS - t0)) s"
  local t1=$SECONDS
  export OMP_NUM_THREADS=2
  for cpu in cortex-a53:neon cortex-a76:dotprod max:i8mm; do
    QEMU_CPU=${cpu%%:*} ESTREAM_EXPECT_HOST_ISA=${cpu##*:} ctest --test-dir "$dir" -j "$JOBS" -R '^Cpu\.' --timeout 600
  done
  ESTREAM_TEST_QUICK=1 ctest --test-dir "$dir" -j "$JOBS" -L arm -LE model --timeout 900
  echo "-- whole-model tests under qemu-aarch64, one run per level side by side (logs: $dir/arm64-model-*.log)"
  local pids=() failed=0 isa exclude jobs
  # The tests whose code is the same at every ARM level: F32 synthetic models, the golden logits
  # of the (F32) tiny models, the packed F32 lfm2moe model, the fp64 reference.
  local ARM_F32_ONCE='_f32|Archs/GoldenTest\.|Lfm2Moe\.'
  for cpu in cortex-a53:neon cortex-a76:dotprod max:i8mm; do
    isa=${cpu##*:}
    # neon runs all 37 tests, the other two 19: neon gets the jobs of the two others together.
    exclude=(-E "$ARM_F32_ONCE") jobs=$(( (JOBS + 2) / 3 ))
    [ "$isa" = neon ] && exclude=() jobs=$(( 2 * jobs ))
    QEMU_CPU=${cpu%%:*} ESTREAM_ISA=$isa ESTREAM_EXPECT_ISA=$isa ESTREAM_EXPECT_HOST_ISA=$isa \
      ctest --test-dir "$dir" -j "$jobs" -L arm -L model "${exclude[@]}" --timeout 900 \
      >"$dir/arm64-model-$isa.log" 2>&1 &
    pids+=($!)
  done
  for isa in neon dotprod i8mm; do
    if wait "${pids[0]}"; then
      echo "   $isa: $(grep -E 'tests passed' "$dir/arm64-model-$isa.log")"
    else
      failed=1
      echo "   $isa: FAILED"
      cat "$dir/arm64-model-$isa.log"
    fi
    pids=("${pids[@]:1}")
  done
  [ "$failed" = 0 ] || { echo "ARM64 stage: whole-model tests failed (above)"; return 1; }
  unset OMP_NUM_THREADS
  echo "ARM64 stage passed in $((SECONDS - t0)) s (build $((t1 - t0)) s, tests under qemu $((SECONDS - t1)) s)"
}

if [ "${ARM64:-1}" = only ]; then
  arm64_stage
  exit 0
fi

step "layering: every #include edge allowed by docs/DESIGN.md section 1 (scripts/layer_deps.py)"
python3 scripts/layer_deps.py
step "release build"
BUILD_DIR=build scripts/build.sh
step "tests (release, native ISA)"
ctest --test-dir build -j "$JOBS" --timeout 600

[ "${QUICK:-0}" = 1 ] && exit 0

for isa in avx2 scalar; do
  if ctest --test-dir build -N -L model | grep -q "Total Tests: [1-9]"; then
    step "whole-model tests with ESTREAM_ISA=$isa"
    ESTREAM_ISA=$isa ctest --test-dir build -j "$JOBS" -L model --timeout 600
  fi
done

step "low-precision attention switched off (ESTREAM_ATTN_LOWP=0, kernels/attention_lowp.h)"
ESTREAM_ATTN_LOWP=0 ctest --test-dir build -j "$JOBS" -R 'AttentionLowp' --timeout 600

step "tests labelled sanitize under ASan + UBSan"
cmake -S . -B build-asan "${SAN_FLAGS[@]}" -DESTREAM_SANITIZE=address,undefined >/dev/null
cmake --build build-asan -j "$JOBS" --target estream_tests_sanitize
ctest --test-dir build-asan -j "$JOBS" -L sanitize --timeout 600

if ctest --test-dir build -N -L tsan | grep -q "Total Tests: [1-9]"; then
  step "concurrency tests under ThreadSanitizer"
  cmake -S . -B build-tsan "${SAN_FLAGS[@]}" -DESTREAM_SANITIZE=thread >/dev/null
  cmake --build build-tsan -j "$JOBS" --target estream_tests_tsan
  # tests/tsan.supp: reports from inside Debian's uninstrumented libcpp-httplib (see the file).
  TSAN_OPTIONS="suppressions=$PWD/tests/tsan.supp ${TSAN_OPTIONS:-}" \
    ctest --test-dir build-tsan -j "$JOBS" -L tsan --timeout 600
fi

if [ -x scripts/ci_fuzz.sh ]; then
  step "fuzzing the GGUF reader and the text parsers (${FUZZ_SECONDS:-60} s)"
  scripts/ci_fuzz.sh "${FUZZ_SECONDS:-60}"
fi
step "single-node Slurm: a 4-task score array, one task killed and requeued, merged = one process"
tests/slurm/run_slurm_test.sh build/tools/estream/estream
step "HAProxy in front of 2 servers: a load test while one is stopped and restarted"
tests/haproxy/run_haproxy_test.sh build/tools/estream/estream
if [ "${ARM64:-1}" = 0 ]; then
  step "ARM64 stage skipped (ARM64=0)"
else
  arm64_stage
fi

echo
echo "all test stages passed in ${SECONDS}s"
