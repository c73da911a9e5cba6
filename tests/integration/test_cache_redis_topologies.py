#!/usr/bin/env python3
"""The shared cache on a Redis Cluster and behind Redis Sentinel, with kilnd.

Each scenario starts its own Redis processes on free loopback ports and two
kilnd sharing them (helpers from test_cache_cluster.py):

  cluster     three primaries and three replicas (`redis-cli --cluster
              create`), kilnd given one seed each (`redis-cluster://`):
              modules compiled on A are SHARED hits on B and run right;
              the entries spread over the primaries; /metrics and Stats
              list every node with its slots and requests;
  reshard     slots moved between primaries (`redis-cli --cluster reshard`)
              under a stream of compiles on both servers: every request
              answered and right, redirections counted, sharing goes on;
  failover    a primary SIGKILLed under a stream of compiles: no request
              fails, its replica's promotion is followed and sharing
              resumes on its slots;
  sentinel    a primary, a replica and a sentinel (`redis-sentinel://`):
              sharing through the primary; the primary killed under load,
              no request fails, and after the sentinel's failover a module
              compiled on A is again a SHARED hit on B.

Usage:

    KILND=build/server/kilnd test_cache_redis_topologies.py --proto-dir proto [--only a,b]

Exit status 0 when everything passed, 1 otherwise, 77 (skipped) when kilnd,
redis-server, redis-cli or grpcio/grpcio-tools is missing.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_cache_cluster as cc  # noqa: E402  (helpers: Redis, RESP, kilnd)
from test_cache_cluster import check, log  # noqa: E402

FAST_SYNC = ["--repl-diskless-sync-delay", "0"]
OPTS = argparse.Namespace(kiln="")


def cluster_port():
    """A free port whose cluster bus port (port + 10000) is valid and free too."""
    import socket
    for _ in range(200):
        p = cc.free_port()
        if p + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 10000))
            except OSError:
                continue
        return p
    raise RuntimeError("no free port pair for a cluster node")


class Cluster:
    """Six redis-server nodes made into three primaries and three replicas."""

    def __init__(self, env, n=6):
        extra = ["--cluster-enabled", "yes", "--cluster-node-timeout", "1000",
                 "--cluster-config-file"]
        self.nodes = []
        for i in range(n):
            d = tempfile.mkdtemp(prefix=f"node{i}-", dir=env.tmp)  # a fresh cluster config
            r = cc.Redis(d, extra + [f"nodes-{i}.conf"] + FAST_SYNC, port=cluster_port())
            env.redises.append(r)
            self.nodes.append(r)
        cmd = ["redis-cli", "--cluster", "create"] + [r.url() for r in self.nodes] + \
              ["--cluster-replicas", "1", "--cluster-yes"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=60)
        self.wait_ok()

    def wait_ok(self, timeout=30):
        t0 = time.time()
        for r in self.alive():
            while True:
                c = r.client()
                info = c.cmd("CLUSTER", "INFO").decode()
                repl = c.cmd("INFO", "replication").decode()
                c.close()
                if "cluster_state:ok" in info and ("role:master" in repl
                                                   or "master_link_status:up" in repl):
                    break
                if time.time() - t0 > timeout:
                    raise RuntimeError(f"node {r.port} never became ok and in sync")
                time.sleep(0.1)

    def alive(self):
        return [r for r in self.nodes if r.proc.poll() is None]

    def primaries(self):
        out = []
        for r in self.alive():
            c = r.client()
            if "role:master" in c.cmd("INFO", "replication").decode():
                out.append(r)
            c.close()
        return out

    def url(self):
        return "redis-cluster://" + self.nodes[0].url()


class Sentinel:
    """A primary, its replica and one sentinel watching them (quorum 1)."""

    def __init__(self, env):
        self.primary = env.redis(FAST_SYNC)
        self.replica = env.redis(["--replicaof", "127.0.0.1", str(self.primary.port)])
        t0 = time.time()
        while "master_link_status:up" not in self.replica.client().cmd(
                "INFO", "replication").decode():
            if time.time() - t0 > 20:
                raise RuntimeError("the replica never synced")
            time.sleep(0.1)
        d = tempfile.mkdtemp(prefix="sentinel-", dir=env.tmp)
        self.port = cc.free_port()
        conf = os.path.join(d, "sentinel.conf")
        with open(conf, "w") as f:
            f.write(f"port {self.port}\nbind 127.0.0.1\ndir {d}\n"
                    f"sentinel monitor kilnm 127.0.0.1 {self.primary.port} 1\n"
                    "sentinel down-after-milliseconds kilnm 500\n"
                    "sentinel failover-timeout kilnm 5000\n")
        self.log = open(os.path.join(d, "sentinel.log"), "ab")
        self.proc = subprocess.Popen(["redis-server", conf, "--sentinel"], stdout=self.log,
                                     stderr=self.log)
        t0 = time.time()
        while True:
            try:
                c = cc.Resp(self.port)
                if c.cmd("PING") == "PONG":
                    c.close()
                    break
            except (OSError, cc.RespError):
                pass
            if time.time() - t0 > 20:
                raise RuntimeError("the sentinel did not answer PING")
            time.sleep(0.05)
        env.redises.append(self)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def url(self):
        return f"redis-sentinel://127.0.0.1:{self.port}/kilnm"


def metrics(k):
    return urllib.request.urlopen(f"http://{k.metrics}/metrics", timeout=10).read().decode()


def node_rows(text, family):
    """{node: value} of a per-node family in a /metrics text."""
    out = {}
    for line in text.splitlines():
        if line.startswith(family + "{node=\""):
            node = line[len(family) + 7:line.index("\"}")]
            out[node] = int(line.rsplit(" ", 1)[1])
    return out


class Load:
    """Compile + execute streams on servers, every result checked."""

    def __init__(self, servers, threads=4):
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.done, self.failed = [], []
        self.threads = [threading.Thread(target=self.worker, args=(servers[i % len(servers)],))
                        for i in range(threads)]
        for t in self.threads:
            t.start()

    def worker(self, server):
        while not self.stop.is_set():
            hlo, want = cc.program()
            try:
                c = server.compile(hlo)
                got = server.execute(c.executable_id)
                with self.lock:
                    (self.done if cc.close(got, want) else self.failed).append(
                        (server.name, cc.src(c), got))
            except Exception as e:  # noqa: BLE001
                with self.lock:
                    self.failed.append((server.name, repr(e)))

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(cc.RPC_TIMEOUT + 60)
        return self.done, self.failed


def sharing_resumes(a, b, what, timeout=30):
    """Whether a module compiled on a becomes a SHARED hit on b within timeout."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        hlo, want = cc.program()
        a.compile(hlo)
        cb = b.compile(hlo)
        if cc.src(cb) == "SHARED":
            check(cc.close(b.execute(cb.executable_id), want),
                  f"{what}: the shared hit executes right")
            log(f"     sharing after {time.time() - t0:.1f} s")
            return True
        time.sleep(0.2)
    return False


