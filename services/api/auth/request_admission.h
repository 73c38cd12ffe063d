// AdmitGeneration: what an authenticated generation request goes through before it reaches a
// backend — its key's tenant replaces its cache_salt, and its key's quotas are charged.
#ifndef SLUICE_SERVICES_API_AUTH_REQUEST_ADMISSION_H_
#define SLUICE_SERVICES_API_AUTH_REQUEST_ADMISSION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/api/auth/api_auth.h"
#include "services/api/openai_protocol.h"

namespace sluice {

// TenantCacheSalt returns the prefix-cache namespace of a request made with `key`: the key's
// tenant when it has one (whatever the request asked for), else the request's own salt. The
// two forms carry distinct prefixes, so no request salt can name a tenant's namespace.
std::string TenantCacheSalt(const ApiKey& key, const std::string& request_salt);

// RequestCostTokens is what a request is charged against tokens/min: every prompt's tokens plus
// the most each of its choices may generate (max_tokens, or the context left when unset).
int64_t RequestCostTokens(const GenerationRequest& request, int32_t max_model_len);

// AdmitGeneration sets request->cache_salt from the key and charges its quotas. Errors:
// ResourceExhausted from ApiAuth::Admit. Hold the ticket until the request is done.
absl::StatusOr<std::shared_ptr<QuotaTicket>> AdmitGeneration(ApiAuth& auth, const ApiKey& key,
                                                             int32_t max_model_len,
                                                             GenerationRequest* request);

}  // namespace sluice

#endif  // SLUICE_SERVICES_API_AUTH_REQUEST_ADMISSION_H_
