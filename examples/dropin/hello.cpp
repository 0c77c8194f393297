// A standalone program (is_standalone=True): opsmith.load returns the executable's path.
#include <cstdio>

int main() {
  std::puts("hello from a standalone build");
  return 0;
}
