// Sizes as users write them ("4G", "600M", "1.5G", "123456"), read the same way by the CLI's size
// flags (--budget, serve's --max-body ...), the C API's estream_parse_size and Python's budget=.
//
// Thread safety: a pure function.
#pragma once

#include <cstdint>
#include <string_view>

#include "base/status.h"

namespace estream {

// Bytes: decimal digits with at most one decimal point, then an optional K/M/G/T (powers of 1024,
// either case) with an optional trailing B or iB. No sign, space, exponent or hexadecimal (strtod
// alone would read them: "0x100M" as 256 MiB), and a NUL is refused, not the end of the text. A
// nonzero size below one byte ("0.4") is refused, not 0; at most 2^63 bytes. InvalidArgument
// names the text (NUL shown as a space) and the accepted forms.
Result<uint64_t> ParseSize(std::string_view text);

}  // namespace estream
