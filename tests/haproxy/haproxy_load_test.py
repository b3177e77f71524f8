#!/usr/bin/env python3
"""HAProxy in front of two `estream serve` instances, one stopped and restarted under load (issue 24).

Run by tests/haproxy/run_haproxy_test.sh (which checks that haproxy is installed and bounds the
whole run); standard library only.

  haproxy_load_test.py --estream E --root SRC --dir TMPDIR [--requests N] [--clients C]

What is tested is what ships:
  - the servers are started with deploy/estream@.service's ExecStart line, expanded as systemd
    does (%i = the port; ${VAR} one argument, $VAR split at whitespace; Environment= defaults,
    then the instance's variables), with /usr/local/bin/estream replaced by E;
  - HAProxy runs deploy/haproxy.cfg with only its addresses and process settings replaced
    (ports, admin socket, logs to stderr, no chroot/user/daemon): every substitution must match
    exactly once, so a change to the shipped file that the test no longer covers fails here.

Steps (every wait has a timeout):
  1. a tiny packed model (`estream synth --preset tiny`, `estream pack`); two servers on free
     ports of 127.0.0.1 with a memory budget; HAProxy on a third; wait until both are UP;
  2. the reference: every distinct request body sent directly to server 1, one at a time;
  3. the load: C client threads send at least N requests (mixed routes: /v1/completions with echo
     and logprobs, with max_tokens 1 and several prompts, /v1/embeddings mean and last,
     /v1/classify) through HAProxy on keep-alive connections. After N/4 answers server 1 gets
     SIGTERM: it must exit 0 after a graceful stop, and HAProxy must mark it DOWN; it is restarted
     on the same port, HAProxy must mark it UP again, and the load goes on until it has served
     20 requests. Then the same with server 2 and SIGKILL (a crash: its requests in flight are
     cut; HAProxy replays those it had no answer to);
     Then HAProxy reloads under the load (SIGUSR2 to its master, as `systemctl reload` does):
     a new worker must take over and no request may fail;
  4. drain by hand (GUIDE): `set server estream/s2 state drain` on the admin socket: s2 gets no
     new request while the others all succeed; `state ready` again;
  5. checks: HAProxy's current worker reused no idle connection to an instance (its `reuse`
     counts); a request that failed (any answer but 200, or none) was in flight at one of the two
     signals (sent before, answered after); the client retried each failed request and every
     request finally got 200; every answer equals server 1's direct answer for the same body
     (the fields "id" and "created" aside; floats within 1e-5 relative, exact equality
     reported); both servers took requests before the first signal. Prints HAProxy's own replays
     (its log's retry counts) and the throughput (reported, never asserted).
"""
import argparse
import csv
import ctypes
import http.client
import io
import json
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

PROCS = []  # every child process, killed on exit


def log(msg):
    print("haproxy test: " + msg, flush=True)


class Failure(Exception):
    pass


def die_with_parent():
    # The children die with this process even if it is killed with SIGKILL.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def spawn(argv, logpath, env=None):
    f = open(logpath, "ab")
    p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                         preexec_fn=die_with_parent)
    f.close()
    PROCS.append(p)
    return p


def stop_all():
    for p in PROCS:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 5
    for p in PROCS:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def free_ports(n):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def wait_until(seconds, what, cond, every=0.1):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            if cond():
                return
        except Exception:  # noqa: BLE001 (not up yet)
            pass
        time.sleep(every)
    raise Failure("timed out after %g s waiting for %s" % (seconds, what))


def http_get(port, path, timeout=5):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=timeout) as r:
        return r.status, r.read()


def run(argv, timeout, what):
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    if r.returncode != 0:
        raise Failure("%s failed (%d): %s" % (what, r.returncode, r.stdout.decode(errors="replace")[-2000:]))


# ---- deploy/estream@.service -> argv and environment ----

def unit_command(unit_path, estream, port, instance_env):
    """The unit's ExecStart for instance `port`, expanded as systemd does, and its environment."""
    env, exec_start = {}, None
    for line in open(unit_path):
        line = line.strip()
        if line.startswith("Environment="):
            for word in shlex.split(line[len("Environment="):]):
                k, _, v = word.partition("=")
                env[k] = v
        elif line.startswith("ExecStart="):
            if exec_start is not None:
                raise Failure("%s has two ExecStart lines" % unit_path)
            exec_start = line[len("ExecStart="):]
    if exec_start is None:
        raise Failure("%s has no ExecStart" % unit_path)
    env.update(instance_env)  # EnvironmentFile=/etc/estream/%i.env overrides Environment=
    argv = []
    for word in exec_start.replace("%i", str(port)).split():
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if m:  # $VAR alone: split at whitespace, zero or more arguments
            argv += env.get(m.group(1), "").split()
        else:  # ${VAR} inside a word: replaced by the value, one argument
            argv.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), word))
    if argv[0] != "/usr/local/bin/estream":
        raise Failure("ExecStart runs %s, expected /usr/local/bin/estream" % argv[0])
    argv[0] = estream
    proc_env = dict(os.environ)
    proc_env.update(env)
    return argv, proc_env


