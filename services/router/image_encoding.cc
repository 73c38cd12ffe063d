#include "services/router/image_encoding.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace sluice {

std::vector<size_t> PendingImages(const EngineRequest& request) {
  std::vector<size_t> pending;
  for (size_t i = 0; i < request.mm_inputs.size(); ++i) {
    if (request.mm_inputs[i].embeddings == nullptr) pending.push_back(i);
  }
  return pending;
}

v1::EncodeRequest EncodeRequestFor(const EngineRequest& request,
                                   const std::vector<size_t>& pending) {
  v1::EncodeRequest out;
  for (size_t i : pending) {
    const MultimodalInput& mm = request.mm_inputs[i];
    out.add_images(mm.image != nullptr ? *mm.image : std::string());
  }
  return out;
}

std::optional<WorkerSnapshot> PickEncoder(WorkerRegistry* registry, const BlockHash& affinity,
                                          const std::set<std::string>& exclude,
                                          int64_t max_extra_load) {
  std::vector<WorkerSnapshot> live;
  for (WorkerSnapshot& w : registry->List()) {
    if (w.role == WorkerRole::kEncoder && !w.draining && !w.suspect &&
        exclude.count(w.worker_id) == 0) {
      live.push_back(std::move(w));
    }
  }
  if (live.empty()) return std::nullopt;
  const auto load = [](const WorkerSnapshot& w) {
    return std::max(w.num_assigned, w.load.num_waiting_requests + w.load.num_running_requests);
  };
  int64_t least = load(live.front());
  for (const WorkerSnapshot& w : live) least = std::min(least, load(w));
  const WorkerSnapshot* chosen = nullptr;
  uint64_t best_weight = 0;
  for (const WorkerSnapshot& w : live) {
    if (load(w) > least + max_extra_load) continue;
    const uint64_t weight =
        XXH3_64bits_withSeed(w.address.data(), w.address.size(), affinity.lo ^ affinity.hi);
    if (chosen == nullptr || weight > best_weight) {
      chosen = &w;
      best_weight = weight;
    }
  }
  // Assign through Pick with every other encoder excluded (it counts the assignment); if the
  // chosen one left meanwhile, the least loaded of the rest.
  std::set<std::string> others = exclude;
  for (const WorkerSnapshot& w : live) {
    if (w.worker_id != chosen->worker_id) others.insert(w.worker_id);
  }
  std::optional<WorkerSnapshot> picked = registry->Pick(WorkerRole::kEncoder, 0, others);
  return picked.has_value() ? picked : registry->Pick(WorkerRole::kEncoder, 0, exclude);
}

std::string ContentHashToWire(const BlockHash& hash) {
  std::string key(16, '\0');
  for (int b = 0; b < 8; ++b) {
    key[b] = static_cast<char>(hash.lo >> (8 * b));
    key[8 + b] = static_cast<char>(hash.hi >> (8 * b));
  }
  return key;
}

absl::Status ApplyEncodeResponse(const v1::EncodeResponse& reply,
                                 const std::vector<size_t>& pending, EngineRequest* request,
                                 std::vector<v1::EmbeddingRef>* refs,
                                 const std::string& encoder_address) {
  if (static_cast<size_t>(reply.embeddings_size()) != pending.size()) {
    return absl::InternalError(absl::StrCat("the encoder answered ", reply.embeddings_size(),
                                            " embeddings for ", pending.size(), " images"));
  }
  std::vector<std::shared_ptr<const std::vector<float>>> values;
  for (size_t k = 0; k < pending.size(); ++k) {
    const v1::ImageEmbedding& e = reply.embeddings(static_cast<int>(k));
    const MultimodalInput& mm = request->mm_inputs[pending[k]];
    // The hash covers the preprocessing config: a mismatch is an encoder set up differently.
    if (e.content_hash() != ContentHashToWire(mm.content_hash)) {
      return absl::InternalError(absl::StrCat(
          "image ", pending[k], ": the encoder's content hash differs from the router's (is the "
          "encoder serving the same model folder and preprocessor_config.json?)"));
    }
    const int64_t floats = int64_t{e.num_tokens()} * e.hidden_size();
    const int64_t size = e.has_ref() ? e.ref().size() : static_cast<int64_t>(e.values().size());
    if (e.num_tokens() != mm.num_tokens || e.hidden_size() <= 0 ||
        size != floats * int64_t{sizeof(float)}) {
      return absl::InternalError(absl::StrCat(
          "image ", pending[k], ": the encoder answered ", e.num_tokens(), " x ",
          e.hidden_size(), " embeddings in ", size, " bytes; the prompt has ",
          mm.num_tokens, " placeholder tokens for it"));
    }
    if (e.has_ref()) {
      if (refs == nullptr) {
        return absl::InternalError(absl::StrCat(
            "image ", pending[k], ": the encoder answered a staged reference, not values"));
      }
      values.push_back(nullptr);
      continue;
    }
    auto v = std::make_shared<std::vector<float>>(static_cast<size_t>(floats));
    std::memcpy(v->data(), e.values().data(), e.values().size());  // little-endian hosts
    values.push_back(std::move(v));
  }
  for (size_t k = 0; k < pending.size(); ++k) {
    MultimodalInput& mm = request->mm_inputs[pending[k]];
    if (values[k] == nullptr) {  // staged: the bytes stay for a worker's own encode
      refs->resize(request->mm_inputs.size());
      (*refs)[pending[k]] = reply.embeddings(static_cast<int>(k)).ref();
      (*refs)[pending[k]].set_encoder_address(encoder_address);
      continue;
    }
    mm.embeddings = std::move(values[k]);
    mm.image.reset();
  }
  return absl::OkStatus();
}

void MmInputsToWire(const std::vector<MultimodalInput>& in,
                    google::protobuf::RepeatedPtrField<v1::MultimodalInput>* out,
                    const std::vector<v1::EmbeddingRef>& refs) {
  out->Clear();
  for (size_t i = 0; i < in.size(); ++i) {
    const MultimodalInput& mm = in[i];
    v1::MultimodalInput* w = out->Add();
    if (i < refs.size() && refs[i].size() > 0) *w->mutable_embedding_ref() = refs[i];
    w->set_offset(mm.offset);
    w->set_num_tokens(mm.num_tokens);
    w->set_content_hash(ContentHashToWire(mm.content_hash));
    if (mm.embeddings != nullptr) {
      w->set_embeddings(reinterpret_cast<const char*>(mm.embeddings->data()),
                        mm.embeddings->size() * sizeof(float));
    } else if (mm.image != nullptr) {
      w->set_image(*mm.image);  // the worker encodes it (no encoder worker could)
    }
  }
}

}  // namespace sluice
