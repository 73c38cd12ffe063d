#ifndef SLUICE_COMMON_STATUS_MACROS_H_
#define SLUICE_COMMON_STATUS_MACROS_H_

// Early-return helpers for absl::Status / absl::StatusOr, the one copy every layer uses.
//
//   SLUICE_RETURN_IF_ERROR(DoThing());             // returns DoThing()'s status when not OK
//   SLUICE_ASSIGN_OR_RETURN(auto x, MakeThing());  // declares x from the StatusOr's value
//   SLUICE_ASSIGN_OR_RETURN(y, MakeThing());       // or assigns an existing y
//
// SLUICE_ASSIGN_OR_RETURN expands to several statements: do not use it as the body of an
// unbraced if/else.

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SLUICE_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status sluice_status_ = (expr);          \
    if (!sluice_status_.ok()) return sluice_status_; \
  } while (0)

#define SLUICE_STATUS_CONCAT_INNER_(a, b) a##b
#define SLUICE_STATUS_CONCAT_(a, b) SLUICE_STATUS_CONCAT_INNER_(a, b)

#define SLUICE_ASSIGN_OR_RETURN(lhs, expr) \
  SLUICE_ASSIGN_OR_RETURN_IMPL_(SLUICE_STATUS_CONCAT_(sluice_status_or_, __LINE__), lhs, expr)
#define SLUICE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return std::move(tmp).status();      \
  lhs = std::move(tmp).value()

#endif  // SLUICE_COMMON_STATUS_MACROS_H_
