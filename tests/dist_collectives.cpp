// A program for test_dist, run under mpirun: ZeRO's collectives (Communicator::all_gather,
// reduce_scatter_sum and gather_to_root) on a flat CPU array whose shards are uneven, checked on every rank against
// the values each rank put in. Prints "collectives ok on rank R of W" or names the first element
// that differs, and exits non-zero then.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "cumulus/dist/communicator.h"

using namespace cumulus;

namespace {
// The value rank `r` holds at element i before a collective.
float value(int r, int64_t i) { return static_cast<float>(r * 1000 + i % 997); }

int fail(const char* what, int rank, int64_t i, float got, float expected) {
  std::fprintf(stderr, "%s: rank %d element %lld is %g, expected %g\n", what, rank, static_cast<long long>(i), got,
               expected);
  return 1;
}
}  // namespace

int main() try {
  const auto comm = dist::Communicator::from_environment();
  const int rank = comm->rank(), world = comm->world_size();
  const int64_t n = 1000;  // 64-element shards: 512 + 488 on two ranks
  const std::vector<dist::Shard> shards = dist::shard_layout(n, world);
  const dist::Shard own = shards[static_cast<std::size_t>(rank)];

  std::vector<float> data(n, -1.0f);
  for (int64_t i = own.offset; i < own.offset + own.count; ++i) data[i] = value(rank, i);
  comm->all_gather(data.data(), shards, Device::cpu());
  for (int r = 0; r < world; ++r)
    for (int64_t i = shards[r].offset; i < shards[r].offset + shards[r].count; ++i)
      if (data[i] != value(r, i)) return fail("all_gather", rank, i, data[i], value(r, i));

  for (int64_t i = 0; i < n; ++i) data[i] = value(rank, i);
  comm->reduce_scatter_sum(data.data(), shards, Device::cpu());
  for (int64_t i = own.offset; i < own.offset + own.count; ++i) {
    float sum = 0.0f;
    for (int r = 0; r < world; ++r) sum += value(r, i);  // integers: exact in any order
    if (data[i] != sum) return fail("reduce_scatter_sum", rank, i, data[i], sum);
  }
  // gather_to_root: the root's whole array, its own shard in place; the others send just theirs.
  std::vector<float> mine(static_cast<std::size_t>(own.count));
  for (int64_t i = 0; i < own.count; ++i) mine[i] = value(rank, own.offset + i);
  if (comm->is_root()) {
    std::fill(data.begin(), data.end(), -1.0f);
    std::copy(mine.begin(), mine.end(), data.begin() + own.offset);
  }
  comm->gather_to_root(comm->is_root() ? data.data() : mine.data(), shards, Device::cpu());
  if (comm->is_root())
    for (int r = 0; r < world; ++r)
      for (int64_t i = shards[r].offset; i < shards[r].offset + shards[r].count; ++i)
        if (data[i] != value(r, i)) return fail("gather_to_root", rank, i, data[i], value(r, i));
  std::printf("collectives ok on rank %d of %d\n", rank, world);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "dist_collectives: %s\n", e.what());
  return 1;
}
