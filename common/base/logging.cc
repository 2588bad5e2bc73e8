#include "common/base/logging.h"

namespace varuna {

void InitLogging(const char* program) {
  static bool initialized = false;
  if (initialized) return;
  initialized = true;
  FLAGS_logtostderr = true;
  FLAGS_colorlogtostderr = false;
  google::InitGoogleLogging(program);
}

}  // namespace varuna
