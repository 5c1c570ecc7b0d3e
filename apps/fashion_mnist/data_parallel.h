// Data parallel (mpirun): each rank's role, device and outputs, and the check that every rank was
// started with the same settings.
#pragma once

#include "cumulus/dist/communicator.h"
#include "options.h"

namespace fmnist {

// Data parallel setup, before any file is touched: the ranks' roles and outputs, the device of
// each rank, the accumulation steps from --effective-batch, and the check that every rank was
// started with the same settings (a usage error on every rank, naming the setting, if not).
void run_data_parallel_setup(Options& o, cumulus::dist::Communicator& comm);

}  // namespace fmnist
