#include "services/common/embedding_fetch.h"

#include <xxhash.h>

#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "services/serve/log.h"
#include "transfer/block_runs.h"

namespace sluice {
namespace {

absl::Status FromGrpc(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

std::chrono::system_clock::time_point DeadlineAfter(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(d);
}

}  // namespace

absl::StatusOr<std::unique_ptr<EmbeddingFetcher>> EmbeddingFetcher::Create(
    const EmbeddingFetchOptions& options) {
  std::unique_ptr<EmbeddingFetcher> fetcher(new EmbeddingFetcher(options));
  if (options.agent != nullptr) {
    absl::StatusOr<std::unique_ptr<kvstore::KvStoreBufferPool>> pool =
        kvstore::KvStoreBufferPool::Create(options.agent, options.buffer_bytes);
    if (!pool.ok()) return pool.status();
    fetcher->pool_ = *std::move(pool);
  }
  return fetcher;
}

v1::Encoder::Stub* EmbeddingFetcher::Stub(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<v1::Encoder::Stub>& stub = stubs_[address];
  if (stub == nullptr) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(256 << 20);  // inline fallbacks: 9 MiB per LLaVA-1.5 image
    stub = v1::Encoder::NewStub(grpc::CreateCustomChannel(
        address,
        options_.credentials != nullptr ? options_.credentials
                                        : grpc::InsecureChannelCredentials(),
        args));
  }
  return stub.get();
}

absl::StatusOr<std::shared_ptr<const std::vector<float>>> EmbeddingFetcher::Fetch(
    const v1::EmbeddingRef& ref, int64_t expected_floats) {
  if (ref.size() != expected_floats * static_cast<int64_t>(sizeof(float)) || ref.size() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("the embedding reference holds ", ref.size(),
                                                   " bytes, not ", expected_floats, " floats"));
  }
  if (ref.encoder_address().empty()) {
    return absl::InvalidArgumentError("the embedding reference names no encoder address");
  }
  auto out = std::make_shared<std::vector<float>>(static_cast<size_t>(expected_floats));
  if (pool_ != nullptr) {
    absl::Status rma = FetchByRma(ref, out.get());
    if (rma.ok()) return out;
    num_rma_failures_.fetch_add(1);
    // A lease that ended is gone for the inline path too.
    if (absl::IsNotFound(rma) || absl::IsPermissionDenied(rma)) {
      num_failures_.fetch_add(1);
      return rma;
    }
    spdlog::warn("embeddings of lease {} at {}: RMA read failed ({}); fetching them inline",
                 ref.lease_id(), ref.encoder_address(), rma.ToString());
  }
  if (absl::Status s = FetchInline(ref, out.get()); !s.ok()) {
    num_failures_.fetch_add(1);
    return s;
  }
  return out;
}

absl::Status EmbeddingFetcher::FetchByRma(const v1::EmbeddingRef& ref, std::vector<float>* out) {
  const size_t bytes = static_cast<size_t>(ref.size());
  KvBlockBuffer buffer = pool_->Allocate(bytes);
  if (!buffer.lent()) return absl::ResourceExhaustedError("the landing pool is full");
  transfer::RemoteKvDescriptor remote;
  remote.worker_address = ref.worker_address();
  remote.regions.push_back({ref.address(), 1, ref.size(), ref.rkey()});
  const transfer::KvRegion local{buffer.data(), 1, ref.size()};
  const transfer::BlockRun run{0, 1};
  if (absl::Status s = options_.agent->Pull(remote, {&run, 1}, {&local, 1}, {&run, 1},
                                            absl::Now() + options_.timeout);
      !s.ok()) {
    return s;
  }
  if (XXH3_64bits(buffer.data(), bytes) != ref.checksum()) {
    return absl::DataLossError("the embeddings read by RMA fail their checksum");
  }
  // The ack: only a lease still held when the read finished vouches for the bytes.
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(options_.timeout));
  v1::ReleaseEmbeddingsRequest request;
  request.set_lease_id(ref.lease_id());
  request.set_token(ref.token());
  v1::ReleaseEmbeddingsResponse response;
  const grpc::Status acked =
      Stub(ref.encoder_address())->ReleaseEmbeddings(&context, request, &response);
  if (!acked.ok()) return FromGrpc(acked);
  std::memcpy(out->data(), buffer.data(), bytes);
  rma_bytes_.fetch_add(static_cast<int64_t>(bytes));
  return absl::OkStatus();
}

absl::Status EmbeddingFetcher::FetchInline(const v1::EmbeddingRef& ref, std::vector<float>* out) {
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(options_.timeout));
  v1::ReleaseEmbeddingsRequest request;
  request.set_lease_id(ref.lease_id());
  request.set_token(ref.token());
  request.set_return_values(true);
  v1::ReleaseEmbeddingsResponse response;
  const grpc::Status status =
      Stub(ref.encoder_address())->ReleaseEmbeddings(&context, request, &response);
  if (!status.ok()) return FromGrpc(status);
  if (static_cast<int64_t>(response.values().size()) != ref.size()) {
    return absl::DataLossError(absl::StrCat("the encoder answered ", response.values().size(),
                                            " bytes of embeddings for ", ref.size()));
  }
  if (XXH3_64bits(response.values().data(), response.values().size()) != ref.checksum()) {
    return absl::DataLossError("the embeddings answered inline fail their checksum");
  }
  std::memcpy(out->data(), response.values().data(), response.values().size());
  inline_bytes_.fetch_add(ref.size());
  return absl::OkStatus();
}

void EmbeddingFetcher::Release(const v1::EmbeddingRef& ref) {
  if (ref.encoder_address().empty()) return;
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(options_.timeout));
  v1::ReleaseEmbeddingsRequest request;
  request.set_lease_id(ref.lease_id());
  request.set_token(ref.token());
  v1::ReleaseEmbeddingsResponse response;
  const grpc::Status status =
      Stub(ref.encoder_address())->ReleaseEmbeddings(&context, request, &response);
  if (!status.ok()) {
    spdlog::debug("release of embedding lease {} at {}: {}", ref.lease_id(),
                  ref.encoder_address(), status.error_message());
  }
}

EmbeddingFetchStats EmbeddingFetcher::stats() const {
  EmbeddingFetchStats s;
  s.rma_bytes = rma_bytes_.load();
  s.inline_bytes = inline_bytes_.load();
  s.num_rma_failures = num_rma_failures_.load();
  s.num_failures = num_failures_.load();
  return s;
}

}  // namespace sluice