def scenario_cluster(env):
    cl = Cluster(env)
    a = env.kilnd("A", redis=cl)
    b = env.kilnd("B", redis=cl)
    progs = [cc.program() for _ in range(24)]
    keys = []
    for hlo, want in progs:
        ca = a.compile(hlo)
        keys.append(ca.cache_key)
        check(cc.src(ca) == "COMPILED", f"cluster: A builds {ca.cache_key[:12]} (got {cc.src(ca)})")
    shared = 0
    for (hlo, want), key in zip(progs, keys):
        cb = b.compile(hlo)
        shared += cc.src(cb) == "SHARED"
        if not cc.close(b.execute(cb.executable_id), want):
            check(False, f"cluster: {key[:12]} runs right on B")
    check(shared == len(progs), f"cluster: every module is a SHARED hit on B ({shared}/24)")
    holders = 0
    for r in cl.primaries():
        c = r.client()
        n = c.cmd("DBSIZE")
        c.close()
        holders += n > 0
    check(holders == 3, f"cluster: the entries spread over all three primaries ({holders})")
    text = metrics(b)
    up = node_rows(text, "kiln_cache_redis_node_up")
    slots = node_rows(text, "kiln_cache_redis_node_slots")
    reqs = node_rows(text, "kiln_cache_redis_node_requests_total")
    check(sum(slots.values()) == 16384 and sum(1 for v in slots.values() if v) == 3,
          f"cluster: /metrics lists three primaries serving all 16384 slots ({slots})")
    check(all(up[n] == 1 for n in slots if slots[n]), f"cluster: every primary is up ({up})")
    check(sum(1 for n in slots if slots[n] and reqs.get(n, 0) > 0) == 3,
          f"cluster: B sent requests to every primary ({reqs})")
    check('kiln_cache_redis_up 1' in text.splitlines(), "cluster: kiln_cache_redis_up 1")
    st = b.stats()
    names = {k[0] for k in st}
    check("kiln_cache_redis_node_redirects_total" in names,
          "cluster: the Stats RPC carries the per-node counters")
    if OPTS.kiln:
        out = subprocess.run([OPTS.kiln, "cache", "stats", "--server", b.addr], capture_output=True,
                             text=True, timeout=60).stdout
        lines = [x.split() for x in out.splitlines() if x.startswith("  127.0.0.1:")]
        check("shared tier: " in out and sum(1 for x in lines if x[1] == "up" and x[2] != "0") == 3,
              f"cluster: `kiln cache stats --server` shows three primaries up:\n{out[-600:]}")


