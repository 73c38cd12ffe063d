// Unit tests of the Jinja interpreter behind ChatTemplate (engine/tokenizer/jinja_*).
//
// Expected strings are what Jinja2 3.1.6 renders for the same template and context in Hugging
// Face's environment (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
// HF's tojson and raise_exception); they were checked against that reference by hand. Contexts
// are parsed as ordered JSON so that dict key order is the one written here.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "engine/tokenizer/chat_template.h"
#include "nlohmann/json.hpp"

namespace sluice {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<std::string> Render(const std::string& source, const std::string& context_json) {
  auto tmpl = ChatTemplate::Parse(source);
  if (!tmpl.ok()) return tmpl.status();
  return (*tmpl)->RenderOrdered(nlohmann::ordered_json::parse(context_json));
}

void ExpectRender(const std::string& source, const std::string& context_json,
                  const std::string& expected) {
  auto rendered = Render(source, context_json);
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  EXPECT_EQ(*rendered, expected);
}

// ExpectError: rendering (or parsing) fails with InvalidArgument mentioning `substring`.
void ExpectError(const std::string& source, const std::string& context_json,
                 const std::string& substring) {
  auto rendered = Render(source, context_json);
  ASSERT_FALSE(rendered.ok()) << "unexpectedly rendered: " << *rendered;
  EXPECT_EQ(rendered.status().code(), absl::StatusCode::kInvalidArgument) << rendered.status();
  EXPECT_THAT(std::string(rendered.status().message()), HasSubstr(substring));
}

// ExpectRaised: the template's raise_exception(message) surfaces with exactly `message`.
void ExpectRaised(const std::string& source, const std::string& context_json,
                  const std::string& message) {
  auto rendered = Render(source, context_json);
  ASSERT_FALSE(rendered.ok()) << "unexpectedly rendered: " << *rendered;
  EXPECT_EQ(rendered.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rendered.status().message(), message);
}

// ---------------------------------------------------------------------------------------------
// Full chat templates in the style of Llama 3 and Qwen 2.5/3 (written for these tests).

constexpr char kLlamaStyle[] = R"J({{- bos_token }}
{%- if messages[0].role == 'system' %}
    {%- set system_message = messages[0].content | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = '' %}
{%- endif %}
{{- '<|start_header_id|>system<|end_header_id|>\n\n' }}
{%- if tools is not none %}
    {{- 'Environment: ipython\n' }}
{%- endif %}
{{- 'Today Date: ' + date_string + '\n\n' if date_string is defined else '' }}
{%- if tools is not none %}
    {{- 'You have access to these functions:\n\n' }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- '\n\n' }}
    {%- endfor %}
{%- endif %}
{{- system_message + '<|eot_id|>' }}
{%- for message in messages %}
    {%- if message.role in ['user', 'assistant'] and message.tool_calls is not defined %}
        {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + message.content | trim + '<|eot_id|>' }}
    {%- elif message.tool_calls is defined %}
        {%- if message.tool_calls | length != 1 %}
            {{- raise_exception('Only one tool call per message is supported.') }}
        {%- endif %}
        {%- set call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
        {{- '{"name": "' + call.name + '", "parameters": ' + call.arguments | tojson + '}' }}
        {{- '<|eot_id|>' }}
    {%- elif message.role in ['tool', 'ipython'] %}
        {{- '<|start_header_id|>ipython<|end_header_id|>\n\n' }}
        {%- if message.content is mapping %}{{ message.content | tojson }}{% else %}{{ message.content }}{% endif %}
        {{- '<|eot_id|>' }}
    {%- else %}
        {{- raise_exception('Unknown role: ' ~ message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
)J";

constexpr char kQwenStyle[] = R"J({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {{- messages[0].content + '\n\n' if messages[0].role == 'system' else 'You are a helpful assistant.\n\n' }}
    {{- '# Tools\n\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + tool | tojson }}
    {%- endfor %}
    {{- '\n</tools>\n\nReturn calls as <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant' }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls | default([]) %}
            {%- set fn = tool_call.function if tool_call.function is defined else tool_call %}
            {{- '\n<tool_call>\n{"name": "' + fn.name + '", "arguments": ' }}
            {{- fn.arguments if fn.arguments is string else fn.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
)J";

// ---------------------------------------------------------------------------------------------
// Template features (expected strings from Jinja2 3.1.6).

TEST(JinjaTest, TrimBlocksDropsNewlineAfterTag) {
  ExpectRender(R"J({% if true %}
yes
{% endif %}
after)J",
               R"J({})J",
               "yes\n"
               "after");
}

TEST(JinjaTest, LstripBlocksDropsIndentBeforeTag) {
  ExpectRender(R"J(  {% if true %}
  x
  {% endif %}
y)J",
               R"J({})J",
               "  x\n"
               "y");
}

TEST(JinjaTest, LstripBlocksKeepsTextBeforeTagOnSameLine) {
  ExpectRender(R"J(a {% if true %}b{% endif %} c)J", R"J({})J", "a b c");
}

TEST(JinjaTest, DashStripsWhitespaceOnBothSides) {
  ExpectRender(R"J(a  
  {%- if true -%}  
 b {%- endif %})J",
               R"J({})J", "ab");
}

TEST(JinjaTest, DashOnExpressionTags) {
  ExpectRender(R"J(a {{- 'b' -}} 
 c)J",
               R"J({})J", "abc");
}

TEST(JinjaTest, ExpressionTagsAreNotTrimmed) {
  ExpectRender(R"J({{ 'a' }}
b
    {{ 'c' }})J",
               R"J({})J",
               "a\n"
               "b\n"
               "    c");
}

TEST(JinjaTest, PlusDisablesLstripBlocks) {
  ExpectRender(R"J(  {%+ if true %}x{% endif %})J", R"J({})J", "  x");
}

TEST(JinjaTest, CommentsAreRemovedAndTrimmed) {
  ExpectRender(R"J(a
  {# note #}
b{#- x -#}  c)J",
               R"J({})J",
               "a\n"
               "bc");
}

TEST(JinjaTest, RawBlockIsLiteral) {
  ExpectRender(R"J({% raw %}{{ x }}{% if %}{% endraw %}!)J", R"J({})J", "{{ x }}{% if %}!");
}

TEST(JinjaTest, SingleTrailingNewlineDropped) {
  ExpectRender(R"J(a

)J",
               R"J({})J", "a\n");
}

TEST(JinjaTest, NewlinesNormalized) {
  ExpectRender(
      "a\r\n"
      "b\rc",
      R"J({})J",
      "a\n"
      "b\n"
      "c");
}

TEST(JinjaTest, NestedBlocksIndentation) {
  ExpectRender(
      R"J({% for m in messages %}
    {% if m.role == 'user' %}
        U:{{ m.content }}
    {% else %}
        O:{{ m.role }}
    {% endif %}
{% endfor %})J",
      R"J({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]})J",
      "        O:system\n"
      "        U:Hi there\n"
      "        O:assistant\n"
      "        U:Bye\n");
}

TEST(JinjaTest, StringEscapes) {
  ExpectRender(R"J({{ "tab\tq\"\u00e9\x41\\n" ~ 'it\'s' }})J", R"J({})J", "tab\tq\"éA\\nit's");
}

