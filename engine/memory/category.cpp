#include "cumulus/memory/category.h"

#include <cstdio>

#include "engine/core/op_profile_hook.h"

namespace cumulus {

namespace {
thread_local bool tls_scope_set = false;
thread_local MemoryCategory tls_category = MemoryCategory::other;
thread_local const char* tls_op_name = nullptr;
thread_local bool tls_op_backward = false;
thread_local MemoryCategory tls_unscoped = MemoryCategory::other;
}  // namespace

const char* category_name(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::parameters: return "parameters";
    case MemoryCategory::gradients: return "gradients";
    case MemoryCategory::optimizer_state: return "optimizer_state";
    case MemoryCategory::activations: return "activations";
    case MemoryCategory::backward_temporaries: return "backward_temporaries";
    case MemoryCategory::workspace: return "workspace";
    case MemoryCategory::data: return "data";
    case MemoryCategory::other: return "other";
    case MemoryCategory::parameter_copies: return "parameter_copies";
  }
  return "unknown";
}

MemoryCategoryScope::MemoryCategoryScope(MemoryCategory c)
    : previous_(tls_category), previous_set_(tls_scope_set) {
  tls_category = c;
  tls_scope_set = true;
}

MemoryCategoryScope::~MemoryCategoryScope() {
  tls_category = previous_;
  tls_scope_set = previous_set_;
}

MemoryCategory current_memory_category(MemoryCategory fallback) {
  return tls_scope_set ? tls_category : fallback;
}

bool memory_category_scope_open() { return tls_scope_set; }

UnscopedMemoryCategory::UnscopedMemoryCategory(MemoryCategory c) : previous_(tls_unscoped) { tls_unscoped = c; }

UnscopedMemoryCategory::~UnscopedMemoryCategory() { tls_unscoped = previous_; }

// Inside an op an unscoped block is the op's own bookkeeping, never the caller's tensor.
MemoryCategory unscoped_memory_category() { return tls_op_name == nullptr ? tls_unscoped : MemoryCategory::other; }

OpScope::OpScope(const char* name, bool backward)
    : previous_name_(tls_op_name), previous_backward_(tls_op_backward) {
  tls_op_name = name;
  tls_op_backward = backward;
  detail::op_profile_transition(name, backward, /*opened=*/true);
}

OpScope::~OpScope() {
  tls_op_name = previous_name_;
  tls_op_backward = previous_backward_;
  detail::op_profile_transition(previous_name_, previous_backward_, /*opened=*/false);
}

CurrentOp current_op() { return {tls_op_name, tls_op_backward}; }

std::string op_label(const char* name, bool backward) {
  if (name == nullptr) return "(no op)";
  return backward ? std::string(name) + " backward" : std::string(name);
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while ((v >= 1024.0 || v <= -1024.0) && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

}  // namespace cumulus
