#include "services/api/multimodal_input.h"

#include <regex>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/vision/image_placeholders.h"
#include "services/api/image_fetch.h"
#include "services/api/openai_errors.h"

namespace sluice {
namespace {

using json = nlohmann::json;

absl::Status Bad(const std::string& where, const std::string& problem) {
  return InvalidParam("messages", absl::StrCat(where, ": ", problem));
}

int64_t CountOccurrences(const std::string& text, const std::string& needle) {
  if (needle.empty()) return 0;
  int64_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + needle.size())) {
    ++n;
  }
  return n;
}

}  // namespace

ChatContentFormat DetectChatContentFormat(const std::string& source) {
  // e.g. "{% for part in message['content'] %}", "message.content[0]['type']", "item.type".
  static const std::regex kIterates(
      R"(for\s+\w+\s+in\s+\w+(\[\s*['"]content['"]\s*\]|\.content)|\[\s*['"]type['"]\s*\]|\.type\b)");
  return std::regex_search(source, kIterates) ? ChatContentFormat::kOpenAi
                                              : ChatContentFormat::kString;
}

absl::StatusOr<ChatImage> ImagePartBytes(const json& part, const std::string& where,
                                         const MultimodalContext& mm) {
  const std::string type = part["type"].get<std::string>();
  const json* url = nullptr;
  if (type == "image_url") {
    auto it = part.find("image_url");
    if (it != part.end() && it->is_object()) {
      if (auto detail = it->find("detail"); detail != it->end() && !detail->is_null()) {
        if (!detail->is_string() ||
            (*detail != "auto" && *detail != "low" && *detail != "high")) {
          return Bad(where, "image_url.detail must be 'auto', 'low' or 'high'");
        }
      }
      if (auto u = it->find("url"); u != it->end()) url = &*u;
    } else if (it != part.end()) {
      url = &*it;
    }
  } else {  // "image": Hugging Face style
    for (const char* key : {"image", "url"}) {
      if (auto u = part.find(key); u != part.end()) url = &*u;
    }
  }
  if (url == nullptr || !url->is_string()) {
    return Bad(where, "an image part needs a string URL (image_url.url)");
  }
  const std::string& text = url->get_ref<const std::string&>();
  if (absl::StartsWithIgnoreCase(text, "http://") || absl::StartsWithIgnoreCase(text, "https://")) {
    if (mm.fetcher == nullptr || !mm.fetcher->enabled()) {
      return Bad(where,
                 "image URLs (http/https) are not fetched by this server (see "
                 "--allowed-media-domains); send the image as a base64 data URL "
                 "(data:image/png;base64,...)");
    }
    absl::StatusOr<std::string> body = mm.fetcher->Fetch(text);
    if (!body.ok()) {
      return Bad(where, absl::StrCat("cannot fetch the image URL: ", body.status().message()));
    }
    ChatImage image;
    image.where = where;
    image.bytes = *std::move(body);
    return image;
  }
  if (!absl::StartsWithIgnoreCase(text, "data:")) {
    return Bad(where, "the image URL must be a base64 data URL (data:image/...;base64,...)");
  }
  const size_t comma = text.find(',');
  if (comma == std::string::npos ||
      !absl::EndsWithIgnoreCase(absl::string_view(text).substr(0, comma), ";base64")) {
    return Bad(where, "the image data URL must be base64-encoded (data:<type>;base64,<data>)");
  }
  const absl::string_view payload = absl::string_view(text).substr(comma + 1);
  // Refuse before decoding: base64 is 4 characters per 3 bytes.
  if (static_cast<int64_t>(payload.size() / 4 * 3) > mm.decode_limits.max_bytes + 3) {
    return Bad(where, absl::StrCat("image is about ", payload.size() / 4 * 3,
                                   " bytes, over the limit of ", mm.decode_limits.max_bytes,
                                   " bytes"));
  }
  ChatImage image;
  image.where = where;
  if (!absl::Base64Unescape(payload, &image.bytes)) {
    return Bad(where, "the image data URL is not valid base64");
  }
  return image;
}

absl::StatusOr<json> FlattenContent(const std::vector<std::string>& texts,
                                    const std::vector<bool>& is_image,
                                    const MultimodalContext& mm, const std::string& where) {
  int64_t num_images = 0;
  for (bool b : is_image) num_images += b;
  if (mm.content_format == ChatContentFormat::kOpenAi) {
    json parts = json::array();
    for (size_t i = 0; i < texts.size(); ++i) {
      parts.push_back(is_image[i] ? json{{"type", "image"}}
                                  : json{{"type", "text"}, {"text", texts[i]}});
    }
    return parts;
  }
  std::vector<std::string> text_parts;
  for (size_t i = 0; i < texts.size(); ++i) {
    if (!is_image[i]) text_parts.push_back(texts[i]);
  }
  const std::string text = absl::StrJoin(text_parts, "\n");
  if (num_images == 0) return json(text);
  const int64_t missing = num_images - CountOccurrences(text, mm.image_placeholder);
  if (missing < 0) {
    return Bad(where, absl::StrCat("the text has more '", mm.image_placeholder,
                                   "' placeholders than the message has images (", num_images,
                                   ")"));
  }
  std::vector<std::string> lines(static_cast<size_t>(missing), mm.image_placeholder);
  lines.push_back(text);
  return json(absl::StrJoin(lines, "\n"));
}

