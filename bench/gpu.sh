#!/usr/bin/env bash
# bench/gpu.sh: the GPU path in one run, in sections ordered by value, so that a run cut
# short (one call of a lent GPU, at most 10 minutes, all included) still leaves the most
# useful results.
#
#   bench/gpu.sh [--emulate] [--quick] [--build-only] [--budget SECONDS] [--sections LIST]
#   bench/gpu.sh --kit [--nccl] [--mpi]     (bench/gpu_kit.sh: the kit for a GPU machine)
#
# On a lent GPU machine, from the unpacked kit (made here with `make gpu-kit`):
#   tar -xzf dtrain-gpu-kit.tar.gz && dtrain-gpu-kit/bench/gpu.sh
# Run from a kit (a folder with a KIT file, see bench/gpu_kit.sh) it uses the kit's
# programs and builds nothing.
# With $OUT set (the folder a lent machine sends back, at most 8 files), the budget is
# 480 s including any build, and $OUT gets summary.txt and logs.tar.gz (every section's
# log, the run's output and the small result files) after each section and when the
# run is killed (TERM, INT, HUP); without $OUT the budget defaults to 780 s after the
# build. Each section has its own timeout (and never more than what is left of the
# budget), prints its wall time, and says "skip: WHY" when it cannot run here; the last
# screen sums everything up. --sections env,ops,... runs those only (in this order).
#   build        (not in a kit) configure --with-cuda --with-cuda-arch=$DT_GPU_ARCH
#                (default 90) [--with-nccl] in a copy of the sources, $DT_GPU_BUILDDIR/src
#                (default build-gpu/src); skipped when that build exists. Needs autotools
#                and the libraries a GPU machine may lack: prefer the kit.
#   env          the libraries of the programs (ldd: nothing missing), then GPU, SMs,
#                clocks, memory, driver/runtime, cuBLAS and NCCL versions; stops the run
#                when the device, the driver or the build's GPU code cannot work here
#                (bench/gpu_info.c)
#   ops          tests/test_cuda_ops: every op against the CPU backend (worst error per
#                op) and the device time of the ops at real shapes
#   parity       mlp and cnn, 20 steps: GPU losses against CPU losses
#   throughput   dtrain against PyTorch on the same GPU, inside each process after
#                warm-up: cnn (batch 256) and an 8 x 4096 MLP (batch 1024) with TF32 off
#                and on and in bf16 (--precision bf16 against torch.autocast),
#                the gpt2 size (batch 8 x 1024 tokens): ms/step, samples/s, peak
#                memory, dtrain's data/compute/comm split (--rank-stats)
#   determinism  the op test's outputs (a hash each) twice and with
#                CUDA_LAUNCH_BLOCKING=1; the cnn's weights after 30 steps likewise
#   sanitizer    compute-sanitizer memcheck on the op table (its own cap), then
#                racecheck if the section has time left
#   kernels      the kernels of one gpt2 training step by device time (nsys, else ncu)
#   nccl         with 2+ GPUs: tests/gpu_nccl.sh and 2-rank training over NCCL
#   summary      one screen
# --emulate runs the same sections with the kernels compiled for the CPU
# (tests/gpu_emu_build.sh; needs a build of this tree, --with-cuda for the training
# sections); what needs a GPU skips, and timings mean nothing there. --quick makes
# every section small (the CI hook in .ci/run: --emulate --quick with $OUT set).
# Results: $DT_GPU_BENCH_OUT (default $DT_GPU_BUILDDIR/bench-out, or a temporary
# directory with --emulate or $OUT) gets each section's log and summary.txt.
set -u
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/.." && pwd)
bd=${DT_GPU_BUILDDIR:-$src/build-gpu}
emulate=0 quick=0 build_only=0 budget= section= sections=
ALL_SECTIONS="env ops parity throughput determinism sanitizer kernels nccl"
while [ $# -gt 0 ]; do
    case $1 in
        --emulate) emulate=1 ;;
        --quick) quick=1 ;;
        --build-only) build_only=1 ;;
        --budget) budget=${2:?--budget needs seconds}; shift ;;
        --sections) sections=${2:?--sections needs a list, e.g. env,ops}; shift ;;
        --kit) shift; exec bash "$here/gpu_kit.sh" "$@" ;;
        --section) section=${2:?}; shift ;;   # internal: run one section (under timeout)
        -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench/gpu.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
OUT=${OUT:-}
[ -n "$budget" ] || { [ -n "$OUT" ] && budget=480 || budget=780; }
case $budget in *[!0-9]*) echo "bench/gpu.sh: --budget expects whole seconds, got '$budget'" >&2; exit 2 ;; esac
for s in $(echo "$sections" | tr ',' ' '); do
    case " $ALL_SECTIONS " in *" $s "*) ;;
        *) echo "bench/gpu.sh: --sections: unknown section '$s' (expected some of: ${ALL_SECTIONS// /,})" >&2; exit 2 ;;
    esac
done
if [ -n "$OUT" ] && [ -z "$section" ]; then
    mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || { echo "bench/gpu.sh: cannot write to OUT=$OUT" >&2; exit 2; }
fi
# A kit (bench/gpu_kit.sh) holds its programs at its top, beside a KIT file.
kit=0
[ -f "$src/KIT" ] && kit=1 bd=$src
jobs=$(nproc 2>/dev/null || echo 4)
[ "$jobs" -gt 16 ] && jobs=16

# ---- what the sections share ----------------------------------------------------------

