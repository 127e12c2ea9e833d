// \brief The C++ tests' registry, failure reports and main (see harness.h).
#include "harness.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace wgrad::test {

namespace {

struct TestCase {
  std::string suite;
  std::string name;
  void (*body)();
};

std::vector<TestCase>& registry() {
  static std::vector<TestCase> tests;  // (a function's static: registered from other files' initialisers)
  return tests;
}

struct TraceEntry {
  const char* file;
  int line;
  std::string message;
};
std::vector<TraceEntry> traces;
bool test_failed = false;
bool fatal_failed = false;

// '*' any run of characters, '?' one character.
bool matches(const char* pattern, const char* text) {
  if (*pattern == '\0') return *text == '\0';
  if (*pattern == '*') return matches(pattern + 1, text) || (*text != '\0' && matches(pattern, text + 1));
  return *text != '\0' && (*pattern == '?' || *pattern == *text) && matches(pattern + 1, text + 1);
}

// A GoogleTest-style filter: patterns separated by ':'.
bool selected(const std::string& filter, const std::string& full_name) {
  size_t start = 0;
  while (true) {
    const size_t end = filter.find(':', start);
    const std::string pattern = filter.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (matches(pattern.c_str(), full_name.c_str())) return true;
    if (end == std::string::npos) return false;
    start = end + 1;
  }
}

std::string count(size_t n) { return std::to_string(n) + (n == 1 ? " test" : " tests"); }

}  // namespace

void Reporter::operator=(const Message& message) const {
  test_failed = true;
  fatal_failed = fatal_failed || fatal;
  std::string text = std::string(file) + ":" + std::to_string(line) + ": Failure\n" + what + "\n";
  const std::string extra = message.str();
  if (!extra.empty()) text += extra + "\n";
  if (!traces.empty()) {
    text += "Trace:\n";
    for (auto it = traces.rbegin(); it != traces.rend(); ++it) {
      text += std::string(it->file) + ":" + std::to_string(it->line) + ": " + it->message + "\n";
    }
  }
  std::fputs(text.c_str(), stdout);
}

ScopedTrace::ScopedTrace(const char* file, int line, const std::string& message) {
  traces.push_back({file, line, message});
}

ScopedTrace::~ScopedTrace() { traces.pop_back(); }

bool has_fatal_failure() { return fatal_failed; }

bool register_test(const char* suite, const char* name, void (*body)()) {
  registry().push_back({suite, name, body});
  return true;
}

}  // namespace wgrad::test

int main(int argc, char** argv) {
  using namespace wgrad::test;
  std::string filter = "*";
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    const char* arg = argv[i];
    if (std::strcmp(arg, "--gtest_list_tests") == 0) {
      list = true;
    } else if (std::strncmp(arg, "--gtest_filter=", 15) == 0) {
      filter = arg + 15;
    } else if (std::strncmp(arg, "--gtest_color=", 14) == 0) {
      // (plain text always)
    } else {
      std::fprintf(stderr, "%s: unknown argument '%s' (takes --gtest_list_tests, --gtest_filter=PATTERN, "
                   "--gtest_color=no)\n", argv[0], arg);
      return 2;
    }
  }
  std::vector<const TestCase*> chosen;
  for (const TestCase& t : registry()) {
    if (selected(filter, t.suite + "." + t.name)) chosen.push_back(&t);
  }
  if (list) {
    std::string suite;
    for (const TestCase* t : chosen) {
      if (t->suite != suite) {
        suite = t->suite;
        std::printf("%s.\n", suite.c_str());
      }
      std::printf("  %s\n", t->name.c_str());
    }
    return 0;
  }
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::time_point a, Clock::time_point b) {
    return static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count());
  };
  std::printf("[==========] Running %s.\n", count(chosen.size()).c_str());
  std::vector<std::string> failed;
  const Clock::time_point start = Clock::now();
  for (const TestCase* t : chosen) {
    const std::string full = t->suite + "." + t->name;
    std::printf("[ RUN      ] %s\n", full.c_str());
    std::fflush(stdout);
    test_failed = false;
    fatal_failed = false;
    const Clock::time_point t0 = Clock::now();
    t->body();
    const long long took = ms(t0, Clock::now());
    std::printf("%s %s (%lld ms)\n", test_failed ? "[  FAILED  ]" : "[       OK ]", full.c_str(), took);
    if (test_failed) failed.push_back(full);
  }
  std::printf("[==========] %s ran. (%lld ms total)\n", count(chosen.size()).c_str(), ms(start, Clock::now()));
  std::printf("[  PASSED  ] %s.\n", count(chosen.size() - failed.size()).c_str());
  if (!failed.empty()) {
    std::printf("[  FAILED  ] %s, listed below:\n", count(failed.size()).c_str());
    for (const std::string& f : failed) std::printf("[  FAILED  ] %s\n", f.c_str());
  }
  return failed.empty() ? 0 : 1;
}
