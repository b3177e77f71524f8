#!/usr/bin/env bash
# Single-node Slurm test of sharded scoring (issue 24): a real Slurm (Debian's slurm-wlm, munge)
# on localhost runs scripts/slurm/score_array.sbatch as a 4-task array on a tiny packed model;
# one task's estream is killed (SIGKILL) mid-way and the task requeued (scontrol requeue); when
# all tasks are COMPLETED the shard outputs are merged (estream score --merge) and must equal a
# single-process run: every id exactly once, same results. Then a task whose memory leaves a budget
# below the model's minimum must fail before scoring, with the message saying so.
#
#   tests/slurm/run_slurm_test.sh [ESTREAM_BINARY]     (default build/tools/estream/estream)
#
# Skips (exit 0, with a message) when Slurm or munge are not installed (scripts/setup_slurm.sh
# installs them) or when not run as root (slurmd starts jobs as root here). Every wait has a timeout and the whole test a watchdog (SLURM_TEST_TIMEOUT,
# default 240 s); the daemons are killed on every exit. KEEP_CLUSTER_DIR=1 keeps the directory
# (logs, slurm.conf, outputs). Prints each task's peak RSS (the engine's figure) against its budget.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
E=$(realpath "${1:-$ROOT/build/tools/estream/estream}")
SBATCH_SCRIPT=$ROOT/scripts/slurm/score_array.sbatch
# shellcheck source=local_cluster.sh
source "$ROOT/tests/slurm/local_cluster.sh"

if ! slurm_available; then
  echo "slurm test: SKIPPED (Slurm/munge not installed; scripts/setup_slurm.sh installs them)"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "slurm test: SKIPPED (slurmd must run as root to start jobs; run the test as root, e.g. in CI's container)"
  exit 0