TEST(JinjaTest, AdjacentStringLiteralsConcatenate) {
  ExpectRender(R"J({{ 'a' "b" 'c' }})J", R"J({})J", "abc");
}

TEST(JinjaTest, PrintsPythonReprs) {
  ExpectRender(
      R"J({{ none }}|{{ true }}|{{ False }}|{{ [1, 'a', "b'c", none, 2.5] }}|{{ {'k': (1,), 'e': ()} }}|{{ (1, 'x') }})J",
      R"J({})J", "None|True|False|[1, 'a', \"b'c\", None, 2.5]|{'k': (1,), 'e': ()}|(1, 'x')");
}

TEST(JinjaTest, FloatFormattingMatchesPython) {
  ExpectRender(
      R"J({{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 1/3 }} {{ -2.5e-7 }} {{ 100.0 * 3 }} {{ 1_000 }})J",
      R"J({})J",
      "1.0 0.30000000000000004 1e+16 1000000000000000.0 0.0001 1e-05 0.3333333333333333 -2.5e-07 "
      "300.0 1000");
}

TEST(JinjaTest, UndefinedPrintsEmpty) {
  ExpectRender(R"J([{{ missing }}][{{ d.nokey }}][{{ d['nokey'] }}][{{ l[10] }}])J",
               R"J({"d": {"a": 1}, "l": [1]})J", "[][][][]");
}

TEST(JinjaTest, Arithmetic) {
  ExpectRender(
      R"J({{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 1.5 + 1 }} {{ -7.5 // 2 }} {{ 7.5 % 2 }} {{ -(3) }} {{ true + 1 }})J",
      R"J({})J", "7 9 3 -4 1 2 1024 3.5 2.0 2.5 -4.0 1.5 -3 2");
}

TEST(JinjaTest, StringAndListOperators) {
  ExpectRender(
      R"J({{ 'ab' + 'cd' }} {{ 'ab' ~ 1 ~ none ~ true }} {{ 'x' * 3 }} {{ [1] + [2, 3] }} {{ [0] * 3 }} {{ 2 * 'yo' }})J",
      R"J({})J", "abcd ab1NoneTrue xxx [1, 2, 3] [0, 0, 0] yoyo");
}

TEST(JinjaTest, ComparisonsAndLogic) {
  ExpectRender(
      R"J({{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ true == 1 }} {{ [1, 2] == [1, 2] }} {{ {'a': 1} == {'a': 1} }} {{ 1 != 2 }} {{ not 0 }} {{ 0 or 'x' }} {{ 'y' and 0 }} {{ none or [] }} {{ missing == none }})J",
      R"J({})J", "True False True True True True True True True x 0 [] False");
}

TEST(JinjaTest, InOperator) {
  ExpectRender(
      R"J({{ 1 in l }} {{ 9 not in l }} {{ 'ell' in 'hello' }} {{ 'a' in d }} {{ 'z' in d }} {{ 'x' in missing }})J",
      R"J({"l": [1, 2], "d": {"a": 1}})J", "True True True True False False");
}

TEST(JinjaTest, ConditionalExpression) {
  ExpectRender(
      R"J({{ 'y' if flag else 'n' }} {{ 'y' if not flag else 'n' }} [{{ 'only' if not flag }}] {{ 1 if false else 2 if false else 3 }})J",
      R"J({"flag": true})J", "y n [] 3");
}

TEST(JinjaTest, SlicingListsAndStrings) {
  ExpectRender(
      R"J({{ l[1:] }} {{ l[:-1] }} {{ l[::-1] }} {{ l[::2] }} {{ l[-2:] }} {{ l[5:] }} {{ s[1:4] }} {{ s[::-1] }} {{ s[-1] }} {{ u[1:3] }} {{ u[::-1] }})J",
      R"J({"l": [1, 2, 3, 4], "s": "hello", "u": "héllo wörld"})J",
      "[2, 3, 4] [1, 2, 3] [4, 3, 2, 1] [1, 3] [3, 4] [] ell olleh o él dlröw olléh");
}

TEST(JinjaTest, AttributeAndItemAccess) {
  ExpectRender(
      R"J({{ m.role }} {{ m['role'] }} {{ m.meta.tags[1] }} {{ m['meta']['tags'][-1] }} {{ l.0 }} {{ m.missing is defined }} {{ m['missing'] is undefined }})J",
      R"J({"m": {"role": "user", "meta": {"tags": ["a", "b", "c"]}}, "l": ["zero"]})J",
      "user user b c zero False True");
}

TEST(JinjaTest, IfElifElse) {
  ExpectRender(
      R"J({% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %};{% endfor %})J",
      R"J({})J", "one;two;many;");
}

TEST(JinjaTest, LoopVariables) {
  ExpectRender(
      R"J({% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}:{{ m.role }};{% endfor %})J",
      R"J({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]})J",
      "1043TrueFalse4:system;2132FalseFalse4:user;3221FalseFalse4:assistant;4310FalseTrue4:user;");
}

TEST(JinjaTest, LoopPrevNextItemAndCycle) {
  ExpectRender(
      R"J({% for x in [1, 2, 3] %}[{{ loop.previtem }}|{{ loop.nextitem }}|{{ loop.cycle('odd', 'even') }}]{% endfor %})J",
      R"J({})J", "[|2|odd][1|3|even][2||odd]");
}

TEST(JinjaTest, LoopFilterAndElse) {
  ExpectRender(
      R"J({% for m in messages if m.role == 'user' %}{{ loop.index }}/{{ loop.length }}={{ m.content }};{% endfor %}{% for x in [] %}x{% else %}empty{% endfor %}{% for x in [1] if x > 5 %}x{% else %}none-kept{% endfor %})J",
      R"J({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]})J",
      "1/2=Hi there;2/2=Bye;emptynone-kept");
}

TEST(JinjaTest, LoopOverDictStringAndItems) {
  ExpectRender(
      R"J({% for k in d %}{{ k }}{% endfor %}|{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for k, v in d|items %}{{ k }}{% endfor %}|{% for c in 'ab' %}{{ c }}.{% endfor %}|{% for a, b in [[1, 2], (3, 4)] %}{{ a + b }}{% endfor %})J",
      R"J({"d": {"z": 1, "a": 2, "m": 3}})J", "zam|z=1;a=2;m=3;|zam|a.b.|37");
}

TEST(JinjaTest, BreakAndContinue) {
  ExpectRender(
      R"J({% for i in range(10) %}{% if i is even %}{% continue %}{% endif %}{% if i > 6 %}{% break %}{% endif %}{{ i }}{% endfor %})J",
      R"J({})J", "135");
}

TEST(JinjaTest, LoopScopeDoesNotLeak) {
  ExpectRender(
      R"J({% set x = 'outer' %}{% for i in [1, 2] %}{{ x }}{% set x = i %}{{ x }};{% endfor %}{{ x }}|{% for i in [1] %}{% set inner = 1 %}{% endfor %}{{ inner is defined }})J",
      R"J({})J", "outer1;outer2;outer|False");
}

