/* The Brown corpus (Form C, POS-tagged) as readable text; the rules are in
 * core/text.h at dt_brown_detag. The files look like
 *
 *   \t``/`` Only/rb a/at relative/jj handful/nn ... received/vbn ''/'' ,/, ...
 *   The/at jury/nn said/vbd ...
 *   <blank line>
 *
 * one sentence a line, paragraphs separated by blank lines. */
#include <string.h>

#include "core/data_text_internal.h"

typedef enum word_kind {
  WORD_PLAIN, /* a space before it */
  WORD_CLOSE, /* no space before it */
  WORD_OPEN,  /* no space after it */
} word_kind;

typedef struct detag_state {
  dt_bytes *out;
  int64_t start_len; /* out->len before this file */
  int in_paragraph;  /* a word of the current paragraph was written */
  int no_space_next; /* the last word was an opener */
  int single_open;   /* a lone ' opened a quote in this paragraph */
  dt_status st;
} detag_state;

static void put(detag_state *s, const void *p, int64_t n) {
  if (s->st == DT_OK)
    s->st = dt_bytes_append(s->out, p, n);
}

/* Latin-1 to UTF-8. */
static void put_latin1(detag_state *s, const uint8_t *p, size_t n) {
  size_t i = 0;
  while (i < n && s->st == DT_OK) {
    size_t j = i;
    while (j < n && p[j] < 0x80)
      j++;
    put(s, p + i, (int64_t)(j - i));
    if (j < n) {
      uint8_t u[2] = {(uint8_t)(0xC0 | (p[j] >> 6)), (uint8_t)(0x80 | (p[j] & 0x3F))};
      put(s, u, 2);
      j++;
    }
    i = j;
  }
}

static int is_word(const uint8_t *w, size_t n, const char *lit) {
  return n == strlen(lit) && memcmp(w, lit, n) == 0;
}

static void put_word(detag_state *s, const uint8_t *w, size_t n) {
  word_kind kind = WORD_PLAIN;
  if (is_word(w, n, "``")) {
    w = (const uint8_t *)"\"";
    n = 1;
    kind = WORD_OPEN;
  } else if (is_word(w, n, "''")) {
    w = (const uint8_t *)"\"";
    n = 1;
    kind = WORD_CLOSE;
  } else if (is_word(w, n, "'")) {
    kind = s->single_open ? WORD_CLOSE : WORD_OPEN;
    s->single_open = !s->single_open;
  } else if (n == 1 && strchr(",.;:?!)]", w[0])) {
    kind = WORD_CLOSE;
  } else if (n == 1 && strchr("([", w[0])) {
    kind = WORD_OPEN;
  }
  if (!s->in_paragraph) {
    if (s->out->len > s->start_len)
      put(s, "\n\n", 2);
    s->in_paragraph = 1;
  } else if (kind != WORD_CLOSE && !s->no_space_next) {
    put(s, " ", 1);
  }
  put_latin1(s, w, n);
  s->no_space_next = kind == WORD_OPEN;
}

static int is_blank(uint8_t c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

/* The next `word/tag` token of p[*i, end): its word's length (up to the
 * last '/', or all of it without one) and whether its tag marks a headline
 * (ends in -hl). Returns 0 at the end of the line. */
static int next_token(const uint8_t *p, size_t *i, size_t end, size_t *start, size_t *word_len,
                      int *headline) {
  size_t j = *i;
  while (j < end && is_blank(p[j]))
    j++;
  if (j == end)
    return 0;
  *start = j;
  while (j < end && !is_blank(p[j]))
    j++;
  size_t len = j - *start, w = len;
  while (w > 0 && p[*start + w - 1] != '/')
    w--;
  *word_len = w > 0 ? w - 1 : len;
  *headline = w > 0 && len - w >= 3 && memcmp(p + *start + len - 3, "-hl", 3) == 0;
  *i = j;
  return 1;
}

static void end_paragraph(detag_state *s) {
  s->in_paragraph = 0;
  s->no_space_next = 0;
  s->single_open = 0;
}

dt_status dt_brown_detag(const void *tagged, size_t n, dt_bytes *out) {
  if (!out || (n > 0 && !tagged))
    return DT_ERROR(DT_ERR_INVALID_ARG, "tagged text and out must not be NULL");
  const uint8_t *p = tagged;
  detag_state s = {out, out->len, 0, 0, 0, DT_OK};
  size_t i = 0;
  while (i < n && s.st == DT_OK) {
    size_t end = i;
    while (end < n && p[end] != '\n')
      end++;
    size_t j = i, start, len;
    int words = 0, headline_words = 0, hl;
    while (next_token(p, &j, end, &start, &len, &hl)) {
      words++;
      headline_words += hl;
    }
    /* A blank line ends the paragraph; a headline is one of its own. */
    int headline = words > 0 && 2 * headline_words >= words;
    if (words == 0 || headline)
      end_paragraph(&s);
    for (j = i; next_token(p, &j, end, &start, &len, &hl);)
      if (len > 0)
        put_word(&s, p + start, len);
    if (headline)
      end_paragraph(&s);
    i = end + 1;
  }
  if (s.st == DT_OK && out->len > s.start_len)
    put(&s, "\n", 1);
  return s.st;
}

int dt_brown_is_file_name(const char *name) {
  return name && strlen(name) == 4 && name[0] == 'c' && name[1] >= 'a' && name[1] <= 'r' &&
         name[2] >= '0' && name[2] <= '9' && name[3] >= '0' && name[3] <= '9';
}
