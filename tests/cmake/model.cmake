# The prefill engine's tests (issue 4). All carry the label "model": CI reruns them with the
# kernels forced to avx2 and to scalar (scripts/test.sh).
#
# estream_ref: the independent naive fp64 forward pass (tests/ref), shared by the model tests.
add_library(estream_ref STATIC ${CMAKE_CURRENT_SOURCE_DIR}/ref/ref_forward.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/ref/ref_deepseek2.cc ${CMAKE_CURRENT_SOURCE_DIR}/ref/ref_lfm2moe.cc)
target_include_directories(estream_ref PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(estream_ref PUBLIC estream_gguf estream_quant estream_base)

estream_add_test(model_golden_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/model_golden_test.cc
  LIBS estream_model estream_ref LABELS model arm)
estream_add_test(model_engine_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/model_engine_test.cc
  LIBS estream_model LABELS model)
# Every metadata key of the five tiny models changed or removed, one at a time: a one-line error
# or a model that serves (runs under ASan+UBSan in CI; not "model": the kernels do not matter).
estream_add_test(model_corrupt_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/model_corrupt_test.cc
  LIBS estream_model estream_pack LABELS sanitize)
# Engine vs fp64 reference on synthetic models of every arch and weight type; golden top-5.
# Label arm: its quantised models run the int8 GEMM of each forced ARM level (scripts/test.sh).
estream_add_test(model_synth_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/model_synth_test.cc
  LIBS estream_model estream_ref nlohmann_json::nlohmann_json LABELS model arm)
if(TARGET model_synth_test)
  target_compile_definitions(model_synth_test PRIVATE ESTREAM_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
endif()
# The batched and the grouped expert paths agree bit for bit.
estream_add_test(model_experts_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/model_experts_test.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/ref/experts_baseline.cc
  LIBS estream_model LABELS model)
# Engine::RunBatch and shared-prefix candidates vs single requests, every arch and model kind
# (GGUF, packed resident, packed streamed under each schedule; the packed model is made at test time).
estream_add_test(model_batch_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/model_batch_test.cc
  LIBS estream_model estream_pack LABELS model)
# The batch workflows as library calls: batch::Score (JSONL, resume, malformed lines, shards then
# merge equal to one call), batch::LoadTasks + Evaluate (hellaswag, winogrande, multiple-choice
# files written by the test), candidate probabilities.
estream_add_test(batch_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/batch_test.cc
  LIBS estream_batch estream_model estream_tokenizer estream_gguf nlohmann_json::nlohmann_json LABELS model)
# CLI smoke tests of `estream score` (killed and resumed, bad flags) and `estream eval` (exit status).
estream_add_test(batch_cli_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/batch_cli_test.cc
  LIBS estream_batch estream_model estream_tokenizer estream_gguf nlohmann_json::nlohmann_json LABELS model)
if(TARGET batch_cli_test)
  target_compile_definitions(batch_cli_test PRIVATE ESTREAM_CLI="$<TARGET_FILE:estream>")
  add_dependencies(batch_cli_test estream)
endif()
# DeepSeek-V2: both kv layouts, router variants vs fp64, streaming, corrupt models (issue 17).
estream_add_test(model_deepseek2_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/model_deepseek2_test.cc
  LIBS estream_model estream_ref estream_pack LABELS model)
# LFM2-MoE: packed resident and streamed under every schedule vs the golden logits; bad input.
estream_add_test(model_lfm2moe_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/model_lfm2moe_test.cc
  LIBS estream_model estream_pack LABELS model arm)
# The estream commands on deepseek2 and lfm2moe end to end (runs the built estream binary).
estream_add_test(family_cli_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/family_cli_test.cc
  LIBS estream_model nlohmann_json::nlohmann_json LABELS model)
if(TARGET family_cli_test)
  add_dependencies(family_cli_test estream)
endif()
# The CLI's error contract for command-line mistakes: one line, exit code 1 (runs the binary).
estream_add_test(cli_errors_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/cli_errors_test.cc LABELS model)
if(TARGET cli_errors_test)
  add_dependencies(cli_errors_test estream)
endif()
# What the CLI writes: bench's --json/--csv, prefill's --logprobs table and warnings, trace lanes.
estream_add_test(cli_output_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/cli_output_test.cc LABELS model)
if(TARGET cli_output_test)
  add_dependencies(cli_output_test estream)
endif()