note() { echo "$*" >> "$R/summary.txt"; }   # one line for the summary screen
skip() { echo "skip: $*"; note "$(printf '%-12s skip: %s' "$section" "$*")"; exit 0; }
if [ -z "${DT_GPU_BENCH_PY+x}" ]; then   # a Python with PyTorch, found once for all sections
    DT_GPU_BENCH_PY=
    for p in python3 /usr/bin/python3; do
        if command -v "$p" > /dev/null 2>&1 && "$p" -c 'import torch' > /dev/null 2>&1; then DT_GPU_BENCH_PY=$p; break; fi
    done
    export DT_GPU_BENCH_PY
fi
PY=$DT_GPU_BENCH_PY

# Losses of the step events of a --metrics file, one per line.
losses() { sed -n 's/.*"event":"step".*"loss":\([^,}]*\).*/\1/p' "$1"; }
# Worst relative difference between two files of numbers, line by line ("missing" when
# the counts differ or are not N).
worst_rel() {
    paste "$1" "$2" | awk -v n="$3" '{ d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1; r = a > 0 ? d / a : d;
                                      if (r > w) w = r } END { if (NR != n) print "missing"; else printf "%.3g", w + 0 }'
}

# dtrain on the device under test: the real build, or the emulated kernels.
# DT_RUN_TIMEOUT=S: stop it after S seconds.
dtrain_dev() {
    local p=$BIN/dtrain
    [ $emulate = 1 ] && p=$R/emu/dtrain_emu
    ${DT_RUN_TIMEOUT:+timeout "$DT_RUN_TIMEOUT"} "$p" "$@"
}
# The op test on the device under test, with DT_CUDA_TEST_PARTS=$1.
optest() {
    local parts=$1; shift
    if [ $emulate = 1 ]; then
        DT_CUDA_TEST_EMU=1 DT_CUDA_TEST_PARTS=$parts "$@" "$R/emu/test_cuda_emu"
    else
        DT_CUDA_TEST_PARTS=$parts "$@" "$BIN/tests/test_cuda_ops"
    fi
}
need_training() {
    [ $emulate = 0 ] || [ -x "$R/emu/dtrain_emu" ] || skip "the emulated dtrain needs a --with-cuda build of this tree" \
        "$(head -1 "$R/emu/build.err" 2>/dev/null | sed 's/^./(&/; s/.$/&)/')"
}

# A training run on the device under test: train MODEL BATCH STEPS TAG [flags...];
# metrics in $R/TAG.jsonl, output in $R/TAG.out.
train() {
    local model=$1 batch=$2 steps=$3 tag=$4; shift 4
    rm -f "$R/$tag.jsonl"
    dtrain_dev train --device cuda --model "$model" --data "${TRAIN_DATA:-synthetic:$((batch * (steps + 1))),1,28,28,10}" \
        --batch "$batch" --steps "$steps" --seed 3 --schedule constant --no-eval --quiet \
        --metrics "$R/$tag.jsonl" "$@" > "$R/$tag.out" 2>&1
}

# ---- the sections ---------------------------------------------------------------------

s_env() {
    if [ $emulate = 1 ]; then
        echo "emulated device: the kernels compiled for the CPU (tests/gpu_emu/), $(nproc) cores of" \
             "$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)"
        echo "build: $B ($(grep -q 'define DT_HAVE_CUDA 1' "$B/config.h" 2>/dev/null && echo --with-cuda || echo 'no CUDA'))"
        note "$(printf '%-12s emulated on the CPU (%s)' env "$(g++ --version | head -1)")"
        return 0
    fi
    local info rc archs cc p progs=
    # the libraries first: gpu_info links the same CUDA (and NCCL) libraries as dtrain
    for p in "$BIN/dtrain" "$BIN/dtrun" "$BIN/tests/test_cuda_ops" "$bd/gpu_info"; do
        [ -e "$p" ] && progs="$progs $p" || echo "missing program: $p"
    done
    missing=$(ldd $progs 2>&1 | grep 'not found' | sort -u)
    if [ -n "$missing" ]; then
        note "$(printf '%-12s FAILED: libraries missing: %s' env "$(echo $missing)")"
        echo "STOP: the programs need libraries this machine lacks:"; echo "$missing"
        echo "(make the kit with bench/gpu_kit.sh: it bundles all but CUDA's runtime libraries and driver)"; exit 3
    fi
    ldd $progs | awk '$1 ~ /^lib(cuda|cudart|cublas|cublasLt|nccl|openblas|sodium)\.so/ && !s[$1]++ { print "  " $1, $3 }'
    info=$("$bd/gpu_info" 2>&1); rc=$?
    echo "$info"
    command -v nvidia-smi > /dev/null 2>&1 &&
        timeout 20 nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu,persistence_mode,mig.mode.current \
            --format=csv 2>&1
    echo "torch: $([ -n "$PY" ] && "$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1 || echo none)"
    get() { echo "$info" | sed -n "s/^$1=//p"; }
    if [ $rc -ne 0 ]; then
        note "$(printf '%-12s FAILED: %s' env "$(get error)")"
        echo "STOP: no usable device ($(get error)); driver CUDA $(get driver_cuda), runtime $(get runtime_cuda)"
        exit 3
    fi
    cc=$(get cc | tr -d .)
    archs=$(cat "$BIN/Makefile" "$BIN/KIT" 2>/dev/null | sed -n 's/^NVCC_ARCH_FLAGS = //p' | head -1)
    if ! echo "$archs" | grep -q "code=sm_$cc\b" &&
       ! echo "$archs" | grep -oE 'code=compute_[0-9]+' | awk -F_ -v c="$cc" '$2 <= c { f = 1 } END { exit !f }'; then
        note "$(printf '%-12s FAILED: the build has no code for compute capability %s (%s)' env "$(get cc)" "$archs")"
        echo "STOP: rebuild with --with-cuda-arch including ${cc} (DT_GPU_ARCH=$cc)"; exit 3
    fi
    note "$(printf '%-12s %s: cc %s, %s SMs, %s/%s MHz, %s GiB; CUDA driver %s runtime %s; cuBLAS %s; NCCL %s; %s GPU(s)' \
        env "$(get device)" "$(get cc)" "$(get sms)" "$(get sm_clock_mhz)" "$(get mem_clock_mhz)" "$(get mem_gib)" \
        "$(get driver_cuda)" "$(get runtime_cuda)" "$(get cublas)" "$(get nccl)" "$(get devices)")"
}

