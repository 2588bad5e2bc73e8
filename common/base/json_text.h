#pragma once

// Writing JSON text by hand where a file format fixes its bytes (safetensors headers, the
// Hugging Face index): one string escaper for all of them.

#include <string>

#include "absl/strings/string_view.h"

namespace varuna {

// Appends `s` as a JSON string: quoted, with '"' and '\' escaped and every control character
// below 0x20 as \u00XX. Other bytes (UTF-8 included) pass through.
void AppendJsonString(std::string* out, absl::string_view s);

}  // namespace varuna
