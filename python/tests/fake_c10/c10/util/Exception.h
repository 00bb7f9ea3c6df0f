// A stand-in for PyTorch's c10/util/Exception.h, for compiling cudamem's torch shim in CI
// where torch is not installed. It offers only what the shim uses, with the same shapes:
// c10::Error, c10::OutOfMemoryError, TORCH_CHECK and TORCH_CHECK_WITH. The real header is used
// on machines with torch (cudamem.torch.build_shim); this one checks the shim's logic.
#pragma once
#include <cstdint>
#include <exception>
#include <string>
#include <utility>

namespace c10 {
struct SourceLocation {
  const char* function;
  const char* file;
  uint32_t line;
};
class Error : public std::exception {
  std::string msg_;

 public:
  Error(SourceLocation, std::string msg) : msg_(std::move(msg)) {}
  const char* what() const noexcept override { return msg_.c_str(); }
};
class OutOfMemoryError : public Error {
  using Error::Error;
};
}  // namespace c10

#define TORCH_CHECK_WITH(error_t, cond, ...)                                              \
  if (!(cond)) {                                                                          \
    throw ::c10::error_t({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},           \
                         std::string(__VA_ARGS__));                                       \
  }
#define TORCH_CHECK(cond, ...) TORCH_CHECK_WITH(Error, cond, __VA_ARGS__)
