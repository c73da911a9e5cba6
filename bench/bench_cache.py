#!/usr/bin/env python3
"""The executable cache: what a hit costs, against baselines measured in the same run.

  (a) memory   repeated Compile of a small cpu program served from memory:
               p50/p99 latency seen by the client and the server's own
               compile_wall_ns; baseline: the cheapest RPC round trip on the
               same channel (CacheList of an absent key), and the floor of a
               Compile that does only request parse + verify + key (BYPASS on
               the interpreter backend);
  (b) shared   Compile served from Redis: before each one the key is evicted
               from the server's local tiers (CacheEvict by key, not shared),
               so every Compile fetches, checks and loads the entry; baseline:
               a raw Redis GET of the same entry's bytes over a socket (RESP),
               same Redis, interleaved with the Compiles; ratio = Compile p50 /
               GET p50, client-side and server-side;
  (c) mlp      cold compile (BYPASS policy: build, store nothing) of the MLP
               of bench_cpu.py (batch 256, 784->1024->1024->10, bias, relu,
               softmax) against a warm memory hit and a Redis hit of it;
  (d) cluster  with --cluster: (b) through a Redis Cluster of three
               primaries and three replicas (redis-cluster:// URL), against
               a raw GET on the primary that owns the entry's slot.

Each round starts its own redis-server (maxmemory-policy allkeys-lru, as
documented for Kiln) and kilnd (free loopback ports, --redis-url, no disk
tier so that (b) measures Redis alone); printed figures are medians over the
rounds, ratios computed per round then their median. One JSON line per
benchmark on stdout (plus meta lines), progress on stderr. Not part of the
test suite.

    .venv/bin/python bench/bench_cache.py [--kilnd build/server/kilnd] [--rounds 3]
        [--hits 2000] [--shared 300] [--cold 3] [--cluster]
"""
import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import test_cache_cluster as cc  # noqa: E402  (helpers: Redis, RESP, kilnd)

NS = time.perf_counter_ns


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def pct(v, p):
    s = sorted(v)
    return s[min(len(s) - 1, int(p / 100.0 * len(s)))] if s else None


def us(ns):
    return None if ns is None else round(ns / 1e3, 1)


def ratio(a, b):
    return None if not a or not b else round(a / b, 3)


def mlp_hlo():
    """The MLP of bench_cpu.py, from its own generator (JAX not imported)."""
    saved = sys.modules.get("jax", "absent")
    sys.modules["jax"] = None  # bench_cpu then runs without JAX
    try:
        import bench_cpu
    finally:
        if saved == "absent":
            del sys.modules["jax"]
        else:
            sys.modules["jax"] = saved
    return bench_cpu.mlp_hlo(**bench_cpu.MLP)


def timed_compiles(k, hlo, n, want_source=None, **kw):
    """n Compiles: client ns, server compile_wall_ns, sources seen."""
    client, server, sources = [], [], {}
    for _ in range(n):
        t0 = NS()
        r = k.compile(hlo, **kw)
        client.append(NS() - t0)
        server.append(r.compile_wall_ns)
        s = cc.src(r)
        sources[s] = sources.get(s, 0) + 1
    if want_source and set(sources) != {want_source}:
        log(f"  warning: wanted {want_source}, got {sources}")
    return client, server, sources


def bench_memory(o, k, hlo):
    k.compile(hlo)
    k.compile(hlo)
    # The RPC floor: grpc.health.v1.Health/Check with an empty request (the
    # bytes of HealthCheckRequest{service: ""}), raw bytes both ways.
    health = k.chan.unary_unary("/grpc.health.v1.Health/Check")
    floor = []
    for _ in range(o.hits):
        t0 = NS()
        health(b"", timeout=30)
        floor.append(NS() - t0)
    client, server, sources = timed_compiles(k, hlo, o.hits, "MEMORY")
    bp = cc.pb.kiln.CachePolicy.Value("CACHE_POLICY_BYPASS")
    k.compile(hlo, backend="interp", policy=bp)
    ic, isv, _ = timed_compiles(k, hlo, o.hits, None, backend="interp", policy=bp)
    return {
        "client_p50_us": us(pct(client, 50)), "client_p99_us": us(pct(client, 99)),
        "server_p50_us": us(pct(server, 50)), "server_p99_us": us(pct(server, 99)),
        "rpc_floor_p50_us": us(pct(floor, 50)),
        "interp_bypass_client_p50_us": us(pct(ic, 50)),
        "interp_bypass_server_p50_us": us(pct(isv, 50)),
        "sources": sources,
    }