s_ops() {
    local parts=table,seq,real,errors,memory reps=20
    [ $quick = 1 ] && parts=table,errors
    [ $emulate = 1 ] && reps=1
    optest "$parts" env DT_CUDA_TEST_TIMING=$reps > "$R/ops.tap" 2>&1
    local rc=$? n_ok n_bad
    n_ok=$(grep -c '^ok' "$R/ops.tap"); n_bad=$(grep -c '^not ok' "$R/ops.tap")
    grep -A4 '^not ok' "$R/ops.tap" | head -40
    echo "worst normwise error against the cpu, per case:"
    sed -n 's/^ok [0-9]* - \(.*\): [a-z]* matches cpu within the stated tolerance (\([0-9]*\) outputs, worst normwise \(.*\))$/\3  \1/p' \
        "$R/ops.tap" | sort -g -r | head -12 | sed 's/^/  /'
    echo "device time at real shapes (mean of $reps calls$([ $emulate = 1 ] && echo ', emulated: not a speed')):"
    sed -n 's/^# time \(.*\): \(.*\) us$/\1|\2/p' "$R/ops.tap" | awk -F'|' '{ printf "  %-44s %12.1f us\n", $1, $2 }' |
        tee "$R/optimes.txt"
    note "$(printf '%-12s %s ok, %s not ok (exit %s); worst error %s' ops "$n_ok" "$n_bad" "$rc" \
        "$(sed -n 's/.*worst normwise \([^)]*\)).*/\1/p' "$R/ops.tap" | sort -g -r | head -1)")"
    while IFS= read -r l; do note "             $l"; done < "$R/optimes.txt"
    [ "$rc" -eq 0 ]
}

s_sanitizer() {
    [ $emulate = 0 ] || skip "compute-sanitizer needs a GPU"
    local cs
    cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
    [ -n "$cs" ] || skip "compute-sanitizer is not installed (PATH, /usr/local/cuda/bin)"
    # memcheck on the op table within its own cap; racecheck only with the time that is left
    local tool parts res= cap left t00=$SECONDS
    for tool in memcheck racecheck; do
        left=$((${DT_GPU_SECTION_S:-150} - (SECONDS - t00) - 5))
        cap=$left
        [ $tool = memcheck ] && [ $cap -gt 75 ] && cap=75
        if [ $cap -lt 30 ]; then
            echo "$tool: skipped, ${left} s left in the section"; res="$res $tool: skipped (no time left);"; continue
        fi
        parts=table
        [ $tool = racecheck ] && [ $quick = 0 ] && parts=table,seq
        local t0=$SECONDS
        DT_CUDA_TEST_PARTS=$parts timeout "$cap" "$cs" --tool $tool --error-exitcode 9 "$BIN/tests/test_cuda_ops" \
            > "$R/$tool.log" 2>&1
        local rc=$?
        grep -E '^========= (ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race|Error)' "$R/$tool.log" | sort | uniq -c | head -12
        echo "$tool ($parts): exit $rc in $((SECONDS - t0)) s$([ $rc = 124 ] && echo " (its cap of $cap s)")"
        res="$res $tool ($parts): $(grep -E '^========= (ERROR|RACECHECK) SUMMARY' "$R/$tool.log" | tail -1 | sed 's/^========= //') (exit $rc);"
    done
    note "$(printf '%-12s%s' sanitizer "$res")"
}

