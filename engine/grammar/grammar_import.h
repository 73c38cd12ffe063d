// ImportRules: copies one grammar's rules into another, so grammars built separately (e.g. the
// JSON Schema of each tool's parameters) can be combined under a new root.
#ifndef SLUICE_ENGINE_GRAMMAR_GRAMMAR_IMPORT_H_
#define SLUICE_ENGINE_GRAMMAR_GRAMMAR_IMPORT_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "engine/grammar/grammar.h"

namespace sluice::grammar {

// ImportRules appends every rule of `source` to `target`, each name prefixed with `prefix`
// (and made unique by AddRule), rule references remapped. Returns the index in `target` of
// `source`'s root rule. `target`'s root is unchanged.
int32_t ImportRules(Grammar& target, const Grammar& source, absl::string_view prefix);

}  // namespace sluice::grammar

#endif  // SLUICE_ENGINE_GRAMMAR_GRAMMAR_IMPORT_H_
