// Data parallel (mpirun): each rank's place and device, and the checks that every rank was started
// with the same settings and loaded the same amount of data.
#pragma once

#include <functional>
#include <string>

#include "cumulus/dist/communicator.h"
#include "run_config.h"

namespace fmnist {

// Before any file is touched: this rank, the number of ranks and this rank's device (one GPU per
// rank of a node for --device auto or cuda), for on_ranks(). Sets g_root and, without --threads,
// each rank's share of the host's cores. Refuses what several ranks cannot run (the planner,
// --graphs on) and a device problem of any rank (a usage error on every rank).
RankPlacement place_on_ranks(const RunConfig& config, cumulus::dist::Communicator& comm);

// Every rank must have been started with the same settings (Note [Settings table]): a usage error
// on every rank, naming the setting, if not.
void check_same_settings_on_every_rank(const RunConfig& config, cumulus::dist::Communicator& comm);

// Runs `check` on every rank; a UsageFailure on any rank becomes a usage error on every rank
// (SameOnEveryRank, naming the rank), so no rank goes on to wait for one that stopped.
void usage_check_on_every_rank(cumulus::dist::Communicator& comm, const std::function<void()>& check);

// Note [Ranks agree on what they loaded]: each rank reads its own files (--data, --resume), so
// equal settings do not make the epoch's length or a resume's position equal, and ranks that differ
// would wait forever in a collective. Compared with dist::difference_among_ranks before any
// collective depends on them: a difference is an error on every rank (exit 1) naming each value.
void check_same_loaded_on_every_rank(const char* what, const std::string& mine, const std::string& advice,
                                     cumulus::dist::Communicator& comm);

}  // namespace fmnist
