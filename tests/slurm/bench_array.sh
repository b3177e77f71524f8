#!/usr/bin/env bash
# Throughput of sharded scoring as a Slurm array against one process on the same machine
# (docs/PERFORMANCE.md, "Scale-out with Slurm"). Starts a single-node cluster (local_cluster.sh),
# then alternates, REPS times: one `estream score` process with all the node's CPUs, and a K-task
# array (scripts/slurm/score_array.sbatch, --cpus-per-task=C each) over the same input, timed
# from sbatch to the last task's end (scheduling included). Prints each run, the medians, and every
# task's budget and peak RSS (the engine's figure; sacct needs slurmdbd, not run here).
#
#   tests/slurm/bench_array.sh MODEL.packed.gguf IN.jsonl [REPS=3] [K=4] [C=1] [MEM=1500M] [ESTREAM]
#
# The single process gets --budget = what one task's --mem gives it (MEM minus the script's margin),
# so both sides run under the same memory bound per process. Run it under
# `flock -x /tmp/estream-cpu.lock` on a shared machine.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MODEL=$(realpath "$1") INPUT=$(realpath "$2")
REPS=${3:-3} K=${4:-4} C=${5:-1} MEM=${6:-1500M}
E=$(realpath "${7:-$ROOT/build/tools/estream/estream}")
source "$ROOT/tests/slurm/local_cluster.sh"
slurm_available || exit 1
trap cluster_stop EXIT
D=$(mktemp -d /tmp/estream-slurm-bench.XXXXXX)
cluster_start "$D" >/dev/null || exit 1
MEM_MIB=$(( ${MEM%M} ))
MARGIN=$(( MEM_MIB * 5 / 100 )); [ $MARGIN -ge 256 ] || MARGIN=256
BUDGET=$((MEM_MIB - MARGIN))M
CPUS=$(nproc)
TOKENS=0
echo "bench: model $MODEL, input $INPUT ($(wc -l <"$INPUT") lines), $REPS reps; one process: -t $CPUS --budget $BUDGET; array: $K tasks x $C CPUs, --mem=$MEM (budget $BUDGET each)"

singles=() arrays=()
for r in $(seq 1 "$REPS"); do
  rm -f "$D/single.jsonl"
  t0=$(date +%s.%N)
  "$E" score -m "$MODEL" --input "$INPUT" --output "$D/single.jsonl" -t "$CPUS" --budget "$BUDGET" --no-progress \
    2>"$D/single.log" || true
  t1=$(date +%s.%N)
  TOKENS=$(grep -o '[0-9]* tokens in' "$D/single.log" | cut -d' ' -f1)
  s=$(python3 -c "print(f'{$TOKENS / ($t1 - $t0):.1f}')")
  singles+=("$s")
  echo "bench: rep $r: one process: $(python3 -c "print(f'{$t1 - $t0:.2f}')") s wall (load included), $s tok/s; $(grep -o 'peak RSS .*' "$D/single.log")"

  rm -rf "$D/shards" && mkdir -p "$D/shards"
  t0=$(date +%s.%N)
  JOB=$(cd "$D" && ESTREAM="$E" sbatch --parsable --array=0-$((K - 1)) --cpus-per-task="$C" --mem="$MEM" \
    --output="$D/out/r$r-%A_%a.log" "$ROOT/scripts/slurm/score_array.sbatch" "$MODEL" "$INPUT" "$D/shards")
  JOB=${JOB%%;*}
  wait_for 600 "array $JOB" bash -c "[ -z \"\$(squeue -h -j $JOB -o %i)\" ]"
  t1=$(date +%s.%N)
  a=$(python3 -c "print(f'{$TOKENS / ($t1 - $t0):.1f}')")
  arrays+=("$a")
  echo "bench: rep $r: array of $K: $(python3 -c "print(f'{$t1 - $t0:.2f}')") s wall (sbatch to last task end), $a tok/s"
  for t in $(seq 0 $((K - 1))); do
    echo "bench:   task $t: $(grep -o 'budget [0-9]* MiB' "$D/out/r$r-${JOB}_$t.log" | head -n 1), $(grep -o '[0-9]* lines scored.*' "$D/out/r$r-${JOB}_$t.log" | sed -E "s/, [0-9]+ failed, [0-9]+ already in [^;]*;/;/")"
  done
  "$E" score --merge "$D"/shards/shard-*-of-$K.jsonl --input "$INPUT" -o "$D/all.jsonl" 2>/dev/null || true
  cmp -s "$D/all.jsonl" "$D/single.jsonl" && echo "bench:   merged array output = one-process output (byte-identical)" ||
    echo "bench:   merged array output DIFFERS from the one-process output"
done
med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
echo "bench: medians over $REPS reps, $TOKENS tokens: one process $(med "${singles[@]}") tok/s, array of $K $(med "${arrays[@]}") tok/s"
