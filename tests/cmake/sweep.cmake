# Calibration request, measured runs, in-place metadata updates, the sweep (owner: sweep).
estream_add_test(calibration_test SOURCES ${CMAKE_SOURCE_DIR}/tests/calibration_test.cc
  LIBS estream_profiler estream_model estream_pack estream_tokenizer LABELS profiler)
estream_add_test(io_metadata_update_test SOURCES ${CMAKE_SOURCE_DIR}/tests/io_metadata_update_test.cc
  LIBS estream_pack estream_model estream_gguf LABELS io pack)
# profiler::Sweep in this process (MeasureRun resets the peak RSS per point), and a smoke test of
# `estream sweep` (the built binary).
estream_add_test(sweep_test SOURCES ${CMAKE_SOURCE_DIR}/tests/sweep_test.cc
  LIBS estream_profiler estream_model estream_pack estream_tokenizer nlohmann_json::nlohmann_json LABELS profiler)
if(TARGET sweep_test)
  add_dependencies(sweep_test estream)
endif()
