#!/usr/bin/env python3
# Kill the leader (issue 15, docs/ha.md): three `gpufleet server`s on one PostgreSQL that this
# script starts (initdb and pg_ctl on loopback, as the `postgres` user when root), three real
# `gpufleet agent`s (simulated GPUs, process runner) naming all three servers, and a seeded load of
# submissions (single-GPU jobs and 2-task gangs whose tasks write START/END with their GPU UUIDs to
# a ledger) and cancels through the CLI, naming all three servers. TRIALS times, at a seeded random
# moment, the leader is SIGKILLed; the trial measures until a survivor leads and until a job
# submitted after the kill (CPU-only, so that it never waits for a GPU) is placed, then starts the
# killed server again on its port (it rejoins as a follower). At the end every job is cancelled and
# drained, and the chaos harness's checker (check_ledger.py) checks the ledger: no acknowledged job
# lost, no GPU UUID held by two live tasks, every job final. Prints the per-trial table and the
# failover p50/p99; exits 1 on a violation or a trial without a new leader within 30 s.
# Usage: kill_leader.py PATH/TO/gpufleet [SEED] [TRIALS]
import glob
import http.client
import json
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

from restartable_port import restartable_port

gpufleet = os.path.abspath(sys.argv[1])
seed = int(sys.argv[2]) if len(sys.argv) > 2 else 15
trials = int(sys.argv[3]) if len(sys.argv) > 3 else 20
here = os.path.dirname(os.path.abspath(__file__))
TOKEN = "kill-leader-admin-token-0123456789"
LEASE_MS = 2000
RENEW_MS = 500
GIVE_UP_S = 30

work = tempfile.mkdtemp(prefix="gpufleet-kill-leader-")
os.chmod(work, 0o755)  # the postgres user and the tasks (a user per run) reach into it
# Each agent takes uids for its runs that no other agent of this machine (another test's too) takes.
uid_base = 2001000000 + (os.getpid() % 100000) * 64
ledger = os.path.join(work, "ledger")
open(ledger, "w").close()
os.chmod(ledger, 0o666)
children = []  # every process started here, ended at exit
acked = []
acked_lock = threading.Lock()
faults = []
stop_load = threading.Event()  # ends the load thread


