#!/bin/sh
# cu2cpp.sh SRC: a CUDA source rewritten for the CPU stand-ins of tests/gpu_emu/, on
# stdout: every kernel launch k<<<cfg>>>(args) becomes emu_cfg(cfg).run(EMU_NAMED(k))(args)
# (k<A, B><<<cfg>>>(args), integer template arguments, emu_cfg(cfg).run(k<A, B>,
# emu_tname<A, B>("k"))(args): the launch names the instance),
# and a kernel whose __launch_bounds__ is a constant gets EMU_BOUNDS(kernel, bound) so
# the stand-in refuses launches over it. Used by tests/gpu_emu.sh and tests/gpu_emu_build.sh.
sed -e 's/\([A-Za-z_][A-Za-z_0-9]*\)<\([A-Za-z_0-9, ]*\)><<<\(.*\)>>>(/emu_cfg(\3).run(\1<\2>, emu_tname<\2>("\1"))(/' \
    -e 's/\([A-Za-z_][A-Za-z_0-9]*\)<<<\(.*\)>>>(/emu_cfg(\2).run(EMU_NAMED(\1))(/' "${1:?usage: cu2cpp.sh SRC}" | awk '
    held != "" {
        if (match($0, /^[A-Za-z_][A-Za-z_0-9]*\(/)) printf "EMU_BOUNDS(%s, %s) ", substr($0, 1, RLENGTH - 1), bound
        print held; held = ""
    }
    /^__global__ void __launch_bounds__\([A-Z0-9_]+\)/ {
        bound = $0; sub(/^__global__ void __launch_bounds__\(/, "", bound); sub(/\).*/, "", bound)
        rest = $0; sub(/^__global__ void __launch_bounds__\([A-Z0-9_]+\) */, "", rest)
        if (rest == "") { held = $0; next }
        if (match(rest, /^[A-Za-z_][A-Za-z_0-9]*\(/)) printf "EMU_BOUNDS(%s, %s) ", substr(rest, 1, RLENGTH - 1), bound
    }
    { print }'
