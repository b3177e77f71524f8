# GEMM benchmarks (owner: gemm): the CPU's peaks and the GEMM table of docs/PERFORMANCE.md.
add_executable(peak_bench ${CMAKE_SOURCE_DIR}/bench/peak_bench.cc)
target_link_libraries(peak_bench PRIVATE benchmark::benchmark Threads::Threads)
add_executable(gemm_bench ${CMAKE_SOURCE_DIR}/bench/gemm_bench.cc)
target_link_libraries(gemm_bench PRIVATE estream_kernels estream_quant estream_base benchmark::benchmark OpenMP::OpenMP_CXX)