# ---- deploy/haproxy.cfg -> a config for this test ----

def haproxy_config(cfg_path, front, stats, backends, workdir):
    text = open(cfg_path).read()

    def sub(pattern, repl, count=1):
        nonlocal text
        text, n = re.subn(pattern, repl, text, flags=re.M)
        if n != count:
            raise Failure("deploy/haproxy.cfg changed: /%s/ matched %d times, expected %d (update the test)"
                          % (pattern, n, count))

    sub(r"^(\s*)log /dev/log local0$", r"\1log stderr format raw local0 info")
    sub(r"^\s*log /dev/log local1 notice\n", "")
    sub(r"^\s*chroot .*\n", "")
    sub(r"^\s*user haproxy\n", "")
    sub(r"^\s*group haproxy\n", "")
    sub(r"^\s*daemon\n", "")
    sub(r"^(\s*stats socket )/run/haproxy/admin.sock ", r"\g<1>%s/admin.sock " % workdir)
    sub(r"^(\s*bind ):8080$", r"\g<1>127.0.0.1:%d" % front)
    sub(r"^(\s*bind )127\.0\.0\.1:8404$", r"\g<1>127.0.0.1:%d" % stats)
    sub(r"^(\s*server s1 )127\.0\.0\.1:8101$", r"\g<1>127.0.0.1:%d" % backends[0])
    sub(r"^(\s*server s2 )127\.0\.0\.1:8102$", r"\g<1>127.0.0.1:%d" % backends[1])
    return text


def haproxy_stats(port):
    """{server name: row} of backend `estream` from the stats page's CSV."""
    _, body = http_get(port, "/;csv", timeout=3)
    text = body.decode()
    if text.startswith("# "):
        text = text[2:]
    rows = {}
    for row in csv.DictReader(io.StringIO(text)):
        if row["pxname"] == "estream" and row["svname"] not in ("BACKEND", "FRONTEND"):
            rows[row["svname"]] = row
    return rows


def admin(sock_path, command):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(sock_path)
    s.sendall((command + "\n").encode())
    out = b""
    while True:
        b = s.recv(4096)
        if not b:
            break
        out += b
    s.close()
    return out.decode()


# ---- requests ----

def request_bodies(n_vocab_max=500, seed=24):
    rnd = random.Random(seed)
    ids = lambda n: [rnd.randrange(1, n_vocab_max) for _ in range(n)]  # noqa: E731
    bodies = []
    for i in range(12):
        bodies.append(("/v1/completions", {"prompt": ids(6 + 7 * i), "echo": True, "logprobs": 1 + i % 3,
                                           "max_tokens": 0}))
    for i in range(4):
        bodies.append(("/v1/completions", {"prompt": [ids(5 + i), ids(20 + 3 * i)], "echo": True, "logprobs": 0,
                                           "max_tokens": 1}))
    for i in range(6):
        bodies.append(("/v1/embeddings", {"input": [ids(4 + 5 * i), ids(30 - 2 * i)],
                                          "pooling": "mean" if i % 2 == 0 else "last"}))
    for i in range(3):
        bodies.append(("/v1/classify", {"prompt": ids(10 + 4 * i), "labels": [ids(1), ids(2), ids(3)]}))
    return [(route, json.dumps(b)) for route, b in bodies]


def normalise(answer):
    d = json.loads(answer)
    d.pop("id", None)
    d.pop("created", None)
    return d


def close_enough(x, y, where, tol=1e-5):
    if isinstance(x, bool) or isinstance(y, bool):
        if x != y:
            raise Failure("%s: %r != %r" % (where, x, y))
    elif isinstance(x, (int, float)) and isinstance(y, (int, float)):
        if abs(x - y) > tol * abs(y) + 1e-6:
            raise Failure("%s: %r != %r" % (where, x, y))
    elif isinstance(x, dict) and isinstance(y, dict):
        if x.keys() != y.keys():
            raise Failure("%s: keys %s != %s" % (where, sorted(x), sorted(y)))
        for k in x:
            close_enough(x[k], y[k], where + "." + k, tol)
    elif isinstance(x, list) and isinstance(y, list):
        if len(x) != len(y):
            raise Failure("%s: %d != %d items" % (where, len(x), len(y)))
        for i, (u, v) in enumerate(zip(x, y)):
            close_enough(u, v, "%s[%d]" % (where, i), tol)
    elif x != y:
        raise Failure("%s: %r != %r" % (where, x, y))


