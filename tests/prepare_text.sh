#!/bin/sh
# prepare_text.sh: dtrain prepare-text end to end: byte-level llm.c token files whose
# tokens are the input bytes in the order given, split at int(len * 0.9); byte for byte
# what a numpy script in the manner of make_bytes_bin.py writes (on small files and on
# Debian's fortunes when installed); atomic files under the umask; bad input exits 2.
. "${DT_SRCDIR:-$(dirname "$0")/..}/tests/tap.sh"
D="$DT_BUILDDIR/dtrain"
[ -x "$D" ] || skip_all "dtrain not built"
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)
[ -n "$PY" ] || skip_all "no python3"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
run() { timeout 60 "$D" "$@"; }

# train.bin + val.bin of DIR: check llm.c's headers and write the tokens, as bytes, to OUT
untok() {
    "$PY" - "$1" "$2" <<'EOF'
import struct, sys
d, out = sys.argv[1], sys.argv[2]
data = b""
for name in ("train.bin", "val.bin"):
    b = open(d + "/" + name, "rb").read()
    magic, version, count = struct.unpack("<3i", b[:12])
    assert magic == 20240520 and version == 1, (name, magic, version)
    assert b[12:1024] == bytes(1012), name + ": header words 3..255 are not zero"
    assert len(b) == 1024 + 2 * count, (name, len(b), count)
    toks = struct.unpack("<%dH" % count, b[1024:])
    assert max(toks, default=0) < 256
    data += bytes(toks)
open(out, "wb").write(data)
EOF
}

# the reference: make_bytes_bin.py's algorithm (sorted inputs, numpy header)
numpy_ref() {
    "$PY" - "$@" <<'EOF'
import os, sys
import numpy as np
out, files = sys.argv[1], sys.argv[2:]
data = b"".join(open(f, "rb").read() for f in sorted(files))
tok = np.frombuffer(data, dtype=np.uint8).astype(np.uint16)
cut = int(len(tok) * 0.9)
os.makedirs(out, exist_ok=True)
for name, part in (("train.bin", tok[:cut]), ("val.bin", tok[cut:])):
    head = np.zeros(256, dtype=np.int32)
    head[0], head[1], head[2] = 20240520, 1, len(part)
    with open(os.path.join(out, name), "wb") as f:
        f.write(head.tobytes())
        f.write(part.tobytes())
EOF
}
have_numpy=0
"$PY" -c 'import numpy' 2> /dev/null && have_numpy=1

# ---- small files: every byte value, an empty file, text --------------------------
printf 'hello, world\n' > "$T/a.txt"
"$PY" -c 'import sys; sys.stdout.buffer.write(bytes(range(256)) * 3)' > "$T/b.bin"
: > "$T/c.empty"
run prepare-text "$T/out" "$T/a.txt" "$T/b.bin" "$T/c.empty" > "$T/log" 2>&1
ok $? "prepare-text of three small files"
ok_grep "$T/log" "^781 tokens: train 702, val 79$" "prints N tokens: train int(N * 0.9), val the rest"
cat "$T/a.txt" "$T/b.bin" > "$T/cat"
untok "$T/out" "$T/back" && cmp -s "$T/cat" "$T/back"
ok $? "llm.c headers, and train.bin + val.bin tokens are the input bytes in the order given"
[ "$(ls "$T/out" | tr '\n' ' ')" = "train.bin val.bin " ]
ok $? "nothing but train.bin and val.bin in OUT_DIR (no temporary files left)"

run prepare-text "$T/out2" "$T/b.bin" "$T/a.txt" > /dev/null 2>&1
cat "$T/b.bin" "$T/a.txt" > "$T/cat2"
untok "$T/out2" "$T/back2" && cmp -s "$T/cat2" "$T/back2" && ! cmp -s "$T/out/train.bin" "$T/out2/train.bin"
ok $? "another order gives another concatenation (inputs are not sorted)"

if [ $have_numpy -eq 1 ]; then
    # given sorted, the inputs make make_bytes_bin.py's bytes
    numpy_ref "$T/ref" "$T/b.bin" "$T/a.txt" "$T/c.empty"
    cmp -s "$T/out/train.bin" "$T/ref/train.bin" && cmp -s "$T/out/val.bin" "$T/ref/val.bin"
    ok $? "sorted inputs: byte for byte the numpy reference's files"
    printf 'x' > "$T/one"
    run prepare-text "$T/out1" "$T/one" > "$T/log1" 2>&1 && numpy_ref "$T/ref1" "$T/one" &&
        cmp -s "$T/out1/train.bin" "$T/ref1/train.bin" && cmp -s "$T/out1/val.bin" "$T/ref1/val.bin"
    ok $? "a single byte: train 0 tokens, val 1, as the reference"
    ok_grep "$T/log1" "^1 tokens: train 0, val 1$" "  and says so"
else
    skip "numpy not installed (python3-numpy)"
    skip "numpy not installed (python3-numpy)"
    skip "numpy not installed (python3-numpy)"
