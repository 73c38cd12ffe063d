// The transport seam between the OpenAI handlers and the HTTP server (or the offline batch
// runner, or a test): requests in, responses and Server-Sent Events out.
#ifndef SLUICE_SERVICES_COMMON_RESPONSE_SINK_H_
#define SLUICE_SERVICES_COMMON_RESPONSE_SINK_H_

#include <functional>
#include <string>

namespace sluice {

// HttpRequestInfo is one parsed HTTP request.
struct HttpRequestInfo {
  std::string method;  // "GET", "POST", ...
  std::string target;  // path with optional query, e.g. "/v1/models?x=1"
  std::string body;
  std::string authorization;  // the Authorization header ("" when absent)
};

// ResponseSink receives one response: either SendResponse once, or StartEventStream, any
// number of SendEvent, then EndEventStream. All calls are made on the executor the handler
// was given (see Poster), never concurrently. A sink whose client is gone ignores calls.
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  virtual void SendResponse(int status, const std::string& content_type, std::string body) = 0;
  // AddResponseHeader adds a header (e.g. Retry-After) to the response started next. Names
  // and values come from the server, never from the client. Sinks without headers ignore it.
  virtual void AddResponseHeader(const std::string& name, const std::string& value) {}
  // StartEventStream sends 200 with Content-Type text/event-stream (chunked transfer).
  virtual void StartEventStream() = 0;
  // SendEvent writes `event`, already framed ("data: ...\n\n").
  virtual void SendEvent(std::string event) = 0;
  virtual void EndEventStream() = 0;
};

// Poster runs a task on the request's executor (a connection's strand): engine callbacks come
// from the engine thread and hand their work over with it. It must not block.
using Poster = std::function<void(std::function<void()>)>;

// RequestHandle lets the transport cancel an in-flight request when its client goes away.
class RequestHandle {
 public:
  virtual ~RequestHandle() = default;
  // Cancel aborts the request's engine work; no more sink calls follow. Call on the executor.
  virtual void Cancel() = 0;
};

}  // namespace sluice

#endif  // SLUICE_SERVICES_COMMON_RESPONSE_SINK_H_
