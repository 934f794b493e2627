/* Values read from text, the same way wherever they come from: the
 * environment table (core/env.h) and the command-line flags
 * (launch/flags.h) accept the same booleans and choice lists. */
#ifndef DT_CORE_PARSE_H
#define DT_CORE_PARSE_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1/true/on/yes -> true, 0/false/off/no -> false, in any case; false
 * (and *out untouched) for anything else. */
bool dt_parse_bool(const char *s, bool *out);

/* The index of `s` in the list "a|b|c", or -1. */
int dt_choice_index(const char *choices, const char *s);

/* "a|b|c" -> "a, b, c" into buf (cut to fit, NUL-terminated); returns buf. */
const char *dt_format_choices(const char *choices, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
