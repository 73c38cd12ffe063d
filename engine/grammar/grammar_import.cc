#include "engine/grammar/grammar_import.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace sluice::grammar {
namespace {

void Remap(Expr& e, const std::vector<int32_t>& index) {
  if (e.kind == ExprKind::kRuleRef) e.rule = index[e.rule];
  for (Expr& child : e.children) Remap(child, index);
}

}  // namespace

int32_t ImportRules(Grammar& target, const Grammar& source, absl::string_view prefix) {
  std::vector<int32_t> index(source.num_rules());
  // Names first (bodies may reference any rule), then the remapped bodies.
  for (int32_t i = 0; i < source.num_rules(); ++i) {
    index[i] = target.AddRule(absl::StrCat(prefix, source.rule(i).name));
  }
  for (int32_t i = 0; i < source.num_rules(); ++i) {
    Expr body = source.rule(i).body;
    Remap(body, index);
    target.rule(index[i]).body = std::move(body);
  }
  return index[source.root()];
}

}  // namespace sluice::grammar
