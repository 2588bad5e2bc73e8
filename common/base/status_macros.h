#pragma once

// RETURN_IF_ERROR / ASSIGN_OR_RETURN, which Debian's Abseil 20220623 lacks.

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define VARUNA_CONCAT_INNER_(a, b) a##b
#define VARUNA_CONCAT_(a, b) VARUNA_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status); returns it from the enclosing function if not OK.
#define RETURN_IF_ERROR(expr)                        \
  do {                                               \
    ::absl::Status varuna_status_ = (expr);          \
    if (!varuna_status_.ok()) return varuna_status_; \
  } while (0)

#define VARUNA_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()

// Evaluates `expr` (an absl::StatusOr<T>); on error returns its status, else assigns the value
// to `lhs` (which may be a declaration, e.g. `auto x`).
#define ASSIGN_OR_RETURN(lhs, expr) \
  VARUNA_ASSIGN_OR_RETURN_IMPL_(VARUNA_CONCAT_(varuna_statusor_, __LINE__), lhs, expr)
