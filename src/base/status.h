// Status and Result<T> live in the public header include/estream/status.h (the public API returns
// them); this header forwards there for the library's own code, together with ESTREAM_CHECK.
#pragma once

#include "base/check.h"
#include "estream/status.h"