s_determinism() {
    local parts=table,seq,real steps=30 batch=64 same=yes
    [ $emulate = 1 ] && parts=table,seq steps=6   # the real shapes take minutes on the emulator
    # quick: the cnn at throughput's quick batch (an emulated cnn step of 64 samples takes
    # seconds, and three runs of it left CI's 3 x 60 s window short on a busy machine)
    [ $quick = 1 ] && parts=table steps=3 batch=16
    for run in 1 2 3; do
        local lb=
        [ $run = 3 ] && lb=1
        CUDA_LAUNCH_BLOCKING=${lb:-0} optest "$parts" env DT_CUDA_TEST_DUMP="$R/dump$run.txt" > "$R/det$run.tap" 2>&1
    done
    for run in 2 3; do
        if ! [ -s "$R/dump1.txt" ] || ! cmp -s "$R/dump1.txt" "$R/dump$run.txt"; then
            same=no; echo "op outputs of run $run differ from run 1:"; diff "$R/dump1.txt" "$R/dump$run.txt" | head -10
        fi
    done
    echo "op outputs (a hash each of $(wc -l < "$R/dump1.txt" 2>/dev/null || echo 0)): identical over 3 runs, the third with CUDA_LAUNCH_BLOCKING=1: $same"
    local wsame=skipped
    if [ $emulate = 0 ] || [ -x "$R/emu/dtrain_emu" ]; then
        wsame=yes
        for run in 1 2 3; do
            local lb=0
            [ $run = 3 ] && lb=1
            CUDA_LAUNCH_BLOCKING=$lb train cnn $batch $steps "det$run" --save "$R/det$run.safetensors" ||
                { wsame="no (run $run failed: $(tail -1 "$R/det$run.out"))"; break; }
        done
        if [ "$wsame" = yes ]; then
            cmp -s "$R/det1.safetensors" "$R/det2.safetensors" && cmp -s "$R/det1.safetensors" "$R/det3.safetensors" ||
                wsame=no
        fi
        echo "cnn weights after $steps steps (batch $batch): identical over 3 runs, the third with CUDA_LAUNCH_BLOCKING=1: $wsame"
    fi
    note "$(printf '%-12s op outputs identical x3 (1 with CUDA_LAUNCH_BLOCKING=1): %s; cnn weights after %s steps: %s' \
        determinism "$same" "$steps" "$wsame")"
    [ "$same" = yes ] && [ "$wsame" != no ]
}

s_parity() {
    need_training
    local steps=20 models="mlp cnn" res= bad=0
    [ $emulate = 1 ] && steps=8      # an emulated cnn step takes seconds
    [ $quick = 1 ] && steps=5 models=mlp
    for m in $models; do
        local dev
        for dev in cpu cuda; do
            rm -f "$R/par-$m-$dev.jsonl"
            dtrain_dev train --device $dev --model $m --data synthetic:1024,1,28,28,10 --steps $steps --batch 64 \
                --seed 3 --log-every 1 --metrics "$R/par-$m-$dev.jsonl" --no-eval --quiet --threads "$jobs" \
                > "$R/par-$m-$dev.out" 2>&1 || echo "$m on $dev failed: $(tail -1 "$R/par-$m-$dev.out")"
            losses "$R/par-$m-$dev.jsonl" > "$R/par-$m-$dev.loss"
        done
        local w
        w=$(worst_rel "$R/par-$m-cpu.loss" "$R/par-$m-cuda.loss" $steps)
        awk -v w="$w" 'BEGIN { exit !(w != "missing" && w <= 1e-4) }' || bad=1
        printf '%-6s step 1 loss cpu %s gpu %s; step %s cpu %s gpu %s; worst relative difference %s\n' $m \
            "$(head -1 "$R/par-$m-cpu.loss")" "$(head -1 "$R/par-$m-cuda.loss")" $steps \
            "$(tail -1 "$R/par-$m-cpu.loss")" "$(tail -1 "$R/par-$m-cuda.loss")" "$w"
        res="$res $m $w;"
    done
    note "$(printf '%-12s worst relative loss difference gpu vs cpu over %s steps (limit 1e-4):%s' parity $steps "$res")"
    [ $bad = 0 ]
}

# One dtrain throughput measurement: MODEL BATCH STEPS TAG [flags]: 2 x STEPS steps with
# --rank-stats STEPS, the second interval measured (the first warms up):
# "ms/step samples/s peak_MiB data_ms compute_ms comm_ms" (tokens/s with TRAIN_PER_SAMPLE set
# to the tokens of a sample).
dtrain_rate() {
    local model=$1 batch=$2 steps=$3 tag=$4; shift 4
    train "$model" "$batch" $((2 * steps)) "$tag" --rank-stats "$steps" "$@" || { echo "fail"; return; }
    awk -v k="$steps" -v b="$((batch * ${TRAIN_PER_SAMPLE:-1}))" -F'[,:}]' '/"event":"rank"/ {
            for (i = 1; i < NF; i++) v[$i] = $(i + 1)
            if (v["\"steps\""] + 0 == k) { s = v["\"step_s\""] / k; printf "%.3f %.0f %.0f %.2f %.2f %.2f\n", s * 1e3, b / s,
                v["\"peak_mem_mb\""], v["\"data_s\""] / k * 1e3, v["\"compute_s\""] / k * 1e3, v["\"comm_s\""] / k * 1e3 } }' \
        "$R/$tag.jsonl" | tail -1
}

