// ResponsesOutput: the `output` items of one /v1/responses generation, and, when streamed, the
// events that build them, in the shapes the official SDK accumulates
// (openai.lib.streaming.responses):
//   text        → a message item {type: "message", id: "msg_…", role: "assistant", status,
//                 content: [{type: "output_text", text, annotations: [], logprobs: []}]}
//                 events: output_item.added, content_part.added, output_text.delta…,
//                 output_text.done, content_part.done, output_item.done
//   a tool call → a function_call item {type: "function_call", id: "fc_…", call_id: "call_…",
//                 name, arguments, status}
//                 events: output_item.added (arguments ""), function_call_arguments.delta…,
//                 function_call_arguments.done, output_item.done
// Items come in output order, one open at a time: text, then the calls the model wrote after it.
// An output that ends without any item gets an empty message (as OpenAI's). The item open when
// the generation is cut by max_output_tokens ends with status "incomplete".
#ifndef SLUICE_SERVICES_API_RESPONSES_OUTPUT_H_
#define SLUICE_SERVICES_API_RESPONSES_OUTPUT_H_

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"

namespace sluice {

class ResponsesOutput {
 public:
  // Emit receives each stream event: its type and fields (without type / sequence_number).
  using Emit = std::function<void(const std::string& type, nlohmann::json fields)>;

  // `emit` may be null: the output is built without events (a non-streamed response).
  explicit ResponsesOutput(Emit emit = nullptr);

  // AddText appends output text (to the open message, else a new one).
  void AddText(std::string_view text);
  // AddToolCallDelta takes one chat-style delta.tool_calls entry (tool_calls/tool_call_output.h):
  // an entry with `id` opens a function_call item (call_id = id, function.name); every entry's
  // function.arguments text is appended to the call with its `index`.
  void AddToolCallDelta(const nlohmann::json& entry);
  // AddToolCalls adds a finished choice's message.tool_calls (non-streamed), in order.
  void AddToolCalls(const nlohmann::json& tool_calls);
  // Finish closes the open item ("incomplete" when `incomplete`). Idempotent.
  void Finish(bool incomplete);

  // The items as they stand (closed ones complete); after Finish, the Response's `output`.
  nlohmann::json Items() const;
  bool any_function_call() const { return !call_items_.empty(); }

 private:
  struct Item {
    nlohmann::json item;  // as in output_item.added, then updated
    std::string body;     // the message text or the call's arguments
    bool open = true;
  };
  void OpenMessage();
  void Close(bool incomplete);
  void Send(const std::string& type, nlohmann::json fields);
  nlohmann::json ItemJson(const Item& item) const;
  static nlohmann::json TextPart(const std::string& text);

  Emit emit_;
  std::vector<Item> items_;
  std::vector<size_t> call_items_;  // items_ index of each tool call (by its `index`)
  bool finished_ = false;
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_API_RESPONSES_OUTPUT_H_
