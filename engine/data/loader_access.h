// The DataLoader's staging of host-resident data, for the Trainer and the tests that replay CUDA
// graphs. Not installed: a training program reads batches with seek() and next(), which stage by
// themselves, and train::Trainer stages before each graph replay.
#pragma once

#include "cumulus/data/dataset.h"

namespace cumulus::data {

struct DataLoaderAccess {
  // Host-resident data only (a no-op otherwise): batch i made ready on the device for the next
  // gather, and batch `then` (usually the next one this rank reads; none when out of range) copied
  // behind it. next(i) stages by itself when it has to, but a replayed CUDA graph runs no host code:
  // with graphs, stage before every micro-batch, outside the captured work. Each stage is followed
  // by exactly one gather (next(i), or the replay of a graph that holds one).
  static void stage(DataLoader& loader, int64_t i, int64_t then) { loader.stage(i, then); }
};

}  // namespace cumulus::data
