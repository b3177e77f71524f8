# The fused expert operator (owner: moe): per-expert throughput vs routes, MoE-layer time against
# the previous path (docs/PERFORMANCE.md, "Fused expert operator").
add_executable(moe_bench ${CMAKE_SOURCE_DIR}/bench/moe_bench.cc ${CMAKE_SOURCE_DIR}/tests/ref/experts_baseline.cc)
target_include_directories(moe_bench PRIVATE ${CMAKE_SOURCE_DIR}/tests)
target_link_libraries(moe_bench PRIVATE estream_model estream_moe estream_kernels estream_quant estream_base OpenMP::OpenMP_CXX)
