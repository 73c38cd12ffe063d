// Sha256Hex: the SHA-256 digest (FIPS 180-4) of bytes as 64 lowercase hex digits, computed with
// OpenSSL's EVP interface. API keys are stored and compared only in this form.
#ifndef SLUICE_SERVICES_API_AUTH_SHA256_H_
#define SLUICE_SERVICES_API_AUTH_SHA256_H_

#include <string>
#include <string_view>

namespace sluice {

// Sha256Hex returns the digest of `bytes`. Thread-safe.
std::string Sha256Hex(std::string_view bytes);

// ConstantTimeEquals compares two strings in time that depends only on their lengths.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

}  // namespace sluice

#endif  // SLUICE_SERVICES_API_AUTH_SHA256_H_
