#include "services/serve/render_flags.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/numbers.h"
#include "engine/tokenizer/jinja/value.h"

namespace sluice {

void AddRenderFlags(CLI::App& app, RenderFlags& flags, bool pools) {
  // Limits past 2^50 are "unbounded" in practice and keep the budget's sums far from overflow.
  constexpr int64_t kHuge = int64_t{1} << 50;
  jinja::RenderLimits& l = flags.limits;
  app.add_option("--render-max-operations", l.max_operations,
                 "Chat template render budget: statements, expressions, macro calls and loop "
                 "iterations of one render (10000000)")
      ->check(CLI::Range(int64_t{1}, kHuge));
  app.add_option("--render-max-work-bytes", l.max_work_bytes,
                 "Chat template render budget: bytes of strings and lists built, copied, "
                 "compared or scanned by one render (536870912)")
      ->check(CLI::Range(int64_t{1}, kHuge));
  app.add_option("--render-max-loop-iterations", l.max_loop_iterations,
                 "Chat template render budget: loop iterations of one render (1000000)")
      ->check(CLI::Range(int64_t{1}, kHuge));
  // Each macro call nests the interpreter's recursion: deeper than 256 risks the stack.
  app.add_option("--render-max-call-depth", l.max_call_depth,
                 "Chat template render budget: nested macro calls (64)")
      ->check(CLI::Range(1, 256));
  app.add_option("--render-max-output-bytes", l.max_output_bytes,
                 "Chat template render budget: bytes of the rendered prompt (16777216, the most)")
      ->check(CLI::Range(int64_t{1}, static_cast<int64_t>(jinja::kMaxValueBytes)));
  if (!pools) return;
  app.add_option("--render-threads", flags.threads,
                 "Threads rendering chat templates (and tokenizing) for requests with the "
                 "model's template, off the I/O threads (2)")
      ->check(CLI::Range(1, 256));
  app.add_option("--custom-template-render-threads", flags.custom_template_threads,
                 "Threads rendering requests that bring their own chat_template, so they cannot "
                 "delay the others (1; 0: they share --render-threads)")
      ->check(CLI::Range(0, 256));
  app.add_option("--max-queued-renders", flags.max_queued,
                 "Requests waiting for a render thread, per pool, before 503 (256)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--render-timeout-s", flags.timeout_s,
                 "Longest a request may wait for and spend in its chat template render before "
                 "504 / DEADLINE_EXCEEDED (30)")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            double seconds = 0;
            if (!absl::SimpleAtod(text, &seconds) || !(seconds > 0 && seconds <= 3600)) {
              return "must be seconds in (0, 3600], got " + text;
            }
            return "";
          },
          "SECONDS"));
}

void ApplyRenderFlags(const RenderFlags& flags, OpenAiServiceOptions& options) {
  options.render_limits = flags.limits;
  options.render_threads = flags.threads;
  options.custom_template_render_threads = flags.custom_template_threads;
  options.max_queued_renders = flags.max_queued;
  options.render_timeout = std::chrono::milliseconds(std::llround(flags.timeout_s * 1000));
}

}  // namespace sluice
