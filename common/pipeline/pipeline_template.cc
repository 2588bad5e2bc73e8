#include "common/pipeline/pipeline_template.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"

namespace varuna {
namespace {

constexpr char kMismatch[] =
    "Modules in the pipeline template do not match the modules in the model.";

// Says how `got` (flattened template) differs from `want` (the model's modules).
std::string MismatchDetail(const std::vector<std::string>& want,
                           const std::vector<std::string>& got) {
  std::set<std::string> known(want.begin(), want.end());
  std::map<std::string, int> seen;
  for (const std::string& m : got) {
    if (!known.count(m)) return absl::StrCat("'", m, "' is not a module of the model");
    if (++seen[m] > 1) return absl::StrCat("'", m, "' is listed twice");
  }
  for (const std::string& m : want) {
    if (!seen.count(m)) return absl::StrCat("'", m, "' is missing");
  }
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] != got[i]) {
      return absl::StrCat("out of order at position ", i, ": '", got[i], "' where the model has '",
                          want[i], "'");
    }
  }
  return "";
}

}  // namespace

const std::vector<std::string>& SupportedTemplateModels() {
  static const auto* models =
      new std::vector<std::string>{"gpt", "mlp", "torchscript", "llama", "gpt2", "bert"};
  return *models;
}

absl::Status CheckTemplateModel(const std::string& model_name) {
  for (const std::string& m : SupportedTemplateModels()) {
    if (m == model_name) return absl::OkStatus();
  }
  return absl::UnimplementedError(
      absl::StrCat("Auto policy for ", model_name, " is not implemented\n. Supported models are [",
                   absl::StrJoin(SupportedTemplateModels(), ", "), "]"));
}

absl::StatusOr<std::vector<int>> TemplateBoundaries(
    const std::string& model_name, const std::vector<std::string>& modules,
    const std::vector<std::vector<std::string>>& modules_per_stage,
    const std::vector<int>& segment_of) {
  RETURN_IF_ERROR(CheckTemplateModel(model_name));
  if (modules_per_stage.empty()) {
    return absl::InvalidArgumentError("a pipeline template needs at least one stage");
  }
  if (modules.empty()) return absl::InvalidArgumentError("the model has no modules");
  const bool builtin = model_name != "torchscript";
  auto contains = [](const std::vector<std::string>& stage, const std::string& m) {
    for (const std::string& s : stage) {
      if (s == m) return true;
    }
    return false;
  };
  if (!contains(modules_per_stage.front(), modules.front())) {
    return absl::InvalidArgumentError(absl::StrCat("The first stage must contain the ",
                                                   builtin ? "embedding module" : "module", " '",
                                                   modules.front(), "'."));
  }
  if (!contains(modules_per_stage.back(), modules.back())) {
    return absl::InvalidArgumentError(absl::StrCat("The last stage must contain the ",
                                                   builtin ? "head module" : "module", " '",
                                                   modules.back(), "'."));
  }
  std::vector<std::string> flat;
  for (const auto& stage : modules_per_stage) flat.insert(flat.end(), stage.begin(), stage.end());
  if (flat != modules) {
    return absl::InvalidArgumentError(absl::StrCat(kMismatch, " (", MismatchDetail(modules, flat),
                                                   "; the model's modules are ",
                                                   absl::StrJoin(modules, " "), ")"));
  }
  auto segment = [&](size_t i) { return segment_of.empty() ? static_cast<int>(i) : segment_of[i]; };
  std::vector<int> bounds = {0};
  size_t next = 0;
  for (size_t s = 0; s < modules_per_stage.size(); ++s) {
    if (modules_per_stage[s].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("stage ", s, " of the template is empty"));
    }
    next += modules_per_stage[s].size();
    if (next < modules.size() && segment(next) == segment(next - 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage ", s, " ends at '", modules[next - 1],
          "', which is not a cut point (it shares a segment with '", modules[next], "')"));
    }
    bounds.push_back(next < modules.size() ? segment(next) : segment(next - 1) + 1);
  }
  return bounds;
}

}  // namespace varuna
