#include "transfer/ucx_transports.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace sluice::transfer {
namespace {

// Transports whose UCT interfaces handle a failed peer (UCT_IFACE_FLAG_ERRHANDLE_PEER_FAILURE):
// tcp and the InfiniBand / EFA families. A "name:aux" entry counts by its name.
bool ReportsPeerFailure(absl::string_view tl) {
  tl = tl.substr(0, tl.find(':'));
  return tl == "tcp" || tl == "ib" || tl == "srd" || absl::StartsWith(tl, "rc") ||
         absl::StartsWith(tl, "dc") || absl::StartsWith(tl, "ud");
}

}  // namespace

absl::Status CheckPeerFailureTransports(absl::string_view transports) {
  transports = absl::StripAsciiWhitespace(transports);
  if (transports.empty() || absl::StartsWith(transports, "^")) return absl::OkStatus();
  for (absl::string_view tl : absl::StrSplit(transports, ',', absl::SkipWhitespace())) {
    tl = absl::StripAsciiWhitespace(tl);
    if (tl == "all" || ReportsPeerFailure(tl)) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "UCX transports '", transports,
      "' have none that reports a failed peer (shared-memory and CUDA transports do not), so UCX "
      "could build no endpoint to another worker and every KV transfer would fail; add tcp "
      "(for example '", transports, ",tcp'; RMA still takes the fastest transport the list "
      "allows) or an InfiniBand transport (rc, dc, ud)"));
}

}  // namespace sluice::transfer
