# Calibration request, measured runs, in-place metadata updates, `estream sweep` (owner: sweep).
estream_add_test(calibration_test SOURCES ${CMAKE_SOURCE_DIR}/tests/calibration_test.cc
  LIBS estream_profiler estream_model estream_pack estream_tokenizer LABELS profiler)
estream_add_test(io_metadata_update_test SOURCES ${CMAKE_SOURCE_DIR}/tests/io_metadata_update_test.cc
  LIBS estream_pack estream_model estream_gguf LABELS io pack)
# `estream sweep` end to end: runs the built estream binary (a fresh process per sweep, so its
# peak RSS figures are its own).
estream_add_test(sweep_cli_test SOURCES ${CMAKE_SOURCE_DIR}/tests/sweep_cli_test.cc
  LIBS estream_model estream_pack nlohmann_json::nlohmann_json LABELS profiler)
if(TARGET sweep_cli_test)
  add_dependencies(sweep_cli_test estream)
endif()