def owner(redis, rkey):
    """A RESP client of the node holding rkey: the one Redis, or the cluster
    primary that answers its GET (the others answer MOVED)."""
    for node in getattr(redis, "nodes", [redis]):
        if node.proc.poll() is not None:
            continue
        c = node.client()
        try:
            if c.cmd("GET", rkey) is not None:
                return c
        except cc.RespError:
            pass
        c.close()
    raise RuntimeError("the entry is not in Redis")


def bench_shared(o, k, redis, hlo, n):
    first = k.compile(hlo)
    key = first.cache_key
    rkey = cc.PREFIX + ("exe:{%s}" % key if hasattr(redis, "nodes") else "exe:" + key)
    rc = owner(redis, rkey)
    val = rc.cmd("GET", rkey)
    client, server, get, sources = [], [], [], {}
    for _ in range(n):
        k.evict([key])
        t0 = NS()
        r = k.compile(hlo)
        client.append(NS() - t0)
        server.append(r.compile_wall_ns)
        s = cc.src(r)
        sources[s] = sources.get(s, 0) + 1
        t0 = NS()
        got = rc.cmd("GET", rkey)
        get.append(NS() - t0)
        if got != val:
            raise RuntimeError("the entry changed in Redis")
    rc.close()
    if set(sources) != {"SHARED"}:
        log(f"  warning: wanted SHARED, got {sources}")
    c50, s50, g50 = pct(client, 50), pct(server, 50), pct(get, 50)
    return {
        "entry_bytes": len(val),
        "client_p50_us": us(c50), "client_p99_us": us(pct(client, 99)),
        "server_p50_us": us(s50), "server_p99_us": us(pct(server, 99)),
        "redis_get_p50_us": us(g50), "redis_get_p99_us": us(pct(get, 99)),
        "ratio_client_vs_get": ratio(c50, g50), "ratio_server_vs_get": ratio(s50, g50),
        "sources": sources,
    }


