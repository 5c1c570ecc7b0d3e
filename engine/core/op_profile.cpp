#include "cumulus/core/op_profile.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>
#include <unordered_map>
#include <utility>

#include <nlohmann/json.hpp>

#include "cumulus/core/error.h"
#include "cumulus/core/timer.h"
#include "cumulus/memory/category.h"
#include "engine/core/op_profile_hook.h"

// Note [Op time profile]
// A profile is a timeline of points, one each time the op current on the profiled thread changes:
// an OpScope opening (the op's own time starts, its caller's pauses) or closing (back to the
// caller, or to no op). The time from one point to the next belongs to the op current after the
// first, so each op gets its self time, the time outside every op is kBetweenOps, and the rows add
// up to the stretches' time exactly. An OpProfileScope's opening and closing are points too: its
// stretch starts with whatever op is current then (a scope opened inside an op), and the time
// between two stretches is nobody's.
// - The points are TimePoints: the host clock on the CPU, an event on the device's stream on CUDA,
//   so there an op's time is the device's from the op's first queued work to the next op's (its
//   kernels, and the device idle while the host queues it: host-bound stretches show as the ops
//   that wait). Taking a point never synchronizes; the elapsed times are read once the device has
//   passed them (a point is kept until then), or when the rows are asked for. Not yet run on a GPU.
// - Labels are keyed by the op's name pointer (OpScope's names are literals or interned) and
//   merged by text when the rows are read, so "linear" from two files is one row.
// - A profiled OpScope costs two clock reads, two small allocations and two hash lookups (its
//   opening and closing; well under a microsecond on the CPU); unprofiled, a thread-local load.
// - CUDA graphs replay without running the host's op code: a replayed step shows as no time here.
//   The apps refuse or switch off graphs with a profile.

namespace cumulus {

namespace {

struct Key {
  const char* name;
  bool backward;
  bool operator==(const Key& o) const { return name == o.name && backward == o.backward; }
};

struct KeyHash {
  std::size_t operator()(const Key& k) const { return std::hash<const void*>()(k.name) * 2 + (k.backward ? 1 : 0); }
};

}  // namespace

struct OpProfile::State {
  explicit State(Device d) : device(std::move(d)) {}

  Device device;
  std::vector<OpTime> rows;
  std::unordered_map<Key, std::size_t, KeyHash> index;
  // Points not yet read, each with the row current after it (-1: the end of a stretch).
  std::deque<std::pair<TimePoint, int64_t>> pending;
  double total_ms = 0.0;
  int64_t stretches = 0;

  std::size_t row_of(const char* name, bool backward) {
    const Key key{name, name != nullptr && backward};
    auto [it, added] = index.emplace(key, rows.size());
    if (added) {
      OpTime row;
      row.op = name == nullptr ? OpProfile::kBetweenOps : op_label(name, backward);
      rows.push_back(row);
    }
    return it->second;
  }

  void point(int64_t row) {
    pending.emplace_back(TimePoint::now(device), row);
    read(false);
  }

  // Adds the spans whose end the device has passed (all of them with `wait`).
  void read(bool wait) {
    while (pending.size() >= 2 && (wait || pending[1].first.reached())) {
      const auto& [start, row] = pending[0];
      if (row >= 0) {
        const double ms = pending[1].first.ms_since(start);
        rows[static_cast<std::size_t>(row)].ms += ms;
        total_ms += ms;
      }
      pending.pop_front();
    }
    if (pending.size() == 1 && pending[0].second < 0 && (wait || pending[0].first.reached())) pending.pop_front();
  }
};

namespace {
thread_local OpProfile::State* tls_profile = nullptr;
}  // namespace

OpProfile::OpProfile(Device device) : state_(std::make_unique<State>(std::move(device))) {}
OpProfile::~OpProfile() = default;

const Device& OpProfile::device() const { return state_->device; }

std::vector<OpTime> OpProfile::rows() const {
  state_->read(true);
  std::map<std::string, OpTime> merged;
  for (const OpTime& r : state_->rows) {
    OpTime& m = merged[r.op];
    m.op = r.op;
    m.calls += r.calls;
    m.ms += r.ms;
  }
  std::vector<OpTime> out;
  for (auto& [op, row] : merged)
    if (row.calls > 0 || row.ms > 0.0) out.push_back(row);
  std::stable_sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.ms > b.ms; });
  return out;
}

