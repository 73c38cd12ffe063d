#include "services/serve/model_runtime.h"

#include <filesystem>
#include <utility>

#include "engine/model/model.h"
#include "engine/sched/async_engine.h"
#include "services/kvstore/kvstore_connector.h"
#include "services/serve/log.h"

namespace sluice {

std::string ModelNameFromDir(const std::string& dir) {
  std::filesystem::path path(dir);
  while (!path.empty() && path.filename().empty()) path = path.parent_path();
  std::string name = path.filename().string();
  return name.empty() ? dir : name;
}

absl::StatusOr<ModelRuntime> LoadModelRuntime(const RuntimeOptions& options) {
  ModelRuntime runtime;
  runtime.served_model_name = options.served_model_name.empty()
                                  ? ModelNameFromDir(options.model_dir)
                                  : options.served_model_name;
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::FromFile(options.model_dir + "/tokenizer.json");
  if (!tokenizer.ok()) return tokenizer.status();
  runtime.tokenizer = *std::move(tokenizer);

  absl::StatusOr<std::unique_ptr<ChatTemplate>> chat_template =
      ChatTemplate::FromModelDir(options.model_dir);
  if (chat_template.ok()) {
    runtime.chat_template = *std::move(chat_template);
  } else if (absl::IsNotFound(chat_template.status())) {
    spdlog::warn("model has no chat template; /v1/chat/completions will answer 400");
  } else {
    return chat_template.status();
  }

  spdlog::info("loading model from {}", options.model_dir);
  absl::StatusOr<std::unique_ptr<Model>> model = LoadModel(options.model_dir);
  if (!model.ok()) return model.status();
  EngineOptions engine_options = options.engine;
  // The served name seeds the block hashes, so every worker of a deployment (and the kvstore)
  // agrees on them while another model never shares an address.
  if (engine_options.model_id.empty()) engine_options.model_id = runtime.served_model_name;
  if (!options.kvstore.empty()) {
    absl::StatusOr<std::vector<std::string>> shards = kvstore::ParseKvStoreShards(options.kvstore);
    if (!shards.ok()) return shards.status();
    absl::StatusOr<std::shared_ptr<KvConnector>> connector =
        kvstore::CreateKvStoreConnector(*shards);
    if (!connector.ok()) return connector.status();
    engine_options.kv_connector = *std::move(connector);
    runtime.kv_connector = engine_options.kv_connector;
    spdlog::info("kvstore connector: {} shard(s) {}", shards->size(), options.kvstore);
  }
  absl::StatusOr<std::unique_ptr<LLMEngine>> engine =
      LLMEngine::Create(*std::move(model), engine_options);
  if (!engine.ok()) return engine.status();
  spdlog::info("engine ready: {} KV blocks of {} tokens, max_model_len {}, prefix caching {}",
               (*engine)->num_total_blocks(), (*engine)->block_size(), (*engine)->max_model_len(),
               engine_options.enable_prefix_caching ? "on" : "off");
  runtime.backend =
      std::make_unique<LocalBackend>(std::make_unique<AsyncEngine>(*std::move(engine)));
  return runtime;
}

}  // namespace sluice
