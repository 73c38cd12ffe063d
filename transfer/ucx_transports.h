// CheckPeerFailureTransports: whether a UCX transport list (UCX_TLS syntax) can reach a peer
// under peer failure detection (UCP_ERR_HANDLING_MODE_PEER, which every Sluice service uses).
// UCX then builds endpoints only from transports that report a failed peer: shared-memory
// (posix, sysv, cma, knem, xpmem) and CUDA (cuda_ipc, cuda_copy, gdr_copy) transports do not,
// so a list of only those makes every ucp_ep_create fail with "Destination is unreachable" at
// the first transfer, and each request falls back to recomputing its prompt.
#ifndef SLUICE_TRANSFER_UCX_TRANSPORTS_H_
#define SLUICE_TRANSFER_UCX_TRANSPORTS_H_

#include "absl/strings/string_view.h"

#include "absl/status/status.h"

namespace sluice::transfer {

// OK for an empty list (UCX's choice of everything), "all", a list with an exclusion ('^...'),
// or one naming tcp or an InfiniBand transport (rc*, dc*, ud*, ib, srd). InvalidArgument,
// saying what to add, otherwise.
absl::Status CheckPeerFailureTransports(absl::string_view transports);

}  // namespace sluice::transfer

#endif  // SLUICE_TRANSFER_UCX_TRANSPORTS_H_
