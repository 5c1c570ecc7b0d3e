// The CUDA paths an environment variable chooses between (CUMULUS_CUDA_ATTENTION,
// CUMULUS_CUDA_LINEAR16, CUMULUS_CUDA_MEMORY_OUTSIDE): one reading of such a setting for all of them.
#pragma once

#include <initializer_list>

namespace cumulus::detail {

// The index in `choices` of `variable`'s value; -1 when it is unset or empty. Any other value is a
// speed or reporting setting's typo: said once on stderr (naming the choices) and read as unset,
// rather than failing the program. Callers read it once (a function-local static).
int environment_choice(const char* variable, std::initializer_list<const char*> choices);

}  // namespace cumulus::detail