def log(message):
    print(f"kill-leader: {message}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(args, log_name):
    out = open(os.path.join(work, log_name), "ab")
    process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    children.append(process)
    return process


# ---- PostgreSQL ---------------------------------------------------------------------------
def pg_bindir():
    if os.environ.get("GPUFLEET_PG_BINDIR"):
        return os.environ["GPUFLEET_PG_BINDIR"]
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                  key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    if not dirs:
        sys.exit("kill-leader: no initdb in /usr/lib/postgresql/<version>/bin (scripts/setup)")
    return os.path.dirname(dirs[-1])


pg_dir = os.path.join(work, "pg")
os.mkdir(pg_dir)
as_postgres = []
if os.geteuid() == 0:  # initdb refuses root
    entry = pwd.getpwnam("postgres")
    os.chown(pg_dir, entry.pw_uid, entry.pw_gid)
    as_postgres = ["runuser", "-u", "postgres", "--"]
bindir = pg_bindir()
pg_port = free_port()


def pg_ctl(*args):
    return subprocess.run(as_postgres + [f"{bindir}/pg_ctl", "-D", f"{pg_dir}/data", *args],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def cleanup():
    for process in children:
        if process.poll() is None:
            process.kill()
    for process in children:
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    # Tasks the agents left behind (their shims lead their own process groups).
    subprocess.run(["pkill", "-KILL", "-f", ledger], check=False)
    pg_ctl("-m", "immediate", "-w", "stop")
    if not os.environ.get("KEEP_KILL_LEADER_DIR"):
        shutil.rmtree(work, ignore_errors=True)


def fail(message):
    log(message)
    stop_load.set()
    for name in sorted(os.listdir(work)):
        if name.endswith(".log"):
            with open(os.path.join(work, name), errors="replace") as f:
                tail = f.readlines()[-15:]
            print(f"--- {name}\n" + "".join(tail), file=sys.stderr)
    sys.stderr.flush()
    log(message)  # again, last, where a CI summary that shows only the end finds it
    cleanup()
    sys.exit(1)


subprocess.run(as_postgres + [f"{bindir}/initdb", "-D", f"{pg_dir}/data", "-U", "gf", "-A", "trust",
                              "-E", "UTF8", "--locale=C", "--no-sync"],
               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
if pg_ctl("-l", f"{pg_dir}/postgres.log", "-w", "-t", "60", "-o",
          f"-p {pg_port} -k {pg_dir} -c listen_addresses=127.0.0.1 -c fsync=off "
          "-c full_page_writes=off -c shared_buffers=16MB -c max_connections=60",
          "start").returncode != 0:
    fail("PostgreSQL did not start")
store_uri = f"postgresql://gf@127.0.0.1:{pg_port}/postgres"

# ---- servers, agents and the CLI ----------------------------------------------------------
with open(os.path.join(work, "admin-token"), "w") as f:
    f.write(TOKEN + "\n")
ports = []  # each server is killed and started again on its port
while len(ports) < 3:
    port = restartable_port()
    if port not in ports:
        ports.append(port)
addresses = [f"http://127.0.0.1:{port}" for port in ports]
all_servers = ",".join(addresses)
servers = [None, None, None]
cli_env = dict(os.environ, GPUFLEET_ADDR=all_servers, GPUFLEET_TOKEN=TOKEN)


def http_get(index, path, timeout=1.0):
    request = urllib.request.Request(addresses[index] + path,
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except (OSError, ValueError, http.client.HTTPException):  # a server killed mid-answer
        return -1, ""


def leads(index):
    status, metrics = http_get(index, "/metrics")
    if status != 200:
        return False
    return any(line.startswith("gpufleet_server_leader{") and line.endswith(" 1")
               for line in metrics.splitlines())


def start_server(index):
    servers[index] = spawn([
        gpufleet, "server", "--store", store_uri, "--listen", f"127.0.0.1:{ports[index]}",
        "--leader-lease-ms", str(LEASE_MS), "--leader-renew-ms", str(RENEW_MS),
        "--cycle-interval-ms", "100", "--heartbeat-interval-ms", "500", "--node-timeout-s", "6",
        "--stop-grace-s", "6", "--gang-start-timeout-s", "8",
        "--admin-token-file", os.path.join(work, "admin-token")], f"server-{index}.log")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if http_get(index, "/healthz")[0] == 200:
            return
        if servers[index].poll() is not None:
            break
        time.sleep(0.05)
    fail(f"server {index} did not start")


def wait_until(seconds, done):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(0.05)
    return done()


def cli(*args, timeout=20):
    try:
        return subprocess.run([gpufleet, *args], env=cli_env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, 124, b"", b"timed out")


start_server(0)
if not wait_until(20, lambda: leads(0)):
    fail("the first server does not lead")
start_server(1)
start_server(2)
made = cli("create", "token", "--role", "agent", "--name", "kill-leader-agents")
join_token = ""
for line in made.stdout.decode().splitlines():
    if line.startswith("token (shown once, keep it): "):
        join_token = line.split(": ", 1)[1].strip()
if not join_token:
    fail(f"create token: {made.stderr.decode()}")
with open(os.path.join(work, "join-token"), "w") as f:
    f.write(join_token + "\n")
for n in range(3):
    spawn([gpufleet, "agent", "--server", all_servers, "--token-file",
           os.path.join(work, "join-token"), "--node-name", f"kl-{n}", "--topology", "leaf=leaf-0",
           "--backend", "simulated", "--simulated-gpus", "2", "--runner", "process",
           "--state-dir", os.path.join(work, f"agent-{n}"), "--metrics-listen", "127.0.0.1:0",
           "--stop-grace-s", "3",
           "--task-uid-range", f"{uid_base + n * 16}-{uid_base + n * 16 + 15}"], f"agent-{n}.log")
for n in range(3):
    if not wait_until(30, lambda: "registered" in open(os.path.join(work, f"agent-{n}.log")).read()):
        fail(f"agent {n} did not register")


def job_yaml(name, replicas, seconds, gpus=True, priority=0):
    ticks = int(seconds * 10)
    resources = "{gpus: {count: 1}}" if gpus else "{cpu: 100m, memory: 64Mi}"
    # START and END with the task's GPUs; 0.8 s to exit after SIGTERM, as in chaos.sh.
    command = (f'L={ledger}; id=$GPUFLEET_TASK_ID; '
               'echo "START $id $(date +%s.%N) ${CUDA_VISIBLE_DEVICES:--}" >>$L; '
               'trap "sleep 0.8; echo END $id \\$(date +%s.%N) >>$L; exit 0" TERM; '
               f'i=0; while [ $i -lt {ticks} ]; do sleep 0.1; i=$((i+1)); done; '
               'echo "END $id $(date +%s.%N)" >>$L')
    path = os.path.join(work, f"{name}.yaml")
    with open(path, "w") as f:
        f.write("apiVersion: gpufleet.io/v1\nkind: Job\n"
                f"metadata: {{name: {name}}}\nspec:\n  priority: {priority}\n  tasks:\n"
                f"    - name: main\n      replicas: {replicas}\n"
                f"      command: [sh, -c, {json.dumps(command)}]\n"
                f"      resources: {resources}\n")
    return path


last_submit_error = {}  # job name -> why its last submission failed (for a failed trial)


def submit(name, replicas, seconds, gpus=True, priority=0):
    done = cli("submit", "-f", job_yaml(name, replicas, seconds, gpus, priority))
    if done.returncode == 0:
        with acked_lock:
            acked.append(name)
        return True
    last_submit_error[name] = f"exit {done.returncode}: {done.stderr.decode(errors='replace')}"
    return False


# ---- the load: submissions and cancels, seeded ---------------------------------------------


def load():
    rng = random.Random(seed + 1)
    job = 0
    while not stop_load.is_set():
        submit(f"kl-{job}", 2 if rng.random() < 0.3 else 1, rng.choice([1, 1.5, 2, 3]))
        job += 1
        if rng.random() < 0.25:
            with acked_lock:
                victim = rng.choice(acked) if acked else None
            if victim:
                cli("cancel", victim)
                faults.append(f"cancel {victim}")
        stop_load.wait(0.3)


loader = threading.Thread(target=load, daemon=True)
loader.start()


def job_state(name):
    for index, process in enumerate(servers):
        if process.poll() is None:
            status, body = http_get(index, f"/v1/jobs/{name}")
            if status == 200:
                return json.loads(body).get("state", "")
    return ""


rng = random.Random(seed)
results = []  # (trial, killed, before_s, leads_s, placed_s)
for trial in range(trials):
    before = rng.uniform(0.2, 1.0)
    time.sleep(before)
    leader = None
    deadline = time.monotonic() + GIVE_UP_S
    while leader is None and time.monotonic() < deadline:
        leader = next((i for i in range(3) if leads(i)), None)
        if leader is None:
            time.sleep(0.05)
    if leader is None:
        fail(f"trial {trial}: no leader before the kill")
    killed_at = time.monotonic()
    servers[leader].kill()
    servers[leader].wait()
    faults.append(f"leader-kill server-{leader}")
    survivors = [i for i in range(3) if i != leader]
    probe = f"probe-{trial}"
    led = placed = None
    submitted = False
    while time.monotonic() - killed_at < GIVE_UP_S and placed is None:
        if led is None and any(leads(i) for i in survivors):
            led = time.monotonic() - killed_at
        if not submitted:
            submitted = submit(probe, 1, 0.5, gpus=False, priority=100)
        if submitted and job_state(probe) in ("Scheduled", "Running", "Succeeded"):
            placed = time.monotonic() - killed_at
            if led is None:
                led = placed
        time.sleep(0.05)
    if placed is None:
        why = (f"the probe is {job_state(probe) or 'not readable'}" if submitted else
               f"the probe was never acknowledged: {last_submit_error.get(probe, '?').strip()}")
        fail(f"trial {trial}: killed server {leader}; no new job placed within {GIVE_UP_S} s "
             f"(leads after {led}; {why}; leading now: "
             f"{[i for i in survivors if leads(i)]})")
    results.append((trial, leader, before, led, placed))
    log(f"trial {trial}: killed server {leader} after {before:.2f} s; a follower leads after "
        f"{led:.2f} s, a new job is placed after {placed:.2f} s")
    start_server(leader)

stop_load.set()
loader.join()

# ---- drain and check -----------------------------------------------------------------------
with acked_lock:
    names = list(acked)
for name in names:
    cli("cancel", name)
jobs_path = os.path.join(work, "jobs.json")


def drained():
    index = next((i for i in range(3) if leads(i)), 0)
    status, body = http_get(index, "/v1/jobs", timeout=5)
    if status != 200:
        return False
    with open(jobs_path, "w") as f:
        f.write(body)
    return all(j["state"] in ("Succeeded", "Failed", "Cancelled") for j in json.loads(body)["items"])


if not wait_until(60, drained):
    log("not every job reached a final state within 60 s")
time.sleep(1)  # the last ENDs reach the ledger
with open(os.path.join(work, "acked"), "w") as f:
    f.write("\n".join(names) + "\n")
with open(os.path.join(work, "faults"), "w") as f:
    f.write("\n".join(faults) + "\n")


def percentile(values, p):  # nearest rank
    ordered = sorted(values)
    return ordered[max(0, -(-len(ordered) * p // 100) - 1)]


print("trial  killed    before  follower leads  new job placed")
for trial, killed, before, led, placed in results:
    print(f"{trial:5d}  server-{killed}  {before:5.2f} s  {led:12.2f} s  {placed:12.2f} s")
leads_s = [r[3] for r in results]
placed_s = [r[4] for r in results]
print(f"failover over {len(results)} trials (lease {LEASE_MS} ms, renewed every {RENEW_MS} ms): "
      f"follower leads p50 {percentile(leads_s, 50):.2f} s p99 {percentile(leads_s, 99):.2f} s; "
      f"new job placed p50 {percentile(placed_s, 50):.2f} s p99 {percentile(placed_s, 99):.2f} s "
      f"max {max(placed_s):.2f} s", flush=True)
checked = subprocess.run([sys.executable, os.path.join(here, "check_ledger.py"), ledger, jobs_path,
                          os.path.join(work, "acked"), os.path.join(work, "faults"), "15"])
if checked.returncode != 0:
    fail(f"invariants violated (seed {seed})")
cleanup()
