#include "engine/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace sluice {
namespace {

using json = nlohmann::json;

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

bool ParseDType(const std::string& s, DType* out) {
  static const std::pair<const char*, DType> kNames[] = {
      {"F32", DType::kF32}, {"F16", DType::kF16}, {"BF16", DType::kBF16},
      {"F64", DType::kF64}, {"I64", DType::kI64}, {"I32", DType::kI32},
      {"I16", DType::kI16}, {"I8", DType::kI8},   {"U8", DType::kU8},
      {"BOOL", DType::kBool}};
  for (const auto& [name, dtype] : kNames) {
    if (s == name) {
      *out = dtype;
      return true;
    }
  }
  return false;
}

// Reads a little-endian value of type T from possibly unaligned memory.
template <typename T>
T LoadUnaligned(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
      return 2;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
      return 1;
  }
  return 1;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kF64:
      return "F64";
    case DType::kI64:
      return "I64";
    case DType::kI32:
      return "I32";
    case DType::kI16:
      return "I16";
    case DType::kI8:
      return "I8";
    case DType::kU8:
      return "U8";
    case DType::kBool:
      return "BOOL";
  }
  return "?";
}

int64_t TensorView::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::vector<float>> ToFloat32(const TensorView& view) {
  const int64_t n = view.NumElements();
  std::vector<float> out(static_cast<size_t>(n));
  const uint8_t* p = view.data;
  switch (view.dtype) {
    case DType::kF32:
      if (n > 0) std::memcpy(out.data(), p, static_cast<size_t>(n) * 4);
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(LoadUnaligned<uint16_t>(p + 2 * i));
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) out[i] = Fp16ToFloat(LoadUnaligned<uint16_t>(p + 2 * i));
      break;
    case DType::kF64:
      for (int64_t i = 0; i < n; ++i) {
        out[i] = static_cast<float>(LoadUnaligned<double>(p + 8 * i));
      }
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("tensor ", view.name, ": dtype ",
                                                     DTypeName(view.dtype),
                                                     " is not a float type"));
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> ToInt64(const TensorView& view) {
  const int64_t n = view.NumElements();
  std::vector<int64_t> out(static_cast<size_t>(n));
  const uint8_t* p = view.data;
  for (int64_t i = 0; i < n; ++i) {
    switch (view.dtype) {
      case DType::kI64:
        out[i] = LoadUnaligned<int64_t>(p + 8 * i);
        break;
      case DType::kI32:
        out[i] = LoadUnaligned<int32_t>(p + 4 * i);
        break;
      case DType::kI16:
        out[i] = LoadUnaligned<int16_t>(p + 2 * i);
        break;
      case DType::kI8:
        out[i] = static_cast<int8_t>(p[i]);
        break;
      case DType::kU8:
      case DType::kBool:
        out[i] = p[i];
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat("tensor ", view.name, ": dtype ",
                                                       DTypeName(view.dtype),
                                                       " is not an integer type"));
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no such file: ", path));
    return absl::InvalidArgumentError(
        absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("cannot stat ", path));
  }
  const size_t file_bytes = static_cast<size_t>(st.st_size);
  if (file_bytes < 8) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": file too small for a safetensors header (", file_bytes, " bytes)"));
  }
  void* map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) {
    return absl::InvalidArgumentError(
        absl::StrCat("mmap failed for ", path, ": ", std::strerror(errno)));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->map_ = map;
  file->map_bytes_ = file_bytes;

  const uint8_t* base = static_cast<const uint8_t*>(map);
  const uint64_t header_bytes = LoadUnaligned<uint64_t>(base);
  if (header_bytes > file_bytes - 8) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header length ", header_bytes,
                                                   " exceeds the file size ", file_bytes));
  }
  json header = json::parse(base + 8, base + 8 + header_bytes, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header is not a JSON object"));
  }
  const uint8_t* data_begin = base + 8 + header_bytes;
  const uint64_t data_bytes = file_bytes - 8 - header_bytes;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& entry = it.value();
    if (name == "__metadata__") {
      if (entry.is_object()) {
        for (auto m = entry.begin(); m != entry.end(); ++m) {
          file->metadata_[m.key()] = m.value().is_string() ? m.value().get<std::string>()
                                                           : m.value().dump();
        }
      }
      continue;
    }
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor ", name, ": ", why));
    };
    if (!entry.is_object()) return bad("header entry is not an object");
    auto dt = entry.find("dtype");
    auto sh = entry.find("shape");
    auto off = entry.find("data_offsets");
    if (dt == entry.end() || !dt->is_string()) return bad("missing dtype");
    if (sh == entry.end() || !sh->is_array()) return bad("missing shape");
    if (off == entry.end() || !off->is_array() || off->size() != 2 ||
        !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned()) {
      return bad("missing or malformed data_offsets");
    }
    TensorView view;
    view.name = name;
    if (!ParseDType(dt->get<std::string>(), &view.dtype)) {
      return bad(absl::StrCat("unknown dtype ", dt->get<std::string>()));
    }
    // The element count must fit int64 (and its bytes the data section, checked below): a
    // product that overflowed could match a small byte range and describe a huge tensor.
    int64_t elements = 1;
    for (const json& d : *sh) {
      if (!d.is_number_unsigned()) return bad("shape entries must be non-negative integers");
      const uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          __builtin_mul_overflow(elements, static_cast<int64_t>(dim), &elements)) {
        return bad(absl::StrCat("shape ", sh->dump(), " has more elements than int64 holds"));
      }
      view.shape.push_back(static_cast<int64_t>(dim));
    }
    const uint64_t begin = (*off)[0].get<uint64_t>();
    const uint64_t end = (*off)[1].get<uint64_t>();
    if (begin > end || end > data_bytes) {
      return bad(absl::StrCat("data_offsets [", begin, ", ", end, "] outside the data section (",
                              data_bytes, " bytes)"));
    }
    uint64_t expected = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(elements), DTypeSize(view.dtype), &expected) ||
        end - begin != expected) {
      return bad(absl::StrCat("byte size ", end - begin, " does not match shape ",
                              ShapeString(view.shape), " x ", DTypeName(view.dtype), " (",
                              expected, " bytes)"));
    }
    view.data = data_begin + begin;
    view.num_bytes = end - begin;
    file->tensors_.emplace(name, std::move(view));
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