fi
[ -x "$E" ] || { echo "slurm test: FAILED: no estream binary at $E (build first)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "slurm test: FAILED: python3 needed" >&2; exit 1; }

fail() {
  echo "slurm test: FAILED: $*" >&2
  [ -n "$CLUSTER_DIR" ] && { cluster_logs; tail -n 20 "$CLUSTER_DIR"/out/*.log >&2 2>/dev/null || true; }
  exit 1
}

WATCHDOG=""
cleanup() {
  if [ -n "$WATCHDOG" ]; then
    pkill -P "$WATCHDOG" 2>/dev/null || true  # its sleep
    kill "$WATCHDOG" 2>/dev/null || true
  fi
  cluster_stop
}
trap cleanup EXIT
trap 'echo "slurm test: FAILED: interrupted or over the time limit" >&2; exit 1' INT TERM
( sleep "${SLURM_TEST_TIMEOUT:-240}"; kill -TERM $$ ) >/dev/null 2>&1 &
WATCHDOG=$!

D=$(mktemp -d /tmp/estream-slurm.XXXXXX)
cluster_start "$D" || fail "the cluster did not start"
START=$SECONDS

# ---- a tiny packed model and an input with every kind of line ----
timeout 60 "$E" synth --preset tiny --arch qwen3moe -q -o "$D/tiny.gguf" >/dev/null || fail "synth"
timeout 60 "$E" pack "$D/tiny.gguf" -o "$D/tiny.packed.gguf" >/dev/null 2>&1 || fail "pack"
N_LINES=12000
python3 - "$D/in.jsonl" "$N_LINES" <<'EOF'
import json, sys
path, n = sys.argv[1], int(sys.argv[2])
with open(path, "w") as f:
    for i in range(n):
        d = {"id": i if i % 3 == 0 else "q%d" % i, "tokens": [(i * 7 + k * 13) % 500 for k in range(8 + (i * 5) % 40)],
             "top_k": 3}
        if i % 97 == 5:
            d["continuations"] = [[1, 2], [3]]
        if i == 100: del d["id"]        # no id: an error line keyed by its line number
        if i == 200: d["id"] = "q2"     # a repeated id: an error line keyed by its line number
        if i == 300: d["tokens"] = [1, 99999]  # a bad token id: an error line
        f.write(json.dumps(d) + "\n")
        if i == 400: f.write("\n")      # blank: no result
        if i == 500: f.write("{not json\n")
EOF
SCORE_FLAGS=(--batch-tokens 64)

# ---- the reference: one process ----
rc=0
timeout 120 "$E" score -m "$D/tiny.packed.gguf" --input "$D/in.jsonl" --output "$D/single.jsonl" -t 1 --budget 144M \
  --no-progress "${SCORE_FLAGS[@]}" 2>"$D/single.log" || rc=$?
[ $rc = 1 ] || fail "the single-process run exited $rc (expected 1: bad lines): $(cat "$D/single.log")"
echo "slurm test: single process: $(tail -n 1 "$D/single.log")"

# ---- the array: 4 tasks, 1 CPU and 400 MiB each (budget 400 - 256 = 144 MiB) ----
mkdir -p "$D/shards"
# Task 1's first run is killed mid-way (SIGKILL once its shard has 20 lines; estream_kill_task.sh,
# which starts that estream itself, so that a run of under a second cannot be missed), then requeued.
JOB=$(cd "$D" && ESTREAM="$ROOT/tests/slurm/estream_kill_task.sh" ESTREAM_REAL="$E" KILL_TASK=1 \
  KILL_REPORT="$D/kill.txt" sbatch --parsable --array=0-3 --cpus-per-task=1 --mem=400M \
  --output="$D/out/task-%A_%a.log" "$SBATCH_SCRIPT" "$D/tiny.packed.gguf" "$D/in.jsonl" "$D/shards" \
  "${SCORE_FLAGS[@]}") || fail "sbatch"
JOB=${JOB%%;*}
echo "slurm test: submitted array job $JOB (4 tasks)"

lines() { [ -f "$1" ] && wc -l <"$1" || echo 0; }
wait_for 100 "task 1's estream to be killed" test -f "$D/kill.txt" || fail "task 1's estream was not killed"
read -r PID KILLED_AT <"$D/kill.txt" || true
[[ "$PID $KILLED_AT" =~ ^[0-9]+\ [0-9]+$ ]] || fail "killing task 1 mid-way: $(cat "$D/kill.txt")"
echo "slurm test: killed task 1's estream (pid $PID) with $KILLED_AT of ~$((N_LINES / 4)) lines written"
task_state() { scontrol -o show job "${JOB}_$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | head -n 1 | cut -d= -f2; }
wait_for 60 "task 1 to end after the kill" bash -c "scontrol -o show job ${JOB}_1 | grep -Eq 'JobState=(FAILED|COMPLETED)'" ||
  fail "task 1 did not end after its estream was killed"
[ "$(task_state 1)" = FAILED ] || fail "task 1 ended $(task_state 1) after the kill, expected FAILED"
scontrol requeue "${JOB}_1" || fail "scontrol requeue ${JOB}_1"
# Slurm holds a requeued batch job back for a while (its begin time is set ~2 minutes ahead): let
# it start now.
scontrol update JobId="${JOB}_1" StartTime=now || fail "scontrol update ${JOB}_1 StartTime=now"
echo "slurm test: task 1 FAILED as expected; requeued"

# ---- wait for every task ----
wait_for 150 "the array to finish" bash -c "[ -z \"\$(squeue -h -j $JOB -o %i)\" ]" || { squeue >&2; fail "array not done"; }
for t in 0 1 2 3; do
  st=$(task_state $t)
  [ "$st" = COMPLETED ] || fail "task $t ended $st"
done
restarts=$(scontrol -o show job "${JOB}_1" | grep -o 'Restarts=[0-9]*' | cut -d= -f2)
[ "$restarts" -ge 1 ] || fail "task 1 shows Restarts=$restarts"
grep -q "restart 1" "$D/out/task-${JOB}_1.log" || fail "task 1's log has no second run"
grep -Eq "shard 1/4 \(by line\): [0-9]+ lines scored, [0-9]+ failed, [1-9][0-9]* already in" "$D/out/task-${JOB}_1.log" ||
  fail "task 1 did not resume (no line was found already done): $(cat "$D/out/task-${JOB}_1.log")"
echo "slurm test: all 4 tasks COMPLETED; task 1 restarted $restarts time(s) and resumed: $(grep -o '[0-9]* already in' "$D/out/task-${JOB}_1.log")"

# ---- merge and compare ----
rc=0
timeout 60 "$E" score --merge "$D"/shards/shard-{0,1,2,3}-of-4.jsonl --input "$D/in.jsonl" -o "$D/all.jsonl" 2>"$D/merge.log" || rc=$?
cat "$D/merge.log"
[ $rc = 1 ] && grep -q "every input line exactly once; 4 of them are errors" "$D/merge.log" ||
  fail "merge exited $rc: $(cat "$D/merge.log")"
if cmp -s "$D/all.jsonl" "$D/single.jsonl"; then
  echo "slurm test: merged output is byte-identical to the single-process run ($(wc -l <"$D/all.jsonl") lines)"
else
  python3 - "$D/all.jsonl" "$D/single.jsonl" <<'EOF' || fail "merged output differs from the single-process run"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b), (len(a), len(b))
def same(x, y, where):
    if isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool):
        assert abs(x - y) <= 1e-5 * abs(y) + 1e-6, (where, x, y)
    elif isinstance(x, dict):
        assert x.keys() == y.keys(), where
        for k in x: same(x[k], y[k], where + "." + k)
    elif isinstance(x, list):
        assert len(x) == len(y), where
        for i, (u, v) in enumerate(zip(x, y)): same(u, v, "%s[%d]" % (where, i))
    else:
        assert x == y, (where, x, y)
for i, (x, y) in enumerate(zip(a, b)): same(x, y, "line %d" % (i + 1))
print("slurm test: merged output equals the single-process run within 1e-5 (%d lines; not byte-identical)" % len(a))
EOF
fi

# ---- each task's peak RSS (the engine's VmHWM) against its budget ----
for t in 0 1 2 3; do
  log=$D/out/task-${JOB}_$t.log
  budget=$(grep -o 'budget [0-9]* MiB' "$log" | tail -n 1)
  peak=$(grep -o 'peak RSS .*' "$log" | tail -n 1)
  echo "slurm test: task $t: $budget, $peak"
  python3 - "$budget" "$peak" <<'EOF' || fail "task $t: peak RSS above its budget"
import sys
b = float(sys.argv[1].split()[1])
v, u = sys.argv[2].split()[2:4]
mib = float(v) * {"B": 1 / 2**20, "KiB": 1 / 1024, "MiB": 1, "GiB": 1024}[u]
assert mib <= b, (mib, b)
EOF
done

# ---- a budget below the model's minimum: the task fails before scoring, saying so ----
# 300 MiB - the 280 MiB margin = 20 MiB, below the ~45 MiB the tiny model needs even for a 128-token pass
# (the shortest the engine plans for by default).
mkdir -p "$D/small"
JOB2=$(cd "$D" && ESTREAM="$E" ESTREAM_MEM_MARGIN_MIN=280 sbatch --parsable --array=0-1 --cpus-per-task=1 --mem=300M \
  --output="$D/out/small-%A_%a.log" "$SBATCH_SCRIPT" "$D/tiny.packed.gguf" "$D/in.jsonl" "$D/small") || fail "sbatch (small)"
JOB2=${JOB2%%;*}
wait_for 60 "the small-budget array to end" bash -c "[ -z \"\$(squeue -h -j $JOB2 -o %i)\" ]" || fail "small-budget array not done"
for t in 0 1; do
  st=$(scontrol -o show job "${JOB2}_$t" | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)
  [ "$st" = FAILED ] || fail "small-budget task $t ended $st, expected FAILED"
  grep -q "is too small" "$D/out/small-${JOB2}_$t.log" &&
    grep -q "score_array: error: the budget 20 MiB = job memory 300 MiB" "$D/out/small-${JOB2}_$t.log" ||
    fail "small-budget task $t: no clear message: $(cat "$D/out/small-${JOB2}_$t.log")"
  [ "$(lines "$D/small/shard-$t-of-2.jsonl")" = 0 ] || fail "small-budget task $t scored lines"
done
echo "slurm test: a 20 MiB budget fails each task before scoring: $(grep -o 'error: memory budget.*need at least [^;]*' "$D/out/small-${JOB2}_0.log" | head -c 160)..."

echo "slurm test: PASSED in $((SECONDS - START)) s (cluster start excluded)"