absl::StatusOr<std::vector<MultimodalInput>> EncodePromptImages(
    const std::vector<ChatImage>& images, const MultimodalContext& mm,
    std::vector<int32_t>* prompt) {
  if (static_cast<int64_t>(images.size()) > mm.max_images_per_prompt) {
    return InvalidParam("messages",
                        absl::StrCat("At most ", mm.max_images_per_prompt,
                                     " image(s) may be provided in one prompt "
                                     "(--limit-mm-per-prompt), got ",
                                     images.size()));
  }
  auto expanded = vision::ExpandImagePlaceholders(*prompt, mm.image_token_id, mm.tokens_per_image,
                                                  static_cast<int64_t>(images.size()));
  if (!expanded.ok()) return InvalidParam("messages", std::string(expanded.status().message()));
  std::vector<MultimodalInput> out;
  for (size_t i = 0; i < images.size(); ++i) {
    MultimodalInput mm_input;
    mm_input.offset = expanded->image_offsets[i];
    mm_input.num_tokens = static_cast<int32_t>(mm.tokens_per_image);
    mm_input.content_hash = vision::ImageContentHash(images[i].bytes, mm.preprocess_fingerprint);
    if (mm.encoder != nullptr && mm.cache != nullptr) {
      mm_input.embeddings = mm.cache->Lookup(mm_input.content_hash);
    }
    if (mm_input.embeddings == nullptr) {
      if (mm.encoder == nullptr && mm.checked != nullptr &&
          mm.checked->Contains(mm_input.content_hash)) {
        // Checked before (an earlier turn of the chat): not decoded again.
        mm_input.image = std::make_shared<const std::string>(images[i].bytes);
        out.push_back(std::move(mm_input));
        continue;
      }
      const absl::Time start = absl::Now();
      auto decoded = vision::DecodeImage(images[i].bytes, mm.decode_limits);
      if (!decoded.ok()) return Bad(images[i].where, std::string(decoded.status().message()));
      if (mm.encoder == nullptr && mm.processor != nullptr) {
        const absl::Status resize = vision::CheckResizedSize(*mm.processor, mm.tower_image_size,
                                                             decoded->height, decoded->width);
        if (!resize.ok()) return Bad(images[i].where, std::string(resize.message()));
      }
      if (mm.encoder == nullptr) {
        // Encoded elsewhere (an encoder worker): only the bytes travel on.
        if (mm.checked != nullptr) mm.checked->Insert(mm_input.content_hash);
        mm_input.image = std::make_shared<const std::string>(images[i].bytes);
        out.push_back(std::move(mm_input));
        continue;
      }
      auto embeddings = mm.encoder->EncodeImage(*decoded);
      if (!embeddings.ok()) return Bad(images[i].where, std::string(embeddings.status().message()));
      mm_input.embeddings = std::make_shared<const std::vector<float>>(*std::move(embeddings));
      if (mm.encode_counters != nullptr) {
        mm.encode_counters->images.fetch_add(1, std::memory_order_relaxed);
        mm.encode_counters->micros.fetch_add(absl::ToInt64Microseconds(absl::Now() - start),
                                             std::memory_order_relaxed);
      }
      if (mm.cache != nullptr) mm.cache->Insert(mm_input.content_hash, mm_input.embeddings);
    }
    out.push_back(std::move(mm_input));
  }
  *prompt = std::move(expanded->token_ids);
  return out;
}

absl::StatusOr<int32_t> ParseLimitMmPerPrompt(const std::string& value) {
  const auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--limit-mm-per-prompt '", value, "': ", why));
  };
  int64_t n = -1;
  nlohmann::json j = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (!j.is_discarded() && j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() != "image") return bad(absl::StrCat("unsupported modality '", it.key(), "'"));
      if (!it->is_number_integer()) return bad("the image limit must be an integer");
      n = it->get<int64_t>();
    }
  } else {
    for (absl::string_view item : absl::StrSplit(value, ',', absl::SkipEmpty())) {
      std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, '=');
      const absl::string_view key = absl::StripAsciiWhitespace(kv.first);
      if (key != "image") return bad(absl::StrCat("unsupported modality '", key, "'"));
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(kv.second), &n)) {
        return bad("the image limit must be an integer");
      }
    }
  }
  if (n < 0 || n > 1024) return bad("the image limit must be in [0, 1024]");
  return static_cast<int32_t>(n);
}

}  // namespace sluice
