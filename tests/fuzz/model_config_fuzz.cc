// config.json (and the RoPE scaling fields in it) as the model loader reads it.
#include <cstdint>
#include <string>

#include "engine/model/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  (void)sluice::ModelConfig::FromJsonText(text);
  return 0;
}
