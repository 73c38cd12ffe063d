// Philox4x32-10 (Salmon et al. 2011, Random123): multipliers and Weyl key increments from the
// paper; round i maps (c0, c1, c2, c3) under key (k0, k1) to
// (hi(M1·c2) ^ c1 ^ k0, lo(M1·c2), hi(M0·c0) ^ c3 ^ k1, lo(M0·c0)), the key bumped between
// rounds.
#include "engine/sample/philox.h"

#include <random>

namespace sluice {
namespace {

constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;  // sqrt(3) - 1
constexpr int kPhiloxRounds = 10;
constexpr uint64_t kSeedLimit = uint64_t{1} << 53;

PhiloxCounter Round(const PhiloxCounter& c, const PhiloxKey& k) {
  const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c[0];
  const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c[2];
  return {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
          static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
}

}  // namespace

PhiloxCounter Philox4x32_10(PhiloxCounter counter, PhiloxKey key) {
  for (int round = 0; round < kPhiloxRounds; ++round) {
    if (round > 0) {
      key[0] += kPhiloxW0;
      key[1] += kPhiloxW1;
    }
    counter = Round(counter, key);
  }
  return counter;
}

double DrawUniform(const SampleDrawKey& key, uint32_t draw) {
  const uint64_t position = static_cast<uint64_t>(key.position);
  const PhiloxCounter out = Philox4x32_10(
      {static_cast<uint32_t>(position), static_cast<uint32_t>(position >> 32), key.choice, draw},
      {static_cast<uint32_t>(key.seed), static_cast<uint32_t>(key.seed >> 32)});
  const uint64_t bits = (static_cast<uint64_t>(out[1]) << 32) | out[0];
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

uint64_t NewRandomSeed() {
  std::random_device device;
  const uint64_t bits = (static_cast<uint64_t>(device()) << 32) | device();
  return bits % kSeedLimit;
}

}  // namespace sluice
