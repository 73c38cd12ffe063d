#include "services/api/responses_output.h"

#include <utility>

#include "services/api/openai_responses.h"

namespace sluice {

using nlohmann::json;

ResponsesOutput::ResponsesOutput(Emit emit) : emit_(std::move(emit)) {}

void ResponsesOutput::Send(const std::string& type, json fields) {
  if (emit_) emit_(type, std::move(fields));
}

json ResponsesOutput::TextPart(const std::string& text) {
  return json{{"type", "output_text"},
              {"text", text},
              {"annotations", json::array()},
              {"logprobs", json::array()}};
}

json ResponsesOutput::ItemJson(const Item& item) const {
  json out = item.item;
  if (out["type"] == "message") {
    out["content"] = item.open ? json::array() : json::array({TextPart(item.body)});
  } else {
    out["arguments"] = item.body;
  }
  return out;
}

void ResponsesOutput::OpenMessage() {
  Item item;
  item.item = json{{"type", "message"},
                   {"id", NewResponseId("msg_")},
                   {"status", "in_progress"},
                   {"role", "assistant"},
                   {"content", json::array()}};
  items_.push_back(std::move(item));
  const size_t index = items_.size() - 1;
  Send("response.output_item.added", {{"output_index", index}, {"item", ItemJson(items_.back())}});
  Send("response.content_part.added", {{"item_id", items_.back().item["id"]},
                                       {"output_index", index},
                                       {"content_index", 0},
                                       {"part", TextPart("")}});
}

void ResponsesOutput::AddText(std::string_view text) {
  if (text.empty() || finished_) return;
  if (items_.empty() || !items_.back().open || items_.back().item["type"] != "message") {
    Close(/*incomplete=*/false);
    OpenMessage();
  }
  Item& item = items_.back();
  item.body.append(text);
  Send("response.output_text.delta", {{"item_id", item.item["id"]},
                                      {"output_index", items_.size() - 1},
                                      {"content_index", 0},
                                      {"delta", std::string(text)},
                                      {"logprobs", json::array()}});
}

void ResponsesOutput::AddToolCallDelta(const json& entry) {
  if (finished_ || !entry.is_object()) return;
  const json function = entry.value("function", json::object());
  if (entry.contains("id")) {
    Close(/*incomplete=*/false);
    Item item;
    item.item = json{{"type", "function_call"},
                     {"id", NewResponseId("fc_")},
                     {"call_id", entry["id"]},
                     {"name", function.value("name", "")},
                     {"arguments", ""},
                     {"status", "in_progress"}};
    items_.push_back(std::move(item));
    call_items_.push_back(items_.size() - 1);
    Send("response.output_item.added",
         {{"output_index", items_.size() - 1}, {"item", ItemJson(items_.back())}});
  }
  const size_t call = entry.value("index", call_items_.size() - 1);
  const std::string arguments = function.value("arguments", "");
  if (call >= call_items_.size() || arguments.empty()) return;
  Item& item = items_[call_items_[call]];
  if (!item.open) return;  // calls stream in order: a closed one gets no more text
  item.body += arguments;
  Send("response.function_call_arguments.delta", {{"item_id", item.item["id"]},
                                                  {"output_index", call_items_[call]},
                                                  {"delta", arguments}});
}

void ResponsesOutput::AddToolCalls(const json& tool_calls) {
  for (size_t i = 0; i < tool_calls.size(); ++i) {
    const json& call = tool_calls[i];
    const json function = call.value("function", json::object());
    AddToolCallDelta({{"index", i},
                      {"id", call.value("id", "")},
                      {"type", "function"},
                      {"function", {{"name", function.value("name", "")}, {"arguments", ""}}}});
    AddToolCallDelta({{"index", i},
                      {"function", {{"arguments", function.value("arguments", "")}}}});
  }
}

void ResponsesOutput::Close(bool incomplete) {
  if (items_.empty() || !items_.back().open) return;
  Item& item = items_.back();
  const size_t index = items_.size() - 1;
  item.open = false;
  item.item["status"] = incomplete ? "incomplete" : "completed";
  if (item.item["type"] == "message") {
    const json where{{"item_id", item.item["id"]}, {"output_index", index}, {"content_index", 0}};
    json text_done = where;
    text_done["text"] = item.body;
    text_done["logprobs"] = json::array();
    Send("response.output_text.done", std::move(text_done));
    json part_done = where;
    part_done["part"] = TextPart(item.body);
    Send("response.content_part.done", std::move(part_done));
  } else {
    Send("response.function_call_arguments.done",
         {{"item_id", item.item["id"]}, {"output_index", index}, {"arguments", item.body}});
  }
  Send("response.output_item.done", {{"output_index", index}, {"item", ItemJson(item)}});
}

void ResponsesOutput::Finish(bool incomplete) {
  if (finished_) return;
  if (items_.empty()) OpenMessage();  // no text and no call: an empty message
  Close(incomplete);
  finished_ = true;
}

json ResponsesOutput::Items() const {
  json out = json::array();
  for (const Item& item : items_) out.push_back(ItemJson(item));
  return out;
}

}  // namespace sluice
