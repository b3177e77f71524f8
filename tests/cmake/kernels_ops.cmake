# Label arm: the tests of the ARM64 stage of scripts/test.sh (run under qemu-aarch64).
# Non-GEMM kernels (attention, RMSNorm, RoPE, SwiGLU, router softmax/top-k, log-sum-exp, add):
# every ISA path against the scalar reference, the reference against fp64.
estream_add_test(kernels_ops_test SOURCES ${CMAKE_SOURCE_DIR}/tests/kernels_ops_test.cc
  LIBS estream_kernels estream_base LABELS kernels arm)
# LFM2's short convolution: every ISA against the scalar reference, the reference against fp64.
estream_add_test(kernels_shortconv_test SOURCES ${CMAKE_SOURCE_DIR}/tests/kernels_shortconv_test.cc
  LIBS estream_kernels estream_base LABELS kernels arm)
# The low-precision attention (x86: int8 Q.K^T, bf16 P.V; AArch64 with bf16: BFDOT) against its
# scalar reference and fp64.
estream_add_test(attention_lowp_test SOURCES ${CMAKE_SOURCE_DIR}/tests/attention_lowp_test.cc
  LIBS estream_kernels estream_base LABELS kernels arm)
