// Tokenizer encode/decode on arbitrary bytes and arbitrary ids, for each fixture tokenizer
// (byte-level: Llama 3, Qwen 2; SentencePiece-style: Llama 2).
//
// Input: byte 0 picks the tokenizer, byte 1 the flags, the rest is the text; the same bytes
// read as int32 ids (any value, negative and past the vocabulary included) are decoded too.
// Checks beyond "no crash": Encode never returns an id outside [0, vocab_size), and the
// incremental detokenizer's output equals DecodeBytes' where no UTF-8 repair is involved.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/tokenizer/incremental_detokenizer.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

std::vector<std::unique_ptr<sluice::Tokenizer>>* g_tokenizers = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_tokenizers = new std::vector<std::unique_ptr<sluice::Tokenizer>>();
  for (const std::string path :
       {sluice::fuzz::SharedPath("tokenizers/llama3/tokenizer.json"),
        sluice::fuzz::SharedPath("tokenizers/qwen2/tokenizer.json"),
        sluice::fuzz::SourcePath("tests/fixtures/llama-spm/tokenizer.json"),
        sluice::fuzz::SharedPath("fixtures/tokenizer/tokenizer.json")}) {
    auto tok = sluice::Tokenizer::FromFile(path);
    if (!tok.ok()) {
      std::fprintf(stderr, "fuzz: %s: %s\n", path.c_str(), tok.status().ToString().c_str());
      std::abort();
    }
    g_tokenizers->push_back(*std::move(tok));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sluice::fuzz::Input in(data, size);
  const sluice::Tokenizer& tok = *(*g_tokenizers)[in.Byte() % g_tokenizers->size()];
  const uint8_t flags = in.Byte();
  const bool add_special = flags & 1, parse_special = flags & 2, skip_special = flags & 4;
  const std::string_view text = in.Rest();

  std::vector<int32_t> ids = tok.Encode(text, add_special, parse_special);
  for (int32_t id : ids) {
    if (id < 0 || id >= tok.vocab_size()) __builtin_trap();
  }
  (void)tok.Decode(ids, skip_special);
  (void)tok.DecodeBytes(ids, skip_special);

  // The same bytes as raw ids: whatever a client sends as `prompt: [ids]` or a peer as tokens.
  std::vector<int32_t> raw(text.size() / 4);
  if (!raw.empty()) std::memcpy(raw.data(), text.data(), raw.size() * 4);
  // Half of them folded into the vocabulary, so decoding also sees valid ids.
  for (size_t i = 0; i < raw.size(); i += 2) {
    raw[i] = static_cast<int32_t>(static_cast<uint32_t>(raw[i]) % tok.vocab_size());
  }
  (void)tok.Decode(raw, skip_special);
  (void)tok.DecodeBytes(raw, skip_special);
  sluice::IncrementalDetokenizer detok(tok, skip_special);
  for (int32_t id : raw) {
    (void)tok.IdToToken(id);
    (void)tok.IsSpecial(id);
    (void)detok.Push(id);
  }
  (void)detok.Flush();
  (void)tok.TokenToId(text);
  return 0;
}
