#include "services/api/auth/request_admission.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace sluice {

std::string TenantCacheSalt(const ApiKey& key, const std::string& request_salt) {
  // Length-prefixed tenant vs "r:" request salt: the namespaces cannot overlap.
  if (!key.tenant.empty()) return absl::StrCat("t", key.tenant.size(), ":", key.tenant);
  if (request_salt.empty()) return request_salt;
  return absl::StrCat("r:", request_salt);
}

int64_t RequestCostTokens(const GenerationRequest& request, int32_t max_model_len) {
  int64_t cost = 0;
  for (const std::vector<int32_t>& prompt : request.prompts) {
    const int64_t prompt_tokens = static_cast<int64_t>(prompt.size());
    const int64_t max_new = request.max_tokens_given
                                ? request.sampling.max_tokens
                                : std::max<int64_t>(0, max_model_len - prompt_tokens);
    cost += prompt_tokens + static_cast<int64_t>(request.n) * max_new;
  }
  return cost;
}

absl::StatusOr<std::shared_ptr<QuotaTicket>> AdmitGeneration(ApiAuth& auth, const ApiKey& key,
                                                             int32_t max_model_len,
                                                             GenerationRequest* request) {
  request->cache_salt = TenantCacheSalt(key, request->cache_salt);
  absl::StatusOr<std::unique_ptr<QuotaTicket>> ticket =
      auth.Admit(key, RequestCostTokens(*request, max_model_len));
  if (!ticket.ok()) return ticket.status();
  return std::shared_ptr<QuotaTicket>(*std::move(ticket));
}

}  // namespace sluice
