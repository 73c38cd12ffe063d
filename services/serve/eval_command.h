// `sluice eval ppl FILE --url URL`: perplexity of a text set through the OpenAI API of a
// running server (`sluice serve` or the router), the way evaluation harnesses score text:
// each text is sent to /v1/completions with echo=true, logprobs=0, max_tokens=1, and the
// prompt tokens' logprobs (all but the first, which nothing predicts) are summed.
//
// With --tokenizer MODEL_DIR the texts are tokenized here (with the server's tokenizer.json)
// and sent as token ids, in strided windows of at most --max-length tokens (default: the
// server's max_model_len - 1) when longer (ppl_windows.h): texts longer than the context are
// scored too. A text that fits one window gives the same numbers as without --tokenizer.
//
// FILE holds one text per line (blank lines skipped), or JSON lines with a "text" field.
// Prints one JSON object on stdout: {"model", "num_texts", "num_tokens" (scored tokens),
// "nll" (their summed negative log-likelihood, nats), "ppl" = exp(nll / num_tokens),
// "num_windows", "texts": [{"num_tokens", "nll", "ppl", "num_windows"}, ...]}, plus
// "max_length" and "stride" with --tokenizer.
#ifndef SLUICE_SERVICES_SERVE_EVAL_COMMAND_H_
#define SLUICE_SERVICES_SERVE_EVAL_COMMAND_H_

#include <string>

#include <CLI/CLI.hpp>

namespace sluice {

struct EvalOptions {
  std::string file;
  std::string url = "http://127.0.0.1:8000";  // the server's base URL
  std::string model;                          // empty: the server's only model
  bool add_special_tokens = true;             // BOS first, as the server's default
  std::string tokenizer_dir;  // tokenize here and score in windows (empty: send the texts)
  int64_t max_length = 0;     // tokens per window; 0: the server's max_model_len - 1
  int64_t stride = 0;         // tokens newly scored by each later window; 0: max_length / 2
  int32_t concurrency = 4;    // requests in flight
};

// AddEvalCommand registers `eval ppl` on `app`; returns the `ppl` subcommand.
CLI::App* AddEvalCommand(CLI::App& app, EvalOptions& options);

// RunEvalPerplexity returns the process exit code (0 ok, 1 on an error, printed on stderr).
int RunEvalPerplexity(const EvalOptions& options);

}  // namespace sluice

#endif  // SLUICE_SERVICES_SERVE_EVAL_COMMAND_H_
