// Memory categories: every block the allocator hands out carries one, set by the engine through
// MemoryCategoryScope (users never tag memory by hand). See docs/ARCHITECTURE.md, "Memory accounting".
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace cumulus {

enum class MemoryCategory : uint8_t {
  parameters,
  gradients,
  optimizer_state,
  activations,           // op outputs in a forward that records the graph (held for backward)
  backward_temporaries,  // tensors made while the backward engine runs
  workspace,             // library workspaces (cuBLAS, later cuDNN)
  data,                  // datasets and batches
  other,
  parameter_copies,  // 16-bit copies of f32 parameters made for compute (mixed precision)
};
inline constexpr std::size_t kNumMemoryCategories = 9;

const char* category_name(MemoryCategory c);

// Sets the category of allocations made on this thread for its lifetime; scopes nest.
class MemoryCategoryScope {
 public:
  explicit MemoryCategoryScope(MemoryCategory c);
  ~MemoryCategoryScope();
  MemoryCategoryScope(const MemoryCategoryScope&) = delete;
  MemoryCategoryScope& operator=(const MemoryCategoryScope&) = delete;

 private:
  MemoryCategory previous_;
  bool previous_set_;
};

// The innermost scope's category, or `fallback` when no scope is open on this thread.
MemoryCategory current_memory_category(MemoryCategory fallback = MemoryCategory::other);
// Whether a MemoryCategoryScope is open on this thread.
bool memory_category_scope_open();

// Sets, for its lifetime, the category of the blocks a thread allocates with no MemoryCategoryScope
// open and outside any op (OpScope): the tensors a caller's own code makes (Tensor::from_vector,
// zeros, full, to). The Trainer's micro-batch sets data around its closure, so a batch built there
// counts as data, not other (Note [A user's tensors in a micro-batch] in engine/train/trainer.cpp);
// such a block still moves to activations when attach_node makes it an op's output (Note [Custom op
// outputs are activations]). Scopes nest.
class UnscopedMemoryCategory {
 public:
  explicit UnscopedMemoryCategory(MemoryCategory c);
  ~UnscopedMemoryCategory();
  UnscopedMemoryCategory(const UnscopedMemoryCategory&) = delete;
  UnscopedMemoryCategory& operator=(const UnscopedMemoryCategory&) = delete;

 private:
  MemoryCategory previous_;
};
// The category of a block allocated now with no MemoryCategoryScope open: the innermost
// UnscopedMemoryCategory's outside any op, else other.
MemoryCategory unscoped_memory_category();

// Names the op whose work runs on this thread for its lifetime, so that every block allocated
// meanwhile is attributed to it (out-of-memory reports list live bytes by op). `name` must outlive
// the blocks: a string literal. Scopes nest; the innermost names the op. `backward` marks the op's
// backward work ("linear backward"). Two thread-local stores and a check for an open
// OpProfileScope (core/op_profile.h), which times the ops by these scopes: cheap enough for every
// op call.
class OpScope {
 public:
  explicit OpScope(const char* name, bool backward = false);
  ~OpScope();
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  const char* previous_name_;
  bool previous_backward_;
};

struct CurrentOp {
  const char* name = nullptr;  // nullptr: no op (allocations outside any op)
  bool backward = false;
};
CurrentOp current_op();
// "linear", "linear backward", or "(no op)".
std::string op_label(const char* name, bool backward);

// "12.0 MiB", "512 B": for messages and reports.
std::string format_bytes(int64_t bytes);

}  // namespace cumulus
