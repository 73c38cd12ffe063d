// `sluice generate`: offline batch inference over a JSONL file.
//
// Each input line is one request with the API's fields: a line with `messages` is a chat
// completion, a line with `prompt` a completion (the OpenAI batch format
// {"custom_id", "url", "body": {...}} is accepted too). `model` may be omitted. Every request is
// submitted up front (up to a window) so the engine batches them continuously. Each output line
// is the response JSON the API would return, in input order, plus `custom_id` (the line's
// `custom_id`, else its `id`) when present; a failed line carries {"error": {...}} instead,
// whose message starts with "line N: " (N: the 1-based input line). Blank input lines are
// skipped: they get no output line.
#ifndef SLUICE_SERVICES_SERVE_GENERATE_COMMAND_H_
#define SLUICE_SERVICES_SERVE_GENERATE_COMMAND_H_

#include <cstdint>
#include <string>

#include "services/serve/model_runtime.h"
#include "services/serve/multimodal_setup.h"
#include "services/serve/render_flags.h"

namespace sluice {

struct GenerateOptions {
  RuntimeOptions runtime;
  std::string input_path;
  std::string output_path;
  int64_t max_in_flight = 1024;  // lines being generated at once
  bool progress = true;          // progress bar on stderr
  MultimodalFlags multimodal;    // vision-language models: images in chat lines
  RenderFlags render;            // chat template render budget (lines parse in turn)
};

// RunGenerate returns the process exit code: 0 when every line was answered (errors per line
// included), 1 when the model or the files cannot be opened.
int RunGenerate(const GenerateOptions& options);

}  // namespace sluice

#endif  // SLUICE_SERVICES_SERVE_GENERATE_COMMAND_H_
