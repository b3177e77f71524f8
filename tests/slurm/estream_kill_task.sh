#!/usr/bin/env bash
# The ESTREAM of run_slurm_test.sh's array: runs $ESTREAM_REAL with the arguments given, except in
# task $KILL_TASK's first run (SLURM_RESTART_COUNT 0), where it starts estream itself and SIGKILLs it
# once its --output file has 20 lines, writing "PID LINES" (or why not) to $KILL_REPORT; it then
# exits as estream did (137 when killed), as score_array.sbatch would see a killed estream.
# Every 5 ms the process is stopped (SIGSTOP) while its lines are counted and killed while still
# stopped, so it cannot finish between the count and the kill; and it is this script's child, so it
# cannot be missed, as a search for it could when it ran for under a second on a busy host.
set -u
if [ "${SLURM_ARRAY_TASK_ID:-}" != "${KILL_TASK:?}" ] || [ "${SLURM_RESTART_COUNT:-0}" != 0 ]; then
  exec "${ESTREAM_REAL:?}" "$@"
fi
out="" prev=""
for arg in "$@"; do
  [ "$prev" = --output ] && out=$arg
  prev=$arg
done
"${ESTREAM_REAL:?}" "$@" &
pid=$!
report="ended with fewer than 20 lines in $out: make the input longer"
while kill -STOP "$pid" 2>/dev/null; do
  n=$(wc -l <"$out" 2>/dev/null) || n=0
  if [ "$n" -ge 20 ]; then
    kill -KILL "$pid"
    report="$pid $n"
    break
  fi
  kill -CONT "$pid"
  sleep 0.005
done
echo "$report" >"${KILL_REPORT:?}.tmp"
mv "$KILL_REPORT.tmp" "$KILL_REPORT"
wait "$pid"
