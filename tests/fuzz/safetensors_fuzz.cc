// The safetensors loader on arbitrary files: header length, JSON header, dtypes, shapes and
// data offsets. Each input is written to a memfd and opened through /proc/self/fd, the same
// mmap path a checkpoint takes. Every tensor that opens is converted, so a header that passes
// validation with offsets outside the mapping shows up as an ASan report.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "engine/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int fd = memfd_create("safetensors_fuzz", 0);
  if (fd < 0) return 0;
  size_t written = 0;
  while (written < size) {
    ssize_t n = write(fd, data + written, size - written);
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  auto file = sluice::SafetensorsFile::Open("/proc/self/fd/" + std::to_string(fd));
  close(fd);
  if (!file.ok()) return 0;
  for (const std::string& name : (*file)->Names()) {
    const sluice::TensorView* view = (*file)->Find(name);
    if (view == nullptr) __builtin_trap();
    if (view->NumElements() < 0) __builtin_trap();
    (void)sluice::ToFloat32(*view);
    (void)sluice::ToInt64(*view);
  }
  return 0;
}