const TensorView* SafetensorsFile::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> SafetensorsFile::Names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, view] : tensors_) names.push_back(name);
  return names;
}

// ---------------------------------------------------------------------------------------------
// Checkpoint

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  namespace fs = std::filesystem;
  auto ckpt = std::make_unique<Checkpoint>();
  const std::string index_path = dir + "/model.safetensors.index.json";
  const std::string single_path = dir + "/model.safetensors";
  std::error_code ec;
  if (fs::exists(index_path, ec)) {
    auto text = ReadTextFile(index_path);
    if (!text.ok()) return text.status();
    json index = json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": not a JSON object"));
    }
    auto wm = index.find("weight_map");
    if (wm == index.end() || !wm->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": missing weight_map"));
    }
    std::map<std::string, size_t> shard_ids;
    std::vector<std::pair<std::string, std::string>> entries;  // tensor, shard
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it.value().is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": weight_map entry for ", it.key(), " is not a string"));
      }
      const std::string shard = it.value().get<std::string>();
      if (shard.find('/') != std::string::npos || shard == "..") {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": shard name ", shard, " must be a plain file name"));
      }
      if (!shard_ids.count(shard)) {
        auto file = SafetensorsFile::Open(dir + "/" + shard);
        if (!file.ok()) {
          if (absl::IsNotFound(file.status())) {
            return absl::InvalidArgumentError(absl::StrCat(
                index_path, ": shard ", shard, " listed for tensor ", it.key(), " is missing"));
          }
          return file.status();
        }
        shard_ids[shard] = ckpt->files_.size();
        ckpt->files_.push_back(std::move(*file));
      }
      entries.emplace_back(it.key(), shard);
    }
    for (const auto& [tensor, shard] : entries) {
      const TensorView* view = ckpt->files_[shard_ids[shard]]->Find(tensor);
      if (view == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": tensor ", tensor,
                                                       " is listed in shard ", shard,
                                                       " but the shard does not contain it"));
      }
      ckpt->index_[tensor] = view;
    }
    return ckpt;
  }
  if (!fs::exists(single_path, ec)) {
    return absl::NotFoundError(absl::StrCat("no model.safetensors or model.safetensors.index.json in ", dir));
  }
  auto file = SafetensorsFile::Open(single_path);
  if (!file.ok()) return file.status();
  for (const std::string& name : (*file)->Names()) ckpt->index_[name] = (*file)->Find(name);
  ckpt->files_.push_back(std::move(*file));
  return ckpt;
}

const TensorView* Checkpoint::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

std::vector<std::string> Checkpoint::Names() const {
  std::vector<std::string> names;
  names.reserve(index_.size());
  for (const auto& [name, view] : index_) names.push_back(name);
  return names;
}

absl::StatusOr<std::vector<float>> Checkpoint::ReadFloat32(
    const std::string& name, const std::vector<int64_t>& expected_shape) const {
  const TensorView* view = Find(name);
  if (view == nullptr) return absl::NotFoundError(absl::StrCat("missing tensor ", name));
  if (view->shape != expected_shape) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, ": shape ",
                                                   ShapeString(view->shape), " expected ",
                                                   ShapeString(expected_shape)));
  }
  if (view->dtype != DType::kF32 && view->dtype != DType::kF16 && view->dtype != DType::kBF16 &&
      view->dtype != DType::kF64) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, ": dtype ", DTypeName(view->dtype), " is not a float type"));
  }
  return ToFloat32(*view);
}

}  // namespace sluice