TEST(JinjaTest, IfDoesNotCreateScope) {
  ExpectRender(R"J({% if true %}{% set y = 5 %}{% endif %}{{ y }})J", R"J({})J", "5");
}

TEST(JinjaTest, NamespaceCarriesStateOutOfLoops) {
  ExpectRender(
      R"J({% set ns = namespace(found=false, count=0, items=[]) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.found = true %}{% set ns.items = ns.items + [m.content] %}{% endif %}{% set ns.count = ns.count + 1 %}{% endfor %}{{ ns.found }} {{ ns.count }} {{ ns.items }})J",
      R"J({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]})J",
      "True 4 ['Hi there', 'Bye']");
}

TEST(JinjaTest, SetTupleAndBlockSet) {
  ExpectRender(R"J({% set a, b = 1, 'two' %}{{ a }}{{ b }}{% set block %}A={{ a }}
{% endset %}[{{ block }}]{% set up | upper | trim %}  shout {% endset %}[{{ up }}])J",
               R"J({})J",
               "1two[A=1\n"
               "][SHOUT]");
}

TEST(JinjaTest, MacroWithDefaultsAndKeywords) {
  ExpectRender(
      R"J({% macro tag(name, body='', close=true) %}<{{ name }}>{{ body }}{% if close %}</{{ name }}>{% endif %}{% endmacro %}{{ tag('a') }}{{ tag('b', 'x') }}{{ tag('c', close=false, body='y') }}{{ tag('d')|upper }})J",
      R"J({})J", "<a></a><b>x</b><c>y<D></D>");
}

TEST(JinjaTest, MacroRecursion) {
  ExpectRender(
      R"J({% macro walk(node) %}{{ node.name }}{% if node.children %}({% for c in node.children %}{{ walk(c) }}{% if not loop.last %},{% endif %}{% endfor %}){% endif %}{% endmacro %}{{ walk(tree) }})J",
      R"J({"tree": {"name": "r", "children": [{"name": "a", "children": []}, {"name": "b", "children": [{"name": "c"}]}]}})J",
      "r(a,b(c))");
}

TEST(JinjaTest, MacroSeesGlobalsNotCallerLocals) {
  ExpectRender(
      R"J({% macro show() %}{{ g }}-{{ local is defined }}{% endmacro %}{% for local in [1] %}{{ show() }}{% endfor %})J",
      R"J({"g": "G"})J", "G-False");
}

TEST(JinjaTest, CallBlockPassesCaller) {
  ExpectRender(
      R"J({% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}inside {{ 1 + 1 }}{% endcall %})J",
      R"J({})J", "<b>inside 2</b>");
}

TEST(JinjaTest, GenerationBlockRendersBody) {
  ExpectRender(
      R"J({% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% endif %}{% endfor %})J",
      R"J({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]})J",
      "Hello!");
}

TEST(JinjaTest, FilterBlock) {
  ExpectRender(R"J({% filter upper %}hello {{ 'world' }}{% endfilter %})J", R"J({})J",
               "HELLO WORLD");
}

TEST(JinjaTest, StringFilters) {
  ExpectRender(
      R"J({{ s|trim }}|{{ 'xxhixx'|trim('x') }}|{{ s|upper }}|{{ s|lower }}|{{ 'hello wORLD'|capitalize }}|{{ "hello wORLD-foo (bar) it's"|title }}|{{ s|length }}|{{ 'héllo'|count }}|{{ 'aaa'|replace('a', 'b') }}|{{ 'aaa'|replace('a', 'b', 2) }}|{{ 42|string ~ '!' }}|{{ 'a<b>&"\''|e }}|{{ 'x'|safe }})J",
      R"J({"s": "  Hello World  "})J",
      "Hello World|hi|  HELLO WORLD  |  hello world  |Hello world|Hello World-Foo (Bar) "
      "It's|15|5|bbb|bba|42!|a&lt;b&gt;&amp;&#34;&#39;|x");
}

TEST(JinjaTest, DefaultFilter) {
  ExpectRender(
      R"J({{ missing|default('d') }} {{ missing|d('short') }} {{ none|default('n') }} {{ ''|default('empty', true) }} {{ 0|default(5, boolean=true) }} {{ 'set'|default('x') }} [{{ missing|default }}])J",
      R"J({})J", "d short None empty 5 set []");
}

TEST(JinjaTest, ListFilters) {
  ExpectRender(
      R"J({{ l|length }} {{ l|first }} {{ l|last }} {{ l|join(', ') }} {{ l|join }} {{ l|sort }} {{ l|sort(reverse=true) }} {{ l|reverse|list }} {{ l|unique|list }} {{ l|sum }} {{ l|min }} {{ l|max }} {{ 'ab'|list }} {{ d|list }} {{ []|first is defined }})J",
      R"J({"l": [3, 1, 2, 3], "d": {"k": 1, "j": 2}})J",
      "4 3 3 3, 1, 2, 3 3123 [1, 2, 3, 3] [3, 3, 2, 1] [3, 2, 1, 3] [3, 1, 2] 9 1 3 ['a', 'b'] "
      "['k', 'j'] False");
}

TEST(JinjaTest, CaseInsensitiveSortAndUnique) {
  ExpectRender(
      R"J({{ w|sort }} {{ w|sort(case_sensitive=true) }} {{ w|unique|list }} {{ w|unique(case_sensitive=true)|list }} {{ w|max }} {{ w|min }})J",
      R"J({"w": ["b", "A", "a", "C"]})J",
      "['A', 'a', 'b', 'C'] ['A', 'C', 'a', 'b'] ['b', 'A', 'C'] ['b', 'A', 'a', 'C'] C A");
}

TEST(JinjaTest, AttributeFilters) {
  ExpectRender(
      R"J({{ users|map(attribute='name')|join(',') }} {{ users|sort(attribute='age')|map(attribute='name')|list }} {{ users|selectattr('admin')|map(attribute='name')|list }} {{ users|rejectattr('admin')|map(attribute='name')|list }} {{ users|selectattr('age', 'gt', 30)|map(attribute='name')|list }} {{ users|selectattr('name', 'equalto', 'bo')|list|length }} {{ users|map(attribute='nick', default='-')|list }} {{ users|sum(attribute='age') }} {{ users|join('/', attribute='name') }})J",
      R"J({"users": [{"name": "bo", "age": 40, "admin": true}, {"name": "al", "age": 25}, {"name": "cy", "age": 31, "admin": false}]})J",
      "bo,al,cy ['al', 'cy', 'bo'] ['bo'] ['al', 'cy'] ['bo', 'cy'] 1 ['-', '-', '-'] 96 bo/al/cy");
}

