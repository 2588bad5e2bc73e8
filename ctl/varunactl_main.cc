#include <cstdlib>
#include <iostream>

#include "ctl/varunactl.h"

namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  varuna::CtlEnvironment env;
  env.manager = Env("VARUNA_MANAGER");
  env.tls_ca = Env("VARUNA_TLS_CA");
  env.token = Env("VARUNA_TOKEN");
  return varuna::RunVarunactl(args, env, std::cout, std::cerr);
}
