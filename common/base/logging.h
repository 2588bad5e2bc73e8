#pragma once

// The one logging layer: glog (LibTorch links it too). Every line names its subject,
// e.g. LOG(INFO) << "job=" << name << " rank=" << rank << " ...".

#include <glog/logging.h>

#include <string>

namespace varuna {

// Initializes glog for a binary: logs to stderr, no log files, `program` as the tag.
// Call once from main() before any other thread starts.
void InitLogging(const char* program);

}  // namespace varuna
