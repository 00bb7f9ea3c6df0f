// The stand-in libc10.so: only c10::detail::torchCheckFail, with PyTorch's signature (so its
// mangled name is the one cudamem.torch looks up), throwing the stand-in c10::Error.
#include <c10/util/Exception.h>

namespace c10 {
namespace detail {
[[noreturn]] void torchCheckFail(const char* func, const char* file, uint32_t line, const char* msg) {
  throw ::c10::Error({func, file, line}, std::string(msg));
}
}  // namespace detail
}  // namespace c10
