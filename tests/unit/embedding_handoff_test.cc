// The staged embedding hand-off (issue 26): `sluice encoder` keeps embeddings over its inline
// threshold in a UCX-registered staging arena and answers a reference; the worker RMA-reads
// them, checks them and acks, which frees the slot. Also: lease expiry and cancellation free
// slots, a wrong token frees nothing, and every failure of the RMA path falls back (inline
// bytes, then the worker's own encode) with the same embeddings.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/vision/image.h"
#include "engine/vision/vision_encoder.h"
#include "gtest/gtest.h"
#include "services/common/embedding_fetch.h"
#include "services/common/worker_images.h"
#include "services/common/worker_wire.h"
#include "services/encoder/embedding_staging.h"
#include "services/encoder/encoder_service.h"
#include "services/router/image_encoding.h"
#include "tests/util/test_paths.h"
#include "transfer/kv_transfer.h"

namespace sluice {
namespace {

using sluice::testing::ReadFileBytes;

constexpr int64_t kBytes = 16 * 64 * 4;  // llava-tiny: 16 tokens x 64 floats per image

// An encoder worker in this process: the tower, a staging arena registered with its own UCX
// agent, the gRPC service on a free port.
class EncoderSide {
 public:
  explicit EncoderSide(int64_t inline_max_bytes = 0) {
    dir_ = testing::FixtureDir("llava-tiny");
    encoder_ = *vision::VisionEncoder::Load(dir_);
    agent_ = *transfer::KvTransferAgent::Create({});
    EmbeddingStagingOptions staging_options;
    staging_options.arena_bytes = 1 << 20;
    staging_ = *EmbeddingStaging::Create(agent_.get(), staging_options);
    EncoderServiceOptions o;
    o.staging = staging_.get();
    o.inline_max_bytes = inline_max_bytes;
    service_ = std::make_unique<EncoderService>(encoder_.get(), nullptr, o);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    address_ = absl::StrCat("127.0.0.1:", port);
    stub_ = v1::Encoder::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }
  ~EncoderSide() { Stop(); }
  void Stop() {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
    server_.reset();
  }

  // Encode: the reply to one call (allow_ref set).
  grpc::Status Encode(const std::vector<std::string>& images, v1::EncodeResponse* reply,
                      bool allow_ref = true) {
    v1::EncodeRequest request;
    for (const std::string& image : images) request.add_images(image);
    request.set_allow_ref(allow_ref);
    grpc::ClientContext context;
    return stub_->Encode(&context, request, reply);
  }
  // The reference the router passes on: the encoder's address filled in.
  v1::EmbeddingRef RefOf(const v1::EncodeResponse& reply, int i = 0) const {
    v1::EmbeddingRef ref = reply.embeddings(i).ref();
    ref.set_encoder_address(address_);
    return ref;
  }
  // What the tower computes for `bytes`, as bytes.
  std::string Expected(const std::string& bytes) const {
    std::vector<float> v = *encoder_->EncodeImage(*vision::DecodeImage(bytes, {}));
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  }

  const std::string& dir() const { return dir_; }
  const std::string& address() const { return address_; }
  EmbeddingStaging& staging() { return *staging_; }
  EncoderService& service() { return *service_; }