TEST(JinjaTest, SelectRejectMap) {
  ExpectRender(
      R"J({{ l|select('odd')|list }} {{ l|reject('odd')|list }} {{ l|select|list }} {{ l|select('greaterthan', 2)|list }} {{ l|map('string')|join('-') }} {{ ['a', 'b']|map('upper')|list }} {{ l|select('in', [1, 4])|list }})J",
      R"J({"l": [0, 1, 2, 3, 4]})J",
      "[1, 3] [0, 2, 4] [1, 2, 3, 4] [3, 4] 0-1-2-3-4 ['A', 'B'] [1, 4]");
}

TEST(JinjaTest, ItemsAndDictsort) {
  ExpectRender(
      R"J({{ d|items|list }} {{ d|dictsort }} {{ d|dictsort(by='value') }} {{ d|dictsort(reverse=true) }})J",
      R"J({"d": {"b": 1, "a": 3, "c": 2}})J",
      "[('b', 1), ('a', 3), ('c', 2)] [('a', 3), ('b', 1), ('c', 2)] [('b', 1), ('c', 2), ('a', "
      "3)] [('c', 2), ('b', 1), ('a', 3)]");
}

TEST(JinjaTest, NumberFilters) {
  ExpectRender(
      R"J({{ -3|abs }} {{ 2.567|round(2) }} {{ 2.5|round }} {{ 3.5|round }} {{ 3|round }} {{ 2.4|round(0, 'ceil') }} {{ 2.6|round(0, 'floor') }} {{ '42'|int }} {{ ' 7 '|int }} {{ '4.7'|int }} {{ 'x'|int(-1) }} {{ 3.9|int }} {{ '3.5'|float }} {{ 3|float }} {{ 'bad'|float }})J",
      R"J({})J", "3 2.57 2.0 4.0 3 3.0 2.0 42 7 4 -1 3 3.5 3.0 0.0");
}

TEST(JinjaTest, TojsonMatchesPythonJsonDumps) {
  ExpectRender(
      R"J({{ v|tojson }}
{{ v|tojson(indent=2) }}
{{ v|tojson(sort_keys=true) }}
{{ 'é "q" \n'|tojson }}
{{ []|tojson(indent=2) }}{{ {}|tojson(indent=2) }})J",
      R"J({"v": {"name": "f", "args": {"z": 1, "a": [1.5, null, true, "x"]}, "e": {}, "l": []}})J",
      "{\"name\": \"f\", \"args\": {\"z\": 1, \"a\": [1.5, null, true, \"x\"]}, \"e\": {}, \"l\": "
      "[]}\n"
      "{\n"
      "  \"name\": \"f\",\n"
      "  \"args\": {\n"
      "    \"z\": 1,\n"
      "    \"a\": [\n"
      "      1.5,\n"
      "      null,\n"
      "      true,\n"
      "      \"x\"\n"
      "    ]\n"
      "  },\n"
      "  \"e\": {},\n"
      "  \"l\": []\n"
      "}\n"
      "{\"args\": {\"a\": [1.5, null, true, \"x\"], \"z\": 1}, \"e\": {}, \"l\": [], \"name\": "
      "\"f\"}\n"
      "\"é \\\"q\\\" \\n\"\n"
      "[]{}");
}

TEST(JinjaTest, TojsonOfToolSchemaWithIndent4) {
  ExpectRender(
      R"J({% for t in tools %}{{ t|tojson(indent=4) }}

{% endfor %})J",
      R"J({"tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather ☀", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}}, "required": ["city"]}}}]})J",
      "{\n"
      "    \"type\": \"function\",\n"
      "    \"function\": {\n"
      "        \"name\": \"get_weather\",\n"
      "        \"description\": \"Get the weather ☀\",\n"
      "        \"parameters\": {\n"
      "            \"type\": \"object\",\n"
      "            \"properties\": {\n"
      "                \"city\": {\n"
      "                    \"type\": \"string\"\n"
      "                },\n"
      "                \"days\": {\n"
      "                    \"type\": \"integer\",\n"
      "                    \"minimum\": 1\n"
      "                }\n"
      "            },\n"
      "            \"required\": [\n"
      "                \"city\"\n"
      "            ]\n"
      "        }\n"
      "    }\n"
      "}\n"
      "\n");
}

TEST(JinjaTest, IndentCenterWordcountBatch) {
  ExpectRender(
      R"J({{ text|indent(2) }}|{{ text|indent(2, true) }}|{{ text|indent('> ', first=true, blank=true) }}|{{ 'ab'|center(6) }}|{{ 'one two  three'|wordcount }}|{{ [1, 2, 3]|batch(2)|list }})J",
      R"J({"text": "a\n\nb\nc"})J",
      "a\n"
      "\n"
      "  b\n"
      "  c|  a\n"
      "\n"
      "  b\n"
      "  c|> a\n"
      "> \n"
      "> b\n"
      "> c|  ab  |3|[[1, 2], [3]]");
}

TEST(JinjaTest, IsTests) {
  ExpectRender(
      R"J({{ x is defined }}{{ missing is defined }}{{ missing is undefined }}{{ none is none }}{{ 's' is string }}{{ 1 is number }}{{ 1.5 is number }}{{ 1 is integer }}{{ 1.0 is integer }}{{ 1.0 is float }}{{ d is mapping }}{{ l is mapping }}{{ l is iterable }}{{ 's' is iterable }}{{ 1 is iterable }}{{ l is sequence }}{{ true is boolean }}{{ 1 is boolean }}{{ true is true }}{{ 1 is true }}{{ false is false }})J",
      R"J({"x": 1, "d": {}, "l": []})J",
      "TrueFalseTrueTrueTrueTrueTrueTrueFalseTrueTrueFalseTrueTrueFalseTrueTrueFalseTrueFalseTrue");
}

TEST(JinjaTest, IsTestsWithArguments) {
  ExpectRender(
      R"J({{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }}{{ 1 is eq 1 }}{{ 1 is ne 2 }}{{ 2 is lt 3 }}{{ 3 is ge 3 }}{{ 2 is gt 3 }}{{ 2 is in [1, 2] }}{{ 'abc' is lower }}{{ 'ABC' is upper }}{{ l is sameas l }}{{ 'x' is not string }}{{ not 'x' is string }}{{ range is callable }})J",
      R"J({"l": [1]})J", "TrueTrueTrueFalseTrueTrueTrueTrueFalseTrueTrueTrueTrueFalseFalseTrue");
}

TEST(JinjaTest, StringMethods) {
  ExpectRender(
      R"J({{ '  x  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  x '.lstrip() }}|{{ ' x  '.rstrip() }}|{{ '\n\nx\n'.strip('\n') }}|{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}|{{ 'a b  c '.split() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}|{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}|{{ 'aXa'.replace('a', 'b') }}|{{ "they're bill's".title() }}|{{ 'hELLO'.capitalize() }}|{{ 'hello'.find('l') }}{{ 'hello'.rfind('l') }}{{ 'hello'.find('z') }}|{{ 'héllo'.find('l') }}|{{ 'a-b'.count('-') }}|{{ ', '.join(['x', 'y']) }}|{{ 'l1\nl2\r\nl3'.splitlines() }}|{{ '42'.isdigit() }}{{ 'a1'.isalpha() }})J",
      R"J({})J",
      "x|hi|x | x|x|TrueTrue|['a', 'b', 'c']|['a', 'b', '', 'c']|['a', 'b,c']|['a,b', "
      "'c']|ABab|bXb|They'Re Bill'S|Hello|23-1|2|1|x, y|['l1', 'l2', 'l3']|TrueFalse");
}