fi

# ---- the fortunes corpus --------------------------------------------------------
F=/usr/share/games/fortunes
if [ -d "$F" ] && [ -n "$(ls "$F" 2> /dev/null)" ]; then
    # the files in byte order, as Python's sorted() orders them
    LC_ALL=C ls "$F" | LC_ALL=C sort | sed "s|^|$F/|" > "$T/list"
    n=$(wc -l < "$T/list")
    # shellcheck disable=SC2046
    run prepare-text "$T/fort" $(cat "$T/list") > "$T/flog" 2>&1
    ok $? "prepare-text of the $n fortunes files"
    # shellcheck disable=SC2046
    total=$(cat $(cat "$T/list") | wc -c)
    ok_grep "$T/flog" "^$total tokens: train $((total * 9 / 10)), val $((total - total * 9 / 10))$" \
        "  $total tokens, 90 % for training"
    # shellcheck disable=SC2046
    cat $(cat "$T/list") > "$T/fcat"
    untok "$T/fort" "$T/fback" && cmp -s "$T/fcat" "$T/fback"
    ok $? "  the round trip gives the corpus back"
    if [ $have_numpy -eq 1 ]; then
        # shellcheck disable=SC2046
        numpy_ref "$T/fref" $(cat "$T/list")
        cmp -s "$T/fort/train.bin" "$T/fref/train.bin" && cmp -s "$T/fort/val.bin" "$T/fref/val.bin"
        ok $? "  byte for byte the numpy reference's files"
    else
        skip "numpy not installed (python3-numpy)"
    fi
else
    skip "fortunes not installed (Debian package fortunes)"
    skip "fortunes not installed (Debian package fortunes)"
    skip "fortunes not installed (Debian package fortunes)"
    skip "fortunes not installed (Debian package fortunes)"
fi

# ---- files: atomic replacement, the umask ----------------------------------------
ln "$T/out/train.bin" "$T/old_link"
run prepare-text "$T/out" "$T/b.bin" > /dev/null 2>&1
untok "$T/out" "$T/back3" && cmp -s "$T/b.bin" "$T/back3" && [ "$(stat -c %h "$T/old_link")" = 1 ]
ok $? "a second run replaces the files by rename (the old inode is left alone)"
(umask 077; run prepare-text "$T/priv" "$T/a.txt" > /dev/null 2>&1)
[ "$(stat -c %a "$T/priv/train.bin" 2> /dev/null)" = 600 ] && [ "$(stat -c %a "$T/priv/val.bin")" = 600 ]
ok $? "under umask 077 the files are mode 600"
(umask 022; run prepare-text "$T/pub/deeper" "$T/a.txt" > /dev/null 2>&1)
[ "$(stat -c %a "$T/pub/deeper/train.bin" 2> /dev/null)" = 644 ]
ok $? "under umask 022 mode 644, and missing parents of OUT_DIR are created"

# ---- bad input: one clear line, exit 2, nothing written --------------------------
bad() {  # expected-pattern description args...
    pat=$1; what=$2; shift 2
    run "$@" > "$T/bad" 2>&1; rc=$?
    [ $rc -eq 2 ]; ok $? "$what exits 2 (got $rc)"
    ok_grep "$T/bad" "$pat" "$what: message names the problem"
}
bad "expected OUT_DIR and at least one FILE" "no arguments" prepare-text
bad "expected OUT_DIR and at least one FILE" "no input file" prepare-text "$T/x"
bad "$T/missing: cannot open" "a missing input" prepare-text "$T/x" "$T/a.txt" "$T/missing"
[ ! -e "$T/x" ]; ok $? "  nothing is created before the inputs are checked"
mkfifo "$T/fifo"
bad "$T/fifo: not a regular file" "a FIFO input (no hang)" prepare-text "$T/x" "$T/fifo"
bad "$T/out: not a regular file" "a directory as input" prepare-text "$T/x" "$T/out"
bad "no bytes" "inputs of no bytes" prepare-text "$T/x" "$T/c.empty"
bad "cannot create directory" "OUT_DIR under a regular file" prepare-text "$T/a.txt/sub" "$T/b.bin"
bad "$T/a.txt: not a directory" "OUT_DIR that is a regular file" prepare-text "$T/a.txt" "$T/b.bin"
bad "unknown flag '--bogus'" "an unknown flag" prepare-text --bogus "$T/x" "$T/a.txt"
untok "$T/out" "$T/back4" && cmp -s "$T/b.bin" "$T/back4"
ok $? "failed runs leave earlier output as it was"
run prepare-text -- "$T/dash" "$T/a.txt" > /dev/null 2>&1
ok $? "-- ends the flags"

run prepare-text --help > "$T/help" 2>&1
ok $? "prepare-text --help exits 0"
ok_grep "$T/help" "order given" "  and says the inputs are taken in the order given"
run --help > "$T/mainhelp" 2>&1
ok_grep "$T/mainhelp" "prepare-text" "dtrain --help lists prepare-text"
done_testing
