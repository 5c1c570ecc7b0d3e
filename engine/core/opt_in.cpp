#include "engine/core/opt_in.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace cumulus::detail {

int environment_choice(const char* variable, std::initializer_list<const char*> choices) {
  const char* value = std::getenv(variable);
  if (value == nullptr || *value == '\0') return -1;
  int index = 0;
  std::string names;
  for (const char* choice : choices) {
    if (std::strcmp(value, choice) == 0) return index;
    names += (index++ == 0 ? "" : " or ") + std::string(choice);
  }
  std::fprintf(stderr, "cumulus: %s=%s is not %s; ignored\n", variable, value, names.c_str());
  return -1;
}

}  // namespace cumulus::detail