TEST(JinjaTest, ThinkingSplitLikeQwen) {
  ExpectRender(
      R"J({% set c = content.split('</think>')[-1].lstrip('\n') %}{% set r = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}[{{ r }}][{{ c }}])J",
      R"J({"content": "<think>\nplan it\n</think>\n\nThe answer."})J", "[plan it][The answer.]");
}

TEST(JinjaTest, DictMethods) {
  ExpectRender(
      R"J({{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 'dv') }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }} {{ d['items'] is defined }})J",
      R"J({"d": {"b": 2, "a": 1}})J", "1 None dv ['b', 'a'] [2, 1] [('b', 2), ('a', 1)] True");
}

TEST(JinjaTest, RangeNamespaceDict) {
  ExpectRender(
      R"J({{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ range(5, 0, -2)|list }} {{ range(0)|list }} {{ dict(a=1, b='x') }} {{ namespace(a=1).a }} {{ namespace({'k': 2}).k }})J",
      R"J({})J", "[0, 1, 2] [1, 3, 5] [5, 3, 1] [] {'a': 1, 'b': 'x'} 1 2");
}

TEST(JinjaTest, PercentFormatting) {
  ExpectRender(
      R"J({{ '%s-%d' % ('a', 3) }}|{{ '%5.2f|%-4s|%04d|%x|%%|%r' % (3.14159, 'ab', 42, 255, 'q') }}|{{ '%(n)s!' % d }})J",
      R"J({"d": {"n": "v"}})J", "a-3| 3.14|ab  |0042|ff|%|'q'|v!");
}

TEST(JinjaTest, TojsonOptions) {
  ExpectRender(
      R"J({{ v|tojson(ensure_ascii=true) }} {{ v|tojson(separators=(',', ':')) }} {{ [1, [2]]|tojson(indent='\t') }})J",
      R"J({"v": {"s": "é☀😀\u0001", "n": [1, 2.0]}})J",
      "{\"s\": \"\\u00e9\\u2600\\ud83d\\ude00\\u0001\", \"n\": [1, 2.0]} "
      "{\"s\":\"é☀😀\\u0001\",\"n\":[1,2.0]} [\n"
      "\t1,\n"
      "\t[\n"
      "\t\t2\n"
      "\t]\n"
      "]");
}

TEST(JinjaTest, MacroAssignmentsStayLocal) {
  ExpectRender(
      R"J({% set x = 1 %}{% macro m() %}[{{ x }}]{% set x = 2 %}[{{ x }}]{% if y is not defined %}{% set y = 'd' %}{% endif %}{{ y }}{% endmacro %}{{ m() }}{{ x }}{{ y is defined }})J",
      R"J({})J", "[1][2]d1False");
}

TEST(JinjaTest, NestedLoopsHaveTheirOwnLoopVariable) {
  ExpectRender(
      R"J({% for i in [1, 2] %}{% for j in [3, 4] %}{{ loop.index }}{{ i }}{{ j }} {% endfor %}{{ loop.index }};{% endfor %}{{ loop is defined }})J",
      R"J({})J", "113 214 1;123 224 2;False");
}

TEST(JinjaTest, ReassigningIterableInsideLoop) {
  ExpectRender(
      R"J({% set items = [1, 2, 3] %}{% for i in items %}{% set items = [9] %}{{ items }}{% endfor %}{{ items }})J",
      R"J({})J", "[9][9][9][1, 2, 3]");
}

TEST(JinjaTest, DeepAccessAndPrecedence) {
  ExpectRender(
      R"J({% set m = {'a': {'b': [1, {'c': 'deep'}]}} %}{{ m.a.b[1].c }}{{ m['a']['b'][-1]['c'] }}{{ m.a.b.1.c }} {{ 10 // 3 * 3 + 10 % 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 1 - -1 }} {{ not 1 == 2 }} {{ -1|abs }})J",
      R"J({})J", "deepdeepdeep 10 64 4 2 True 1");
}

TEST(JinjaTest, StrftimeNow) {
  ExpectRender(R"J({{ strftime_now('%%') }}{{ strftime_now('%Y')|length }})J", R"J({})J", "%4");
}

TEST(JinjaTest, SyntaxErrorReportsLine) {
  // Jinja2: TemplateSyntaxError: Expected an expression, got 'end of statement block'
  ExpectError(R"J(line1
{{ ok }}
{% if %}
)J",
              R"J({})J", "line 3");
}

TEST(JinjaTest, UnknownTag) {
  // Jinja2: TemplateSyntaxError: Encountered unknown tag 'frobnicate'.
  ExpectError(R"J({% frobnicate %})J", R"J({})J", "unknown tag 'frobnicate'");
}

TEST(JinjaTest, UnknownFilterIsRejectedAtParse) {
  // Jinja2: TemplateAssertionError: No filter named 'nosuch'.
  ExpectError(R"J({{ x|nosuch }})J", R"J({})J", "No filter named 'nosuch'");
}

TEST(JinjaTest, UnknownTestIsRejectedAtParse) {
  // Jinja2: TemplateAssertionError: No test named 'nosuch'.
  ExpectError(R"J({{ x is nosuch }})J", R"J({})J", "No test named 'nosuch'");
}

TEST(JinjaTest, UnclosedForLoop) {
  // Jinja2: TemplateSyntaxError: Unexpected end of template. Jinja was looking for the following
  // tags: 'endfor' or 'else'. The innermost block that needs to be cl
  ExpectError(R"J({% for x in y %}body)J", R"J({})J", "endfor");
}

TEST(JinjaTest, UnclosedPrintStatement) {
  // Jinja2: TemplateSyntaxError: unexpected end of template, expected 'end of print statement'.
  ExpectError(R"J({{ x )J", R"J({})J", "line 1");
}

TEST(JinjaTest, UnterminatedComment) {
  // Jinja2: TemplateSyntaxError: Missing end of comment tag
  ExpectError(R"J(a {# b)J", R"J({})J", "comment");
}

TEST(JinjaTest, UnbalancedBracket) {
  // Jinja2: TemplateSyntaxError: unexpected '}', expected ')'
  ExpectError(R"J({{ (1 + 2 }})J", R"J({})J", "line 1");
}

TEST(JinjaTest, UndefinedVariableAttribute) {
  // Jinja2: UndefinedError: 'missing' is undefined
  ExpectError(R"J({{ missing.attr }})J", R"J({})J", "'missing' is undefined");
}

TEST(JinjaTest, MethodOnMissingKey) {
  // Jinja2: UndefinedError: 'dict object' has no attribute 'content'
  ExpectError(R"J({{ m.content.strip() }})J", R"J({"m": {}})J",
              "'dict object' has no attribute 'content'");
}

