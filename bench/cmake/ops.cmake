# Non-GEMM kernel benchmarks (owner: ops): attention table of docs/PERFORMANCE.md, row kernels.
add_executable(ops_bench ${CMAKE_SOURCE_DIR}/bench/ops_bench.cc)
target_link_libraries(ops_bench PRIVATE estream_kernels estream_base benchmark::benchmark OpenMP::OpenMP_CXX)
