// GemmTuningTable: JSON reading and writing (format in gemm_tuning_table.h).
#include "kernels/linear/gemm_tuning_table.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace sluice::kernels {
namespace {

using nlohmann::json;

constexpr absl::string_view kFormat = "sluice-gemm-tuning-v1";

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("GEMM tuning table: ", what));
}

bool IsAlignment(int64_t a) { return a >= 1 && a <= 256 && (a & (a - 1)) == 0; }

// Field `name` of object `o` as T; InvalidArgument when missing or of another type.
template <typename T>
absl::StatusOr<T> Field(const json& o, const char* name, absl::string_view where) {
  auto it = o.find(name);
  if (it == o.end()) return Bad(absl::StrCat(where, ": missing \"", name, "\""));
  const json& v = *it;
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) return Bad(absl::StrCat(where, ": \"", name, "\" is not a boolean"));
    return v.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!v.is_number_integer()) return Bad(absl::StrCat(where, ": \"", name, "\" is not an integer"));
    return v.get<T>();
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) return Bad(absl::StrCat(where, ": \"", name, "\" is not a number"));
    return v.get<T>();
  } else {
    if (!v.is_string()) return Bad(absl::StrCat(where, ": \"", name, "\" is not a string"));
    return v.get<std::string>();
  }
}

#define SLUICE_TUNING_ASSIGN(lhs, expr)    \
  do {                                     \
    auto _v = (expr);                      \
    if (!_v.ok()) return _v.status();      \
    lhs = *std::move(_v);                  \
  } while (false)

absl::StatusOr<GemmTuningChoice> ParseChoice(const json& e, const GemmTuningKey& key,
                                             absl::string_view where) {
  GemmTuningChoice c;
  std::string kind;
  SLUICE_TUNING_ASSIGN(kind, Field<std::string>(e, "kind", where));
  SLUICE_TUNING_ASSIGN(c.search_mask, Field<int>(e, "search", where));
  SLUICE_TUNING_ASSIGN(c.us, Field<float>(e, "us", where));
  if (auto d = e.find("describe"); d != e.end() && d->is_string()) c.describe = d->get<std::string>();
  if (kind == "cublaslt") {
    c.kind = GemmTuningChoice::Kind::kCublasLt;
    std::string algo;
    SLUICE_TUNING_ASSIGN(algo, Field<std::string>(e, "algo", where));
    SLUICE_TUNING_ASSIGN(c.algo, ParseAlgoWords(algo));
  } else if (kind == "gemv") {
    c.kind = GemmTuningChoice::Kind::kGemv;
    SLUICE_TUNING_ASSIGN(c.gemv_unroll, Field<int>(e, "gemv_unroll", where));
    SLUICE_TUNING_ASSIGN(c.gemv_split, Field<int>(e, "gemv_split", where));
    if (c.gemv_unroll < 1 || c.gemv_split < 1) return Bad(absl::StrCat(where, ": bad GEMV shape"));
  } else if (kind == "skinny") {
    c.kind = GemmTuningChoice::Kind::kSkinny;
    SLUICE_TUNING_ASSIGN(c.skinny_split, Field<int>(e, "skinny_split", where));
    SLUICE_TUNING_ASSIGN(c.skinny_stages, Field<int>(e, "skinny_stages", where));
    if (c.skinny_split < 1 || c.skinny_stages < 1) {
      return Bad(absl::StrCat(where, ": bad skinny GEMM shape"));
    }
  } else if (kind == "split") {
    c.kind = GemmTuningChoice::Kind::kSplit;
    SLUICE_TUNING_ASSIGN(c.split_n1, Field<int64_t>(e, "n1", where));
    SLUICE_TUNING_ASSIGN(c.split_two_streams, Field<bool>(e, "two_streams", where));
    if (c.split_n1 <= 0 || c.split_n1 >= key.n) {
      return Bad(absl::StrCat(where, ": split n1 ", c.split_n1, " outside (0, ", key.n, ")"));
    }
    auto parts = e.find("algo_parts");
    if (parts == e.end() || !parts->is_array() || parts->size() != 2) {
      return Bad(absl::StrCat(where, ": \"algo_parts\" is not an array of 2 strings"));
    }
    for (int i = 0; i < 2; ++i) {
      if (!(*parts)[i].is_string()) return Bad(absl::StrCat(where, ": \"algo_parts\" holds a non-string"));
      SLUICE_TUNING_ASSIGN(c.split_algos[i], ParseAlgoWords((*parts)[i].get<std::string>()));
    }
  } else {
    return Bad(absl::StrCat(where, ": unknown kind \"", kind, "\""));
  }
  return c;
}

}  // namespace