s_throughput() {
    need_training
    local mlp="flatten$(for i in 1 2 3 4 5 6 7 8; do printf ' linear(4096) relu'; done) linear(10)"
    local cb=256 mb=1024 gb=64 g2b=8 cs=50 ms=10 gs=50 g2s=5 w=4096 big=1 gp="fp32 tf32 bf16" rt=45
    local gpt="gpt" gpt2="gpt(layers=12,heads=12,dim=768,block=1024,vocab=50304)"
    if [ $emulate = 1 ] || [ $quick = 1 ]; then
        w=64 cb=16 mb=32 gb=4 cs=2 ms=2 gs=2 big=0 gp=fp32 rt=200   # an emulated gpt step takes seconds
        mlp="flatten$(for i in 1 2 3 4 5 6 7 8; do printf ' linear(64) relu'; done) linear(10)"
    fi
    local tok="$R/tokens"
    head -c 4000000 /dev/urandom > "$R/text" && dtrain_dev prepare-text "$tok" "$R/text" > /dev/null 2>&1 ||
        { echo "prepare-text failed"; tok=; }
    printf '%-18s %10s %12s %9s %8s %8s %8s | %10s %12s %9s | %6s\n' row "ms/step" "samples/s" "peak MiB" "data ms" \
        "comp ms" "comm ms" "torch ms" "samples/s" "peak MiB" ratio | tee "$R/throughput.txt"
    # row NAME MODEL BATCH STEPS PRECISION(fp32, tf32 or bf16) TORCHMODEL [DATA TOKENS_PER_SAMPLE]:
    # dtrain runs 2 x STEPS steps and measures the second half; PyTorch runs STEPS to warm
    # up, then STEPS; each of the two within $rt seconds
    row() {
        local d t tf= tt=0 data=${7:-}
        case $5 in tf32) tf=--allow-tf32 tt=1 ;; bf16) tf="--precision bf16" tt=bf16 ;; esac
        if [ -n "$data" ] && [ -z "$tok" ]; then d=fail
        else d=$(TRAIN_DATA=$data TRAIN_PER_SAMPLE=${8:-1} DT_RUN_TIMEOUT=$rt dtrain_rate "$2" "$3" "$4" "tp-$1" $tf); fi
        if [ $emulate = 1 ]; then t="n/a emulated"
        elif [ -n "$PY" ]; then t=$(timeout "$rt" "$PY" "$here/gpu_torch.py" "$6" "$3" "$4" "$4" "$tt" "$tok" 2>&1 | tail -1)
        else t="n/a no PyTorch"; fi
        set -- "$1" $d
        local name=$1 dms=${2:-fail} dsp=${3:--} dpk=${4:--} dda=${5:--} dco=${6:--} dcm=${7:--}
        set -- $t
        local tms=$1 tsp=${2:--} tpk=${3:--} ratio=-
        case $tms in n/a*|''|*[!0-9.]*) tms="n/a"; tsp=-; tpk=- ;; esac
        [ "$tms" != n/a ] && [ "$dms" != fail ] && ratio=$(awk -v a="$tms" -v b="$dms" 'BEGIN { printf "%.2f", a / b }')
        printf '%-18s %10s %12s %9s %8s %8s %8s | %10s %12s %9s | %6s\n' "$name" "$dms" "$dsp" "$dpk" "$dda" "$dco" "$dcm" \
            "$tms" "$tsp" "$tpk" "$ratio" | tee -a "$R/throughput.txt"
        [ "$dms" != fail ] || sed 's/^/    /' "$R/tp-$name.out" 2> /dev/null | tail -3
        [ "$tms" != n/a ] || [ $emulate = 1 ] || echo "    torch: $t"
    }
    local p
    for p in fp32 tf32 bf16; do row cnn-$p cnn $cb $cs $p cnn; done
    for p in fp32 tf32 bf16; do row mlp8x$w-$p "$mlp" $mb $ms $p mlp8x4096; done
    if [ $big = 1 ]; then
        for p in fp32 tf32 bf16; do row gpt2-$p "$gpt2" $g2b $g2s $p gpt2 "tokens:$tok" 1024; done
    else
        echo "gpt2: skipped (124M parameters need a GPU; --quick and --emulate leave it out)"
    fi
    for p in $gp; do row gpt-$p "$gpt" $gb $gs $p gpt:4,4,128,64,256 "tokens:$tok" 64; done
    note "throughput   (gpt rows: samples/s are tokens/s; ratio = PyTorch ms/step / dtrain ms/step: above 1, dtrain is faster)"
    while IFS= read -r l; do note "  $l"; done < "$R/throughput.txt"
}

# The kernels of one gpt2 training step (batch 8 x 1024, TF32), by total device time:
# from nsys when it is installed, else from ncu (one metric, gpu__time_duration, each
# kernel once: Nsight Compute serialises the launches, so the times are each kernel's
# own, without overlap).
s_kernels() {
    [ $emulate = 0 ] || skip "profiling needs a GPU"
    local ns nc tok="$R/ktokens" rc
    ns=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
    nc=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    [ -n "$ns" ] || [ -n "$nc" ] || skip "neither nsys (Nsight Systems) nor ncu (Nsight Compute) is installed"
    head -c 1000000 /dev/urandom > "$R/ktext" && "$BIN/dtrain" prepare-text "$tok" "$R/ktext" > /dev/null 2>&1 ||
        { echo "prepare-text failed"; return 1; }
    set -- "$BIN/dtrain" train --device cuda --model "gpt(layers=12,heads=12,dim=768,block=1024,vocab=50304)" \
        --data "tokens:$tok" --batch 8 --steps 1 --allow-tf32 --peak-gflops 1 --no-eval --quiet
    if [ -n "$ns" ]; then
        timeout $((${DT_GPU_SECTION_S:-60} - 10)) "$ns" profile -t cuda -o "$R/step" --force-overwrite true "$@" \
            > "$R/kernels.log" 2>&1; rc=$?
        local rep
        for rep in cuda_gpu_kern_sum gpukernsum; do
            "$ns" stats --report $rep --format csv --output - "$R/step.nsys-rep" > "$R/kernels.csv" 2> /dev/null &&
                grep -q '%' "$R/kernels.csv" && break
        done
    else
        timeout $((${DT_GPU_SECTION_S:-60} - 10)) "$nc" --clock-control none --metrics gpu__time_duration.sum --csv \
            --print-units base --launch-count 4000 "$@" > "$R/kernels.csv" 2> "$R/kernels.log"; rc=$?
    fi
    [ $rc = 0 ] || { tail -5 "$R/kernels.log"; note "$(printf '%-12s FAILED (exit %s): %s' kernels $rc "$(tail -1 "$R/kernels.log")")"; return 1; }
    echo "kernels of one gpt2 step (batch 8 x 1024, TF32; $([ -n "$ns" ] && echo nsys || echo ncu)): time %, total ms, calls, name"
    python3 - "$R/kernels.csv" <<'PY' | tee "$R/kernels.txt"
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1], errors="replace")) if r]
tot = {}
head = next((i for i, r in enumerate(rows) if r[0].replace(" ", "").startswith("Time(%)")), None)
if head is not None:   # nsys: a row per kernel name
    col = {n.replace(" ", ""): i for i, n in enumerate(rows[head])}
    for r in rows[head + 1:]:
        if len(r) == len(rows[head]):
            tot[r[col["Name"]]] = [float(r[col["TotalTime(ns)"]]), int(r[col["Instances"]])]
