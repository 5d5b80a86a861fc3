#!/usr/bin/env bash
# The vertical-slice benchmark on a GPU: tune 4096^3 fp16 and bf16 with 128 random trials each into
# a fresh database (wall clock of each whole command), two more fp16 seeds into their own
# databases, a rerun (must resume, measure nothing), an isolation run with an out-of-bounds and a
# hanging candidate injected, and replay through tritune.ops. Ends with a compact table.
# Usage: scripts/bench/bench_tune.sh [OUTDIR]
set -uo pipefail
out=$(realpath -m "${1:-/tmp/tritune-bench}")
cd "$(dirname "$0")/../.."  # the repository's root: the replay check runs as python -m scripts.probes.replay_check
mkdir -p "$out"
rm -f "$out"/*.db*
timed() {  # timed NAME CMD...: run CMD, keep its log, print its wall clock
  local name=$1; shift
  local t0 t1; t0=$(date +%s%N)
  "$@" > "$out/$name.log" 2>&1
  local rc=$?; t1=$(date +%s%N)
  echo "$name rc=$rc wall_ms=$(( (t1 - t0) / 1000000 ))" | tee -a "$out/walls.txt"
}
tune="python3 -m tritune run --op matmul --shape 4096 --trials 128 --strategy random"
timed fp16 $tune --dtype fp16 --db "$out/main.db" --summary-json "$out/fp16.json"
timed bf16 $tune --dtype bf16 --db "$out/main.db" --summary-json "$out/bf16.json"
timed fp16_rerun $tune --dtype fp16 --db "$out/main.db" --summary-json "$out/fp16_rerun.json"
for seed in 1 2; do
  timed "fp16_seed$seed" $tune --dtype fp16 --seed $seed --db "$out/seed$seed.db" --summary-json "$out/fp16_seed$seed.json"
done
timed isolation python3 -m tritune run --op matmul --shape 4096 --dtype fp16 --trials 32 --inject-fault oob \
  --inject-fault hang --timeout 10 --db "$out/isolation.db" --summary-json "$out/isolation.json"
timed replay python3 -m scripts.probes.replay_check --db "$out/main.db" --shape 4096 --dtype fp16
python3 -m tritune export --db "$out/main.db" --out "$out/trials.jsonl"
python3 -m tritune export --db "$out/isolation.db" --out "$out/isolation.jsonl"
cat "$out/replay.log"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
walls = dict(l.split(" ", 1) for l in open(f"{out}/walls.txt").read().splitlines())
print(f"{'run':12s} {'wall s':>7s} {'trials':>6s} {'statuses':34s} {'ours':>14s} {'torch':>14s} {'ratio':>6s}  best config")
for name in ("fp16", "bf16", "fp16_rerun", "fp16_seed1", "fp16_seed2", "isolation"):
    s = json.load(open(f"{out}/{name}.json"))
    wall = int(walls[name].split("wall_ms=")[1]) / 1000
    cfg = " ".join(f"{k}={v}" for k, v in sorted(s["best_config"].items()))
    print(f"{name:12s} {wall:7.1f} {s['trials']:6d} {json.dumps(s['statuses'], sort_keys=True):34s} "
          f"{s['ours_rate']:>14} {s['torch_rate']:>14} {s['ratio_vs_torch']:6.3f}  {cfg}")
PY
