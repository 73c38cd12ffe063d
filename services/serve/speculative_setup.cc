#include "services/serve/speculative_setup.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/model/model.h"
#include "engine/model/model_config.h"
#include "engine/spec/draft_model_drafter.h"
#include "engine/spec/mtp_drafter.h"
#include "engine/spec/ngram_drafter.h"
#include "engine/spec/spec_sizing.h"
#include "engine/spec/speculative.h"
#include "services/serve/log.h"

namespace sluice {
namespace {

// A draft folder that does not load: the error names the flag, not only the file.
absl::Status DraftLoadError(const std::string& draft_dir, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("--speculative-model ", draft_dir,
                                             ": cannot load the draft model: ", s.message()));
}

}  // namespace

absl::Status CheckDraftMatchesTarget(const std::string& draft_dir, const std::string& target_dir,
                                     int64_t target_vocab_size,
                                     const Tokenizer& target_tokenizer) {
  absl::StatusOr<ModelConfig> config = ModelConfig::Load(draft_dir);
  if (!config.ok()) return DraftLoadError(draft_dir, config.status());
  auto mismatch = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat("--speculative-model: the draft model ", draft_dir,
                     " does not match the target model ", target_dir, ": ", what));
  };
  if (config->vocab_size != target_vocab_size) {
    return mismatch(absl::StrCat("vocab_size ", config->vocab_size, " vs ", target_vocab_size));
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> draft_tokenizer =
      Tokenizer::FromFile(draft_dir + "/tokenizer.json");
  if (!draft_tokenizer.ok()) return DraftLoadError(draft_dir, draft_tokenizer.status());
  const Tokenizer& draft = **draft_tokenizer;
  if (draft.vocab_size() != target_tokenizer.vocab_size()) {
    return mismatch(absl::StrCat("tokenizer vocabulary of ", draft.vocab_size(), " vs ",
                                 target_tokenizer.vocab_size(), " tokens"));
  }
  for (int32_t id = 0; id < draft.vocab_size(); ++id) {
    if (draft.IdToToken(id) != target_tokenizer.IdToToken(id) ||
        draft.IsSpecial(id) != target_tokenizer.IsSpecial(id)) {
      return mismatch(absl::StrCat("tokenizers differ at id ", id, " ('", draft.IdToToken(id),
                                   "' vs '", target_tokenizer.IdToToken(id), "')"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSpeculativeFlags(const SpeculativeFlags& flags,
                                   const SpeculativeFlagsGiven& given) {
  if (given.model && flags.model.empty()) {
    return absl::InvalidArgumentError("--speculative-model: empty path");
  }
  const std::string method =
      !flags.method.empty() ? flags.method : (flags.model.empty() ? "" : "draft_model");
  if (method.empty()) {
    for (const auto& [set, name] : {std::pair{given.num_speculative_tokens,
                                              "--num-speculative-tokens"},
                                    std::pair{given.verify, "--speculative-verify"},
                                    std::pair{given.draft_vocab, "--speculative-draft-vocab"},
                                    std::pair{given.prompt_lookup, "--prompt-lookup-min/max"}}) {
      if (set) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, " needs a drafter: --speculative-model DIR or --speculative-method"));
      }
    }
    return absl::OkStatus();
  }
  if (method == "draft_model" && flags.model.empty()) {
    return absl::InvalidArgumentError(
        "--speculative-method draft_model needs --speculative-model DIR");
  }
  if (!flags.model.empty() && method != "draft_model") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--speculative-method ", method,
        method == "mtp" ? " drafts with the target's own MTP module"
                        : " does not use a draft model",
        ": drop --speculative-model"));
  }
  if (given.draft_vocab && method != "draft_model") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--speculative-draft-vocab restricts a draft model's LM head; --speculative-method ",
        method, " has none"));
  }
  if (given.prompt_lookup && method != "ngram") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--prompt-lookup-min/max set n-gram lookup; --speculative-method is ", method));
  }
  if (method == "ngram" && flags.prompt_lookup_min > flags.prompt_lookup_max) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--prompt-lookup-min ", flags.prompt_lookup_min, " is above --prompt-lookup-max ",
        flags.prompt_lookup_max));
  }
  VerifyMode mode = VerifyMode::kAuto;
  int32_t fixed_k = flags.num_speculative_tokens;
  if (absl::Status s = ParseVerifyMode(flags.verify, &mode, &fixed_k); !s.ok()) return s;
  if (given.verify && given.num_speculative_tokens && mode == VerifyMode::kFixed &&
      fixed_k != flags.num_speculative_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--speculative-verify ", flags.verify, " fixes k = ", fixed_k,
        " but --num-speculative-tokens is ", flags.num_speculative_tokens, ": give one"));
  }
  return absl::OkStatus();
}

int32_t SpeculativeVerifyRows(const SpeculativeFlags& flags) {
  if (flags.method.empty() && flags.model.empty()) return 0;
  return MaxVerifiedDrafts(flags.num_speculative_tokens, flags.verify);
}

