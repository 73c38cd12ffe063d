// Memory-mapped safetensors checkpoints, single file or sharded
// (`model.safetensors.index.json`).
//
// Format: https://github.com/huggingface/safetensors — 8-byte little-endian header length N,
// N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
// then the raw little-endian tensor bytes. Offsets are relative to the end of the header.
#ifndef SLUICE_ENGINE_MODEL_SAFETENSORS_H_
#define SLUICE_ENGINE_MODEL_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/float16.h"  // the loader's users convert 16-bit floats with it

namespace sluice {

// DType is the element type of a stored tensor.
enum class DType { kF32, kF16, kBF16, kF64, kI64, kI32, kI16, kI8, kU8, kBool };

// DTypeSize returns bytes per element.
size_t DTypeSize(DType dtype);
// DTypeName returns the safetensors spelling ("F32", "BF16", ...).
const char* DTypeName(DType dtype);

// TensorView is a non-owning view of one stored tensor; `data` points into the mmap and lives
// as long as the file object that returned it.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t num_bytes = 0;

  int64_t NumElements() const;
};

// SafetensorsFile is one memory-mapped .safetensors file. Thread-safe for reads.
class SafetensorsFile {
 public:
  // Open maps `path`. Errors: NotFound (no file), InvalidArgument (bad header, offsets outside
  // the file, unknown dtype, size not matching shape × dtype), each naming the file/tensor.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // Find returns the tensor or nullptr.
  const TensorView* Find(const std::string& name) const;
  std::vector<std::string> Names() const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Checkpoint is every safetensors file of a Hugging Face model folder: `model.safetensors`, or
// the shards listed by `model.safetensors.index.json`. Thread-safe for reads.
class Checkpoint {
 public:
  // Open loads the folder `dir`. Errors: NotFound when no safetensors file exists,
  // InvalidArgument for a malformed index or shard.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  const TensorView* Find(const std::string& name) const;
  bool Contains(const std::string& name) const { return Find(name) != nullptr; }
  std::vector<std::string> Names() const;

  // ReadFloat32 returns the tensor converted to float32 (from f32/f16/bf16, exact), checking the
  // shape. Errors: NotFound "missing tensor <name>", InvalidArgument "tensor <name>: shape
  // [a, b] expected [c, d]" or "tensor <name>: dtype I64 is not a float type".
  absl::StatusOr<std::vector<float>> ReadFloat32(const std::string& name,
                                                 const std::vector<int64_t>& expected_shape) const;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;
};

// ToFloat32 converts a float tensor view (f32/f16/bf16/f64) to float32.
absl::StatusOr<std::vector<float>> ToFloat32(const TensorView& view);
// ToInt64 converts an integer tensor view (i64/i32/i16/i8/u8) to int64.
absl::StatusOr<std::vector<int64_t>> ToInt64(const TensorView& view);

}  // namespace sluice

#endif  // SLUICE_ENGINE_MODEL_SAFETENSORS_H_
