// ModelRuntime: everything `sluice serve` and `sluice generate` load from a model folder —
// the model and its engine (as an InferenceBackend), the tokenizer, and the chat template.
#ifndef SLUICE_SERVICES_SERVE_MODEL_RUNTIME_H_
#define SLUICE_SERVICES_SERVE_MODEL_RUNTIME_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/sched/llm_engine.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "services/api/local_backend.h"

namespace sluice {

// RuntimeOptions are the engine-facing command-line flags.
struct RuntimeOptions {
  std::string model_dir;
  std::string served_model_name;  // empty: the model folder's name
  EngineOptions engine;
  // "host:port[,host:port...]": kvstore shards to load prompt KV from and write it through to
  // (services/kvstore/kvstore_connector.h); empty: none.
  std::string kvstore;
};

struct ModelRuntime {
  std::string served_model_name;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatTemplate> chat_template;  // null when the model has none
  std::unique_ptr<LocalBackend> backend;        // owns the AsyncEngine (and the model)
  std::shared_ptr<KvConnector> kv_connector;    // --kvstore (also held by the engine), or null
};

// LoadModelRuntime loads `<model_dir>`: config + weights (LoadModel), tokenizer.json, the chat
// template (optional), and starts the engine thread. Errors: those of LoadModel,
// Tokenizer::FromFile, ChatTemplate (other than NotFound) and LLMEngine::Create.
absl::StatusOr<ModelRuntime> LoadModelRuntime(const RuntimeOptions& options);

// ModelNameFromDir returns the last path component of `dir` ("a/b/model/" → "model").
std::string ModelNameFromDir(const std::string& dir);

}  // namespace sluice

#endif  // SLUICE_SERVICES_SERVE_MODEL_RUNTIME_H_
