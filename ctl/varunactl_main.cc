#include <cstdlib>
#include <iostream>

#include "ctl/varunactl.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  const char* env = std::getenv("VARUNA_MANAGER");
  return varuna::RunVarunactl(args, env != nullptr ? env : "", std::cout, std::cerr);
}
