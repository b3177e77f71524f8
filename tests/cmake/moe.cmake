# The expert plan, fused expert operator and route CSR builder (issue 6).
estream_add_test(moe_expert_op_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/moe_expert_op_test.cc
  LIBS estream_moe LABELS moe arm)
# The engine's fused expert path is bit-identical to the previous batched one.
estream_add_test(moe_model_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/moe_model_test.cc
  LIBS estream_model LABELS moe model)
