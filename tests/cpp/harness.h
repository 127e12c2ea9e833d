// \brief The C++ tests' own harness: TEST registration, EXPECT_* / ASSERT_* checks that print file:line and
// both values, SCOPED_TRACE, and a main (harness.cpp) that runs them, so that CMake and a C++ compiler are
// all the tests need. The command line and the output follow GoogleTest's where tests/test_cpp.py reads them:
//   wgrad_cpp_tests [--gtest_list_tests] [--gtest_filter=PATTERN[:PATTERN...]] [--gtest_color=no]
// lists "Suite." lines with "  Name" lines under them, runs the tests whose "Suite.Name" matches a pattern
// (* and ? wildcards), prints "[ RUN      ]", "[       OK ]" or "[  FAILED  ]" per test and ends with
// "[  PASSED  ] N tests." (or "1 test."); the exit status is non-zero when any test failed.
//
// A failed EXPECT_* goes on with the test, a failed ASSERT_* returns from the function it is in (a helper
// that returns void too: the test then checks has_fatal_failure(), as with GoogleTest's HasFatalFailure).
// Every check takes a message after it: EXPECT_EQ(a, b) << "row " << r;
#pragma once

#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace wgrad::test {

// A message built with <<; the text of a check's failure and of SCOPED_TRACE.
class Message {
 public:
  template <class T>
  Message& operator<<(const T& v) {
    if constexpr (std::is_same_v<T, signed char> || std::is_same_v<T, unsigned char>) {
      s_ << static_cast<int>(v);
    } else {
      s_ << v;
    }
    return *this;
  }
  std::string str() const { return s_.str(); }

 private:
  std::ostringstream s_;
};

// A check's outcome: passed, or what failed in words.
struct Result {
  bool passed;
  std::string what;
  explicit operator bool() const { return passed; }
};

// Prints a value that has an operator<<, else a placeholder.
template <class T>
std::string show(const T& v) {
  if constexpr (requires(std::ostream& os) { os << v; }) {
    Message m;
    m << v;
    return m.str();
  } else {
    return "(a value without operator<<)";
  }
}

template <class A, class B, class Op>
Result compare(const A& a, const B& b, Op op, const char* a_text, const char* op_text, const char* b_text) {
  if (op(a, b)) return {true, {}};
  return {false, std::string("Expected: (") + a_text + ") " + op_text + " (" + b_text + "), actual: " + show(a) +
                     " vs " + show(b)};
}

inline Result truth(bool value, bool expected, const char* text) {
  if (value == expected) return {true, {}};
  return {false, std::string("Value of: ") + text + "\n  Actual: " + (value ? "true" : "false") +
                     "\nExpected: " + (expected ? "true" : "false")};
}

// Records a failure (with the trace of the enclosing SCOPED_TRACEs) when a Message is assigned to it: the
// end of a failed check's statement, after the caller's << message.
struct Reporter {
  const char* file;
  int line;
  bool fatal;
  std::string what;
  void operator=(const Message& message) const;
};

// A SCOPED_TRACE entry, printed with every failure while it is alive.
class ScopedTrace {
 public:
  ScopedTrace(const char* file, int line, const std::string& message);
  ScopedTrace(const char* file, int line, const Message& message) : ScopedTrace(file, line, message.str()) {}
  ~ScopedTrace();
  ScopedTrace(const ScopedTrace&) = delete;
  ScopedTrace& operator=(const ScopedTrace&) = delete;
};

// Whether the running test has had a failed ASSERT_*.
bool has_fatal_failure();

bool register_test(const char* suite, const char* name, void (*body)());

}  // namespace wgrad::test

#define WGRAD_TEST_CONCAT_(a, b) a##b
#define WGRAD_TEST_CONCAT(a, b) WGRAD_TEST_CONCAT_(a, b)

#define TEST(suite, name)                                                                              \
  static void wgrad_test_##suite##_##name();                                                           \
  [[maybe_unused]] static const bool wgrad_test_registered_##suite##_##name =                          \
      ::wgrad::test::register_test(#suite, #name, &wgrad_test_##suite##_##name);                       \
  static void wgrad_test_##suite##_##name()

#define SCOPED_TRACE(message) \
  const ::wgrad::test::ScopedTrace WGRAD_TEST_CONCAT(wgrad_test_trace_, __LINE__)(__FILE__, __LINE__, (message))

// (switch: an `else` after the macro in the caller's code cannot bind to the macro's `if`.)
#define WGRAD_TEST_CHECK_(result, fatal, on_failure)                                  \
  switch (0)                                                                          \
  case 0:                                                                             \
  default:                                                                            \
    if (const ::wgrad::test::Result wgrad_test_result_ = (result)) {                  \
    } else                                                                            \
      on_failure ::wgrad::test::Reporter{__FILE__, __LINE__, fatal, wgrad_test_result_.what} = ::wgrad::test::Message()

#define WGRAD_TEST_CMP_(a, op, b, fatal, on_failure)                                                       \
  WGRAD_TEST_CHECK_(::wgrad::test::compare((a), (b), [](const auto& x, const auto& y) { return x op y; }, #a, \
                                           #op, #b),                                                       \
                    fatal, on_failure)

#define EXPECT_EQ(a, b) WGRAD_TEST_CMP_(a, ==, b, false, )
#define EXPECT_NE(a, b) WGRAD_TEST_CMP_(a, !=, b, false, )
#define EXPECT_LT(a, b) WGRAD_TEST_CMP_(a, <, b, false, )
#define EXPECT_LE(a, b) WGRAD_TEST_CMP_(a, <=, b, false, )
#define EXPECT_GT(a, b) WGRAD_TEST_CMP_(a, >, b, false, )
#define EXPECT_GE(a, b) WGRAD_TEST_CMP_(a, >=, b, false, )
#define EXPECT_TRUE(c) WGRAD_TEST_CHECK_(::wgrad::test::truth(static_cast<bool>(c), true, #c), false, )
#define EXPECT_FALSE(c) WGRAD_TEST_CHECK_(::wgrad::test::truth(static_cast<bool>(c), false, #c), false, )

#define ASSERT_EQ(a, b) WGRAD_TEST_CMP_(a, ==, b, true, return)
#define ASSERT_NE(a, b) WGRAD_TEST_CMP_(a, !=, b, true, return)
#define ASSERT_LT(a, b) WGRAD_TEST_CMP_(a, <, b, true, return)
#define ASSERT_LE(a, b) WGRAD_TEST_CMP_(a, <=, b, true, return)
#define ASSERT_GT(a, b) WGRAD_TEST_CMP_(a, >, b, true, return)
#define ASSERT_GE(a, b) WGRAD_TEST_CMP_(a, >=, b, true, return)
#define ASSERT_TRUE(c) WGRAD_TEST_CHECK_(::wgrad::test::truth(static_cast<bool>(c), true, #c), true, return)
#define ASSERT_FALSE(c) WGRAD_TEST_CHECK_(::wgrad::test::truth(static_cast<bool>(c), false, #c), true, return)
