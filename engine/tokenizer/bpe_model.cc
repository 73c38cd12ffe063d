#include "engine/tokenizer/bpe_model.h"

#include <algorithm>
#include <climits>
#include <queue>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/tokenizer/byte_level.h"

namespace sluice {
namespace {

constexpr uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// Words with more initial symbols than this use the heap-based merge loop.
constexpr size_t kSmallWordSymbols = 96;

}  // namespace

BpeModel::BpeModel(BpeModelOptions options)
    : options_(std::move(options)), cache_(options_.cache_capacity) {
  byte_to_id_.fill(-1);
  fallback_byte_id_.fill(-1);
}

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(
    const std::vector<std::pair<std::string, int32_t>>& vocab,
    const std::vector<std::pair<std::string, std::string>>& merges, BpeModelOptions options) {
  std::unique_ptr<BpeModel> model(new BpeModel(std::move(options)));
  int32_t max_id = -1;
  for (const auto& [token, id] : vocab) {
    if (id < 0) return absl::InvalidArgumentError(absl::StrCat("negative id for token ", token));
    max_id = std::max(max_id, id);
  }
  model->id_to_token_.resize(static_cast<size_t>(max_id + 1));
  model->token_to_id_.reserve(vocab.size());
  model->key_to_id_.reserve(vocab.size());
  for (const auto& [token, id] : vocab) {
    model->id_to_token_[id] = token;
    model->token_to_id_[token] = id;
    if (model->options_.byte_level) {
      std::optional<std::string> bytes = byte_level::DecodeToken(token);
      // Tokens outside the byte alphabet can never be produced from bytes; keep their text.
      std::string key = bytes.has_value() ? *std::move(bytes) : token;
      if (key.size() == 1) model->byte_to_id_[static_cast<uint8_t>(key[0])] = id;
      model->key_to_id_.try_emplace(std::move(key), id);
    } else {
      model->key_to_id_.try_emplace(token, id);
    }
  }
  if (model->options_.byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      const auto it = model->token_to_id_.find(absl::StrFormat("<0x%02X>", b));
      if (it != model->token_to_id_.end()) model->fallback_byte_id_[b] = it->second;
    }
  }
  if (model->options_.unk_token.has_value()) {
    const auto it = model->token_to_id_.find(*model->options_.unk_token);
    if (it == model->token_to_id_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("BPE unk_token '", *model->options_.unk_token, "' is not in the vocab"));
    }
    model->unk_id_ = it->second;
  }
  model->merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const auto l = model->token_to_id_.find(left);
    const auto r = model->token_to_id_.find(right);
    const auto n = model->token_to_id_.find(absl::StrCat(left, right));
    if (l == model->token_to_id_.end() || r == model->token_to_id_.end() ||
        n == model->token_to_id_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("BPE merge ", rank, " ('", left, "', '", right,
                                                     "') uses a token not in the vocab"));
    }
    model->merges_.try_emplace(PairKey(l->second, r->second),
                               Merge{static_cast<int32_t>(rank), n->second});
  }
  return model;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  const auto it = token_to_id_.find(absl::string_view(token.data(), token.size()));
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return nullptr;
  const std::string& token = id_to_token_[id];
  if (token.empty()) return nullptr;
  return &token;
}

