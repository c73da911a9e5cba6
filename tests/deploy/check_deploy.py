"""The deploy/ files checked without Docker or a cluster.

- Every Kubernetes manifest (deploy/k8s/*.yaml) validates, strictly (no
  unknown fields), against the schemas of the pinned Kubernetes version
  (kubernetes-validate, pinned in requirements.txt).
- The manifests say what deploy/README.md promises: kilnd's Deployment
  probes grpc.health.v1 natively on its health port, which is the port
  KILN_HEALTH_LISTEN names; a GPU variant asks for nvidia.com/gpu; a
  Service, the ConfigMap (whose kilnd.conf is deploy/kilnd.conf), a Secret
  with the cache secret, TLS and tokens; Redis with allkeys-lru, a
  maxmemory below its memory limit; a PodDisruptionBudget over kilnd.
- The Dockerfiles: the CPU one on Debian 12, the other on a CUDA base, a
  non-root USER and a HEALTHCHECK in each.
- compose.yaml parses: Redis with allkeys-lru and two kilnd sharing it.
- Every file of deploy/ opens with a comment.

Exits 77 (skipped) when kubernetes-validate or PyYAML is not installed.
"""
import argparse
import glob
import os
import re
import sys

try:
    import yaml
    import kubernetes_validate
except ImportError as e:
    print(f"deploy_manifests: skipped: {e.name} is not installed (requirements.txt)")
    sys.exit(77)

problems = []


def check(cond, what):
    if not cond:
        problems.append(what)
    return cond


def size_bytes(text):
    """'2560Mi', '2gb', '640m' -> bytes."""
    m = re.fullmatch(r"(\d+)([KMGT]i?|[kmgt]b?|)", str(text))
    if not m:
        raise ValueError(f"size {text!r}")
    n, unit = int(m.group(1)), m.group(2)
    powers = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}
    base = 1024 if unit.endswith("i") or unit.endswith("b") else 1000
    return n * base ** powers[unit[:1].lower()] if unit else n


def manifests(deploy):
    docs = []
    for path in sorted(glob.glob(os.path.join(deploy, "k8s", "*.yaml"))):
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc:
                    docs.append((os.path.basename(path), doc))
    return docs


