#!/usr/bin/env python3
"""Kills (SIGKILL) process PID once FILE, which it writes, has MIN lines.

    kill_when_lines.py PID FILE MIN TIMEOUT_S    prints "PID LINES" and exits 0; else a reason, exit 1

Every 5 ms it stops the process (SIGSTOP), counts FILE's lines, and kills it while still stopped
when there are MIN or more, else lets it go on (SIGCONT): the process cannot finish between the
count and the kill. Its caller starts the process (estream_kill_task.sh), so it cannot be missed
either, as a search for it could when it ran for less than a second on a busy host.
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


def main():
    pid, out, min_lines, timeout = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    end = time.monotonic() + timeout
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
