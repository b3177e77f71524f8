#!/usr/bin/env bash
# The ESTREAM of run_slurm_test.sh's array: runs $ESTREAM_REAL with the arguments given, except in
# task $KILL_TASK's first run (SLURM_RESTART_COUNT 0), where it starts it and has
# kill_when_lines.py SIGKILL it once its --output file has 20 lines, writing "PID LINES" (or why
# not) to $KILL_REPORT; it then exits as estream did (137 when killed), as a killed estream would
# make score_array.sbatch see.
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
python3 "$(dirname "$0")/kill_when_lines.py" "$pid" "$out" 20 90 >"${KILL_REPORT:?}.tmp" 2>&1
mv "$KILL_REPORT.tmp" "$KILL_REPORT"
wait "$pid"
