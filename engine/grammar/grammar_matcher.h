// GrammarMatcher: the decoding state of one sequence under a CompiledGrammar — which tokens
// may come next (a bitmask over the vocabulary) and the advance by each sampled token.
//
// Mask per step: for every stack top, the top's state's precomputed accepted tokens are OR-ed
// in, and only its uncertain tokens are checked against the real stack. EOS ids are allowed
// exactly when the grammar can end here; when it can end and nothing else fits, EOS is the
// only allowed token (the request is forced to stop). Token terminals (special tokens) are
// allowed by id where a top's state has an edge for them; text never spells them.
// Not thread-safe; one per sequence. Keeps the CompiledGrammar alive.
#ifndef SLUICE_ENGINE_GRAMMAR_GRAMMAR_MATCHER_H_
#define SLUICE_ENGINE_GRAMMAR_GRAMMAR_MATCHER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "engine/grammar/compiled_grammar.h"
#include "engine/grammar/stack_walk.h"

namespace sluice::grammar {

class GrammarMatcher {
 public:
  // `eos_token_ids`: the ids that end the output (the model's EOS and the request's stop ids);
  // nullopt: the vocabulary's.
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar,
                          std::optional<std::vector<int32_t>> eos_token_ids = std::nullopt);

  // FillNextTokenBitmask writes the allowed tokens into `bitmask` (num_bitmask_words() words;
  // bit i of word i/32 set = token i allowed). After termination only EOS ids are set.
  void FillNextTokenBitmask(absl::Span<uint32_t> bitmask);
  int32_t num_bitmask_words() const { return grammar_->vocab().num_bitmask_words(); }

  // AcceptToken advances by `token_id`; false (state unchanged) when the grammar does not allow
  // it. An EOS id is accepted where the grammar can end, and terminates the matcher.
  bool AcceptToken(int32_t token_id);
  // AcceptBytes advances by raw bytes (no tokenization); false (state unchanged) if rejected.
  bool AcceptBytes(std::string_view bytes);

  // CanEnd: the text so far is a complete match. IsTerminated: EOS was accepted, or the text is
  // complete and no further byte can follow.
  bool CanEnd() const { return can_end_; }
  bool IsTerminated() const { return terminated_ || (tops_.empty() && can_end_); }

  // ForcedBytes returns the bytes every continuation must start with (jump-forward
  // candidates), stopping where there is a choice or the grammar may end.
  std::string ForcedBytes() const;

  const CompiledGrammar& grammar() const { return *grammar_; }

 private:
  bool Advance(std::string_view bytes);
  // AdvanceByTokenEdge takes a token terminal (grammar.h kToken) of some top for `token_id`;
  // false (state unchanged) when none matches.
  bool AdvanceByTokenEdge(int32_t token_id);
  // CheckUncertain appends to `fits` the uncertain tokens of `top`'s state that the stack
  // under `top` lets through, walking prefixes shared by consecutive tokens once.
  void CheckUncertain(int32_t top, const StateTokens& tokens, std::vector<int32_t>* fits);
  void Compact();

  std::shared_ptr<const CompiledGrammar> grammar_;
  StackWalk walk_;
  std::vector<int32_t> eos_token_ids_;
  std::vector<int32_t> tops_;
  bool can_end_ = false;
  bool terminated_ = false;
  // Uncertain tokens that fit, by the states of the stack from the top down (bounded).
  static constexpr size_t kUncertainCacheEntries = 256;
  absl::flat_hash_map<std::vector<int32_t>, std::vector<int32_t>> uncertain_cache_;
  std::vector<int32_t> stack_key_;
  // Scratch.
  std::vector<int32_t> cur_, next_;
  std::vector<int32_t> seen_states_;
  std::vector<int32_t> level_tops_;
  std::vector<size_t> level_begin_, level_pool_;
};

}  // namespace sluice::grammar

#endif  // SLUICE_ENGINE_GRAMMAR_GRAMMAR_MATCHER_H_
