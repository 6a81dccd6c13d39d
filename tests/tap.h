/*
 * tap.h: a minimal Test Anything Protocol producer for dtrain's C unit tests.
 *
 *   ok(cond, "what")          one test point
 *   is_int(a, b, "what")      equality of integers, printing both on failure
 *   is_str(a, b, "what")      equality of strings
 *   like(s, sub, "what")      s contains sub (for error messages)
 *   skip_all("reason")        the whole file is skipped (prints 1..0 # SKIP)
 *   skip(n, "reason")         n test points skipped
 *   diag("fmt", ...)          a comment line
 *   return done_testing();    prints the plan; exit code 1 if anything failed
 */
#ifndef DT_TAP_H
#define DT_TAP_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tap_count_ = 0, tap_failed_ = 0;

static inline void diag(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("# ", stdout);
    vprintf(fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
    fflush(stdout);
}

static inline int tap_ok_(int cond, const char *file, int line, const char *fmt, ...) {
    va_list ap;
    tap_count_++;
    printf("%sok %d - ", cond ? "" : "not ", tap_count_);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    if (!cond) {
        tap_failed_++;
        printf("#   failed at %s:%d\n", file, line);
    }
    fflush(stdout);
    return cond;
}

#define ok(cond, ...) tap_ok_(!!(cond), __FILE__, __LINE__, __VA_ARGS__)

#define is_int(a, b, ...) do { \
    long long tap_a_ = (long long)(a), tap_b_ = (long long)(b); \
    if (!tap_ok_(tap_a_ == tap_b_, __FILE__, __LINE__, __VA_ARGS__)) \
        diag("   got %lld, expected %lld", tap_a_, tap_b_); \
} while (0)

#define is_str(a, b, ...) do { \
    const char *tap_a_ = (a), *tap_b_ = (b); \
    int tap_c_ = tap_a_ && tap_b_ && strcmp(tap_a_, tap_b_) == 0; \
    if (!tap_ok_(tap_c_, __FILE__, __LINE__, __VA_ARGS__)) \
        diag("   got \"%s\", expected \"%s\"", tap_a_ ? tap_a_ : "(null)", tap_b_ ? tap_b_ : "(null)"); \
} while (0)

#define like(s, sub, ...) do { \
    const char *tap_s_ = (s), *tap_sub_ = (sub); \
    int tap_c_ = tap_s_ && tap_sub_ && strstr(tap_s_, tap_sub_) != NULL; \
    if (!tap_ok_(tap_c_, __FILE__, __LINE__, __VA_ARGS__)) \
        diag("   \"%s\" does not contain \"%s\"", tap_s_ ? tap_s_ : "(null)", tap_sub_ ? tap_sub_ : "(null)"); \
} while (0)

static inline void skip(int n, const char *reason) {
    for (int i = 0; i < n; i++) printf("ok %d # SKIP %s\n", ++tap_count_, reason);
    fflush(stdout);
}

static inline void skip_all(const char *reason) {
    printf("1..0 # SKIP %s\n", reason);
    fflush(stdout);
    exit(0);
}

static inline int done_testing(void) {
    printf("1..%d\n", tap_count_);
    fflush(stdout);
    return tap_failed_ ? 1 : 0;
}

#endif /* DT_TAP_H */
