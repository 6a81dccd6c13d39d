/* test_status.c: error messages, wrapping and exit codes of status.c. */
#include "status.h"
#include "tap.h"

#include <string.h>

int main(void) {
    is_str(dt_last_error(), "", "no error message at start");
    dt_status s = dt_error(DT_ERR_INVALID, "--lr: expected a number, got '%s'", "abc");
    is_int(s, DT_ERR_INVALID, "dt_error returns its status");
    is_str(dt_last_error(), "--lr: expected a number, got 'abc'", "message is formatted");
    dt_error_wrap(s, "parsing flags: ");
    is_str(dt_last_error(), "parsing flags: --lr: expected a number, got 'abc'", "wrap prepends context");
    /* a wrapped message longer than the buffer (1 KiB) is cut, and ends in "..." to say so */
    char pre[2000];
    memset(pre, 'x', sizeof pre - 1);
    pre[sizeof pre - 1] = '\0';
    dt_error_wrap(s, "%s: ", pre);
    size_t n = strlen(dt_last_error());
    ok(n > 3 && n < sizeof pre && !strcmp(dt_last_error() + n - 3, "..."),
       "a wrapped message too long for the buffer is cut, ending in ... (%zu bytes)", n);
    is_int(dt_exit_code(DT_OK), 0, "ok exits 0");
    is_int(dt_exit_code(DT_ERR_INVALID), 2, "bad input exits 2");
    is_int(dt_exit_code(DT_ERR_FORMAT), 2, "corrupt input exits 2");
    is_int(dt_exit_code(DT_ERR_PEER), 1, "runtime failure exits 1");
    dt_error_clear();
    is_str(dt_last_error(), "", "clear forgets the message");
    return done_testing();
}
