// JSON text that never throws, for every writer whose values can hold strings from outside the
// program: paths, GGUF metadata, task files, error messages naming them.
#pragma once

#include <string>

namespace estream {

// j's JSON text (indent < 0: compact, else pretty with that many spaces). A string that is not
// valid UTF-8 (a path such as $'hs_\xff.txt', a Latin-1 file name in a GGUF key, a token piece
// that cuts a character) has each ill-formed byte written as U+FFFD, where nlohmann's default
// dump throws type_error.316 and ends the program. Json: nlohmann::json or ordered_json (the
// includer has nlohmann/json.hpp; base itself does not depend on it).
template <class Json>
std::string DumpJson(const Json& j, int indent = -1) {
  return j.dump(indent, ' ', false, Json::error_handler_t::replace);
}

}  // namespace estream
