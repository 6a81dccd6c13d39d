/*
 * rdzv_file.c: reading the file of a file:// rendezvous (see rdzv_file.h).
 *
 * The text is cut into words at white space (what fscanf's %s took before this parser
 * existed), and each word is checked for what it holds. Nothing is read past n bytes
 * and nothing is written past a field, whatever the text: the file may be another
 * job's, an older dtrain's or anything a user left at that path.
 */
#include "rdzv_file.h"

#include <string.h>

typedef struct {
    const char *p;
    size_t      len;
} word;

static int is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* The next word of text[*at, n) into w; 0 when only white space is left. */
static int next_word(const char *text, size_t n, size_t *at, word *w) {
    size_t i = *at;
    while (i < n && is_space(text[i])) i++;
    size_t start = i;
    while (i < n && !is_space(text[i])) i++;
    w->p = text + start;
    w->len = i - start;
    *at = i;
    return w->len > 0;
}

/* w as a string into out (cap bytes); 0 when it does not fit or holds a zero byte. */
static int copy_word(const word *w, char *out, size_t cap) {
    if (w->len >= cap || memchr(w->p, '\0', w->len)) return 0;
    memcpy(out, w->p, w->len);
    out[w->len] = '\0';
    return 1;
}

/* w as a number of at most max_digits digits of base 10 or 16; 0 when it is not one. */
static int word_number(const word *w, int hex, size_t max_digits, unsigned long long *v) {
    if (w->len == 0 || w->len > max_digits) return 0;
    *v = 0;
    for (size_t i = 0; i < w->len; i++) {
        char c = w->p[i];
        int d = c >= '0' && c <= '9' ? c - '0'
              : hex && c >= 'a' && c <= 'f' ? c - 'a' + 10
              : hex && c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return 0;
        *v = *v * (hex ? 16 : 10) + (unsigned)d;
    }
    return 1;
}

dt_status dt_rdzv_file_parse(const char *text, size_t n, dt_rdzv_file *out) {
    static const char *const what[] = {"the words \"dtrain-store\"", "the version", "the job id",
                                       "the store's address", "the store's port", "the nonce", "the secret"};
    memset(out, 0, sizeof *out);
    if (!text) text = "", n = 0;
    size_t at = 0;
    word w[7];
    int field = 0;
    while (field < 7 && next_word(text, n, &at, &w[field])) field++;
    unsigned long long port = 0;
    dt_status s = DT_ERR_FORMAT;
    if (field == 0)
        dt_error(s, "rendezvous file: it is empty");
    else if (w[0].len != 12 || memcmp(w[0].p, "dtrain-store", 12) != 0)
        dt_error(s, "rendezvous file: %s do not start it", what[0]);
    else if (field < 7)
        dt_error(s, "rendezvous file: %s is missing", what[field]);
    else if (!word_number(&w[1], 0, 9, &port) || port != DT_RDZV_FILE_VERSION)
        dt_error(s, "rendezvous file: version \"%.*s\", this dtrain reads %d", w[1].len > 16 ? 16 : (int)w[1].len,
                 w[1].p, DT_RDZV_FILE_VERSION);
    else if (!copy_word(&w[2], out->job, sizeof out->job))
        dt_error(s, "rendezvous file: the job id is longer than %d bytes or holds a zero byte", DT_AUTH_MAX_JOB);
    else if (!copy_word(&w[3], out->addr, sizeof out->addr))
        dt_error(s, "rendezvous file: the store's address is longer than %zu bytes or holds a zero byte",
                 sizeof out->addr - 1);
    else if (!word_number(&w[4], 0, 5, &port) || port < 1 || port > 65535)
        dt_error(s, "rendezvous file: the store's port is not a number in 1..65535");
    else if (!word_number(&w[5], 1, 16, &out->nonce))
        dt_error(s, "rendezvous file: the nonce is not 1 to 16 hex digits");
    else if (!copy_word(&w[6], out->secret, sizeof out->secret))
        dt_error(s, "rendezvous file: the secret is longer than %zu bytes or holds a zero byte",
                 sizeof out->secret - 1);
    else if (next_word(text, n, &at, &w[0]))
        dt_error(s, "rendezvous file: something follows the secret");
    else
        s = DT_OK;
    if (s != DT_OK) {
        memset(out, 0, sizeof *out);
        return s;
    }
    out->port = (int)port;
    return DT_OK;
}