TEST(JinjaTest, StrPlusInt) {
  // Jinja2: TypeError: can only concatenate str (not "int") to str
  ExpectError(R"J({{ 'a' + 1 }})J", R"J({})J", "can only concatenate str (not \"int\") to str");
}

TEST(JinjaTest, DivisionByZeroHasLine) {
  // Jinja2: ZeroDivisionError: division by zero
  ExpectError(R"J(a

{{ 1 / 0 }})J",
              R"J({})J", "line 3: division by zero");
}

TEST(JinjaTest, SandboxRefusesMutation) {
  // Jinja2: SecurityError: access to attribute 'append' of 'list' object is unsafe.
  ExpectError(R"J({{ l.append(1) }})J", R"J({"l": []})J", "unsafe");
}

TEST(JinjaTest, UnpackMismatch) {
  // Jinja2: ValueError: too many values to unpack (expected 2)
  ExpectError(R"J({% for a, b in [[1, 2, 3]] %}{% endfor %})J", R"J({})J",
              "too many values to unpack");
}

TEST(JinjaTest, NotIterable) {
  // Jinja2: TypeError: 'int' object is not iterable
  ExpectError(R"J({% for x in 5 %}{% endfor %})J", R"J({})J", "'int' object is not iterable");
}

TEST(JinjaTest, RangeTooBig) {
  // Jinja2: OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).
  ExpectError(R"J({{ range(1000000)|length }})J", R"J({})J", "Range too big");
}

TEST(JinjaTest, AssignAttributeOnNonNamespace) {
  // Jinja2: TemplateRuntimeError: cannot assign attribute on non-namespace object
  ExpectError(R"J({% set d = {} %}{% set d.x = 1 %})J", R"J({})J", "non-namespace");
}

TEST(JinjaTest, IncomparableTypes) {
  // Jinja2: TypeError: '<' not supported between instances of 'int' and 'str'
  ExpectError(R"J({{ 1 < 'a' }})J", R"J({})J",
              "not supported between instances of 'int' and 'str'");
}

TEST(JinjaTest, TojsonOfUndefined) {
  // Jinja2: TypeError: Object of type Undefined is not JSON serializable
  ExpectError(R"J({{ missing|tojson }})J", R"J({})J", "not JSON serializable");
}

TEST(JinjaTest, CallingNonCallable) {
  // Jinja2: TypeError: 'str' object is not callable
  ExpectError(R"J({{ s() }})J", R"J({"s": "x"})J", "not callable");
}

TEST(JinjaTest, LlamaStyleTemplateWithTools) {
  ExpectRender(
      kLlamaStyle,
      R"J({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather", "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "City, e.g. Zürich"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["location"]}}}], "documents": null, "date_string": "26 Jul 2024", "messages": [{"role": "system", "content": "You are a weather bot."}, {"role": "user", "content": "Weather in Zürich?"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"location": "Zürich", "unit": "celsius"}}}]}, {"role": "tool", "content": "{\"temperature\": 21.5}"}, {"role": "assistant", "content": "It is 21.5 °C."}], "add_generation_prompt": true})J",
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n"
      "\n"
      "Environment: ipython\n"
      "Today Date: 26 Jul 2024\n"
      "\n"
      "You have access to these functions:\n"
      "\n"
      "{\n"
      "    \"type\": \"function\",\n"
      "    \"function\": {\n"
      "        \"name\": \"get_weather\",\n"
      "        \"description\": \"Get the current weather\",\n"
      "        \"parameters\": {\n"
      "            \"type\": \"object\",\n"
      "            \"properties\": {\n"
      "                \"location\": {\n"
      "                    \"type\": \"string\",\n"
      "                    \"description\": \"City, e.g. Zürich\"\n"
      "                },\n"
      "                \"unit\": {\n"
      "                    \"type\": \"string\",\n"
      "                    \"enum\": [\n"
      "                        \"celsius\",\n"
      "                        \"fahrenheit\"\n"
      "                    ]\n"
      "                }\n"
      "            },\n"
      "            \"required\": [\n"
      "                \"location\"\n"
      "            ]\n"
      "        }\n"
      "    }\n"
      "}\n"
      "\n"
      "You are a weather bot.<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
      "\n"
      "Weather in Zürich?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
      "\n"
      "{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Zürich\", \"unit\": "
      "\"celsius\"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n"
      "\n"
      "{\"temperature\": 21.5}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
      "\n"
      "It is 21.5 °C.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
      "\n");
}

TEST(JinjaTest, LlamaStyleTemplateWithoutTools) {
  ExpectRender(
      kLlamaStyle,
      R"J({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "tools": null, "documents": null, "messages": [{"role": "system", "content": "You are a weather bot."}, {"role": "user", "content": "Weather in Zürich?"}, {"role": "assistant", "content": " Hi! "}], "add_generation_prompt": false})J",
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n"
      "\n"
      "You are a weather bot.<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
      "\n"
      "Weather in Zürich?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
      "\n"
      "Hi!<|eot_id|>");
}

TEST(JinjaTest, QwenStyleTemplateWithTools) {
  ExpectRender(
      kQwenStyle,
      R"J({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather", "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "City, e.g. Zürich"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["location"]}}}], "documents": null, "messages": [{"role": "system", "content": "You are a weather bot."}, {"role": "user", "content": "Weather in Zürich?"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"location": "Zürich", "unit": "celsius"}}}]}, {"role": "tool", "content": "{\"temperature\": 21.5}"}, {"role": "assistant", "content": "It is 21.5 °C."}], "add_generation_prompt": true})J",
      "<|im_start|>system\n"
      "You are a weather bot.\n"
      "\n"
      "# Tools\n"
      "\n"
      "<tools>\n"
      "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get "
      "the current weather\", \"parameters\": {\"type\": \"object\", \"properties\": "
      "{\"location\": {\"type\": \"string\", \"description\": \"City, e.g. Zürich\"}, \"unit\": "
      "{\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"]}}, \"required\": "
      "[\"location\"]}}}\n"
      "</tools>\n"
      "\n"
      "Return calls as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n"
      "<|im_start|>user\n"
      "Weather in Zürich?<|im_end|>\n"
      "<|im_start|>assistant\n"
      "<tool_call>\n"
      "{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Zürich\", \"unit\": "
      "\"celsius\"}}\n"
      "</tool_call><|im_end|>\n"
      "<|im_start|>user\n"
      "<tool_response>\n"
      "{\"temperature\": 21.5}\n"
      "</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n"
      "It is 21.5 °C.<|im_end|>\n"
      "<|im_start|>assistant\n");
}