 private:
  std::string dir_;
  std::unique_ptr<vision::VisionEncoder> encoder_;
  std::unique_ptr<transfer::KvTransferAgent> agent_;
  std::unique_ptr<EmbeddingStaging> staging_;
  std::unique_ptr<EncoderService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<v1::Encoder::Stub> stub_;
};

// Polls `done` for up to 10 s (the server's OnDone runs after the client has the status).
template <typename Done>
bool Eventually(Done done) {
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (!done()) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

std::string AsBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

std::string Image(int k) {
  return ReadFileBytes(testing::FixtureDir("llava-tiny") +
                       (k == 2 ? "/image_2.jpg" : absl::StrCat("/image_", k, ".png")));
}

TEST(EmbeddingHandoffTest, StagedEmbeddingsArriveByRmaAndTheAckFreesTheSlot) {
  EncoderSide encoder;
  v1::EncodeResponse reply;
  ASSERT_TRUE(encoder.Encode({Image(0), Image(2)}, &reply).ok());
  ASSERT_EQ(reply.embeddings_size(), 2);
  for (const v1::ImageEmbedding& e : reply.embeddings()) {
    EXPECT_TRUE(e.has_ref());
    EXPECT_TRUE(e.values().empty());  // no inline copy
    EXPECT_EQ(e.ref().size(), kBytes);
  }
  EXPECT_EQ(encoder.staging().stats().staged_bytes, 2 * kBytes);
  EXPECT_EQ(encoder.staging().stats().num_staged_leases, 2);

  auto agent = *transfer::KvTransferAgent::Create({});
  EmbeddingFetchOptions o;
  o.agent = agent.get();
  o.buffer_bytes = 1 << 20;
  auto fetcher = *EmbeddingFetcher::Create(o);
  auto first = fetcher->Fetch(encoder.RefOf(reply, 0), kBytes / 4);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(AsBytes(**first), encoder.Expected(Image(0)));
  EXPECT_EQ(encoder.staging().stats().staged_bytes, kBytes);  // the ack freed one slot
  auto second = fetcher->Fetch(encoder.RefOf(reply, 1), kBytes / 4);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(AsBytes(**second), encoder.Expected(Image(2)));

  const EmbeddingFetchStats fs = fetcher->stats();
  EXPECT_EQ(fs.rma_bytes, 2 * kBytes);
  EXPECT_EQ(fs.inline_bytes, 0);
  EXPECT_EQ(fs.num_rma_failures, 0);
  const EmbeddingStagingStats ss = encoder.staging().stats();
  EXPECT_EQ(ss.staged_bytes, 0);
  EXPECT_EQ(ss.num_staged_leases, 0);
  EXPECT_EQ(ss.num_released, 2);
  EXPECT_EQ(ss.num_expired, 0);
  const std::string metrics = encoder.service().RenderMetrics();
  EXPECT_NE(metrics.find(absl::StrCat("sluice_encoder_embedding_bytes_total{path=\"staged\"} ",
                                      2 * kBytes, "\n")),
            std::string::npos);
  EXPECT_NE(metrics.find("sluice_encoder_embedding_bytes_total{path=\"inline\"} 0\n"),
            std::string::npos);

  // The lease is over: a second read is refused (its slot may hold another image now).
  auto again = fetcher->Fetch(encoder.RefOf(reply, 0), kBytes / 4);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kNotFound) << again.status();
}

TEST(EmbeddingHandoffTest, AnExpiredLeaseIsFreedAndItsBytesAreNotUsed) {
  EncoderSide encoder;
  v1::EncodeResponse reply;
  ASSERT_TRUE(encoder.Encode({Image(1)}, &reply).ok());
  ASSERT_TRUE(reply.embeddings(0).has_ref());
  EXPECT_EQ(reply.embeddings(0).ref().lease_ms(), 30000);
  EXPECT_EQ(encoder.staging().Sweep(absl::Now()), 0);  // not yet
  EXPECT_EQ(encoder.staging().Sweep(absl::Now() + absl::Seconds(31)), 1);
  EmbeddingStagingStats ss = encoder.staging().stats();
  EXPECT_EQ(ss.staged_bytes, 0);
  EXPECT_EQ(ss.num_expired, 1);

  auto agent = *transfer::KvTransferAgent::Create({});
  EmbeddingFetchOptions o;
  o.agent = agent.get();
  auto fetcher = *EmbeddingFetcher::Create(o);
  auto fetched = fetcher->Fetch(encoder.RefOf(reply), kBytes / 4);
  EXPECT_EQ(fetched.status().code(), absl::StatusCode::kNotFound) << fetched.status();
  EXPECT_EQ(fetcher->stats().rma_bytes, 0);
  EXPECT_EQ(fetcher->stats().inline_bytes, 0);
}

TEST(EmbeddingHandoffTest, AWrongTokenFreesNothing) {
  EncoderSide encoder;
  v1::EncodeResponse reply;
  ASSERT_TRUE(encoder.Encode({Image(0)}, &reply).ok());
  v1::EmbeddingRef ref = encoder.RefOf(reply);
  auto refused = encoder.staging().Release(ref.lease_id(), std::string(16, 'x'), true,
                                           absl::Now());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(encoder.staging().stats().num_staged_leases, 1);
  auto released = encoder.staging().Release(ref.lease_id(), ref.token(), true, absl::Now());
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(*released, encoder.Expected(Image(0)));
  EXPECT_EQ(encoder.staging().stats().num_staged_leases, 0);
}

TEST(EmbeddingHandoffTest, ACallThatFailsOrIsNotAllowedRefsStagesNothing) {
  EncoderSide encoder;
  v1::EncodeResponse reply;
  // The first image was staged when the second turned out bad: its slot is freed.
  grpc::Status bad = encoder.Encode({Image(0), "not an image"}, &reply);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(Eventually([&] { return encoder.staging().stats().num_cancelled == 1; }));
  EmbeddingStagingStats ss = encoder.staging().stats();
  EXPECT_EQ(ss.num_staged_leases, 0);
  EXPECT_EQ(ss.staged_bytes, 0);
  EXPECT_EQ(ss.bytes_staged_total, kBytes);
  // A caller that cannot pass refs on gets values.
  v1::EncodeResponse inline_reply;
  ASSERT_TRUE(encoder.Encode({Image(0)}, &inline_reply, /*allow_ref=*/false).ok());
  EXPECT_FALSE(inline_reply.embeddings(0).has_ref());
  EXPECT_EQ(inline_reply.embeddings(0).values(), encoder.Expected(Image(0)));
  // At or below the inline threshold: values.
  EncoderSide small(/*inline_max_bytes=*/kBytes);
  v1::EncodeResponse small_reply;
  ASSERT_TRUE(small.Encode({Image(0)}, &small_reply).ok());
  EXPECT_FALSE(small_reply.embeddings(0).has_ref());
  EXPECT_EQ(small.staging().stats().bytes_staged_total, 0);
}

TEST(EmbeddingHandoffTest, WithoutUcxOrAfterABadReadTheBytesComeInline) {
  EncoderSide encoder;
  v1::EncodeResponse reply;
  ASSERT_TRUE(encoder.Encode({Image(0), Image(1)}, &reply).ok());
  // No agent (a worker without UCX): inline, and the slot is freed by that call.
  auto no_ucx = *EmbeddingFetcher::Create({});
  auto fetched = no_ucx->Fetch(encoder.RefOf(reply, 0), kBytes / 4);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(AsBytes(**fetched), encoder.Expected(Image(0)));
  EXPECT_EQ(no_ucx->stats().inline_bytes, kBytes);
  EXPECT_EQ(no_ucx->stats().rma_bytes, 0);
  // An RMA read of the wrong bytes (here: another offset of the arena) fails its checksum and
  // is not used; the bytes come inline.
  auto agent = *transfer::KvTransferAgent::Create({});
  EmbeddingFetchOptions o;
  o.agent = agent.get();
  auto fetcher = *EmbeddingFetcher::Create(o);
  v1::EmbeddingRef shifted = encoder.RefOf(reply, 1);
  shifted.set_address(shifted.address() + 64);
  fetched = fetcher->Fetch(shifted, kBytes / 4);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(AsBytes(**fetched), encoder.Expected(Image(1)));
  EXPECT_EQ(fetcher->stats().num_rma_failures, 1);
  EXPECT_EQ(fetcher->stats().inline_bytes, kBytes);
  EXPECT_EQ(fetcher->stats().rma_bytes, 0);
  EXPECT_EQ(encoder.staging().stats().num_staged_leases, 0);
}

// The worker's path: the router's reply handling and wire inputs, WorkerImages reading the
// staged embeddings on its encode threads, and its own encode when the encoder is gone.
TEST(EmbeddingHandoffTest, WorkerImagesReadStagedEmbeddingsElseEncodeThemselves) {
  EncoderSide encoder;
  const std::string png = Image(0);
  auto agent = *transfer::KvTransferAgent::Create({});  // outlives the fetchers' buffers
  auto images = *WorkerImages::Load(encoder.dir(), {});
  ASSERT_NE(images, nullptr);
  EmbeddingFetchOptions o;
  o.agent = agent.get();
  images->SetEmbeddingFetcher(*EmbeddingFetcher::Create(o));

  const std::string fingerprint =
      (*vision::VisionEncoder::Load(encoder.dir()))->processor().Fingerprint();
  auto request_with_image = [&] {
    EngineRequest r;
    MultimodalInput mm;
    mm.offset = 1;
    mm.num_tokens = 16;
    mm.content_hash = vision::ImageContentHash(png, fingerprint);
    mm.image = std::make_shared<const std::string>(png);
    r.mm_inputs.push_back(mm);
    return r;
  };
  // Router: the reply's ref goes with the image's bytes to the workers.
  EngineRequest r = request_with_image();
  v1::EncodeResponse reply;
  ASSERT_TRUE(encoder.Encode({png}, &reply).ok());
  std::vector<v1::EmbeddingRef> refs;
  ASSERT_TRUE(ApplyEncodeResponse(reply, {0}, &r, &refs, encoder.address()).ok());
  EXPECT_EQ(r.mm_inputs[0].embeddings, nullptr);
  ASSERT_NE(r.mm_inputs[0].image, nullptr);
  google::protobuf::RepeatedPtrField<v1::MultimodalInput> wire;
  MmInputsToWire(r.mm_inputs, &wire, refs);
  ASSERT_TRUE(wire[0].has_embedding_ref());
  EXPECT_EQ(wire[0].embedding_ref().encoder_address(), encoder.address());
  EXPECT_EQ(wire[0].image(), png);
  EXPECT_TRUE(wire[0].embeddings().empty());

  // Worker: the handler records the ref, the encode thread reads it.
  auto inputs = *MmInputsFromWire(wire);
  ASSERT_TRUE(CheckImages(images.get(), inputs).ok());
  NoteWireInputs(images.get(), wire);
  EXPECT_EQ(images->num_embedding_refs(), 1);
  ASSERT_TRUE(images->EncodeMissing(&inputs).ok());
  EXPECT_EQ(AsBytes(*inputs[0].embeddings), encoder.Expected(png));
  EXPECT_EQ(images->num_encoded(), 0);  // read, not encoded here
  EXPECT_EQ(images->embedding_rma_bytes(), kBytes);
  EXPECT_EQ(images->embedding_inline_bytes(), 0);
  EXPECT_EQ(images->num_embedding_refs(), 0);
  EXPECT_EQ(encoder.staging().stats().num_staged_leases, 0);
  const std::string metrics = RenderWorkerImageMetrics(*images);
  EXPECT_NE(metrics.find(absl::StrCat("sluice_worker_embedding_bytes_total{path=\"rma\"} ",
                                      kBytes, "\n")),
            std::string::npos);

  // The encoder is gone before the worker reads: the worker encodes the bytes itself.
  ASSERT_TRUE(encoder.Encode({png}, &reply).ok());
  v1::EmbeddingRef dead = encoder.RefOf(reply);
  encoder.Stop();
  auto images2 = *WorkerImages::Load(encoder.dir(), {});
  EmbeddingFetchOptions short_timeout = o;
  short_timeout.timeout = absl::Seconds(2);
  images2->SetEmbeddingFetcher(*EmbeddingFetcher::Create(short_timeout));
  std::vector<MultimodalInput> again = request_with_image().mm_inputs;
  images2->AddEmbeddingRef(again[0].content_hash, dead);
  ASSERT_TRUE(images2->EncodeMissing(&again).ok());
  EXPECT_EQ(AsBytes(*again[0].embeddings), encoder.Expected(png));
  EXPECT_EQ(images2->num_encoded(), 1);
  EXPECT_EQ(images2->embedding_rma_bytes(), 0);
}

// Recorded refs leave the worker's table at their lease's end: an expired one is never read
// (its slot may hold another image), and the image is encoded here.
TEST(EmbeddingHandoffTest, WorkerImagesForgetExpiredRefs) {
  EncoderSide encoder;
  const std::string png = Image(1);
  auto agent = *transfer::KvTransferAgent::Create({});
  auto images = *WorkerImages::Load(encoder.dir(), {});
  EmbeddingFetchOptions o;
  o.agent = agent.get();
  images->SetEmbeddingFetcher(*EmbeddingFetcher::Create(o));
  v1::EncodeResponse reply;
  ASSERT_TRUE(encoder.Encode({png}, &reply).ok());
  v1::EmbeddingRef ref = encoder.RefOf(reply);
  ref.set_lease_ms(1);
  MultimodalInput mm;
  mm.offset = 0;
  mm.num_tokens = 16;
  mm.content_hash = vision::ImageContentHash(
      png, (*vision::VisionEncoder::Load(encoder.dir()))->processor().Fingerprint());
  mm.image = std::make_shared<const std::string>(png);
  images->AddEmbeddingRef(mm.content_hash, ref);
  images->AddEmbeddingRef(mm.content_hash, ref);  // the same lease again: recorded once
  EXPECT_EQ(images->num_embedding_refs(), 1);
  absl::SleepFor(absl::Milliseconds(5));
  v1::EmbeddingRef other = ref;
  other.set_lease_id(ref.lease_id() + 1000);
  other.set_lease_ms(60000);
  images->AddEmbeddingRef(BlockHash{1, 2}, other);  // sweeps the expired one
  EXPECT_EQ(images->num_embedding_refs(), 1);
  std::vector<MultimodalInput> inputs = {mm};
  ASSERT_TRUE(images->EncodeMissing(&inputs).ok());
  EXPECT_EQ(AsBytes(*inputs[0].embeddings), encoder.Expected(png));
  EXPECT_EQ(images->num_encoded(), 1);
  EXPECT_EQ(images->embedding_rma_bytes(), 0);
  EXPECT_EQ(encoder.staging().stats().num_staged_leases, 1);  // left to the encoder's expiry
}

}  // namespace
}  // namespace sluice
