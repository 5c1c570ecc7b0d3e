// Errors thrown by the library. Library code never calls exit(): it throws one of these, and the
// caller (an app, a test) decides what to do. Messages name the op, the value and the expectation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

namespace cumulus {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad argument values (sizes, dtypes, options).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// Tensor shapes that do not fit an op.
class ShapeError : public Error {
 public:
  using Error::Error;
};

// Tensors on the wrong device, or a device that is not available.
class DeviceError : public Error {
 public:
  using Error::Error;
};

// A failing CUDA / cuBLAS call: the message carries the expression, file and line.
class CudaError : public Error {
 public:
  using Error::Error;
};

// The caching allocator could not satisfy a request even after releasing its cache.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

// Text quoted from a file or from a user (a JSON value, a tensor name, a dtype) as it goes into an
// error message: at most `max_bytes` bytes, cut at a UTF-8 character boundary and ended with "..."
// when shortened, so a hostile input cannot turn one message into megabytes.
std::string excerpt(const std::string& text, std::size_t max_bytes = 80);


}  // namespace cumulus

// CUMULUS_CHECK(cond, ErrorType, message parts...): throw ErrorType(message) unless cond holds.
#define CUMULUS_CHECK(cond, ErrorType, ...)                          \
  do {                                                               \
    if (!(cond)) throw ErrorType(::cumulus::detail::concat(__VA_ARGS__)); \
  } while (0)
