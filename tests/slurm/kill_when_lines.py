#!/usr/bin/env python3
"""Kills (SIGKILL) the process whose command line has `--output FILE` once FILE has MIN lines.

    kill_when_lines.py FILE MIN TIMEOUT_S      prints "PID LINES" and exits 0; else a reason, exit 1

It looks for the process in /proc; found, every 5 ms it stops it (SIGSTOP), counts FILE's lines,
and kills it while still stopped when there are MIN or more, else lets it go on (SIGCONT). So the
process cannot finish between the count and the kill, as it could with a shell loop of wc, pgrep
and kill, each a process start on a host the other tasks keep busy (run_slurm_test.sh's task
scores its ~1500 lines in about a second).
"""
import os
import signal
import sys
import time


def count_lines(path):
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


def find(needle):
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                if needle in f.read():
                    return int(pid)
        except OSError:
            pass  # gone meanwhile
    return None


def main():
    out, min_lines, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    needle = b"--output\0" + out.encode() + b"\0"
    end = time.monotonic() + timeout
    pid = None
    while pid is None:
        if time.monotonic() > end:
            print("no process writing %s appeared within %g s" % (out, timeout))
            return 1
        pid = find(needle)
        time.sleep(0.005)
    while time.monotonic() < end:
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            print("the process writing %s ended with fewer than %d lines: make the input longer" % (out, min_lines))
            return 1
        n = count_lines(out)
        if n >= min_lines:
            os.kill(pid, signal.SIGKILL)
            print(pid, n)
            return 0
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.005)
    os.kill(pid, signal.SIGCONT)
    print("the process writing %s wrote fewer than %d lines in %g s" % (out, min_lines, timeout))
    return 1


if __name__ == "__main__":
    sys.exit(main())
