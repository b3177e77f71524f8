# Sharded batch scoring (owner: batch, issue 24): shard specs, id hash, keys, merge; no model, no CLI.
estream_add_test(batch_shard_test SOURCES ${CMAKE_SOURCE_DIR}/tests/batch_shard_test.cc
  LIBS estream_batch estream_base LABELS batch sanitize)