std::string FormatAlgoWords(const CublasLtAlgoWords& words) {
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) {
    char buf[24];
    std::snprintf(buf, sizeof(buf), "%s%016" PRIx64, i == 0 ? "" : " ", words[i]);
    out += buf;
  }
  return out;
}

absl::StatusOr<CublasLtAlgoWords> ParseAlgoWords(absl::string_view text) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, ' ', absl::SkipEmpty());
  CublasLtAlgoWords words{};
  if (parts.size() != words.size()) {
    return Bad(absl::StrCat("algo \"", text, "\" does not hold 8 hex words"));
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].empty() || parts[i].size() > 16) return Bad(absl::StrCat("bad algo word \"", parts[i], "\""));
    uint64_t v = 0;
    for (char ch : parts[i]) {
      int d = ch >= '0' && ch <= '9'   ? ch - '0'
              : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
              : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                                       : -1;
      if (d < 0) return Bad(absl::StrCat("bad algo word \"", parts[i], "\""));
      v = v << 4 | static_cast<uint64_t>(d);
    }
    words[i] = v;
  }
  return words;
}

std::string GemmTuningFileName(absl::string_view device_name) {
  std::string out;
  for (char ch : device_name) {
    const bool keep = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
                      (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-';
    out += keep ? ch : '_';
  }
  return out + ".json";
}

absl::StatusOr<GemmTuningTable> GemmTuningTable::Parse(absl::string_view text) {
  json root = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) return Bad("not a JSON object");
  std::string format;
  SLUICE_TUNING_ASSIGN(format, Field<std::string>(root, "format", "table"));
  if (format != kFormat) return Bad(absl::StrCat("format \"", format, "\" is not ", kFormat));
  GemmTuningDevice device;
  SLUICE_TUNING_ASSIGN(device.name, Field<std::string>(root, "device", "table"));
  SLUICE_TUNING_ASSIGN(device.compute_capability, Field<int>(root, "compute_capability", "table"));
  SLUICE_TUNING_ASSIGN(device.sms, Field<int>(root, "sms", "table"));
  SLUICE_TUNING_ASSIGN(device.cublaslt_version, Field<int>(root, "cublaslt_version", "table"));
  GemmTuningTable table(std::move(device));
  auto entries = root.find("entries");
  if (entries == root.end() || !entries->is_array()) return Bad("\"entries\" is not an array");
  for (size_t i = 0; i < entries->size(); ++i) {
    const json& e = (*entries)[i];
    const std::string where = absl::StrCat("entry ", i);
    if (!e.is_object()) return Bad(absl::StrCat(where, " is not an object"));
    GemmTuningKey key;
    SLUICE_TUNING_ASSIGN(key.m, Field<int64_t>(e, "m", where));
    SLUICE_TUNING_ASSIGN(key.n, Field<int64_t>(e, "n", where));
    SLUICE_TUNING_ASSIGN(key.k, Field<int64_t>(e, "k", where));
    SLUICE_TUNING_ASSIGN(key.bias, Field<bool>(e, "bias", where));
    SLUICE_TUNING_ASSIGN(key.glu, Field<bool>(e, "glu", where));
    if (key.m < 1 || key.n < 1 || key.k < 1) return Bad(absl::StrCat(where, ": non-positive shape"));
    auto align = e.find("align");
    if (align == e.end() || !align->is_array() || align->size() != 4) {
      return Bad(absl::StrCat(where, ": \"align\" is not an array of 4 integers"));
    }
    uint32_t* const slots[4] = {&key.align_x, &key.align_w, &key.align_y, &key.align_bias};
    for (int j = 0; j < 4; ++j) {
      const json& a = (*align)[j];
      if (!a.is_number_integer() || !IsAlignment(a.get<int64_t>())) {
        return Bad(absl::StrCat(where, ": alignment ", a.dump(), " is not a power of two <= 256"));
      }
      *slots[j] = static_cast<uint32_t>(a.get<int64_t>());
    }
    absl::StatusOr<GemmTuningChoice> choice = ParseChoice(e, key, where);
    if (!choice.ok()) return choice.status();
    table.Insert(key, *std::move(choice));
  }
  return table;
}

