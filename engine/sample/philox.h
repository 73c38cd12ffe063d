// Counter-based random numbers for sampling: Philox4x32-10 and the draw key of one sampled
// token, so a draw is a pure function of (seed, choice, position, draw) and never of how many
// draws came before (batching, async steps, disaggregation and migration cannot shift it).
#ifndef SLUICE_ENGINE_SAMPLE_PHILOX_H_
#define SLUICE_ENGINE_SAMPLE_PHILOX_H_

#include <array>
#include <cstdint>

namespace sluice {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

// Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel Random Numbers: As Easy as 1, 2, 3",
// SC 2011): a bijection of the 128-bit counter under a 64-bit key, ten rounds. Matches the
// Random123 reference's known-answer vectors.
PhiloxCounter Philox4x32_10(PhiloxCounter counter, PhiloxKey key);

// SampleDrawKey names one sampled token's randomness:
//  - seed: the request's seed (given, or generated and reported in the response);
//  - choice: the choice index within its API request (n > 1 choices share the seed);
//  - position: index of the token being sampled in prompt + output (the first output token is
//    at prompt length), so a request resumed elsewhere at position p draws the same.
// Philox key = seed (low word, high word); counter = (position low, position high, choice,
// draw index).
struct SampleDrawKey {
  uint64_t seed = 0;
  uint32_t choice = 0;
  int64_t position = 0;
};

// Draw indices within one key, so no two uses share a uniform:
//  - kTokenDraw: the categorical choice of SampleToken (and the device SamplingRow::uniform);
//    speculative decoding's recovered/bonus token at a position uses it too, so a sequence's
//    tokens keep the same keys with and without a draft;
//  - kAcceptDraw: speculative decoding's acceptance test of the draft token at a position
//    (Leviathan et al. 2023 / Chen et al. 2023: accept when u < min(1, p/q)).
inline constexpr uint32_t kTokenDraw = 0;
inline constexpr uint32_t kAcceptDraw = 1;
//  - kDraftDraw: a draft model's sampled proposal at a position (its own stream, independent of
//    the target's draws at that position).
inline constexpr uint32_t kDraftDraw = 2;

// DrawUniform returns a uniform double in [0, 1): the top 53 bits of (word1 · 2^32 + word0) of
// Philox4x32_10(counter, key) for `key` and `draw`, times 2^-53. Exact and platform-independent.
double DrawUniform(const SampleDrawKey& key, uint32_t draw = kTokenDraw);

// NewRandomSeed returns a fresh nondeterministic seed in [0, 2^53): exactly representable as a
// JSON number in every client (I-JSON, RFC 7493), so a reported seed can be sent back as is.
uint64_t NewRandomSeed();

}  // namespace sluice

#endif  // SLUICE_ENGINE_SAMPLE_PHILOX_H_
