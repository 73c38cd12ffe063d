// Unit tests of the chat template render budget (engine/tokenizer/jinja/budget.h): hostile
// templates (huge strings, nested loops, recursive macros, quadratic builtins) stop with the
// exact error naming the limit, cancellation and the deadline stop a render, and a real
// template on a large conversation stays within the default budget.
#include <gtest/gtest.h>

#include <atomic>
#include <string>

#include "absl/time/clock.h"
#include "engine/tokenizer/chat_template.h"
#include "nlohmann/json.hpp"

namespace sluice {
namespace {

absl::StatusOr<std::string> Render(const std::string& source, const jinja::RenderLimits& limits,
                                   const std::string& context_json = "{}") {
  auto tmpl = ChatTemplate::Parse(source);
  if (!tmpl.ok()) return tmpl.status();
  return (*tmpl)->RenderOrdered(nlohmann::ordered_json::parse(context_json), limits);
}

void ExpectStatus(const absl::StatusOr<std::string>& rendered, absl::StatusCode code,
                  const std::string& message) {
  ASSERT_FALSE(rendered.ok()) << "unexpectedly rendered " << rendered->size() << " bytes";
  EXPECT_EQ(rendered.status().code(), code) << rendered.status();
  EXPECT_EQ(rendered.status().message(), message);
}

TEST(JinjaBudgetTest, HugeStringsPerIterationHitTheWorkBytes) {
  // 1000 x 1000 iterations under the iteration limit, but 100 KB built per iteration: the
  // default budget stops it after ~5000 of them instead of building 100 GB.
  ExpectStatus(Render("{% for i in range(1000) %}{% for j in range(1000) %}"
                      "{% set x = 'y' * 100000 %}{% endfor %}{% endfor %}",
                      jinja::RenderLimits()),
               absl::StatusCode::kInvalidArgument,
               "line 1: template exceeds its render budget of 536870912 bytes of work "
               "(max_work_bytes)");
}

TEST(JinjaBudgetTest, StringGrowthByConcatenationIsCharged) {
  jinja::RenderLimits limits;
  limits.max_work_bytes = 1 << 20;
  // 2000 steps of a growing string: about 2000^2 * 5 / 2 = 10 MB copied.
  ExpectStatus(Render("{% set ns = namespace(s='') %}{% for i in range(2000) %}"
                      "{% set ns.s = ns.s ~ 'abcde' %}{% endfor %}{{ ns.s | length }}",
                      limits),
               absl::StatusCode::kInvalidArgument,
               "line 1: template exceeds its render budget of 1048576 bytes of work "
               "(max_work_bytes)");
  // The same loop, 200 steps (100 KB copied), fits.
  auto rendered = Render(
      "{% set ns = namespace(s='') %}{% for i in range(200) %}"
      "{% set ns.s = ns.s ~ 'abcde' %}{% endfor %}{{ ns.s | length }}",
      limits);
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  EXPECT_EQ(*rendered, "1000");
}

TEST(JinjaBudgetTest, QuadraticSumFilterIsCharged) {
  // sum() of strings copies the running total each step: 100000 x 160 B would copy ~800 GB.
  ExpectStatus(Render("{{ (['x' * 160] * 100000) | sum(start='') }}", jinja::RenderLimits()),
               absl::StatusCode::kInvalidArgument,
               "line 1: template exceeds its render budget of 536870912 bytes of work "
               "(max_work_bytes)");
}

TEST(JinjaBudgetTest, DeepComparisonsAreCharged) {
  // `a == a` walks a million elements each time although `a` took 2000 to build.
  ExpectStatus(Render("{% set a = [range(1000) | list] * 1000 %}{% for i in range(10000) %}"
                      "{% if a == a %}{% endif %}{% endfor %}",
                      jinja::RenderLimits()),
               absl::StatusCode::kInvalidArgument,
               "line 1: template exceeds its render budget of 536870912 bytes of work "
               "(max_work_bytes)");
}

TEST(JinjaBudgetTest, NestedLoopsHitTheIterationLimit) {
  jinja::RenderLimits limits;
  limits.max_loop_iterations = 5000;
  ExpectStatus(Render("{% for i in range(100) %}{% for j in range(100) %}{% endfor %}"
                      "{% endfor %}",
                      limits),
               absl::StatusCode::kInvalidArgument,
               "line 1: template exceeds its render budget of 5000 loop iterations "
               "(max_loop_iterations)");
}

TEST(JinjaBudgetTest, ExpensiveLoopBodiesHitTheOperationLimit) {
  jinja::RenderLimits limits;
  limits.max_operations = 100000;
  // 1000 iterations (well under the iteration limit) of ~200 operations each.
  std::string body;
  for (int k = 0; k < 50; ++k) body += "{% if i > 1 and i < 0 %}{% endif %}";
  ExpectStatus(Render("{% for i in range(1000) %}" + body + "{% endfor %}", limits),
               absl::StatusCode::kInvalidArgument,
               "line 1: template exceeds its render budget of 100000 operations "
               "(max_operations)");
}

TEST(JinjaBudgetTest, ExponentialMacroRecursionHitsTheOperationLimit) {
  jinja::RenderLimits limits;
  limits.max_operations = 200000;
  // Depth 40 is within max_call_depth, but 2^40 calls are not.
  ExpectStatus(Render("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}"
                      "{% endmacro %}{{ f(40) }}",
                      limits),
               absl::StatusCode::kInvalidArgument,
               "line 1: template exceeds its render budget of 200000 operations "
               "(max_operations)");
}

TEST(JinjaBudgetTest, UnboundedMacroRecursionHitsTheCallDepth) {
  jinja::RenderLimits limits;
  limits.max_call_depth = 10;
  ExpectStatus(Render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", limits),
               absl::StatusCode::kInvalidArgument,
               "line 1: maximum recursion depth exceeded in macro call (max_call_depth 10)");
}

TEST(JinjaBudgetTest, OutputIsCappedByTheLimit) {
  jinja::RenderLimits limits;
  limits.max_output_bytes = 100;
  ExpectStatus(Render("{% for i in range(30) %}abcd{% endfor %}", limits),
               absl::StatusCode::kInvalidArgument,
               "line 1: rendered output exceeds the limit of 100 bytes (max_output_bytes)");
  auto rendered = Render("{% for i in range(25) %}abcd{% endfor %}", limits);
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  EXPECT_EQ(rendered->size(), 100u);
}

TEST(JinjaBudgetTest, CancelledRenderStops) {
  std::atomic<bool> cancelled{true};
  jinja::RenderLimits limits;
  limits.cancelled = &cancelled;
  // Polled at the first operation (a render cancelled while queued never starts), then every
  // few thousand.
  ExpectStatus(Render("{{ 1 + 1 }}", limits), absl::StatusCode::kCancelled,
               "line 1: template render cancelled");
  cancelled = false;
  limits.deadline = absl::Now() + absl::Hours(1);
  auto small = Render("{{ 1 + 1 }}", limits);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(*small, "2");
}

TEST(JinjaBudgetTest, RenderPastItsDeadlineStops) {
  jinja::RenderLimits limits;
  limits.deadline = absl::Now() - absl::Seconds(1);
  ExpectStatus(Render("{% for i in range(100000) %}{{ i }}{% endfor %}", limits),
               absl::StatusCode::kDeadlineExceeded, "line 1: template render passed its deadline");
}

// A Llama-3-style template (written for this test) on a conversation near the 8 MiB body
// limit renders within the default budget.
TEST(JinjaBudgetTest, RealTemplateOnLargeConversationFitsTheDefaultBudget) {
  const std::string source =
      "{{- bos_token }}{%- for message in messages %}"
      "{%- if message.role not in ['system', 'user', 'assistant'] %}"
      "{{- raise_exception('Unknown role: ' + message.role) }}{%- endif %}"
      "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
      "message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
      "{%- if add_generation_prompt %}"
      "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}";
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  const std::string content(1000, 'w');
  for (int i = 0; i < 7000; ++i) {
    messages.push_back({{"role", i % 2 == 0 ? "user" : "assistant"}, {"content", content}});
  }
  auto tmpl = ChatTemplate::Parse(source);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  auto rendered = (*tmpl)->RenderMessagesOrdered(messages, true, nlohmann::ordered_json::object(),
                                                 jinja::RenderLimits());
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  EXPECT_GT(rendered->size(), 7000u * 1000u);
}

}  // namespace
}  // namespace sluice