std::string GemmTuningTable::Serialize() const {
  std::vector<std::pair<GemmTuningKey, const GemmTuningChoice*>> sorted;
  sorted.reserve(entries_.size());
  for (const auto& [key, choice] : entries_) sorted.emplace_back(key, &choice);
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  json entries = json::array();
  for (const auto& [key, c] : sorted) {
    json e = {{"m", key.m},         {"n", key.n},
              {"k", key.k},         {"bias", key.bias},
              {"glu", key.glu},     {"align", {key.align_x, key.align_w, key.align_y, key.align_bias}},
              {"search", c->search_mask}, {"us", c->us}};
    switch (c->kind) {
      case GemmTuningChoice::Kind::kCublasLt:
        e["kind"] = "cublaslt";
        e["algo"] = FormatAlgoWords(c->algo);
        break;
      case GemmTuningChoice::Kind::kGemv:
        e["kind"] = "gemv";
        e["gemv_unroll"] = c->gemv_unroll;
        e["gemv_split"] = c->gemv_split;
        break;
      case GemmTuningChoice::Kind::kSkinny:
        e["kind"] = "skinny";
        e["skinny_split"] = c->skinny_split;
        e["skinny_stages"] = c->skinny_stages;
        break;
      case GemmTuningChoice::Kind::kSplit:
        e["kind"] = "split";
        e["n1"] = c->split_n1;
        e["two_streams"] = c->split_two_streams;
        e["algo_parts"] = {FormatAlgoWords(c->split_algos[0]), FormatAlgoWords(c->split_algos[1])};
        break;
    }
    if (!c->describe.empty()) e["describe"] = c->describe;
    entries.push_back(std::move(e));
  }
  json root = {{"format", std::string(kFormat)},
               {"device", device_.name},
               {"compute_capability", device_.compute_capability},
               {"sms", device_.sms},
               {"cublaslt_version", device_.cublaslt_version},
               {"entries", std::move(entries)}};
  return root.dump(1) + "\n";
}

bool GemmTuningTable::Applies(const GemmTuningDevice& device) const {
  return device.name == device_.name && device.compute_capability == device_.compute_capability &&
         device.sms == device_.sms;
}

bool GemmTuningTable::CublasLtApplies(const GemmTuningDevice& device) const {
  return Applies(device) && device.cublaslt_version == device_.cublaslt_version;
}

const GemmTuningChoice* GemmTuningTable::Find(const GemmTuningKey& key, int search_mask) const {
  auto it = entries_.find(key);
  if (it == entries_.end()) return nullptr;
  if ((it->second.search_mask & search_mask) != search_mask) return nullptr;
  return &it->second;
}

void GemmTuningTable::Insert(const GemmTuningKey& key, GemmTuningChoice choice) {
  entries_[key] = std::move(choice);
}

}  // namespace sluice::kernels
