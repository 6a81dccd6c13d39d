#!/bin/sh
# gpu_train.sh: a short training run (20 steps, synthetic data) of the mlp and cnn
# presets on the CPU and on the GPU (dtrain train --device cuda): the per-step losses
# (--metrics JSON lines, --log-every 1) agree within 1e-4 relative, and two GPU runs give
# the same losses to the last printed digit (deterministic kernels), also with the grid of
# the grid-stride kernels capped at one block (DT_CU_MAX_BLOCKS=1). Skips, saying why,
# without a --with-cuda build or a usable GPU; fails when nvidia-smi lists a GPU that
# dtrain cannot use (an insufficient driver).
. "$DT_SRCDIR/tests/tap.sh"
. "$DT_SRCDIR/tests/gpu_lib.sh"
gpu_need_build
[ -x "$B/dtrain" ] || skip_all "dtrain is not built"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

train() {  # device model tag [steps]
    rm -f "$TMP/$3.jsonl"
    timeout 300 "$B/dtrain" train --device "$1" --model "$2" --data synthetic:1024,1,28,28,10 \
        --steps "${4:-20}" --batch 64 --seed 3 --log-every 1 --metrics "$TMP/$3.jsonl" \
        --no-eval --quiet --threads 2 > "$TMP/$3.out" 2>&1
}
losses() { sed -n 's/.*"event":"step".*"loss":\([^,}]*\).*/\1/p' "$1"; }

if ! train cuda mlp probe 1 && gpu_absent_msg "$TMP/probe.out"; then gpu_probe_failed "$TMP/probe.out"; fi

for m in mlp cnn; do
    train cpu $m $m-cpu; ok $? "$m: 20 steps on the cpu"
    train cuda $m $m-gpu; rc=$?
    ok $rc "$m: 20 steps on the gpu"
    [ $rc -eq 0 ] || sed 's/^/#   /' "$TMP/$m-gpu.out" | tail -5
    losses "$TMP/$m-cpu.jsonl" > "$TMP/$m.c"
    losses "$TMP/$m-gpu.jsonl" > "$TMP/$m.g"
    [ "$(wc -l < "$TMP/$m.c")" -eq 20 ] && [ "$(wc -l < "$TMP/$m.g")" -eq 20 ]
    ok $? "$m: 20 losses logged on each device"
    worst=$(paste "$TMP/$m.c" "$TMP/$m.g" | awk '{ d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1);
                                                  if (r > w) w = r } END { printf "%.3g", w + 0 }')
    awk -v w="$worst" 'BEGIN { exit !(w <= 1e-4) }'
    ok $? "$m: gpu losses within 1e-4 relative of the cpu's (worst $worst)"
    train cuda $m $m-gpu2
    losses "$TMP/$m-gpu2.jsonl" > "$TMP/$m.g2"
    cmp -s "$TMP/$m.g" "$TMP/$m.g2"
    ok $? "$m: two gpu runs give the same losses"
    DT_CU_MAX_BLOCKS=1 train cuda $m $m-cap
    losses "$TMP/$m-cap.jsonl" > "$TMP/$m.cap"
    cmp -s "$TMP/$m.g" "$TMP/$m.cap"
    ok $? "$m: the same losses with the grid capped at one block (DT_CU_MAX_BLOCKS=1)"
done
done_testing
