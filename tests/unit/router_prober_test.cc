// WorkerProber: a worker whose address refuses connections is removed from the
// registry at once (with a reason naming it); one that accepts them stays.
// WorkerRegistry::Remove runs the removal callback.
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <mutex>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/router/worker_prober.h"
#include "services/router/worker_registry.h"
#include "sluice/v1/inference.grpc.pb.h"

namespace sluice {
namespace {

// ClosedPort returns a loopback port nothing listens on (bound, then closed).
int ClosedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  return ntohs(addr.sin_port);
}

// WaitFor polls `done` for up to 20 s (a deadline, not a timing assertion).
template <typename Pred>
bool WaitFor(Pred done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return done();
}

TEST(WorkerRegistryRemove, RunsTheCallbackWithTheReason) {
  WorkerRegistry registry;
  auto registration = registry.Register(WorkerRole::kPrefill, "127.0.0.1:1", WorkerLoad{});
  ASSERT_TRUE(registration.ok());
  std::string reason;
  registry.OnRemoved([&](const WorkerSnapshot& worker, const absl::Status& why) {
    EXPECT_EQ(worker.worker_id, registration->worker_id);
    reason = std::string(why.message());
  });
  ASSERT_TRUE(registry.Remove(registration->worker_id, absl::UnavailableError("gone")).ok());
  EXPECT_EQ(reason, "gone");
  EXPECT_EQ(registry.Remove(registration->worker_id, absl::UnavailableError("again")).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.CountLive(WorkerRole::kPrefill), 0);
}

TEST(WorkerProber, RemovesAnUnreachableWorkerAndKeepsALiveOne) {
  // A live gRPC server (any service: the probe only connects).
  v1::Inference::CallbackService service;
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  int live_port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &live_port);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(live_port, 0);

  WorkerRegistry registry;
  const std::string dead_address = absl::StrCat("127.0.0.1:", ClosedPort());
  auto live = registry.Register(WorkerRole::kDecode, absl::StrCat("127.0.0.1:", live_port),
                                WorkerLoad{});
  auto dead = registry.Register(WorkerRole::kPrefill, dead_address, WorkerLoad{});
  ASSERT_TRUE(live.ok() && dead.ok());
  std::string reason;
  std::mutex mu;
  registry.OnRemoved([&](const WorkerSnapshot&, const absl::Status& why) {
    std::lock_guard<std::mutex> lock(mu);
    reason = std::string(why.message());
  });

  WorkerProber prober(&registry, absl::Seconds(5));
  // Probes run in order: once the dead one is gone, the live one was probed.
  const WorkerSnapshot live_worker = *registry.Get(live->worker_id);
  const WorkerSnapshot dead_worker = *registry.Get(dead->worker_id);
  prober.Suspect(live_worker);
  prober.Suspect(dead_worker);
  prober.Suspect(dead_worker);  // a duplicate while queued or in probe: ignored
  ASSERT_TRUE(WaitFor([&] { return prober.num_removed() == 1; }));
  EXPECT_FALSE(registry.Get(dead->worker_id).has_value());
  EXPECT_TRUE(registry.Get(live->worker_id).has_value());
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(absl::StrContains(reason, dead->worker_id)) << reason;
    EXPECT_TRUE(absl::StrContains(reason, "unreachable")) << reason;
  }
  server->Shutdown();
}

// A stalled worker (a SIGSTOPped process: the kernel completes the TCP handshake, nothing
// answers) is left to its lease: only a failed connection removes a worker.
TEST(WorkerProber, KeepsAWorkerWhoseConnectTimesOut) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 16), 0);  // never accepted: connects complete, nothing is read
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);

  WorkerRegistry registry;
  auto stalled = registry.Register(WorkerRole::kDecode,
                                   absl::StrCat("127.0.0.1:", ntohs(addr.sin_port)),
                                   WorkerLoad{});
  auto dead = registry.Register(WorkerRole::kDecode, absl::StrCat("127.0.0.1:", ClosedPort()),
                                WorkerLoad{});
  ASSERT_TRUE(stalled.ok() && dead.ok());
  WorkerProber prober(&registry, absl::Milliseconds(500));
  // Probes run in order: once the dead one is gone, the stalled one was probed.
  prober.Suspect(*registry.Get(stalled->worker_id));
  prober.Suspect(*registry.Get(dead->worker_id));
  ASSERT_TRUE(WaitFor([&] { return prober.num_removed() == 1; }));
  EXPECT_FALSE(registry.Get(dead->worker_id).has_value());
  EXPECT_TRUE(registry.Get(stalled->worker_id).has_value());
  close(fd);
}

}  // namespace
}  // namespace sluice
