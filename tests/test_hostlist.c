/* test_hostlist.c: Slurm compressed host lists, good and malformed (launch_env.c). */
#include "launch_env.h"
#include "tap.h"

/* Expand list and compare with the hosts joined by spaces. */
static void expands_to(const char *list, const char *want) {
    char **h = NULL;
    size_t n = 0;
    dt_status s = dt_hostlist_expand(list, &h, &n);
    char got[4096] = "";
    if (s == DT_OK)
        for (size_t i = 0; i < n; i++) {
            if (i) strncat(got, " ", sizeof got - strlen(got) - 1);
            strncat(got, h[i], sizeof got - strlen(got) - 1);
        }
    else
        snprintf(got, sizeof got, "error: %s", dt_last_error());
    is_str(got, want, "'%s'", list);
    dt_hostlist_free(h, n);
}

/* Expect DT_ERR_INVALID with a message containing sub; outputs left empty. */
static void rejects(const char *list, const char *sub) {
    char **h = (char **)1;
    size_t n = 99;
    dt_error_clear();
    dt_status s = dt_hostlist_expand(list, &h, &n);
    is_int(s, DT_ERR_INVALID, "'%s' is rejected", list ? list : "(null)");
    like(dt_last_error(), sub, "'%s': message says why", list ? list : "(null)");
    ok(h == NULL && n == 0, "'%s': no hosts returned", list ? list : "(null)");
}

int main(void) {
    expands_to("node1", "node1");
    expands_to("node[01-03,7],gpu5", "node01 node02 node03 node7 gpu5");   /* each range keeps its own width, as in Slurm */
    expands_to("node[01-03,07]", "node01 node02 node03 node07");
    expands_to("n[08-10]", "n08 n09 n10");
    expands_to("n[8-10]", "n8 n9 n10");
    expands_to("n[098-101]", "n098 n099 n100 n101");
    expands_to("r[1-2]n[1-2]", "r1n1 r1n2 r2n1 r2n2");
    expands_to("r[1-2]n[1-2].ib", "r1n1.ib r1n2.ib r2n1.ib r2n2.ib");
    expands_to("[1-3]", "1 2 3");
    expands_to("a,b,c", "a b c");
    expands_to("a[5],b[0-1]-x", "a5 b0-x b1-x");
    expands_to("gpu-a100-[3,1]", "gpu-a100-3 gpu-a100-1");
    expands_to("c[1-2],d,e[00-01]f[7]", "c1 c2 d e00f7 e01f7");

    /* a big but legal list: 2 x 1000 hosts, check the ends only */
    char **h = NULL;
    size_t n = 0;
    is_int(dt_hostlist_expand("rack[1-2]n[0000-0999]", &h, &n), DT_OK, "2000-host list expands");
    is_int(n, 2000, "2000 hosts");
    if (n == 2000) {
        is_str(h[0], "rack1n0000", "first host");
        is_str(h[1999], "rack2n0999", "last host");
    } else skip(2, "wrong count");
    dt_hostlist_free(h, n);

    rejects("", "empty");
    rejects(NULL, "empty");
    rejects("node[1-3", "unbalanced '['");
    rejects("node1-3]", "unbalanced ']'");
    rejects("node[3-1]", "reversed range 3-1");
    rejects("node[]", "expected a number");
    rejects("node[1-]", "expected a number after '-'");
    rejects("node[a-b]", "expected a number");
    rejects("node[1-2,]", "expected a number");
    rejects("node[[1-2]]", "nested '['");
    rejects("a,,b", "empty host name");
    rejects("a,", "empty host name");
    rejects(",a", "empty host name");
    rejects("node[1-2x]", "unexpected 'x'");
    rejects("node 1", "whitespace");
    rejects("n[1-999999999999]", "more than");
    rejects("a[1-1000]b[1-1000]c[1-10]", "more than");
    rejects("n[1234567890123456789]", "expected a number");
    return done_testing();
}
