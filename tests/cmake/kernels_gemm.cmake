# Quantised/float GEMM (owner: gemm): every ISA and both weight layouts against an fp64
# reference, Q8A quantiser bit-exactness, repack exactness, thread-count independence.
estream_add_test(kernels_gemm_test SOURCES ${CMAKE_SOURCE_DIR}/tests/kernels_gemm_test.cc
  LIBS estream_kernels estream_quant estream_base LABELS kernels arm)
