/* test_lexer.c - the .gdl lexer: token kinds, positions, numbers, newline
 * rules inside () and [], ';', comments, and errors. */
#include <string.h>

#include "testutil.h"

typedef struct Lexed {
  Arena a;
  Diag d;
  SrcFile src;
  Token *t;
  int n;
} Lexed;

static void lex(Lexed *x, const char *text) {
  arena_init(&x->a);
  diag_init(&x->d, NULL);
  x->d.quiet = true;
  x->src = (SrcFile){"t.gdl", text, strlen(text)};
  x->n = lex_tokenize(&x->src, &x->a, &x->d, &x->t);
}

static void done(Lexed *x) {
  arena_free(&x->a);
  diag_free(&x->d);
}

/* The token kinds as one string: I=ident N=int F=float S=string P=punct
 * ;=newline $=eof. */
static const char *kinds(const Lexed *x) {
  static char buf[256];
  int k = 0;
  for (int i = 0; i < x->n && k < 255; i++) buf[k++] = "$;INFSP"[x->t[i].kind];
  buf[k] = '\0';
  return buf;
}

static bool text_is(const Token *t, const char *s) { return (size_t)t->len == strlen(s) && memcmp(t->text, s, t->len) == 0; }

static void test_lexer_tokens_and_positions(void **state) {
  (void)state;
  Lexed x;
  lex(&x, "model m {\n  h = relu(x @ W1 + b1)\n}\n");
  assert_int_equal(x.d.nerrors, 0);
  assert_string_equal(kinds(&x), "IIP;IPIPIPIPIP;P;$");
  assert_true(text_is(&x.t[0], "model"));
  assert_int_equal(x.t[0].line, 1);
  assert_int_equal(x.t[0].col, 1);
  assert_true(text_is(&x.t[4], "h"));
  assert_int_equal(x.t[4].line, 2);
  assert_int_equal(x.t[4].col, 3);
  assert_true(text_is(&x.t[9], "@")); /* columns count bytes from 1 */
  assert_int_equal(x.t[9].col, 14);
  assert_true(text_is(&x.t[11], "+"));
  assert_int_equal(x.t[11].col, 19);
  assert_int_equal(x.t[x.n - 1].kind, TK_EOF);
  done(&x);
}

static void test_lexer_numbers(void **state) {
  (void)state;
  Lexed x;
  lex(&x, "1e-4 3. .5 42 2.5e3 1E+2 0..L 7");
  assert_int_equal(x.d.nerrors, 0);
  assert_string_equal(kinds(&x), "FFFNFFNPIN;$");
  assert_true(x.t[0].fval == 1e-4);
  assert_true(x.t[1].fval == 3.0);
  assert_true(x.t[2].fval == 0.5);
  assert_int_equal(x.t[3].ival, 42);
  assert_true(x.t[4].fval == 2500.0);
  assert_true(x.t[5].fval == 100.0);
  /* `0..L` is a range, not the float `0.` */
  assert_int_equal(x.t[6].ival, 0);
  assert_true(text_is(&x.t[7], ".."));
  assert_true(text_is(&x.t[8], "L"));
  done(&x);
}

static void test_lexer_newlines_skipped_inside_parens_and_brackets(void **state) {
  (void)state;
  Lexed x;
  lex(&x, "y = f(a,\n  b)\nz = x[0,\n 1]\n");
  assert_int_equal(x.d.nerrors, 0);
  assert_string_equal(kinds(&x), "IPIPIPIP;IPIPNPNP;$");
  assert_int_equal(x.t[6].line, 2); /* b */
  done(&x);
}

static void test_lexer_braces_keep_newlines(void **state) {
  (void)state;
  Lexed x;
  /* An unclosed '(' ends at a brace, so it cannot swallow the file. */
  lex(&x, "for i in 0..2 {\n  x = f(x\n}\ny = 1\n");
  assert_int_equal(x.d.nerrors, 0);
  assert_string_equal(kinds(&x), "IIINPNP;IPIPIP;IPN;$");
  done(&x);
}

static void test_lexer_semicolons_and_comments(void **state) {
  (void)state;
  Lexed x;
  lex(&x, "# header\n\n a = 1; b = 2 # trailing\n\n\n;; c = 3");
  assert_int_equal(x.d.nerrors, 0);
  /* newlines and ';' collapse into one statement end, none at the start */
  assert_string_equal(kinds(&x), "IPN;IPN;IPN;$");
  assert_true(text_is(&x.t[3], ";"));
  assert_int_equal(x.t[8].line, 6);
  done(&x);
}

static void test_lexer_punctuators_longest_first(void **state) {
  (void)state;
  Lexed x;
  lex(&x, "a ** b ... : = , . {}");
  assert_string_equal(kinds(&x), "IPIPPPPPPP;$");
  assert_true(text_is(&x.t[1], "**"));
  assert_true(text_is(&x.t[3], "..."));
  done(&x);
}

static void test_lexer_strings(void **state) {
  (void)state;
  Lexed x;
  lex(&x, "r = \"mean\"");
  assert_int_equal(x.d.nerrors, 0);
  assert_string_equal(kinds(&x), "IPS;$");
  assert_true(text_is(&x.t[2], "\"mean\""));
  done(&x);
  lex(&x, "r = \"mean\nx = 1");
  assert_int_equal(x.d.nerrors, 1);
  assert_non_null(strstr(sb_str(&x.d.log), "t.gdl:1:5: error: unterminated string"));
  done(&x);
}

static void test_lexer_errors_keep_going(void **state) {
  (void)state;
  Lexed x;
  lex(&x, "a = 1 $ 2\nb = 3x\nc = 99999999999999999999\nd = \xc3\xa9");
  assert_int_equal(x.d.nerrors, 4);
  const char *log = sb_str(&x.d.log);
  assert_non_null(strstr(log, "t.gdl:1:7: error: unexpected character '$'"));
  assert_non_null(strstr(log, "t.gdl:2:5: error: invalid number '3x'"));
  assert_non_null(strstr(log, "t.gdl:3:5: error: integer literal '99999999999999999999' is too large"));
  /* one error for a multi-byte character */
  assert_non_null(strstr(log, "t.gdl:4:5: error: unexpected byte 0xc3"));
  done(&x);
}

static void test_lexer_nul_bytes_and_empty_input(void **state) {
  (void)state;
  Lexed x;
  static const char text[] = "a\0b";
  arena_init(&x.a);
  diag_init(&x.d, NULL);
  x.d.quiet = true;
  x.src = (SrcFile){"t.gdl", text, 3};
  x.n = lex_tokenize(&x.src, &x.a, &x.d, &x.t);
  assert_int_equal(x.d.nerrors, 1);
  assert_string_equal(kinds(&x), "II;$");
  done(&x);
  lex(&x, "");
  assert_string_equal(kinds(&x), "$");
  done(&x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lexer_tokens_and_positions),
      cmocka_unit_test(test_lexer_numbers),
      cmocka_unit_test(test_lexer_newlines_skipped_inside_parens_and_brackets),
      cmocka_unit_test(test_lexer_braces_keep_newlines),
      cmocka_unit_test(test_lexer_semicolons_and_comments),
      cmocka_unit_test(test_lexer_punctuators_longest_first),
      cmocka_unit_test(test_lexer_strings),
      cmocka_unit_test(test_lexer_errors_keep_going),
      cmocka_unit_test(test_lexer_nul_bytes_and_empty_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
