/* test_dtrun_parse.c: dtrun's parsers of the elastic probe's answer and of a rendezvous
 * START and PEERS (src/tools/dtrun_parse.c): what dtrun's own peers send, read field by field, and
 * each kind of message that must be refused. */
#include "tools/dtrun_parse.h"
#include "tap.h"

static void answer_rejected(const char *line, const char *what) {
    dtrun_exact ex;
    is_int(dtrun_parse_answer(line, &ex), -1, "answer refused: %s", what);
}

static void start_rejected(const char *args, const char *what) {
    dtrun_start st;
    is_int(dtrun_parse_start(args, &st), -1, "START refused: %s", what);
}

static dtrun_peers pe;   /* 300 KiB */

static void peers_rejected(const char *args, const char *what) {
    is_int(dtrun_parse_peers(args, &pe), -1, "PEERS refused: %s", what);
    is_int(pe.n, 0, "  and nothing left behind");
}

int main(void) {
    dtrun_exact ex;
    char line[2200];

    /* the answers dtrain train prints (src/tools/dtrain.c, elastic_probe) */
    is_int(dtrun_parse_answer("sizes=1,2,4,8 resume=auto checkpoint-dir=/data/run 1/ck", &ex), 0, "full answer");
    is_int(ex.nsizes, 4, "four sizes");
    ok(ex.sizes[0] == 1 && ex.sizes[1] == 2 && ex.sizes[2] == 4 && ex.sizes[3] == 8, "sizes 1, 2, 4, 8");
    is_str(ex.resume, "auto", "resume");
    is_str(ex.ckpt_dir, "/data/run 1/ck", "checkpoint dir, spaces and all");
    is_int(dtrun_parse_answer("sizes=3 resume=none", &ex), 0, "answer without a checkpoint dir");
    ok(ex.nsizes == 1 && ex.sizes[0] == 3 && ex.ckpt_dir[0] == '\0', "one size, no dir");
    is_str(ex.resume, "none", "resume none");
    is_int(dtrun_parse_answer("sizes=16777216", &ex), 0, "sizes alone, the largest world");
    ok(ex.nsizes == 1 && ex.sizes[0] == 16777216 && !ex.resume[0] && !ex.ckpt_dir[0], "largest world, nothing else");
    /* 64 sizes fit, 65 do not */
    strcpy(line, "sizes=1");
    for (int i = 2; i <= 64; i++) snprintf(line + strlen(line), sizeof line - strlen(line), ",%d", i);
    is_int(dtrun_parse_answer(line, &ex), 0, "64 sizes");
    is_int(ex.nsizes, 64, "64 sizes kept");
    strcat(line, ",65");
    answer_rejected(line, "65 sizes");
    /* a checkpoint dir of 1023 bytes fits; 1024 would be cut */
    strcpy(line, "sizes=1 resume=auto checkpoint-dir=/");
    size_t head = strlen(line) - 1;
    memset(line + head + 1, 'd', 1022);
    line[head + 1023] = '\0';
    is_int(dtrun_parse_answer(line, &ex), 0, "1023-byte checkpoint dir");
    is_int(strlen(ex.ckpt_dir), 1023, "kept whole");
    strcat(line, "d");
    is_int(dtrun_parse_answer(line, &ex), -1, "answer refused: 1024-byte checkpoint dir");
    ok(ex.nsizes == 0 && ex.ckpt_dir[0] == '\0', "a refused answer leaves nothing behind");
    is_int(dtrun_parse_answer("sizes=1 resume=0123456789012345678901234567890", &ex), 0, "31-byte resume");
    answer_rejected("sizes=1 resume=01234567890123456789012345678901", "32-byte resume");

    answer_rejected("", "empty");
    answer_rejected("sizes=", "no size");
    answer_rejected("sizes=0,1", "size 0");
    answer_rejected("sizes=-1,2", "negative size");
    answer_rejected("sizes=+1,2", "a sign");
    answer_rejected("sizes=1,4,2", "sizes out of order");
    answer_rejected("sizes=1,1", "a size twice");
    answer_rejected("sizes=16777217", "a world beyond the largest");
    answer_rejected("sizes=99999999999999999999999", "a size that overflows");
    answer_rejected("sizes=1,2,", "a trailing comma");
    answer_rejected("sizes=1,,2", "an empty size");
    answer_rejected("sizes=1,2x", "junk after a size");
    answer_rejected("sizes=1,2 resume=auto junk", "trailing junk");
    answer_rejected("sizes=1,2 ", "a trailing space");
    answer_rejected("sizes=1 resume=auto resume=path", "resume twice");
    answer_rejected("sizes=1 resume=auto checkpoint-dir=/ck\r", "a CR at the end of the dir");
    answer_rejected("sizes=1 resume=au\x1bto", "a control character in resume");
    answer_rejected("resume=auto sizes=1", "sizes not first");

    /* START as node 0 sends it (dtrun_rdzv.c, server_round and elastic_joined) */
    dtrun_start st;
    is_int(dtrun_parse_start("3 1 2 41234 8 4 4 1 2 0.000 -", &st), 0, "a restart's START");
    ok(st.attempt == 3 && st.kind == 1 && st.restarts == 2 && st.port == 41234, "attempt, kind, restarts, port");
    ok(st.world == 8 && st.rank0 == 4 && st.nlocal == 4 && st.group == 1 && st.ngroups == 2,
       "world 8, ranks 4..7, group 1 of 2");
    ok(st.change_at == 0 && st.change[0] == '\0', "no change");
    is_int(dtrun_parse_start("4 2 0 35001 4 2 2 1 2 1767225600.125 node 3 (h3) lost: closed\tranks 6..7", &st), 0,
           "a membership change's START");
    ok(st.change_at == 1767225600.125, "change time");
    is_str(st.change, "node 3 (h3) lost: closed\nranks 6..7", "change text, tab decoded");
    is_int(dtrun_parse_start("5 2 0 0 8 0 0 -1 2 0.000 -", &st), 0, "a late node's spare START (port 0)");
    ok(st.nlocal == 0 && st.group == -1 && st.port == 0, "a spare");
    is_int(dtrun_parse_start("1 2 0 40000 6 6 0 -1 2 1.500 node 2 joined", &st), 0, "a spare at the world's end");
    is_int(dtrun_parse_start("0 0 0 65535 16777216 16773120 4096 4095 4096 0.000 -", &st), 0, "the largest job");
    /* a change text of 599 bytes fits; 600 would be cut */
    strcpy(line, "0 2 0 29500 2 0 1 0 2 5.000 ");
    head = strlen(line);
    memset(line + head, 'c', 599);
    line[head + 599] = '\0';
    is_int(dtrun_parse_start(line, &st), 0, "a 599-byte change");
    is_int(strlen(st.change), 599, "kept whole");
    strcat(line, "c");
    is_int(dtrun_parse_start(line, &st), -1, "START refused: a 600-byte change");
    ok(st.world == 0 && st.change[0] == '\0', "a refused START leaves nothing behind");

    start_rejected("", "empty");
    start_rejected("0 0 0 29500 8 4 4 1 2 0.000", "9 fields and a time, no change");
    start_rejected("0 0 0 29500 8 4 4 1 2 -", "9 fields");
    start_rejected("0 0 0 29500 8 4 4 1 2 0.000 ", "an empty change");
    start_rejected("0 0 0 0 8 4 4 1 2 0.000 -", "port 0 on a node that runs ranks");
    start_rejected("0 0 0 70000 8 4 4 1 2 0.000 -", "port 70000");
    start_rejected("0 0 0 -1 8 0 0 -1 2 0.000 -", "a negative port");
    start_rejected("0 0 0 29500 8 4 4 2 2 0.000 -", "group = ngroups");
    start_rejected("0 0 0 29500 8 4 4 -1 2 0.000 -", "group -1 on a node that runs ranks");
    start_rejected("0 0 0 29500 8 8 0 1 2 0.000 -", "a group on a spare");
    start_rejected("0 0 0 29500 8 4 4 0 0 0.000 -", "ngroups 0");
    start_rejected("0 0 0 29500 2 0 1 0 3 0.000 -", "more groups than ranks");
    start_rejected("0 0 0 29500 8 5 4 1 2 0.000 -", "rank0 + nlocal > world");
    start_rejected("0 0 0 29500 8 2147483647 4 1 2 0.000 -", "rank0 + nlocal overflows");
    start_rejected("0 0 0 29500 0 0 0 -1 1 0.000 -", "world 0");
    start_rejected("0 0 0 29500 16777217 0 1 0 1 0.000 -", "a world beyond the largest");
    start_rejected("0 0 0 29500 8 0 4097 0 2 0.000 -", "nlocal beyond DTRUN_MAX_RANKS");
    start_rejected("-1 0 0 29500 8 4 4 1 2 0.000 -", "a negative attempt");
    start_rejected("0 0 -1 29500 8 4 4 1 2 0.000 -", "negative restarts");
    start_rejected("0 3 0 29500 8 4 4 1 2 0.000 -", "kind 3");
    start_rejected("4294967296 0 0 29500 8 4 4 1 2 0.000 -", "an attempt beyond int");
    start_rejected("0 0 0 29500 8 4 4 1 2 nan -", "a change time nan");
    start_rejected("0 0 0 29500 8 4 4 1 2 inf -", "a change time inf");
    start_rejected("0 0 0 29500 8 4 4 1 2 1e999 -", "a change time that overflows");
    start_rejected("0 0 0 29500 8 4 4 1 2 -1.000 -", "a negative change time");
    start_rejected("0 0 0 29500 8 4x 4 1 2 0.000 -", "junk in a number");
    start_rejected("0 0 0 29500 8 +4 4 1 2 0.000 -", "a sign");
    start_rejected("0 0 0 29500 8 4 4 1 2 0.000x -", "junk after the time");

    /* PEERS: node 0 lists the live nodes and where each would serve */
    is_int(dtrun_parse_peers("3 0 10.0.0.1 0 1 10.0.0.2 40123 3 fe80::1 65535", &pe), 0, "three nodes");
    ok(pe.n == 3 && pe.node[0] == 0 && pe.node[1] == 1 && pe.node[2] == 3, "their node ranks");
    is_str(pe.addr[1], "10.0.0.2", "an IPv4 address");
    is_str(pe.addr[2], "fe80::1", "an IPv6 address");
    ok(pe.port[0] == 0 && pe.port[1] == 40123 && pe.port[2] == 65535, "their ports");
    is_int(dtrun_parse_peers("1 0 127.0.0.1 0", &pe), 0, "node 0 alone");
    static char big[80000] = "4096";
    for (int i = 0; i < 4096; i++) snprintf(big + strlen(big), sizeof big - strlen(big), " %d ::1 %d", i, i);
    is_int(dtrun_parse_peers(big, &pe), 0, "4096 nodes");
    ok(pe.n == 4096 && pe.node[4095] == 4095 && pe.port[4095] == 4095, "the last of them");
    char addr[200] = "1 0 ";   /* 64 characters would be cut: refused; 63 fit */
    memset(addr + 4, '1', 64);
    strcpy(addr + 68, " 5");
    peers_rejected(addr, "a 64-character address");
    strcpy(addr + 67, " 5");
    is_int(dtrun_parse_peers(addr, &pe), 0, "a 63-character address");
    is_int(strlen(pe.addr[0]), 63, "kept whole");
    peers_rejected("", "empty");
    peers_rejected("0", "no nodes");
    peers_rejected("0 ", "n 0");
    peers_rejected("4097 0 ::1 1", "more nodes than DTRUN_MAX_NODES");
    peers_rejected("2 0 10.0.0.1 0", "fewer triples than n");
    peers_rejected("1 0 10.0.0.1 0 1 10.0.0.2 5", "more triples than n");
    peers_rejected("1 0 10.0.0.1 0 ", "a space at the end");
    peers_rejected("2 1 10.0.0.1 0 1 10.0.0.2 5", "a node twice");
    peers_rejected("2 2 10.0.0.1 0 1 10.0.0.2 5", "nodes out of order");
    peers_rejected("1 4096 10.0.0.1 0", "node 4096");
    peers_rejected("1 -1 10.0.0.1 0", "a negative node");
    peers_rejected("1 0 10.0.0.1 65536", "port 65536");
    peers_rejected("1 0 10.0.0.1 -1", "a negative port");
    peers_rejected("1 0 10.0.0.1 +1", "a sign");
    peers_rejected("1 0 host.example 1", "a name, not an address");
    peers_rejected("1 0  1", "an empty address");
    peers_rejected("1 0 10.0.0.1  1", "two spaces");
    peers_rejected("1 0 10.0.0.1 1x", "junk after a port");
    peers_rejected("1 0 10.0.0.1\t1", "a tab");
    return done_testing();
}