TEST(JinjaTest, QwenStyleTemplateParallelToolCalls) {
  ExpectRender(
      kQwenStyle,
      R"J({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather", "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "City, e.g. Zürich"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["location"]}}}], "documents": null, "messages": [{"role": "user", "content": "Compare Paris and Rome."}, {"role": "assistant", "content": "Checking both.", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"location": "Paris"}}}, {"type": "function", "function": {"name": "get_weather", "arguments": "{\"location\": \"Rome\"}"}}]}, {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "rainy"}], "add_generation_prompt": false})J",
      "<|im_start|>system\n"
      "You are a helpful assistant.\n"
      "\n"
      "# Tools\n"
      "\n"
      "<tools>\n"
      "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get "
      "the current weather\", \"parameters\": {\"type\": \"object\", \"properties\": "
      "{\"location\": {\"type\": \"string\", \"description\": \"City, e.g. Zürich\"}, \"unit\": "
      "{\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"]}}, \"required\": "
      "[\"location\"]}}}\n"
      "</tools>\n"
      "\n"
      "Return calls as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n"
      "<|im_start|>user\n"
      "Compare Paris and Rome.<|im_end|>\n"
      "<|im_start|>assistant\n"
      "Checking both.\n"
      "<tool_call>\n"
      "{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n"
      "</tool_call>\n"
      "<tool_call>\n"
      "{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Rome\"}}\n"
      "</tool_call><|im_end|>\n"
      "<|im_start|>user\n"
      "<tool_response>\n"
      "sunny\n"
      "</tool_response>\n"
      "<tool_response>\n"
      "rainy\n"
      "</tool_response><|im_end|>\n");
}

TEST(JinjaTest, QwenStyleTemplateNoThinking) {
  ExpectRender(
      kQwenStyle,
      R"J({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "tools": null, "documents": null, "enable_thinking": false, "messages": [{"role": "system", "content": "You are a weather bot."}, {"role": "user", "content": "Weather in Zürich?"}], "add_generation_prompt": true})J",
      "<|im_start|>system\n"
      "You are a weather bot.<|im_end|>\n"
      "<|im_start|>user\n"
      "Weather in Zürich?<|im_end|>\n"
      "<|im_start|>assistant\n"
      "<think>\n"
      "\n"
      "</think>\n"
      "\n");
}

TEST(JinjaTest, LlamaStyleTemplateRejectsParallelCalls) {
  ExpectRaised(
      kLlamaStyle,
      R"J({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather", "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "City, e.g. Zürich"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["location"]}}}], "documents": null, "messages": [{"role": "user", "content": "Compare Paris and Rome."}, {"role": "assistant", "content": "Checking both.", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"location": "Paris"}}}, {"type": "function", "function": {"name": "get_weather", "arguments": "{\"location\": \"Rome\"}"}}]}, {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "rainy"}], "add_generation_prompt": false})J",
      "Only one tool call per message is supported.");
}

TEST(JinjaTest, LlamaStyleTemplateRejectsUnknownRole) {
  ExpectRaised(
      kLlamaStyle,
      R"J({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "tools": null, "documents": null, "messages": [{"role": "critic", "content": "x"}], "add_generation_prompt": false})J",
      "Unknown role: critic");
}

// ---------------------------------------------------------------------------------------------
// raise_exception, resource limits and hostile input.

TEST(JinjaTest, RaiseExceptionMessageIsVerbatim) {
  ExpectRaised("a\n{% if x %}{{ raise_exception('Bad role: ' ~ x) }}{% endif %}",
               R"({"x": "critic"})", "Bad role: critic");
}

TEST(JinjaTest, RaiseExceptionInsideMacroAndLoop) {
  ExpectRaised(
      "{% macro check(m) %}{% if m.role not in ['user'] %}{{ raise_exception('no ' + m.role) }}"
      "{% endif %}{% endmacro %}{% for m in messages %}{{ check(m) }}{% endfor %}",
      R"({"messages": [{"role": "user"}, {"role": "bot"}]})", "no bot");
}

TEST(JinjaTest, OutputSizeIsCapped) {
  ExpectError("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "{}",
              "rendered output exceeds the limit");
}

TEST(JinjaTest, StringValueSizeIsCapped) {
  ExpectError("{{ 'x' * 100000000 }}", "{}", "exceeds the limit");
  ExpectError(
      "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
      "{% endfor %}",
      "{}", "exceeds the limit");
}

TEST(JinjaTest, LoopIterationsAreCapped) {
  ExpectError("{% for i in range(1000) %}{% for j in range(1001) %}{% endfor %}{% endfor %}", "{}",
              "loop iterations");
}

// The default render budget (jinja/budget.h) leaves room for real templates on the largest
// conversations the server accepts (8 MiB bodies): 7000 messages of 1 KB, with 64 tools.
TEST(JinjaTest, StyleTemplatesOnLargeConversationsFitTheDefaultBudget) {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  messages.push_back({{"role", "system"}, {"content", "Be brief."}});
  const std::string content(1000, 'w');
  for (int i = 0; i < 7000; ++i) {
    messages.push_back({{"role", i % 2 == 0 ? "user" : "assistant"}, {"content", content}});
  }
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  for (int i = 0; i < 64; ++i) {
    tools.push_back({{"type", "function"},
                     {"function",
                      {{"name", "f" + std::to_string(i)},
                       {"description", std::string(200, 'd')},
                       {"parameters", {{"type", "object"},
                                       {"properties", {{"x", {{"type", "string"}}}}}}}}}});
  }
  for (const char* source : {kLlamaStyle, kQwenStyle}) {
    auto tmpl = ChatTemplate::Parse(source);
    ASSERT_TRUE(tmpl.ok()) << tmpl.status();
    auto rendered = (*tmpl)->RenderMessagesOrdered(
        messages, true,
        {{"bos_token", "<s>"}, {"tools", tools}, {"enable_thinking", false}},
        jinja::RenderLimits());
    ASSERT_TRUE(rendered.ok()) << rendered.status();
    EXPECT_GT(rendered->size(), 7000u * 1000u);
  }
}

