// Chat template render settings of the API servers (`sluice serve`, `sluice router`; the budget
// also for `sluice generate`): the render pools' sizes and queue bound, the render timeout and
// the work budget of one render (jinja::RenderLimits). Each flag is range-checked by CLI11, so
// a bad value stops the command with a message naming the flag and its range.
#ifndef SLUICE_SERVICES_SERVE_RENDER_FLAGS_H_
#define SLUICE_SERVICES_SERVE_RENDER_FLAGS_H_

#include <CLI/CLI.hpp>

#include "services/api/openai_service.h"

namespace sluice {

struct RenderFlags {
  int threads = 2;
  int custom_template_threads = 1;
  int max_queued = 256;
  double timeout_s = 30;
  jinja::RenderLimits limits;
};

// AddRenderFlags registers --render-max-operations, --render-max-work-bytes,
// --render-max-loop-iterations, --render-max-call-depth and --render-max-output-bytes; with
// `pools` also --render-threads, --custom-template-render-threads, --max-queued-renders and
// --render-timeout-s.
void AddRenderFlags(CLI::App& app, RenderFlags& flags, bool pools);

// ApplyRenderFlags sets the service's render options from the flags (pools included).
void ApplyRenderFlags(const RenderFlags& flags, OpenAiServiceOptions& options);

}  // namespace sluice

#endif  // SLUICE_SERVICES_SERVE_RENDER_FLAGS_H_
