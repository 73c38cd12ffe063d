// Speculative decoding set-up for `sluice serve`, `generate`, `prefill` and `decode`:
// --speculative-model / --speculative-method / --num-speculative-tokens / --speculative-verify
// become EngineOptions::speculative (engine/spec/).
#ifndef SLUICE_SERVICES_SERVE_SPECULATIVE_SETUP_H_
#define SLUICE_SERVICES_SERVE_SPECULATIVE_SETUP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "engine/sched/llm_engine.h"
#include "engine/tokenizer/tokenizer.h"

namespace sluice {

struct SpeculativeFlags {
  std::string model;   // --speculative-model DIR: a draft model of the target's vocabulary
  std::string method;  // --speculative-method: "" (draft_model with a model, else none),
                       // "draft_model", "ngram" or "mtp" (the target's own MTP module)
  int32_t num_speculative_tokens = 5;  // --num-speculative-tokens: k, or the maximum for auto
  std::string verify = "auto";         // --speculative-verify: auto | a fixed k
  int32_t draft_vocab = 0;             // --speculative-draft-vocab: FR-Spec subset (0: all)
  int32_t prompt_lookup_min = 2;       // --prompt-lookup-min/max: n-gram lengths matched
  int32_t prompt_lookup_max = 4;
};

// Which speculative flags the command line gave (CLI11's count), for CheckSpeculativeFlags.
struct SpeculativeFlagsGiven {
  bool model = false;
  bool num_speculative_tokens = false;
  bool verify = false;
  bool draft_vocab = false;
  bool prompt_lookup = false;  // --prompt-lookup-min or --prompt-lookup-max
};

// CheckSpeculativeFlags: the flag combination means one thing, before any model loads (a usage
// error, exit 2, in main.cc). Errors (InvalidArgument, naming the flags): an empty
// --speculative-model; a drafter flag without a drafter (--num-speculative-tokens,
// --speculative-verify); --speculative-method draft_model without --speculative-model;
// --speculative-model with another method than draft_model;
// --speculative-draft-vocab without a draft model; --prompt-lookup-min/max without ngram or
// with min > max; a fixed --speculative-verify k that contradicts --num-speculative-tokens.
// (Ranges of single values are CLI11 checks on the flags themselves.)
absl::Status CheckSpeculativeFlags(const SpeculativeFlags& flags,
                                   const SpeculativeFlagsGiven& given);

// CheckDraftMatchesTarget: the draft folder's vocabulary size (config.json) and tokenizer
// (tokenizer.json, every id's token string and the special tokens) equal the target's.
// Errors: InvalidArgument naming both folders and the first difference; those of
// ModelConfig::Load / Tokenizer::FromFile for the draft folder.
absl::Status CheckDraftMatchesTarget(const std::string& draft_dir, const std::string& target_dir,
                                     int64_t target_vocab_size, const Tokenizer& target_tokenizer);

// SpeculativeVerifyRows: the most draft tokens one decode sequence may verify in a step with
// `flags` (MaxVerifiedDrafts), 0 when speculation is off: a device target sizes its logits
// rows for max_num_seqs · (1 + this).
int32_t SpeculativeVerifyRows(const SpeculativeFlags& flags);

// DraftModelOnDevice: how a draft model is loaded beside a target on a GPU (model_runtime.cc):
// `load` makes the device model of a draft folder; its forwards hold at most
// max_tokens_per_forward tokens (DraftModelOptions), and its KV cache, kept on the device, at
// most kv_bytes of bf16 blocks (and no more blocks than the target's).
struct DraftModelOnDevice {
  std::function<absl::StatusOr<std::unique_ptr<Model>>(const std::string& dir)> load;
  int64_t max_tokens_per_forward = 0;
  int64_t kv_bytes = 0;
};

// ConfigureSpeculative fills engine->speculative from `flags` (nothing when speculation is off).
// `target_dir` / `target_vocab_size` / `target_tokenizer` describe the target; `target` is the
// target model itself (MTP drafts with its module; not owned, must outlive the engine's drafter).
// The draft model's or MTP module's KV cache gets as many blocks as the target's
// (engine->num_kv_blocks, or what engine->kv_cache_bytes holds of `target_block_bytes` blocks);
// beside a target whose KV lives on the GPU (!engine->allocate_host_kv_cache) the draft model's
// host KV gets at most what engine->kv_cache_bytes holds of its own blocks (DraftKvBlocks).
// The draft model runs on the CPU engine, or through `on_device` (not null) on the target's
// GPU; a CUDA target cannot draft with MTP (its MtpStatus says so), nor restrict a device draft
// model's LM head (--speculative-draft-vocab: InvalidArgument).
// Errors: InvalidArgument for an unknown method, --speculative-method draft_model without
// --speculative-model, --speculative-method mtp on a target without MTP weights (the message
// names them), --num-speculative-tokens or --speculative-verify out of range, a
// mismatching draft (CheckDraftMatchesTarget); those of loading the draft model.
absl::Status ConfigureSpeculative(const SpeculativeFlags& flags, const std::string& target_dir,
                                  int64_t target_vocab_size, const Tokenizer& target_tokenizer,
                                  int64_t target_block_bytes, Model* target,
                                  EngineOptions* engine,
                                  const DraftModelOnDevice* on_device = nullptr);

}  // namespace sluice

#endif  // SLUICE_SERVICES_SERVE_SPECULATIVE_SETUP_H_