def bench_mlp(o, k, redis, hlo):
    bp = cc.pb.kiln.CachePolicy.Value("CACHE_POLICY_BYPASS")
    cold_c, cold_s, _ = timed_compiles(k, hlo, o.cold, "COMPILED", policy=bp)
    # A BYPASS compile leaves the executable in kilnd's loaded table only,
    # where a DEFAULT compile would find it without storing it: drop it.
    k.evict([k.compile(hlo, policy=bp).cache_key])
    if cc.src(k.compile(hlo)) != "COMPILED":  # built and stored now
        log("  warning: the MLP was not built and stored")
    warm_c, warm_s, wsrc = timed_compiles(k, hlo, max(50, o.hits // 10), "MEMORY")
    sh = bench_shared(o, k, redis, hlo, max(10, o.shared // 10))
    cold = statistics.median(cold_c)
    return {
        "cold_client_ms": round(cold / 1e6, 1),
        "cold_server_ms": round(statistics.median(cold_s) / 1e6, 1),
        "warm_client_p50_us": us(pct(warm_c, 50)), "warm_server_p50_us": us(pct(warm_s, 50)),
        "shared_client_p50_us": sh["client_p50_us"], "shared_server_p50_us": sh["server_p50_us"],
        "entry_bytes": sh["entry_bytes"], "redis_get_p50_us": sh["redis_get_p50_us"],
        "cold_vs_warm": ratio(cold, pct(warm_c, 50)),
        "cold_vs_shared": ratio(cold, sh["client_p50_us"] * 1e3),
    }


def one_round(o, tmp, mlp):
    env = cc.Env(o.kilnd, tmp)
    try:
        redis = env.redis(["--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru"])
        k = env.kilnd("bench", redis=redis, cache_dir=None)
        small, _ = cc.program(1)
        res = {"memory": bench_memory(o, k, small)}
        res["shared"] = bench_shared(o, k, redis, cc.program(2)[0], o.shared)
        res["mlp"] = bench_mlp(o, k, redis, mlp)
        if o.cluster:
            import test_cache_redis_topologies as topo
            cl = topo.Cluster(env)
            kc = env.kilnd("bench-cluster", redis=cl, cache_dir=None)
            res["shared_cluster"] = bench_shared(o, kc, cl, cc.program(3)[0], o.shared)
        return res
    except Exception:
        env.dump_logs()
        raise
    finally:
        env.close()


def merge(rounds):
    """Medians over rounds, key by key (numbers only)."""
    out = {}
    for name in rounds[0]:
        out[name] = {}
        for f, v in rounds[0][name].items():
            vals = [r[name][f] for r in rounds]
            if isinstance(v, (int, float)) and all(isinstance(x, (int, float)) for x in vals):
                out[name][f] = round(statistics.median(vals), 3)
            else:
                out[name][f] = vals
    return out


def loadavg():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kilnd", default=os.path.join(ROOT, "build", "server", "kilnd"))
    ap.add_argument("--proto-dir", default=os.path.join(ROOT, "proto"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hits", type=int, default=2000, help="memory-hit compiles per round")
    ap.add_argument("--shared", type=int, default=300, help="Redis-hit compiles per round")
    ap.add_argument("--cold", type=int, default=3, help="cold MLP compiles per round")
    ap.add_argument("--cluster", action="store_true",
                    help="also a shared hit through a 3+3 Redis Cluster vs a raw GET on the "
                         "node owning the entry (needs redis-cli)")
    o = ap.parse_args()
    if cc.protoc is None:
        sys.exit(f"bench_cache: needs grpcio and grpcio-tools ({cc.IMPORT_ERROR})")
    if not shutil.which("redis-server"):
        sys.exit("bench_cache: needs redis-server")
    tmp = tempfile.mkdtemp(prefix="kiln-bench-cache-")
    cc.load_stubs(o.proto_dir, os.path.join(tmp, "stubs"))
    try:
        tree = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
    except OSError:
        tree = None
    print(json.dumps({"bench": "meta", "date": datetime.datetime.now(datetime.timezone.utc)
                      .strftime("%Y-%m-%d %H:%M"), "tree": tree, "cores": os.cpu_count(),
                      "loadavg": loadavg(), "rounds": o.rounds, "hits": o.hits,
                      "shared": o.shared, "cold": o.cold}), flush=True)
    mlp = mlp_hlo()
    rounds = []
    try:
        for i in range(o.rounds):
            r = one_round(o, tmp, mlp)
            log(f"round {i}: memory p50 {r['memory']['client_p50_us']} us, "
                f"shared p50 {r['shared']['client_p50_us']} us vs GET "
                f"{r['shared']['redis_get_p50_us']} us, mlp cold {r['mlp']['cold_client_ms']} ms "
                f"vs warm {r['mlp']['warm_client_p50_us']} us")
            rounds.append(r)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    m = merge(rounds)
    print(json.dumps({"bench": "cache_memory_hit", **m["memory"]}), flush=True)
    print(json.dumps({"bench": "cache_shared_hit", **m["shared"]}), flush=True)
    print(json.dumps({"bench": "cache_mlp_cold_vs_hit", **m["mlp"]}), flush=True)
    if "shared_cluster" in m:
        print(json.dumps({"bench": "cache_shared_hit_cluster", **m["shared_cluster"]}), flush=True)
    print(json.dumps({"bench": "meta_end", "loadavg": loadavg()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