double OpProfile::total_ms() const {
  state_->read(true);
  return state_->total_ms;
}

int64_t OpProfile::stretches() const { return state_->stretches; }

namespace {

std::string line(const char* format, const std::string& op, long long calls, double ms, double per_ms, double share,
                 bool with_per) {
  char buf[256];
  if (with_per) std::snprintf(buf, sizeof buf, format, op.c_str(), calls, ms, per_ms, share);
  else std::snprintf(buf, sizeof buf, format, op.c_str(), calls, ms, share);
  return buf;
}

}  // namespace

std::string OpProfile::table(int max_rows, int64_t per, const std::string& per_name) const {
  const std::vector<OpTime> all = rows();
  const double total = total_ms();
  const bool with_per = per > 0;
  const double divisor = with_per ? static_cast<double>(per) : 1.0;
  char head[256];
  if (with_per)
    std::snprintf(head, sizeof head, "op time on %s: %.1f ms over %lld %s%s, %.3f ms per %s\n",
                  state_->device.str().c_str(), total, static_cast<long long>(per), per_name.c_str(),
                  per == 1 ? "" : "s", total / divisor, per_name.c_str());
  else
    std::snprintf(head, sizeof head, "op time on %s: %.1f ms over %lld profiled stretch%s\n",
                  state_->device.str().c_str(), total, static_cast<long long>(state_->stretches),
                  state_->stretches == 1 ? "" : "es");
  std::string out = head;
  const char* row_format = with_per ? "  %-32s %9lld %11.1f %11.3f %6.1f%%\n" : "  %-32s %9lld %11.1f %6.1f%%\n";
  char title[256];
  if (with_per)
    std::snprintf(title, sizeof title, "  %-32s %9s %11s %11s %7s\n", "op", "calls", "ms", ("ms/" + per_name).c_str(),
                  "share");
  else std::snprintf(title, sizeof title, "  %-32s %9s %11s %7s\n", "op", "calls", "ms", "share");
  out += title;
  const double share_of = total > 0.0 ? 100.0 / total : 0.0;
  const std::size_t shown = std::min(all.size(), static_cast<std::size_t>(std::max(max_rows, 0)));
  for (std::size_t i = 0; i < shown; ++i)
    out += line(row_format, all[i].op, all[i].calls, all[i].ms, all[i].ms / divisor, all[i].ms * share_of, with_per);
  if (shown < all.size()) {
    OpTime rest;
    for (std::size_t i = shown; i < all.size(); ++i) rest.calls += all[i].calls, rest.ms += all[i].ms;
    const std::string name = std::to_string(all.size() - shown) + " other op labels";
    out += line(row_format, name, rest.calls, rest.ms, rest.ms / divisor, rest.ms * share_of, with_per);
  }
  return out;
}

std::string OpProfile::json(int64_t per, const std::string& per_name) const {
  nlohmann::json j;
  j["device"] = state_->device.str();
  j["total_ms"] = total_ms();
  j["stretches"] = state_->stretches;
  j["per"] = per;
  j["per_name"] = per_name;
  nlohmann::json ops = nlohmann::json::array();
  for (const OpTime& r : rows()) ops.push_back({{"op", r.op}, {"calls", r.calls}, {"ms", r.ms}});
  j["ops"] = std::move(ops);
  return j.dump(1) + "\n";
}

OpProfileScope::OpProfileScope(OpProfile& profile) : state_(*profile.state_) {
  CUMULUS_CHECK(tls_profile == nullptr, InvalidArgument,
                "OpProfileScope: another one is open on this thread; close it first");
  const CurrentOp op = current_op();
  state_.point(static_cast<int64_t>(state_.row_of(op.name, op.backward)));
  tls_profile = &state_;
}

OpProfileScope::~OpProfileScope() {
  tls_profile = nullptr;
  ++state_.stretches;
  state_.point(-1);
}

namespace detail {

void op_profile_transition(const char* name, bool backward, bool opened) {
  OpProfile::State* s = tls_profile;
  if (s == nullptr) return;
  const std::size_t row = s->row_of(name, backward);
  if (opened) ++s->rows[row].calls;
  s->point(static_cast<int64_t>(row));
}

}  // namespace detail

}  // namespace cumulus
