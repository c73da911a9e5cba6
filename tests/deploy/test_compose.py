"""deploy/compose.yaml's cluster started for real, without Docker.

Reads compose.yaml (YAML merge keys and all), takes the redis service's
command and each kilnd service's command and environment, with the
image's ENV from the Dockerfile the service builds underneath, and starts
them as processes: a redis-server and two kilnd. What only makes sense
inside containers is mapped onto this host, and nothing else is changed:
  - listen addresses 0.0.0.0:PORT become 127.0.0.1:0 (two servers share
    this host's ports; kilnd prints what it picked);
  - the Redis URL's host (the redis service's name) becomes the local
    redis-server's address;
  - the config file and the secret are the files compose would mount at
    those paths (configs: / secrets: entries; the secret, which a user
    creates, is made here), and KILN_CACHE_DIR a directory per server.
Then: both servers are healthy (/healthz on their metrics port); a program
compiled on the first is built there, and on the second comes from the
shared Redis tier (`cache shared`): they share the secret and the cache;
their stderr is the JSON log kilnd.conf asks for. Both drain and exit 0
on SIGTERM.

Exits 77 (skipped) without PyYAML or redis-server.
"""
import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

try:
    import yaml
except ImportError:
    print("deploy_compose: skipped: PyYAML is not installed (requirements.txt)")
    sys.exit(77)

PROGRAM = """HloModule compose_check
ENTRY main {
  x = f32[7] parameter(0)
  ROOT y = f32[7] exponential(x)
}
"""


def fail(msg):
    print(f"deploy_compose: FAIL: {msg}")
    sys.exit(1)


def dockerfile_env(path):
    """The ENV settings of the final stage of a Dockerfile."""
    env = {}
    text = re.sub(r"\\\n", " ", open(path).read())
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("FROM "):
            env = {}
        elif line.startswith("ENV "):
            for part in shlex.split(line[4:]):
                k, _, v = part.partition("=")
                env[k] = v
    return env


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_listen(value):
    return "127.0.0.1:0" if value.startswith("0.0.0.0:") else value


class Cluster:
    def __init__(self, args):
        self.a = args
        self.dir = tempfile.mkdtemp(prefix="kiln-compose-")
        self.procs = []
        with open(os.path.join(args.deploy_dir, "compose.yaml")) as f:
            self.compose = yaml.safe_load(f)

    def path_in_deploy(self, rel):
        return os.path.normpath(os.path.join(self.a.deploy_dir, rel))

    def start_redis(self):
        svc = self.compose["services"]["redis"]
        cmd = list(svc["command"])
        if cmd[0] != "redis-server":
            fail(f"the redis service runs {cmd[0]}, not redis-server")
        self.redis_port = free_port()
        cmd += ["--port", str(self.redis_port), "--bind", "127.0.0.1"]
        log = open(os.path.join(self.dir, "redis.log"), "w")
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.redis_port), 0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        fail("redis-server did not start")

    def kilnd_env(self, name, svc):
        env = {}
        build = svc.get("build", {})
        dockerfile = os.path.join(self.path_in_deploy(build.get("context", ".")),
                                  build.get("dockerfile", "Dockerfile"))
        env.update(dockerfile_env(dockerfile))
        env.update({k: str(v) for k, v in svc.get("environment", {}).items()})
        for k in list(env):
            if k.endswith("LISTEN"):
                env[k] = local_listen(env[k])
        # The redis service's name as the URL's host.
        url = env.get("KILN_REDIS_URL", "")
        m = re.fullmatch(r"redis://([^:/]+):(\d+)", url)
        if not m or m.group(1) not in self.compose["services"]:
            fail(f"{name}: KILN_REDIS_URL {url!r} does not name a compose service")
        env["KILN_REDIS_URL"] = f"redis://127.0.0.1:{self.redis_port}"
        # Files compose mounts: configs by target, secrets under /run/secrets.
        mounts = {}
        for c in svc.get("configs", []):
            mounts[c["target"]] = self.path_in_deploy(self.compose["configs"][c["source"]]["file"])
        for s in svc.get("secrets", []):
            src = s if isinstance(s, str) else s["source"]
            target = f"/run/secrets/{src}" if isinstance(s, str) else s.get("target", src)
            secret = os.path.join(self.dir, src)
            if not os.path.exists(secret):
                with open(secret, "w") as f:
                    f.write(os.urandom(16).hex())
                os.chmod(secret, 0o600)
            mounts[target] = secret
        for k, v in list(env.items()):
            if v in mounts:
                env[k] = mounts[v]
            elif v.startswith("/etc/") or v.startswith("/run/"):
                fail(f"{name}: {k}={v} is a path no configs:/secrets: entry provides")
        if "KILN_CACHE_DIR" in env:
            env["KILN_CACHE_DIR"] = os.path.join(self.dir, name, "cache")
        if "KILN_CONFIG" not in env:
            fail(f"{name}: no KILN_CONFIG")
        return env

    def start_kilnd(self, name):
        svc = self.compose["services"][name]
        env = dict(os.environ)
        for k in list(env):
            if k.startswith("KILN_"):
                del env[k]
        env.update(self.kilnd_env(name, svc))
        cmd = [self.a.kilnd] + [str(x) for x in svc.get("command", [])]
        os.makedirs(os.path.join(self.dir, name), exist_ok=True)
        out = open(os.path.join(self.dir, name, "out"), "w")
        err = open(os.path.join(self.dir, name, "err"), "w")
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=err)
        self.procs.append(p)
        addrs = {}
        deadline = time.time() + 30
        while time.time() < deadline and len(addrs) < 3:
            text = open(os.path.join(self.dir, name, "out")).read()
            for what, addr in re.findall(r"kilnd: (metrics |health |)listening on (\S+)", text):
                addrs[what.strip() or "grpc"] = addr
            if p.poll() is not None:
                fail(f"{name} exited with {p.returncode}:\n"
                     + open(os.path.join(self.dir, name, "err")).read())
            time.sleep(0.05)
        if len(addrs) < 3:
            fail(f"{name} printed {addrs}; expected the gRPC, health and metrics addresses")
        return p, addrs

    def log(self, name):
        return open(os.path.join(self.dir, name, "err")).read()

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes = []
        for p in reversed(self.procs):
            try:
                codes.append(p.wait(60))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(None)
        return codes