else:                  # ncu: a row per launch and metric
    head = next((i for i, r in enumerate(rows) if "Kernel Name" in r and "Metric Value" in r), None)
    if head is not None:
        k, v = rows[head].index("Kernel Name"), rows[head].index("Metric Value")
        for r in rows[head + 1:]:
            if len(r) > max(k, v) and r[v].replace(",", "").replace(".", "", 1).isdigit():
                t = tot.setdefault(r[k], [0.0, 0])
                t[0] += float(r[v].replace(",", ""))
                t[1] += 1
if not tot:
    print("  (no kernel table in the profile)")
    sys.exit(0)
s = sum(t for t, _ in tot.values())
print("  %5.1f %9.2f %7d  %s" % (100.0, s / 1e6, sum(n for _, n in tot.values()), "(all kernels)"))
for name, (t, n) in sorted(tot.items(), key=lambda x: -x[1][0])[:14]:
    print("  %5.1f %9.2f %7d  %s" % (100.0 * t / s, t / 1e6, n, name[:90]))
PY
    note "kernels      one gpt2 step (batch 8 x 1024, TF32): time %, total ms, calls, name"
    head -12 "$R/kernels.txt" | while IFS= read -r l; do note "  $l"; done
}

s_nccl() {
    [ $emulate = 0 ] || skip "NCCL needs GPUs (the emulator has no NCCL)"
    grep -q 'define DT_HAVE_NCCL 1' "$BIN/config.h" || skip "the build has no NCCL backend (nccl.h was not found)"
    local n
    n=$("$bd/gpu_info" | sed -n 's/^devices=//p')
    [ "${n:-0}" -ge 2 ] || skip "$n GPU: NCCL needs 2 or more"
    DT_SRCDIR=$BIN DT_BUILDDIR=$BIN timeout 100 sh "$BIN/tests/gpu_nccl.sh" > "$R/gpu_nccl.tap" 2>&1
    grep -E '^(not ok|ok)' "$R/gpu_nccl.tap" | head -20
    rm -f "$R/nccl2.jsonl"
    timeout 100 "$BIN/dtrun" -n 2 "$BIN/dtrain" train --device cuda --backend nccl --model cnn \
        --data synthetic:8192,1,28,28,10 --batch 256 --steps 30 --seed 3 --no-eval --quiet --rank-stats 10 \
        --metrics "$R/nccl2.jsonl" > "$R/nccl2.out" 2>&1
    local rc=$?
    tail -3 "$R/nccl2.out"
    note "$(printf '%-12s gpu_nccl.sh: %s ok, %s not ok; 2-rank cnn over NCCL: exit %s' nccl \
        "$(grep -c '^ok' "$R/gpu_nccl.tap")" "$(grep -c '^not ok' "$R/gpu_nccl.tap")" $rc)"
}

# ---- one section, under its timeout (the script runs itself with --section) -----------

if [ -n "$section" ]; then
    : "${R:?}" "${BIN:?}"
    s_"$section"
    exit $?
fi

# ---- the build ------------------------------------------------------------------------

build() {
    local arch=${DT_GPU_ARCH:-90} nccl=
    { [ -f /usr/local/cuda/include/nccl.h ] || [ -f /usr/include/nccl.h ]; } && nccl=--with-nccl
    echo "== build: $BIN (--with-cuda --with-cuda-arch=$arch $nccl)"
    local t0=$SECONDS
    mkdir -p "$BIN" || return 1
    # the tracked files of this tree as they are now (a tree configured in place cannot
    # host another build), their times kept so that make rebuilds only what changed
    if git -C "$src" rev-parse --git-dir > /dev/null 2>&1; then
        git -C "$src" ls-files -z --cached --others --exclude-standard |
            (cd "$src" && tar --null --ignore-failed-read -T - -cf -) | tar -C "$BIN" -xf - || return 1
    else
        (cd "$src" && tar --exclude=./build-gpu --exclude=./.git -cf - .) | tar -C "$BIN" -xf - || return 1
    fi
    command -v autoreconf > /dev/null 2>&1 ||
        { echo "no autotools here (autoreconf): make the kit on another machine (make gpu-kit) and carry it over"; return 1; }
    (cd "$BIN" && { [ -f Makefile ] || { ./autogen.sh > autogen.log 2>&1 &&
        ./configure -q --with-cuda --with-cuda-arch="$arch" $nccl > configure.log 2>&1; }; } &&
        make -j"$jobs" > make.log 2>&1 && make -j"$jobs" tests/test_cuda_ops $([ -n "$nccl" ] && echo tests/gpu_nccl_prog) \
        >> make.log 2>&1) || { tail -20 "$BIN/autogen.log" "$BIN/configure.log" "$BIN/make.log" 2>/dev/null | grep -v '^$' | tail -20; return 1; }
    local cuda_cflags cuda_libs nccl_libs
    cuda_cflags=$(sed -n 's/^CUDA_CFLAGS = //p' "$BIN/Makefile")
    cuda_libs=$(sed -n 's/^CUDA_LIBS = //p' "$BIN/Makefile")
    nccl_libs=$(sed -n 's/^NCCL_LIBS = //p' "$BIN/Makefile")
    cc -std=c11 -O1 $cuda_cflags $(sed -n 's/^NCCL_CFLAGS = //p' "$BIN/Makefile") ${nccl_libs:+-DDT_GPU_INFO_NCCL} \
        "$here/gpu_info.c" -o "$bd/gpu_info" $nccl_libs $cuda_libs || return 1
    echo "-- build: $((SECONDS - t0)) s; carry $(du -sh "$bd" | cut -f1) in $bd"
}