class Client:
    """One keep-alive connection; reconnects after any error."""

    def __init__(self, port, timeout=30):
        self.port, self.timeout, self.conn = port, timeout, None

    def post(self, route, body):
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        try:
            self.conn.request("POST", route, body=body, headers={"Content-Type": "application/json"})
            r = self.conn.getresponse()
            data = r.read()
            if r.getheader("Connection", "").lower() == "close":
                self.close()
            return r.status, data
        except Exception:
            self.close()
            raise

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class Load:
    """C threads sending requests through HAProxy until stop(); every failure is retried."""

    def __init__(self, port, bodies, clients, max_requests):
        self.port, self.bodies, self.max_requests = port, bodies, max_requests
        self.lock = threading.Lock()
        self.next = 0
        self.done = 0
        self.attempts = []   # (start, end, ok, what)
        self.answers = {}    # request index -> (body index, final answer bytes)
        self.errors = []
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self.worker, daemon=True) for _ in range(clients)]

    def start(self):
        self.t0 = time.monotonic()
        for t in self.threads:
            t.start()

    def worker(self):
        client = Client(self.port)
        while not self.stopping.is_set():
            with self.lock:
                if self.next >= self.max_requests:
                    break
                i = self.next
                self.next += 1
            b = i % len(self.bodies)
            route, body = self.bodies[b]
            for attempt in range(6):
                start = time.monotonic()
                try:
                    status, data = client.post(route, body)
                    what = "HTTP %d" % status
                except Exception as e:  # noqa: BLE001 (any failure counts, and is retried)
                    status, data, what = None, None, "%s: %s" % (type(e).__name__, e)
                end = time.monotonic()
                with self.lock:
                    self.attempts.append((start, end, status == 200, what, i))
                if status == 200:
                    with self.lock:
                        self.answers[i] = (b, data)
                        self.done += 1
                    break
                time.sleep(0.2)  # the client's retry
            else:
                with self.lock:
                    self.errors.append("request %d (%s) failed 6 times, last: %s" % (i, route, what))
                    self.done += 1
        client.close()

    def stop(self, timeout=60):
        self.stopping.set()
        for t in self.threads:
            t.join(timeout)
            if t.is_alive():
                raise Failure("a client thread did not finish within %g s" % timeout)
        self.t1 = time.monotonic()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--estream", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--haproxy", default="haproxy")
    ap.add_argument("--requests", type=int, default=400, help="at least this many through HAProxy")
    ap.add_argument("--clients", type=int, default=8)
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("haproxy test: FAILED: interrupted (over the time limit?)"))
    D, E = a.dir, a.estream
    t_start = time.monotonic()

    # ---- 1. model, servers, HAProxy ----
    run([E, "synth", "--preset", "tiny", "--arch", "qwen3moe", "-q", "-o", D + "/tiny.gguf"], 60, "estream synth")
    run([E, "pack", D + "/tiny.gguf", "-o", D + "/tiny.packed.gguf"], 60, "estream pack")
    p1, p2, front, stats = free_ports(4)
    instance_env = {"MODEL": D + "/tiny.packed.gguf", "BUDGET": "256M", "THREADS": "1",
                    "EXTRA_ARGS": "--budget-tokens 1024 --max-batch-tokens 1024"}
    unit = os.path.join(a.root, "deploy", "estream@.service")
    servers = {}

    def start_server(name, port):
        argv, env = unit_command(unit, E, port, instance_env)
        servers[name] = spawn(argv, "%s/%s.log" % (D, name), env)
        return argv

    argv = start_server("s1", p1)
    start_server("s2", p2)
    log("servers: " + " ".join(shlex.quote(x) for x in argv).replace(str(p1), "PORT"))
    for name, port in (("s1", p1), ("s2", p2)):
        wait_until(60, name + "'s /health to answer 200", lambda: http_get(port, "/health")[0] == 200)
        if servers[name].poll() is not None:
            raise Failure("%s exited: %s" % (name, open("%s/%s.log" % (D, name)).read()))

    cfg = haproxy_config(os.path.join(a.root, "deploy", "haproxy.cfg"), front, stats, (p1, p2), D)
    with open(D + "/haproxy.cfg", "w") as f:
        f.write(cfg)
    run([a.haproxy, "-c", "-q", "-f", D + "/haproxy.cfg"], 20, "haproxy -c (the config from deploy/haproxy.cfg)")
    # Master-worker (-W), as Debian's haproxy.service runs it (-Ws), in the foreground (-db).
    haproxy = spawn([a.haproxy, "-W", "-db", "-f", D + "/haproxy.cfg"], D + "/haproxy.log")
    wait_until(30, "HAProxy to show s1 and s2 UP",
               lambda: [r["status"] for r in haproxy_stats(stats).values()] == ["UP", "UP"])
    log("HAProxy on 127.0.0.1:%d in front of s1 :%d and s2 :%d, both UP" % (front, p1, p2))

    # ---- 2. the reference: each body once, directly to s1 ----
    bodies = request_bodies()
    ref = []
    c = Client(p1)
    for route, body in bodies:
        status, data = c.post(route, body)
        if status != 200:
            raise Failure("reference %s answered %d: %s" % (route, status, data[:300]))
        ref.append(data)
    c.close()
    log("reference: %d distinct requests answered by s1 directly" % len(ref))

    # ---- 3. the load; s1 stopped (SIGTERM) and restarted, then s2 killed (SIGKILL) and restarted ----
    load = Load(front, bodies, a.clients, max_requests=50 * a.requests)
    load.start()
    kills = []  # (time of the signal, server, signal name)

    def bounce(name, port, sig, after_answers):
        wait_until(60, "%d answers" % after_answers, lambda: load.done >= after_answers, every=0.01)
        st = haproxy_stats(stats)
        done_at_kill = load.done
        t_kill = time.monotonic()
        servers[name].send_signal(sig)
        kills.append((t_kill, name, signal.Signals(sig).name))
        seen_down = []

        def down():
            if not seen_down and haproxy_stats(stats)[name]["status"].startswith("DOWN"):
                seen_down.append(time.monotonic())
            return bool(seen_down)

        def exited():
            down()  # and note when HAProxy saw it go, meanwhile
            return servers[name].poll() is not None
        wait_until(30, "%s to exit after %s" % (name, signal.Signals(sig).name), exited, every=0.05)
        t_exit = time.monotonic()
        rc = servers[name].returncode
        out = open("%s/%s.log" % (D, name)).read()
        if sig == signal.SIGTERM and (rc != 0 or not out.rstrip().endswith("stopped")):
            raise Failure("%s exited %d after SIGTERM (want 0 after a graceful stop): %s" % (name, rc, out[-1500:]))
        wait_until(10, "HAProxy to mark %s DOWN" % name, down, every=0.05)
        log("%s: %s after %d answers (%s in flight on it); it exited (%d) %.2f s later; HAProxy marked it DOWN "
            "%.2f s after the signal" % (name, signal.Signals(sig).name, done_at_kill, st[name]["scur"], rc,
                                         t_exit - t_kill, seen_down[0] - t_kill))
        time.sleep(0.5)
        start_server(name, port)
        t_restart = time.monotonic()
        wait_until(60, "HAProxy to mark the restarted %s UP" % name,
                   lambda: haproxy_stats(stats)[name]["status"] == "UP", every=0.05)
        up = haproxy_stats(stats)
        log("%s: restarted; UP again %.2f s later" % (name, time.monotonic() - t_restart))
        # Until it has served again (slowstart ramps its weight up over 5 s).
        wait_until(60, "the restarted %s to serve 20 requests" % name,
                   lambda: int(haproxy_stats(stats)[name]["stot"]) >= int(up[name]["stot"]) + 20, every=0.05)
        return st

    before = bounce("s1", p1, signal.SIGTERM, a.requests // 4)
    served_before = {k: int(before[k]["stot"]) for k in ("s1", "s2")}
    bounce("s2", p2, signal.SIGKILL, load.done + a.requests // 4)
    # A reload, as `systemctl reload haproxy` does it (SIGUSR2 to the master): a new worker with the
    # file read again takes over the listening sockets; the old one finishes what it holds.
    sock = D + "/admin.sock"
    worker = lambda: re.search(r"^Pid: (\d+)$", admin(sock, "show info"), re.M).group(1)  # noqa: E731
    old_worker = worker()
    totals = haproxy_stats(stats)  # the new worker counts from 0
    done_at_reload = load.done
    haproxy.send_signal(signal.SIGUSR2)
    wait_until(30, "a new HAProxy worker after SIGUSR2", lambda: worker() != old_worker)
    wait_until(60, "100 answers after the reload", lambda: load.done >= done_at_reload + 100, every=0.05)
    log("reload: SIGUSR2 to HAProxy's master after %d answers: worker %s replaced by %s, 100 more answers"
        % (done_at_reload, old_worker, worker()))
    wait_until(60, "%d answers" % a.requests, lambda: load.done >= a.requests, every=0.05)
    load.stop()
    n_req = load.done
    secs = load.t1 - load.t0

    # ---- 4. drain s2 by hand through the admin socket ----
    admin(sock, "set server estream/s2 state drain")
    wait_until(5, "s2 to be DRAIN", lambda: haproxy_stats(stats)["s2"]["status"] == "DRAIN")
    s2_before = int(haproxy_stats(stats)["s2"]["stot"])
    c = Client(front)
    for i in range(20):
        route, body = bodies[i % len(bodies)]
        status, data = c.post(route, body)
        if status != 200:
            raise Failure("while s2 drains, a request got %d: %s" % (status, data[:300]))
        close_enough(normalise(data), normalise(ref[i % len(bodies)]), "drain request %d" % i)
    c.close()
    s2_after = int(haproxy_stats(stats)["s2"]["stot"])
    if s2_after != s2_before:
        raise Failure("s2 took %d requests while set to drain" % (s2_after - s2_before))
    admin(sock, "set server estream/s2 state ready")
    wait_until(5, "s2 to be UP again", lambda: haproxy_stats(stats)["s2"]["status"] == "UP")
    log("drain: with s2 set to drain on the admin socket, 20 requests all went to s1; s2 ready again")

    # ---- 5. checks ----
    # No request may go out on an idle connection to an instance (option http-server-close): one
    # to an instance just killed is reset, and HAProxy 2.6 does not replay that request.
    reused = {k: int(r.get("reuse") or 0) for k, r in haproxy_stats(stats).items()}
    if any(reused.values()):
        raise Failure("HAProxy reused idle connections to the instances %s: deploy/haproxy.cfg must open one "
                      "per request (option http-server-close)" % reused)
    if load.errors:
        raise Failure("requests that never succeeded: " + "; ".join(load.errors[:5]))
    failed = [x for x in load.attempts if not x[2]]
    in_flight = lambda x: any(x[0] < t < x[1] for t, _, _ in kills)  # noqa: E731
    bad = [x for x in failed if not in_flight(x)]
    if bad:
        raise Failure("%d failed requests were not in flight at a kill (%s), e.g. %s"
                      % (len(bad), bad[0][3], bad[:3]))
    exact = 0
    for i, (b, data) in sorted(load.answers.items()):
        x, y = normalise(data), normalise(ref[b])
        exact += x == y
        close_enough(x, y, "request %d (%s)" % (i, bodies[b][0]))
    if min(served_before.values()) == 0:
        raise Failure("leastconn sent every request to one server before the kill: %s" % served_before)
    replays = redispatched = 0
    for line in open(D + "/haproxy.log", errors="replace"):
        m = re.search(r" \d+/\d+/\d+/\d+/(\+?)(\d+) \d+/\d+ ", line)
        if m and int(m.group(2)) > 0:
            replays += 1
            redispatched += m.group(1) == "+"
    log("load: %d requests (%d clients, %d distinct bodies, %d routes) in %.1f s = %.0f req/s through HAProxy"
        % (n_req, a.clients, len(bodies), len({r for r, _ in bodies}), secs, n_req / secs))
    log("load: %d requests in flight at the two kills; %d attempts failed at the client (all of them in flight "
        "at a kill; all retried and answered); HAProxy replayed %d requests itself (%d on another server)"
        % (sum(in_flight(x) for x in load.attempts), len(failed), replays, redispatched))
    log("load: served by s1 / s2: %d / %d before the first kill, %d / %d before the reload (HAProxy's counts)"
        % (served_before["s1"], served_before["s2"], int(totals["s1"]["stot"]), int(totals["s2"]["stot"])))
    log("answers: all %d equal s1's direct answers to the same bodies (%d bit-identical, the rest within 1e-5)"
        % (len(load.answers), exact))
    log("PASSED in %.0f s" % (time.monotonic() - t_start))


if __name__ == "__main__":
    code = 0
    try:
        main()
    except Failure as e:
        print("haproxy test: FAILED: %s" % e, file=sys.stderr, flush=True)
        code = 1
    finally:
        stop_all()
    sys.exit(code)