absl::Status ConfigureSpeculative(const SpeculativeFlags& flags, const std::string& target_dir,
                                  int64_t target_vocab_size, const Tokenizer& target_tokenizer,
                                  int64_t target_block_bytes, Model* target,
                                  EngineOptions* engine, const DraftModelOnDevice* on_device) {
  SpeculativeOptions& spec = engine->speculative;
  spec.num_speculative_tokens = flags.num_speculative_tokens;
  if (absl::Status s = spec.Validate(); !s.ok()) return s;
  if (absl::Status s = ParseVerifyMode(flags.verify, &spec.verify, &spec.num_speculative_tokens);
      !s.ok()) {
    return s;
  }
  std::string method = flags.method;
  if (method.empty() && !flags.model.empty()) method = "draft_model";
  if (method.empty()) return absl::OkStatus();
  if (method == "ngram") {
    if (flags.prompt_lookup_min < 1 || flags.prompt_lookup_max < flags.prompt_lookup_min) {
      return absl::InvalidArgumentError(
          absl::StrCat("--prompt-lookup-min/max must satisfy 1 <= min <= max, got ",
                       flags.prompt_lookup_min, " and ", flags.prompt_lookup_max));
    }
    spec.drafter = std::make_shared<NgramDrafter>(
        NgramOptions{flags.prompt_lookup_min, flags.prompt_lookup_max});
  } else if (method == "mtp") {
    if (!flags.model.empty()) {
      return absl::InvalidArgumentError(
          "--speculative-method mtp drafts with the target's own MTP module: drop "
          "--speculative-model");
    }
    MtpOptions options;
    options.block_size = engine->block_size;
    options.num_kv_blocks = engine->num_kv_blocks > 0
                                ? engine->num_kv_blocks
                                : engine->kv_cache_bytes / std::max<int64_t>(1, target_block_bytes);
    options.enable_prefix_caching = engine->enable_prefix_caching;
    options.model_id = target_dir;
    absl::StatusOr<std::unique_ptr<MtpDrafter>> drafter = MtpDrafter::Create(target, options);
    if (!drafter.ok()) {
      return absl::Status(drafter.status().code(),
                          absl::StrCat("--speculative-method mtp: the target model ", target_dir,
                                       " cannot draft: ", drafter.status().message()));
    }
    spec.drafter = std::shared_ptr<MtpDrafter>(*std::move(drafter));
  } else if (method == "draft_model") {
    if (flags.model.empty()) {
      return absl::InvalidArgumentError(
          "--speculative-method draft_model needs --speculative-model DIR");
    }
    if (absl::Status s =
            CheckDraftMatchesTarget(flags.model, target_dir, target_vocab_size, target_tokenizer);
        !s.ok()) {
      return s;
    }
    // Beside a GPU target the draft model runs on the same GPU (a draft round there is a decode
    // graph replay; on the host's cores it took longer than the target's step), else on the CPU
    // engine's kernels.
    absl::StatusOr<std::unique_ptr<Model>> draft =
        on_device != nullptr ? on_device->load(flags.model) : LoadModel(flags.model);
    if (!draft.ok()) return DraftLoadError(flags.model, draft.status());
    const int64_t target_blocks =
        engine->num_kv_blocks > 0
            ? engine->num_kv_blocks
            : engine->kv_cache_bytes / std::max<int64_t>(1, target_block_bytes);
    const int64_t draft_block_floats = (*draft)->kv_cache_spec().BytesPerToken() * engine->block_size;
    DraftModelOptions options;
    options.block_size = engine->block_size;
    if (on_device != nullptr) {
      if (flags.draft_vocab > 0) {
        return absl::InvalidArgumentError(
            "--speculative-draft-vocab: a draft model on the GPU keeps its full LM head (the "
            "restricted head is a CPU-engine option); drop the flag");
      }
      // bf16 on the device: half the float32 bytes BytesPerToken counts.
      options.num_kv_blocks =
          DraftKvBlocks(target_blocks, true, on_device->kv_bytes, draft_block_floats / 2);
      options.max_tokens_per_forward = on_device->max_tokens_per_forward;
      options.host_kv_storage = false;
    } else {
      options.num_kv_blocks = DraftKvBlocks(target_blocks, !engine->allocate_host_kv_cache,
                                            engine->kv_cache_bytes, draft_block_floats);
    }
    options.enable_prefix_caching = engine->enable_prefix_caching;
    options.model_id = flags.model;
    if (flags.draft_vocab < 0 || flags.draft_vocab > target_vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("--speculative-draft-vocab must be in [0, ", target_vocab_size,
                       "] (the vocabulary), got ", flags.draft_vocab));
    }
    options.draft_vocab = flags.draft_vocab;
    absl::StatusOr<std::unique_ptr<DraftModelDrafter>> drafter =
        DraftModelDrafter::Create(*std::move(draft), options);
    if (!drafter.ok()) return DraftLoadError(flags.model, drafter.status());
    spec.drafter = std::shared_ptr<DraftModelDrafter>(*std::move(drafter));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--speculative-method must be draft_model, ngram or mtp, got '", method, "'"));
  }
  spdlog::info("speculative decoding: {} drafts, verify {} (up to {} tokens)", method,
               spec.verify == VerifyMode::kAuto ? "auto" : "fixed", spec.num_speculative_tokens);
  return absl::OkStatus();
}

}  // namespace sluice