T0=$SECONDS   # with $OUT the budget counts the build too
if [ $emulate = 1 ]; then
    # the tree's own build (configured in place), or DT_BUILDDIR
    B=${DT_BUILDDIR:-$src}
    [ -f "$B/.libs/libdtrain.so" ] || { echo "bench/gpu.sh --emulate: no build in $B (build this tree, or set DT_BUILDDIR)" >&2; exit 2; }
    R=${DT_GPU_BENCH_OUT:-$(mktemp -d)}
    BIN=$B
elif [ $kit = 1 ]; then
    BIN=$src B=$src
    R=${DT_GPU_BENCH_OUT:-$([ -n "$OUT" ] && mktemp -d || echo "$src/bench-out")}
    echo "== kit: $src ($(sed -n 's/^built: //p' "$src/KIT"))"
    [ $build_only = 0 ] || exit 0
else
    BIN=$bd/src
    R=${DT_GPU_BENCH_OUT:-$([ -n "$OUT" ] && mktemp -d || echo "$bd/bench-out")}
    [ -n "$OUT" ] || T0=
    if [ -x "$BIN/dtrain" ] && [ -x "$BIN/tests/test_cuda_ops" ] && [ -x "$bd/gpu_info" ] && [ $build_only = 0 ]; then
        echo "== build: using the existing build in $BIN (remove $bd to rebuild)"
    else
        if [ -n "$OUT" ]; then   # the build's output comes back too
            build 2>&1 | tee "$OUT/build.log"
            [ "${PIPESTATUS[0]}" = 0 ] || { echo "build FAILED"; echo "build FAILED: see build.log" > "$OUT/summary.txt"; exit 1; }
        else
            build || { echo "build FAILED"; exit 1; }
        fi
    fi
    grep -q 'define DT_HAVE_CUDA 1' "$BIN/config.h" || { echo "$BIN is not a --with-cuda build" >&2; exit 1; }
    [ $build_only = 0 ] || exit 0
fi
mkdir -p "$R" && R=$(cd "$R" && pwd) && : > "$R/summary.txt" || exit 1
export R BIN B bd emulate quick
# the run's own output goes into the logs too
[ -z "$OUT" ] || exec > >(tee -a "$R/run.log") 2>&1

# CUDA's runtime libraries where the programs' RUNPATH (the kit: /usr/local/cuda/lib64) does
# not reach them: a CUDA image's other folders, or the pip wheels beside PyTorch
cuda_lib_path() {
    local miss l d cands
    miss=$(ldd "$BIN/dtrain" 2> /dev/null | awk '/not found/ && $1 ~ /^lib(cudart|cublas|cublasLt|cuda)\.so/ { print $1 }' | sort -u)
    [ -n "$miss" ] || return 0
    cands="/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib $(ls -d /usr/local/cuda-*/lib64 2> /dev/null)
           /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu"
    [ -n "$PY" ] && cands="$cands $("$PY" -c 'import os, nvidia
for p in nvidia.__path__:
    for d in sorted(os.listdir(p)): print(os.path.join(p, d, "lib"))' 2> /dev/null)"
    for l in $miss; do
        for d in $cands; do
            [ -e "$d/$l" ] || continue
            echo "== $l: not where the programs look; found in $d (LD_LIBRARY_PATH)"
            note "$(printf '%-12s %s from %s (LD_LIBRARY_PATH)' libraries "$l" "$d")"
            LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
            break
        done
    done
    export LD_LIBRARY_PATH
}
[ $emulate = 1 ] || cuda_lib_path

