// LocalBackend: InferenceBackend over an in-process AsyncEngine (`sluice serve`, `generate`).
#ifndef SLUICE_SERVICES_API_LOCAL_BACKEND_H_
#define SLUICE_SERVICES_API_LOCAL_BACKEND_H_

#include <memory>
#include <string>

#include "engine/sched/async_engine.h"
#include "services/api/inference_backend.h"

namespace sluice {

// LocalBackend forwards to the AsyncEngine it owns; thread-safe as AsyncEngine is.
// Destroying it aborts everything in flight and joins the engine thread.
class LocalBackend : public InferenceBackend {
 public:
  explicit LocalBackend(std::unique_ptr<AsyncEngine> engine);

  absl::Status Submit(EngineRequest request, OutputCallback on_output) override;
  void Abort(const std::string& request_id) override;
  BackendStats Stats() const override;
  int32_t max_model_len() const override;

  AsyncEngine& engine() { return *engine_; }

 private:
  std::unique_ptr<AsyncEngine> engine_;
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_API_LOCAL_BACKEND_H_
