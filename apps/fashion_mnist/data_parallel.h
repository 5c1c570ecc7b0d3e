// Data parallel (mpirun): each rank's place and device, and the check that every rank was started
// with the same settings.
#pragma once

#include "cumulus/dist/communicator.h"
#include "run_config.h"

namespace fmnist {

// Data parallel setup, before any file is touched: this rank, the number of ranks and this rank's
// device (one GPU per rank of a node for --device auto or cuda), for on_ranks() to fold into the
// configuration. Sets g_root and, without --threads, each rank's share of the host's cores.
// Refuses what several ranks cannot run (the planner, --graphs on) and a device problem of any
// rank (a usage error on every rank).
RankPlacement place_on_ranks(const RunConfig& config, cumulus::dist::Communicator& comm);

// Every rank must have been started with the same settings (Note [Settings table]): a usage error
// on every rank, naming the setting, if not.
void check_same_settings_on_every_rank(const RunConfig& config, cumulus::dist::Communicator& comm);

}  // namespace fmnist