const BpeModel::Merge* BpeModel::FindMerge(int32_t left, int32_t right) const {
  const auto it = merges_.find(PairKey(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeModel::InitialSymbols(std::string_view word, std::vector<int32_t>* symbols) const {
  // Pending unknown run (HF `merge_word`): with fuse_unk, consecutive unknowns become one unk.
  bool pending_unk = false;
  const auto flush_unk = [&] {
    if (pending_unk) symbols->push_back(*unk_id_);
    pending_unk = false;
  };
  size_t pos = 0;
  while (pos < word.size()) {
    size_t len = 1;
    int32_t id = -1;
    if (options_.byte_level) {
      id = byte_to_id_[static_cast<uint8_t>(word[pos])];
    } else {
      const byte_level::Utf8Sequence seq = byte_level::ScanUtf8(word, pos);
      len = seq.length;
      const auto it = key_to_id_.find(absl::string_view(word.data() + pos, len));
      if (it != key_to_id_.end()) id = it->second;
    }
    const std::string_view unit = word.substr(pos, len);
    pos += len;
    if (id >= 0) {
      flush_unk();
      symbols->push_back(id);
      continue;
    }
    if (options_.byte_fallback && std::all_of(unit.begin(), unit.end(), [&](char c) {
          return fallback_byte_id_[static_cast<uint8_t>(c)] >= 0;
        })) {
      flush_unk();
      for (char c : unit) symbols->push_back(fallback_byte_id_[static_cast<uint8_t>(c)]);
      continue;
    }
    if (!unk_id_.has_value()) continue;  // no unk token: the unit is dropped, as in HF
    if (!options_.fuse_unk) flush_unk();
    pending_unk = true;
  }
  flush_unk();
}

void BpeModel::MergeSmall(std::vector<int32_t>* symbols) const {
  std::vector<int32_t>& sym = *symbols;
  if (sym.size() < 2) return;
  // ranks[i] / new_ids[i]: the merge of pair (sym[i], sym[i+1]); INT_MAX when none.
  thread_local std::vector<int32_t> ranks;
  thread_local std::vector<int32_t> new_ids;
  ranks.resize(sym.size() - 1);
  new_ids.resize(sym.size() - 1);
  const auto rank_pair = [&](size_t i) {
    const Merge* m = FindMerge(sym[i], sym[i + 1]);
    ranks[i] = m != nullptr ? m->rank : INT_MAX;
    new_ids[i] = m != nullptr ? m->new_id : -1;
  };
  for (size_t i = 0; i + 1 < sym.size(); ++i) rank_pair(i);
  while (!ranks.empty()) {
    // Lowest rank, leftmost on ties (std::min_element returns the first minimum).
    const size_t best = std::min_element(ranks.begin(), ranks.end()) - ranks.begin();
    if (ranks[best] == INT_MAX) break;
    sym[best] = new_ids[best];
    sym.erase(sym.begin() + best + 1);
    ranks.erase(ranks.begin() + best);
    new_ids.erase(new_ids.begin() + best);
    if (best < ranks.size()) rank_pair(best);
    if (best > 0) rank_pair(best - 1);
  }
}

void BpeModel::MergeLarge(std::vector<int32_t>* symbols) const {
  std::vector<int32_t>& sym = *symbols;
  const int32_t n = static_cast<int32_t>(sym.size());
  if (n < 2) return;
  std::vector<int32_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  const auto push = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    const Merge* m = FindMerge(sym[pos], sym[next[pos]]);
    if (m != nullptr) queue.push({m->rank, pos, m->new_id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    if (!alive[top.pos] || next[top.pos] < 0) continue;
    const Merge* m = FindMerge(sym[top.pos], sym[next[top.pos]]);
    if (m == nullptr || m->new_id != top.new_id) continue;  // stale entry
    const int32_t right = next[top.pos];
    sym[top.pos] = top.new_id;
    alive[right] = false;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = top.pos;
    push(prev[top.pos]);
    push(top.pos);
  }
  int32_t out = 0;
  for (int32_t i = 0; i >= 0; i = next[i]) sym[out++] = sym[i];
  sym.resize(out);
}

void BpeModel::Tokenize(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (options_.byte_level && word.size() == 1) {
    const int32_t id = byte_to_id_[static_cast<uint8_t>(word[0])];
    if (id >= 0) {
      out->push_back(id);
      return;
    }
  }
  if (options_.ignore_merges) {
    const auto it = key_to_id_.find(absl::string_view(word.data(), word.size()));
    if (it != key_to_id_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  if (cache_.Lookup(word, out)) return;
  thread_local std::vector<int32_t> symbols;
  symbols.clear();
  InitialSymbols(word, &symbols);
  if (symbols.size() <= kSmallWordSymbols) {
    MergeSmall(&symbols);
  } else {
    MergeLarge(&symbols);
  }
  out->insert(out->end(), symbols.begin(), symbols.end());
  cache_.Insert(word, symbols);
}

}  // namespace sluice