def scenario_reshard(env):
    cl = Cluster(env)
    a = env.kilnd("A", redis=cl)
    b = env.kilnd("B", redis=cl)
    check(sharing_resumes(a, b, "reshard", timeout=10), "reshard: sharing before the move")
    prim = cl.primaries()
    ids = []
    for r in prim[:2]:
        c = r.client()
        ids.append(c.cmd("CLUSTER", "MYID").decode())
        c.close()
    load = Load([a, b])
    time.sleep(1.0)
    subprocess.run(["redis-cli", "--cluster", "reshard", prim[0].url(), "--cluster-from", ids[0],
                    "--cluster-to", ids[1], "--cluster-slots", "3000", "--cluster-yes"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    time.sleep(1.0)
    done, failed = load.finish()
    log(f"     {len(done)} compile+execute done during the resharding")
    check(not failed, f"reshard: no failed or wrong request ({len(failed)}: {failed[:2]})")
    check(len(done) > 0, "reshard: requests were served meanwhile")
    check(sharing_resumes(a, b, "reshard", timeout=20), "reshard: sharing after the move")
    text = metrics(a) + metrics(b)
    redirects = sum(node_rows(metrics(a), "kiln_cache_redis_node_redirects_total").values()) + \
        sum(node_rows(metrics(b), "kiln_cache_redis_node_redirects_total").values())
    log(f"     {redirects} redirections followed")
    check("kiln_cache_redis_node_slots" in text, "reshard: per-node slot rows are present")


def scenario_failover(env):
    cl = Cluster(env)
    a = env.kilnd("A", redis=cl)
    b = env.kilnd("B", redis=cl)
    check(sharing_resumes(a, b, "failover", timeout=10), "failover: sharing before the kill")
    load = Load([a, b])
    time.sleep(1.0)
    victim = cl.primaries()[0]
    victim.kill()
    time.sleep(6.0)  # the node timeout (1 s), the election, the map reread
    done, failed = load.finish()
    log(f"     {len(done)} compile+execute done around the kill")
    check(not failed, f"failover: no failed or wrong request ({len(failed)}: {failed[:2]})")
    ok = all(sharing_resumes(a, b, "failover", timeout=30) for _ in range(12))
    check(ok, "failover: after the promotion, modules compiled on A are SHARED on B again "
          "(twelve in a row, so every primary's slots are covered in all likelihood)")
    st = b.stats()
    check(cc.ctr(st, "kiln_cache_redis_up") == 1, "failover: B reports the shared tier up again")


def scenario_sentinel(env):
    se = Sentinel(env)
    a = env.kilnd("A", redis=se)
    b = env.kilnd("B", redis=se)
    check(sharing_resumes(a, b, "sentinel", timeout=10), "sentinel: sharing through the primary")
    slots = node_rows(metrics(b), "kiln_cache_redis_node_slots")
    check(slots.get(se.primary.url()) == 16384,
          f"sentinel: B routes everything to the primary ({slots})")
    load = Load([a, b])
    time.sleep(1.0)
    se.primary.kill()
    time.sleep(5.0)
    done, failed = load.finish()
    log(f"     {len(done)} compile+execute done around the kill")
    check(not failed, f"sentinel: no failed or wrong request ({len(failed)}: {failed[:2]})")
    check(sharing_resumes(a, b, "sentinel", timeout=30),
          "sentinel: after the failover, a module compiled on A is SHARED on B")
    slots = node_rows(metrics(b), "kiln_cache_redis_node_slots")
    check(slots.get(se.replica.url()) == 16384,
          f"sentinel: B follows the promoted replica ({slots})")


SCENARIOS = [("cluster", scenario_cluster), ("reshard", scenario_reshard),
             ("failover", scenario_failover), ("sentinel", scenario_sentinel)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--proto-dir", required=True)
    ap.add_argument("--kilnd", default=os.environ.get("KILND", ""))
    ap.add_argument("--kiln", default="", help="the kiln CLI, to check `kiln cache stats`")
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    opts = ap.parse_args()
    OPTS.kiln = opts.kiln
    if cc.protoc is None:
        log(f"test_cache_redis_topologies: skipped: {cc.IMPORT_ERROR}")
        return 77
    if not opts.kilnd or not os.access(opts.kilnd, os.X_OK):
        log(f"test_cache_redis_topologies: skipped: kilnd is not built (KILND={opts.kilnd!r})")
        return 77
    if not shutil.which("redis-server") or not shutil.which("redis-cli"):
        log("test_cache_redis_topologies: skipped: redis-server or redis-cli is not installed")
        return 77
    tmp = tempfile.mkdtemp(prefix="kiln-redis-topo-")
    cc.load_stubs(opts.proto_dir, os.path.join(tmp, "stubs"))
    only = set(filter(None, opts.only.split(",")))
    for name, fn in SCENARIOS:
        if only and name not in only:
            continue
        log(f"== {name}")
        env = cc.Env(opts.kilnd, tmp, name)
        n_fail, t0 = len(cc.FAILURES), time.time()
        try:
            fn(env)
        except Exception:  # noqa: BLE001 - a scenario's crash is one failure
            traceback.print_exc()
            cc.FAILURES.append(f"{name}: raised")
        finally:
            if len(cc.FAILURES) > n_fail:
                env.dump_logs()
            env.close()
        log(f"   {name}: {time.time() - t0:.1f} s")
    shutil.rmtree(tmp, ignore_errors=True)
    if cc.FAILURES:
        log(f"test_cache_redis_topologies: {len(cc.FAILURES)} failed")
        return 1
    log("test_cache_redis_topologies: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