def compile_on(kiln, addr, path):
    r = subprocess.run([kiln, "compile", path, "--server", addr], capture_output=True, text=True,
                       timeout=120)
    if r.returncode != 0:
        fail(f"kiln compile --server {addr}: exit {r.returncode}\n{r.stderr}")
    m = re.search(r"^cache (\S+)", r.stdout, re.M)
    return m.group(1) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deploy-dir", required=True)
    ap.add_argument("--kilnd", required=True)
    ap.add_argument("--kiln", required=True)
    a = ap.parse_args()
    if shutil.which("redis-server") is None:
        print("deploy_compose: skipped: no redis-server")
        return 77
    cl = Cluster(a)
    kilnds = [n for n, s in cl.compose["services"].items()
              if "KILN_REDIS_URL" in s.get("environment", {})]
    if len(kilnds) != 2:
        fail(f"compose.yaml has kilnd services {kilnds}; expected two")
    ok = False
    try:
        cl.start_redis()
        servers = {n: cl.start_kilnd(n)[1] for n in kilnds}
        for n, addrs in servers.items():
            with urllib.request.urlopen(f"http://{addrs['metrics']}/healthz", timeout=5) as r:
                if r.status != 200:
                    fail(f"{n}: /healthz answered {r.status}")
        # Both connect to Redis in the background: wait until they have.
        for n, addrs in servers.items():
            deadline = time.time() + 20
            while True:
                body = urllib.request.urlopen(f"http://{addrs['metrics']}/metrics", timeout=5).read()
                if b"\nkiln_cache_redis_up 1" in body:
                    break
                if time.time() > deadline:
                    fail(f"{n} never reached Redis")
                time.sleep(0.1)
        prog = os.path.join(cl.dir, "prog.hlo")
        with open(prog, "w") as f:
            f.write(PROGRAM)
        first, second = kilnds
        got = compile_on(a.kiln, servers[first]["grpc"], prog)
        if got != "compiled":
            fail(f"{first}: cache {got}, expected compiled")
        got = compile_on(a.kiln, servers[second]["grpc"], prog)
        if got != "shared":
            fail(f"{second}: cache {got}, expected shared (the two do not share the Redis tier)")
        # kilnd.conf's log format: every line a JSON object, calls logged.
        for n in kilnds:
            lines = [l for l in cl.log(n).splitlines() if l.strip()]
            try:
                recs = [json.loads(l) for l in lines]
            except json.JSONDecodeError as e:
                fail(f"{n}: a log line is not JSON ({e}):\n{cl.log(n)}")
            if not any(r.get("msg") == "request" and r.get("method") == "Compile" for r in recs):
                fail(f"{n}: no request line for its Compile:\n{cl.log(n)}")
        ok = True
    finally:
        codes = cl.stop()
        if ok and any(c != 0 for c in codes[:-1]):
            print(f"deploy_compose: FAIL: exit codes {codes}")
            ok = False
        if ok:
            shutil.rmtree(cl.dir, ignore_errors=True)
        else:
            print(f"deploy_compose: logs kept in {cl.dir}")
    print("deploy_compose: two kilnd from compose.yaml share the Redis tier")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
