#include "transfer/ucx_transports.h"

#include <gtest/gtest.h>

namespace sluice::transfer {
namespace {

TEST(CheckPeerFailureTransportsTest, AcceptsListsWithAPeerFailureTransport) {
  for (const char* tls : {"", "all", "tcp", "sm,tcp", "sm,cuda_ipc,cuda_copy,tcp", "rc_x,sm",
                          "dc_mlx5", "ud_v", "ib,cuda_copy", "^sm", " tcp , sm "}) {
    EXPECT_TRUE(CheckPeerFailureTransports(tls).ok()) << "'" << tls << "'";
  }
}

TEST(CheckPeerFailureTransportsTest, RefusesSharedMemoryAndCudaOnly) {
  for (const char* tls : {"sm", "posix,sysv,cma", "sm,cuda_ipc,cuda_copy", "cuda_ipc", "self"}) {
    absl::Status s = CheckPeerFailureTransports(tls);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "'" << tls << "'";
    EXPECT_NE(s.message().find("add tcp"), std::string::npos) << s.message();
  }
  EXPECT_EQ(CheckPeerFailureTransports("sm,cuda_ipc,cuda_copy").message(),
            "UCX transports 'sm,cuda_ipc,cuda_copy' have none that reports a failed peer "
            "(shared-memory and CUDA transports do not), so UCX could build no endpoint to "
            "another worker and every KV transfer would fail; add tcp (for example "
            "'sm,cuda_ipc,cuda_copy,tcp'; RMA still takes the fastest transport the list allows) "
            "or an InfiniBand transport (rc, dc, ud)");
}

}  // namespace
}  // namespace sluice::transfer
