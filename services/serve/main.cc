// `sluice`: command-line entry point (serve, generate).
#include <cstdio>

int main(int argc, char** argv) {
  std::fprintf(stderr, "sluice: no commands yet\n");
  return 1;
}
