#ifndef KVTIER_TESTS_SUPPORT_SANITIZERS_H_
#define KVTIER_TESTS_SUPPORT_SANITIZERS_H_

namespace kvtier::testing {

// Whether this build runs under ThreadSanitizer (scripts/tsan). Every memory access is
// instrumented there: processes run several times slower and hold several times the memory, so
// a bound a test puts on a rate, a delay or resident memory says nothing in that build, while
// what it checks of behaviour still holds.
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kUnderThreadSanitizer = true;
#else
inline constexpr bool kUnderThreadSanitizer = false;
#endif

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_SUPPORT_SANITIZERS_H_