def validate(docs, version):
    for name, doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            problems.append(f"{name}: {doc.get('kind')}/{doc['metadata'].get('name')}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            problems.append(f"{name}: no schema: {e}")


def env_of(container):
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def check_kilnd(name, dep, deploy):
    c = dep["spec"]["template"]["spec"]["containers"][0]
    env = env_of(c)
    health = env.get("KILN_HEALTH_LISTEN", "")
    check(health.endswith(":50052") or ":" in health, f"{name}: KILN_HEALTH_LISTEN unset")
    hport = int(health.rsplit(":", 1)[1]) if ":" in health else None
    for probe in ("readinessProbe", "livenessProbe"):
        p = c.get(probe, {})
        check("grpc" in p, f"{name}: {probe} is not a native gRPC probe")
        check(p.get("grpc", {}).get("port") == hport,
              f"{name}: {probe} asks port {p.get('grpc', {}).get('port')}, health listens on {hport}")
    check(env.get("KILN_REDIS_URL", "").startswith("redis://kiln-redis:"),
          f"{name}: KILN_REDIS_URL does not name the kiln-redis Service")
    check(env.get("KILN_CACHE_SECRET_FILE", "").startswith("/etc/kiln/secret/"),
          f"{name}: the cache secret does not come from the Secret")
    grace = dep["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
    conf = open(os.path.join(deploy, "kilnd.conf")).read()
    drain = sum(float(m) for m in re.findall(r"^drain-(?:grace|timeout) = (\d+)", conf, re.M))
    check(grace > drain, f"{name}: terminationGracePeriodSeconds {grace} <= the drain's {drain} s")
    sc = c.get("securityContext", {})
    check(sc.get("allowPrivilegeEscalation") is False, f"{name}: privilege escalation allowed")
    check(dep["spec"]["template"]["spec"].get("securityContext", {}).get("runAsNonRoot") is True,
          f"{name}: not runAsNonRoot")
    return c


def check_manifests(docs, deploy):
    by_kind = {}
    for name, doc in docs:
        by_kind.setdefault(doc["kind"], []).append((name, doc))
    deps = {d["metadata"]["name"]: (n, d) for n, d in by_kind.get("Deployment", [])}
    if check("kilnd" in deps, "no kilnd Deployment"):
        check_kilnd("kilnd", deps["kilnd"][1], deploy)
    gpu = [d for n, d in deps.values()
           if "nvidia.com/gpu" in d["spec"]["template"]["spec"]["containers"][0]
           .get("resources", {}).get("limits", {})]
    if check(gpu, "no Deployment asks for nvidia.com/gpu"):
        check_kilnd(gpu[0]["metadata"]["name"], gpu[0], deploy)
    # Selectors of the Deployments must not overlap.
    sels = [d["spec"]["selector"]["matchLabels"] for n, d in deps.values()
            if d["metadata"]["name"].startswith("kilnd")]
    for i, a in enumerate(sels):
        for b in sels[i + 1:]:
            check(not (a.items() <= b.items() or b.items() <= a.items()),
                  f"kilnd Deployments' selectors overlap: {a} {b}")
    svcs = {d["metadata"]["name"]: d for n, d in by_kind.get("Service", [])}
    check("kilnd" in svcs and any(p["port"] == 50051 for p in svcs["kilnd"]["spec"]["ports"]),
          "no kilnd Service on 50051")
    check("kiln-redis" in svcs, "no kiln-redis Service")
    cms = [d for n, d in by_kind.get("ConfigMap", [])]
    if check(cms and "kilnd.conf" in cms[0]["data"], "no ConfigMap with kilnd.conf"):
        with open(os.path.join(deploy, "kilnd.conf")) as f:
            check(cms[0]["data"]["kilnd.conf"] == f.read(),
                  "the ConfigMap's kilnd.conf differs from deploy/kilnd.conf")
    secrets = [d for n, d in by_kind.get("Secret", [])]
    if check(secrets, "no Secret"):
        keys = set(secrets[0].get("stringData", {})) | set(secrets[0].get("data", {}))
        for k in ("cache-secret", "tls.crt", "tls.key", "tokens"):
            check(k in keys, f"the Secret has no {k}")
    if check("kiln-redis" in deps, "no kiln-redis Deployment"):
        c = deps["kiln-redis"][1]["spec"]["template"]["spec"]["containers"][0]
        args = c.get("args", []) + c.get("command", [])
        check("allkeys-lru" in args, "Redis does not run allkeys-lru")
        if check("--maxmemory" in args, "Redis has no maxmemory"):
            maxmem = size_bytes(args[args.index("--maxmemory") + 1])
            limit = c.get("resources", {}).get("limits", {}).get("memory")
            if check(limit, "Redis has no memory limit"):
                check(maxmem < size_bytes(limit), "Redis maxmemory is not below its memory limit")
    pdbs = [d for n, d in by_kind.get("PodDisruptionBudget", [])]
    check(pdbs and pdbs[0]["spec"]["selector"]["matchLabels"].get("app.kubernetes.io/name") == "kilnd",
          "no PodDisruptionBudget over kilnd")


def check_dockerfiles(deploy):
    for name, base in (("Dockerfile", r"debian:12"), ("Dockerfile.cuda", r"nvidia/cuda:")):
        path = os.path.join(deploy, name)
        if not check(os.path.exists(path), f"no deploy/{name}"):
            continue
        text = open(path).read()
        lines = [l.strip() for l in text.splitlines()]
        froms = [l.split()[1] for l in lines if l.startswith("FROM ")]
        check(froms and all(re.match(base, f) or "${" in f for f in froms), f"{name}: FROM {froms}")
        users = [l.split()[1] for l in lines if l.startswith("USER ")]
        check(users and users[-1].split(":")[0] not in ("root", "0"), f"{name}: runs as root")
        check(any(l.startswith("HEALTHCHECK ") for l in lines), f"{name}: no HEALTHCHECK")


def check_compose(deploy):
    with open(os.path.join(deploy, "compose.yaml")) as f:
        compose = yaml.safe_load(f)
    services = compose["services"]
    redis = [s for s in services.values() if "redis" in str(s.get("image", ""))]
    check(redis and "allkeys-lru" in redis[0].get("command", []), "compose: no LRU Redis")
    kilnds = [n for n, s in services.items() if "KILN_REDIS_URL" in s.get("environment", {})]
    check(len(kilnds) == 2, f"compose: kilnd services sharing Redis: {kilnds}")


def check_comments(deploy):
    for path in sorted(glob.glob(os.path.join(deploy, "**", "*"), recursive=True)):
        if os.path.isdir(path) or path.endswith(".md") or os.path.basename(path) == "cache-secret":
            continue
        with open(path) as f:
            first = f.readline()
        check(first.startswith("#"), f"{os.path.relpath(path, deploy)} does not open with a comment")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deploy-dir", required=True)
    ap.add_argument("--kubernetes-version", required=True)
    a = ap.parse_args()
    docs = manifests(a.deploy_dir)
    validate(docs, a.kubernetes_version)
    check_manifests(docs, a.deploy_dir)
    check_dockerfiles(a.deploy_dir)
    check_compose(a.deploy_dir)
    check_comments(a.deploy_dir)
    for p in problems:
        print(f"deploy_manifests: {p}")
    if problems:
        return 1
    print(f"deploy_manifests: {len(docs)} manifests valid for Kubernetes {a.kubernetes_version}; "
          "Dockerfiles, compose.yaml and comments checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
