#!/bin/sh
# exports.sh: libdtrain.so exports the public API and nothing else.
#
# The library is compiled with -fvisibility=hidden and the installed headers mark their
# functions DT_API (src/dt_api.h), so its dynamic symbol table must hold exactly the
# functions those headers declare: no internal helper that a program could come to
# depend on (the clock, the testing hook, the store, the CPU kernels, the layer rows),
# and no public function hidden by a forgotten DT_API, which nothing else here would
# notice: the programs and tests link the library's objects statically
# (libdtrain_core). The declarations come from GCC's -aux-info, which lists every
# function a translation unit declares with the file that declares it.
. "$DT_SRCDIR/tests/tap.sh"
S=$DT_SRCDIR
B=$DT_BUILDDIR
so=$B/.libs/libdtrain.so
core=$B/.libs/libdtrain_core.a
command -v nm > /dev/null 2>&1 || skip_all "no nm (binutils)"
[ -f "$so" ] || skip_all "no shared library $so (configured with --disable-shared?)"
[ -f "$core" ] || skip_all "no $core"
grep -q '^DT_VISIBILITY_CFLAGS = -fvisibility=hidden' "$B/Makefile" ||
    skip_all "configure found no -fvisibility=hidden for this compiler: every symbol is exported"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

nm -D --defined-only "$so" | awk '{ print $NF }' | sort -u > "$TMP/exported"
# the global symbols of the library's objects: what a hidden one is checked against
nm --defined-only "$core" 2> /dev/null | awk 'NF == 3 && $2 ~ /[A-Z]/ { print $3 }' | sort -u > "$TMP/core"
diag "$so exports $(wc -l < "$TMP/exported") symbols"

# 1. names: the public prefix, a few public functions present, private ones absent
grep -v '^dt_' "$TMP/exported" > "$TMP/bad"
[ ! -s "$TMP/bad" ]
ok $? "every exported symbol starts with dt_"
sed 's/^/#   /' "$TMP/bad" | head -20
for f in dt_last_error dt_comm_init dt_allreduce dt_model_build dt_train_run dt_ops_get; do
    grep -qx "$f" "$TMP/exported"
    ok $? "public $f is exported"
done
# private: the clock, the testing hook, the store, typed reductions, a CPU kernel and its
# multiversioned helper, a layer row, helpers without the prefix
for f in dt_now dt_testing_set_fault dt_store_connect dt_reduce_apply dt_cpu_sgemm dt_cpu_run_sums \
         dt_layer_def_linear layer_shape_error tcp_xfer; do
    if ! grep -qx "$f" "$TMP/core"; then
        ok 1 "private $f is defined in libdtrain_core (renamed? pick another private symbol here)"
    else
        ! grep -qx "$f" "$TMP/exported"
        ok $? "private $f is not exported"
    fi
done

# 2. the exported set is the set of functions the installed headers declare
cc=${DT_CC:-cc}
if [ -z "${DT_PUBLIC_HEADERS:-}" ]; then
    skip "DT_PUBLIC_HEADERS is not set (make check sets it): exported = declared"
    skip "DT_PUBLIC_HEADERS is not set (make check sets it): declared = exported"
    done_testing
fi
for h in $DT_PUBLIC_HEADERS; do echo "#include \"$S/$h\""; done > "$TMP/all.c"
if ! $cc -std=gnu11 -fsyntax-only -I"$S/src" -I"$S/src/comm" -I"$B" -aux-info "$TMP/aux" "$TMP/all.c" \
        > "$TMP/log" 2>&1; then
    skip "$cc has no -aux-info (a GCC option): exported = declared"
    skip "$cc has no -aux-info (a GCC option): declared = exported"
    done_testing
fi
# "/* /src/dir/src/model.h:67:NC */ extern dt_status dt_model_build (const char *, ...);"
for h in $DT_PUBLIC_HEADERS; do echo "$S/$h"; done > "$TMP/headers"
awk 'NR == FNR { pub[$0] = 1; next }
     { file = $2; sub(/:[0-9]+:N[CF]$/, "", file) }
     (file in pub) && $4 != "static" && match($0, /[A-Za-z_][A-Za-z_0-9]* \(/) {
         print substr($0, RSTART, RLENGTH - 2) }' "$TMP/headers" "$TMP/aux" | sort -u > "$TMP/declared"
diag "the installed headers declare $(wc -l < "$TMP/declared") functions"
comm -13 "$TMP/declared" "$TMP/exported" > "$TMP/extra"
[ ! -s "$TMP/extra" ]
ok $? "every exported symbol is a function declared in an installed header"
sed 's/^/#   exported, declared in no installed header: /' "$TMP/extra" | head -20
comm -23 "$TMP/declared" "$TMP/exported" > "$TMP/missing"
[ ! -s "$TMP/missing" ]
ok $? "every function declared in an installed header is exported"
sed 's/^/#   not exported (no DT_API, or never defined): /' "$TMP/missing" | head -20
done_testing
