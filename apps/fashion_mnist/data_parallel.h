// Data parallel (mpirun): each rank's place and device, and the checks that every rank was started
// with the same settings and loaded the same amount of data.
#pragma once

#include <functional>
#include <string>

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

// Runs `check` on every rank; a UsageFailure on any rank becomes a usage error on every rank
// (SameOnEveryRank, naming the rank), so no rank goes on to wait for one that stopped. With one
// process, just `check`.
void usage_check_on_every_rank(cumulus::dist::Communicator& comm, const std::function<void()>& check);

// Note [Ranks agree on what they loaded]
// The ranks issue one collective per optimizer step and per stop check, a number fixed by the
// micro-batches of an epoch (the training set's size) and by where a resume starts (the
// checkpoint's position). Each rank reads its own files (--data, --resume: the same path may name
// another file on another host), so equal settings do not make them equal: ranks that differ would
// wait forever in a collective the others never reach. What each rank loaded is compared before
// any collective depends on it; a difference is an error on every rank (exit 1), naming each rank's
// value. `what` says what is compared ("data", "checkpoint"), `mine` is this rank's description.
void check_same_loaded_on_every_rank(const char* what, const std::string& mine, const std::string& advice,
                                     cumulus::dist::Communicator& comm);

}  // namespace fmnist
