# peer_lib.sh: what the tests against a PyTorch peer (torch_gpt.sh, torch_llama.sh) share.
# They set DTRAIN, MODEL, T (the temporary directory: token files, the peer's output) and B.

# One dtrain step with plain SGD (no momentum, decay, clipping or schedule): w - lr * g.
step() {
    timeout 120 "$DTRAIN" train --model "$MODEL" --data "tokens:$T" --batch $B --steps 1 --optim sgd --momentum 0 \
        --weight-decay 0 --schedule constant --warmup 0 --clip 0 --no-eval --log-every 1 --quiet --threads 1 "$@"
}
# The first step line's loss of a metrics file, as printed.
loss_of() { sed -n 's/.*"event":"step".*"loss":\([^,]*\),.*/\1/p' "$1" | head -1; }
# A value the peer printed as "NAME VALUE" into $T/cmp.out.
val() { sed -n "s/^$1 \([^ ]*\).*/\1/p" "$T/cmp.out"; }
# close A B TOL: A is non-zero and within TOL relative of B.
close() { awk -v a="${1:-0}" -v b="${2:-1}" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; if (b < 0) b = -b; exit !(a != 0 && d <= t * b) }'; }
