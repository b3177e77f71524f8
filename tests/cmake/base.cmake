# CPU feature detection and the ISA levels (base/cpu.h) with the dispatch tables they select.
# Label arm: part of the ARM64 stage of scripts/test.sh (run under qemu-aarch64 with several CPUs).
estream_add_test(base_cpu_test SOURCES ${CMAKE_SOURCE_DIR}/tests/base_cpu_test.cc
  LIBS estream_kernels estream_base LABELS base arm)
