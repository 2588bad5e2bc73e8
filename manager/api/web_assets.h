#pragma once

#include <string_view>

namespace varuna {

struct WebAsset {
  std::string_view path;
  std::string_view content_type;
  std::string_view body;
};

// The dashboard's files, built with npm at build time and embedded (docs/observability.md).
// path: "/", "/index.html", "/app.js", "/app.css"; nullptr if unknown.
const WebAsset* FindWebAsset(std::string_view path);

}  // namespace varuna