if [ $emulate = 1 ]; then
    echo "== emulated kernels (tests/gpu_emu_build.sh)"
    want=
    grep -q 'define DT_HAVE_CUDA 1' "$B/config.h" 2>/dev/null && [ -x "$B/dtrain" ] && want=dtrain
    mkdir -p "$R/emu" || exit 1
    DT_SRCDIR=$src DT_BUILDDIR=$B "$src/tests/gpu_emu_build.sh" "$R/emu" 3 $want 2> "$R/emu/build.err" ||
        { [ -x "$R/emu/test_cuda_emu" ] || { cat "$R/emu/build.err"; exit 1; }; }
    # every launch held to nvcc's registers and shared memory of its kernel, as in
    # tests/gpu_emu.sh (the same sources, so the same table under DT_GPU_EMU_CACHE)
    DT_SRCDIR=$src DT_BUILDDIR=$B timeout 600 sh "$src/tests/gpu_emu/resources.sh" "$R/emu/resources" \
        "$src"/src/cuda/*.cu "$src/tests/gpu_emu/selftest.cu" > "$R/emu/resources.err" 2>&1
    case $? in
    0) export DT_GPU_EMU_RESOURCES="$R/emu/resources" ;;
    77) echo "(no nvcc: launches are not checked against nvcc's resource counts)" ;;
    *) cat "$R/emu/resources.err"; exit 1 ;;
    esac
    T0=   # the emulator's build is this machine's, not a GPU's
fi

T0=${T0:-$SECONDS}
status=0 current=
# publish [STATE]: summary.txt and logs.tar.gz into $OUT, each replaced whole
publish() {
    [ -n "$OUT" ] || return 0
    { echo "bench/gpu.sh $(date -u '+%Y-%m-%d %H:%M:%S UTC'); $((SECONDS - T0)) s of the $budget s budget;" \
           "${1:-running}$([ $emulate = 1 ] && echo '; EMULATED: no GPU, times mean nothing')"
      cat "$R/summary.txt"; } > "$OUT/summary.txt.tmp" && mv -f "$OUT/summary.txt.tmp" "$OUT/summary.txt"
    (cd "$R" && find . -maxdepth 1 -type f \( -name '*.log' -o -name '*.txt' -o -name '*.tap' -o -name '*.out' \
        -o -name '*.jsonl' -o -name '*.csv' \) -size -20M -printf '%P\0' | tar --null -T - -czf "$OUT/logs.tar.gz.tmp") &&
        mv -f "$OUT/logs.tar.gz.tmp" "$OUT/logs.tar.gz"
}
on_signal() {
    # the files first: the tee of our output may be gone already (the same signal)
    trap - TERM INT HUP
    trap '' PIPE
    [ -n "$current" ] && printf '%-12s KILLED (%s) after %s s\n' "$current" "$1" "$((SECONDS - T0))" >> "$R/summary.txt"
    # the section's timeout (a child of the subshell) passes the signal on to the section's
    # whole process group; killing the subshell alone would leave the section running
    if [ -n "${child:-}" ]; then
        pkill -TERM -P "$child" 2> /dev/null || ps -o pid= --ppid "$child" 2> /dev/null | xargs -r kill 2> /dev/null
        kill "$child" 2> /dev/null
    fi
    publish "killed ($1) during ${current:-the run}"
    echo "== killed ($1) during ${current:-the run} after $((SECONDS - T0)) s" 2> /dev/null
    exit 1
}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT
trap 'on_signal HUP' HUP
run_section() {  # number name timeout
    local left=$((budget - (SECONDS - T0))) t=$3 t0=$SECONDS rc
    if [ -n "$sections" ]; then
        case ",$sections," in *",$2,"*) ;; *) return ;; esac
    fi
    [ $emulate = 1 ] && t=$((t * 3))   # the emulated kernels are slower than a GPU, not the budget
    [ "$t" -gt "$left" ] && t=$left
    echo
    echo "== [$1] $2 (timeout ${t} s; ${left} s of the budget left)"
    if [ "$t" -lt 15 ]; then
        echo "skip: the budget of $budget s is spent"
        printf '%-12s skip: the budget of %s s is spent\n' "$2" "$budget" >> "$R/summary.txt"
        publish
        return
    fi
    current=$2
    publish "running $2"
    # in the background, so that a signal reaches on_signal at once (bash runs a trap only
    # after the foreground command)
    ( DT_GPU_SECTION_S=$t timeout -k 10 "$t" bash "$0" --section "$2" $([ $emulate = 1 ] && echo --emulate) \
          $([ $quick = 1 ] && echo --quick) 2>&1 | tee "$R/$2.log"; exit "${PIPESTATUS[0]}" ) &
    child=$!
    wait "$child"; rc=$?
    child= current=
    case $rc in
        0) echo "-- $2: $((SECONDS - t0)) s" ;;
        124|137) echo "-- $2: TIMEOUT after $((SECONDS - t0)) s"; printf '%-12s TIMEOUT after %s s\n' "$2" "$t" >> "$R/summary.txt"; status=1 ;;
        3) echo "-- $2: STOP after $((SECONDS - t0)) s"; status=1; summary; publish "stopped in $2"; exit 1 ;;
        *) echo "-- $2: FAILED (exit $rc) after $((SECONDS - t0)) s"; status=1 ;;
    esac
    publish
}
summary() {
    echo
    echo "== summary ($(date -u '+%Y-%m-%d %H:%M UTC'); $((SECONDS - T0)) s of the $budget s budget$([ $emulate = 1 ] && echo '; EMULATED: no GPU, times mean nothing'))"
    cat "$R/summary.txt"
    echo "logs: $R$([ -n "$OUT" ] && echo "; $OUT: summary.txt, logs.tar.gz")"
}
# with $OUT, 480 s: 30 + 90 + 60 + 210 + 60 + 30 (and what a section leaves goes to the next)
run_section 1 env 30
run_section 2 ops 90
run_section 3 parity 60
run_section 4 throughput 210
run_section 5 determinism 60
run_section 6 sanitizer 90
run_section 7 kernels 90
run_section 8 nccl 60
summary
publish "done$([ $status = 0 ] || echo ', with failures')"
exit $status
