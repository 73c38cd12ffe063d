// The router's worker choice for grammar-constrained requests (PickWorkerFor): only prefill and
// decode workers that advertised the 'grammar' capability take them, however lightly loaded
// the others are, with the registry's load-based choice and with the KV router's (every
// policy); requests
// without a grammar, and encoders, ignore the capability.
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "engine/grammar/compiled_grammar.h"
#include "engine/grammar/ebnf_parser.h"
#include "gtest/gtest.h"
#include "services/router/kv_router.h"
#include "services/router/remote_backend.h"
#include "services/router/worker_registry.h"
#include "tests/unit/grammar/grammar_test_util.h"

namespace sluice {
namespace {

class RouterGrammarPickTest : public ::testing::Test {
 protected:
  std::string Add(WorkerRole role, const std::string& address, int64_t running, bool grammar) {
    std::vector<std::string> capabilities;
    if (grammar) capabilities.push_back(kGrammarCapability);
    auto r = registry_.Register(role, address, WorkerLoad{0, running, 100, 100, 16},
                                capabilities);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->worker_id : "";
  }

  static EngineRequest Request(bool constrained) {
    EngineRequest r;
    r.request_id = constrained ? "constrained" : "free";
    r.prompt_token_ids = {1, 2, 3};
    if (constrained) {
      auto g = grammar::ParseEbnf("root ::= \"a\"+");
      auto c = grammar::CompiledGrammar::Create(*g, grammar::testing::ByteVocab());
      EXPECT_TRUE(c.ok()) << c.status();
      r.grammar = *c;
    }
    return r;
  }

  std::string Pick(WorkerRole role, bool constrained, const std::set<std::string>& exclude = {},
                   KvRouter* kv_router = nullptr) {
    std::optional<WorkerSnapshot> w =
        PickWorkerFor(registry_, kv_router, role, Request(constrained), 16, exclude);
    if (!w.has_value()) return "none";
    registry_.Release(w->worker_id);  // keep the loads as registered
    return w->worker_id;
  }

  WorkerRegistry registry_;
};

TEST_F(RouterGrammarPickTest, ConstrainedRequestsGoOnlyToGrammarWorkers) {
  // The old workers are idle, the capable ones busy: load alone would pick the old ones.
  const std::string old_decode = Add(WorkerRole::kDecode, "127.0.0.1:7201", 0, false);
  const std::string decode = Add(WorkerRole::kDecode, "127.0.0.1:7202", 5, true);
  const std::string old_prefill = Add(WorkerRole::kPrefill, "127.0.0.1:7101", 0, false);
  const std::string prefill = Add(WorkerRole::kPrefill, "127.0.0.1:7102", 5, true);
  const std::string encoder = Add(WorkerRole::kEncoder, "127.0.0.1:7301", 0, false);

  EXPECT_EQ(Pick(WorkerRole::kDecode, false), old_decode);
  EXPECT_EQ(Pick(WorkerRole::kDecode, true), decode);
  EXPECT_EQ(Pick(WorkerRole::kPrefill, false), old_prefill);
  EXPECT_EQ(Pick(WorkerRole::kPrefill, true), prefill);
  // Encoders sample nothing: the capability does not matter there.
  EXPECT_EQ(Pick(WorkerRole::kEncoder, true), encoder);
  // The caller's exclusions still hold; with the only capable worker excluded or draining
  // nothing qualifies (never the old worker).
  EXPECT_EQ(Pick(WorkerRole::kDecode, true, {decode}), "none");
  EXPECT_EQ(Pick(WorkerRole::kDecode, false, {old_decode}), decode);
  ASSERT_TRUE(registry_.Drain(prefill).ok());
  EXPECT_EQ(Pick(WorkerRole::kPrefill, true), "none");
  EXPECT_EQ(Pick(WorkerRole::kPrefill, false), old_prefill);
}

TEST_F(RouterGrammarPickTest, KvRouterChoiceHonoursTheCapability) {
  const std::string old_decode = Add(WorkerRole::kDecode, "127.0.0.1:7201", 0, false);
  const std::string decode = Add(WorkerRole::kDecode, "127.0.0.1:7202", 5, true);
  // Round-robin and KV-aware picks once fell back to an excluded worker: the registry was told
  // to skip only the other candidates, and an excluded, idler worker won (KvRouter::Assign).
  for (RoutingPolicy policy : {RoutingPolicy::kLoad, RoutingPolicy::kRoundRobin, RoutingPolicy::kKv}) {
    KvRouterOptions options;
    options.policy = policy;
    options.start_poller = false;
    KvRouter router(&registry_, options);
    for (int i = 0; i < 3; ++i) {
      std::optional<WorkerSnapshot> w =
          PickWorkerFor(registry_, &router, WorkerRole::kDecode, Request(true), 16, {});
      ASSERT_TRUE(w.has_value());
      EXPECT_EQ(w->worker_id, decode);
      router.Release(w->worker_id, "constrained");
    }
    std::set<std::string> seen;
    for (int i = 0; i < 4; ++i) {
      std::optional<WorkerSnapshot> w =
          PickWorkerFor(registry_, &router, WorkerRole::kDecode, Request(false), 16, {});
      ASSERT_TRUE(w.has_value());
      seen.insert(w->worker_id);
      router.Release(w->worker_id, "free");
    }
    EXPECT_TRUE(seen.contains(old_decode)) << "policy " << static_cast<int>(policy);
  }
}

}  // namespace
}  // namespace sluice