TEST(JinjaTest, MacroRecursionIsCapped) {
  ExpectError("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "{}", "recursion");
}

TEST(JinjaTest, DeepNestingIsRejectedNotCrashing) {
  ExpectError("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}", "{}",
              "nested too deeply");
  std::string blocks;
  for (int i = 0; i < 2000; ++i) blocks += "{% if true %}";
  ExpectError(blocks, "{}", "nested too deeply");
  ExpectError("{{ " + std::string(3000, '-') + "1 }}", "{}", "nested too deeply");
  ExpectError("{{ " + std::string(3000, '[') + " }}", "{}", "line 1");
}

TEST(JinjaTest, LongOperatorAndFilterChainsAreBounded) {
  std::string sum = "{{ 1";
  for (int i = 0; i < 5000; ++i) sum += " + 1";
  ExpectError(sum + " }}", "{}", "nested too deeply");
  std::string filters = "{{ 'x'";
  for (int i = 0; i < 5000; ++i) filters += "|upper";
  ExpectError(filters + " }}", "{}", "nested too deeply");
  std::string attrs = "{{ d";
  for (int i = 0; i < 5000; ++i) attrs += ".a";
  ExpectError(attrs + " }}", "{}", "nested too deeply");
  // A long but shallow chain is fine: 150 additions.
  std::string ok = "{{ 0";
  for (int i = 0; i < 150; ++i) ok += " + 1";
  ExpectRender(ok + " }}", "{}", "150");
}

TEST(JinjaTest, StoredValueNestingIsBounded) {
  ExpectError(
      "{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}"
      "{% endfor %}",
      "{}", "nested deeper than 256 levels");
  std::string sets = "{% set y = [] %}";
  for (int i = 0; i < 300; ++i) sets += "{% set y = [y] %}";
  ExpectError(sets, "{}", "nested deeper than 256 levels");
  ExpectError("{% set ns = namespace(a=1) %}{% set ns.self = [ns] %}", "{}",
              "namespace cannot be stored");
  std::string deep_json(1000, '[');
  deep_json += std::string(1000, ']');
  ExpectError("{{ x|length }}", R"({"x": )" + deep_json + "}", "nested deeper than 256 levels");
}

TEST(JinjaTest, GarbageInputNeverCrashes) {
  const char* inputs[] = {"{{",
                          "{%",
                          "{#",
                          "{{ }}",
                          "{% %}",
                          "{{ 'a }}",
                          "{{ a. }}",
                          "{{ a[ }}",
                          "{% for %}",
                          "{% set %}",
                          "{% macro %}",
                          "{% endif %}",
                          "{{ a | }}",
                          "{{ a is }}",
                          "{% if a %}{% else %}{% else %}{% endif %}",
                          "}}",
                          "%}",
                          "{{ 1 + }}",
                          "{{ (1, }}",
                          "{{ {1: } }}",
                          "{% raw %}",
                          "\xff\xfe{{ 1 }}"};
  for (const char* input : inputs) {
    auto rendered = Render(input, "{}");
    if (!rendered.ok()) {
      EXPECT_EQ(rendered.status().code(), absl::StatusCode::kInvalidArgument) << input;
    }
  }
  // Literal text that looks like tags but is not is passed through.
  ExpectRender("}} %} #} { {x} \xff\xfe", "{}", "}} %} #} { {x} \xff\xfe");
}

TEST(JinjaTest, LexerErrorQuotesWholeUtf8Character) {
  ExpectError("{{ a \u00ff b }}", "{}", "line 1: unexpected char '\u00ff'");
  ExpectError("{{ a \x01 }}", "{}", "unexpected char '\\x01'");
}

// ---------------------------------------------------------------------------------------------
// ChatTemplate API.

TEST(ChatTemplateTest, ParseErrorIsInvalidArgumentWithLine) {
  auto tmpl = ChatTemplate::Parse("ok\n{% for x in %}");
  ASSERT_FALSE(tmpl.ok());
  EXPECT_EQ(tmpl.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(tmpl.status().message()), HasSubstr("line 2"));
}

TEST(ChatTemplateTest, RenderSortsKeysButRenderOrderedKeepsThem) {
  auto tmpl = ChatTemplate::Parse("{{ v|tojson }}");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  const std::string json = R"({"v": {"b": 1, "a": 2}})";
  auto ordered = (*tmpl)->RenderOrdered(nlohmann::ordered_json::parse(json));
  ASSERT_TRUE(ordered.ok()) << ordered.status();
  EXPECT_EQ(*ordered, R"({"b": 1, "a": 2})");
  auto sorted = (*tmpl)->Render(nlohmann::json::parse(json));
  ASSERT_TRUE(sorted.ok()) << sorted.status();
  EXPECT_EQ(*sorted, R"({"a": 2, "b": 1})");
}

TEST(ChatTemplateTest, ContextMustBeAnObject) {
  auto tmpl = ChatTemplate::Parse("x");
  ASSERT_TRUE(tmpl.ok());
  auto rendered = (*tmpl)->Render(nlohmann::json::array());
  ASSERT_FALSE(rendered.ok());
  EXPECT_EQ(rendered.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, RenderMessagesPassesToolsDocumentsAndExtra) {
  auto tmpl = ChatTemplate::Parse(
      "[{{ bos_token }}|{{ tools is none }}|{{ documents is none }}|{{ add_generation_prompt }}|"
      "{{ messages|length }}|{{ custom }}]");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  auto plain = (*tmpl)->RenderMessages(nlohmann::json::array({{{"role", "user"}}}), true);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(*plain, "[|True|True|True|1|]");
  nlohmann::json extra = {{"tools", nlohmann::json::array()}, {"custom", "c"}, {"bos_token", "B"}};
  auto with_extra = (*tmpl)->RenderMessages(nlohmann::json::array(), false, extra);
  ASSERT_TRUE(with_extra.ok()) << with_extra.status();
  EXPECT_EQ(*with_extra, "[B|False|True|False|0|c]");
}

class ModelDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("sluice_jinja_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  std::filesystem::path dir_;
};

TEST_F(ModelDirTest, ReadsNamedTemplateListAndAddedTokenObjects) {
  nlohmann::ordered_json config = {
      {"bos_token", {{"__type", "AddedToken"}, {"content", "<s>"}, {"lstrip", false}}},
      {"eos_token", "</s>"},
      {"chat_template",
       nlohmann::ordered_json::array(
           {{{"name", "tool_use"}, {"template", "TOOLS"}},
            {{"name", "default"},
             {"template",
              "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}"
              "{% endfor %}{% if add_generation_prompt %}>{% endif %}"}}})}};
  Write("tokenizer_config.json", config.dump());
  auto tmpl = ChatTemplate::FromModelDir(dir_.string());
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  auto rendered =
      (*tmpl)->RenderMessages(nlohmann::json::array({{{"role", "user"}, {"content", "a"}},
                                                     {{"role", "assistant"}, {"content", "b"}}}),
                              true);
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  EXPECT_EQ(*rendered, "<s>a</s>b</s>>");
}

TEST_F(ModelDirTest, ChatTemplateJinjaFileTakesPrecedence) {
  Write("tokenizer_config.json", R"({"eos_token": "E", "chat_template": "from config"})");
  Write("chat_template.jinja", "from file {{ eos_token }}\n");
  auto tmpl = ChatTemplate::FromModelDir(dir_.string());
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  auto rendered = (*tmpl)->RenderMessages(nlohmann::json::array(), false);
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  EXPECT_EQ(*rendered, "from file E");
}

TEST_F(ModelDirTest, MissingTemplateIsNotFound) {
  Write("tokenizer_config.json", R"({"eos_token": "E"})");
  auto tmpl = ChatTemplate::FromModelDir(dir_.string());
  ASSERT_FALSE(tmpl.ok());
  EXPECT_EQ(tmpl.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ModelDirTest, InvalidConfigOrTemplateIsInvalidArgument) {
  Write("tokenizer_config.json", "{not json");
  auto bad_json = ChatTemplate::FromModelDir(dir_.string());
  ASSERT_FALSE(bad_json.ok());
  EXPECT_EQ(bad_json.status().code(), absl::StatusCode::kInvalidArgument);

  Write("tokenizer_config.json", R"({"chat_template": "{% if %}"})");
  auto bad_template = ChatTemplate::FromModelDir(dir_.string());
  ASSERT_FALSE(bad_template.ok());
  EXPECT_EQ(bad_template.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_template.status().message()), HasSubstr("line 1"));
}

}  // namespace
}  // namespace sluice
