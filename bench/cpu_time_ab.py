"""CPU time per run of two kiln binaries on the same HLO files, single-threaded.

For a machine too loaded for wall-clock comparisons: the CPU time (user + system) a
`kiln bench` process spends on N runs, less that of a 1-run process (compile served by the
kernel cache both times), over N, with KILN_CPU_THREADS=1. Binaries alternate; the minimum
over the rounds is kept. oneDNN's OpenMP threads (convolutions) are counted too.

    python3 bench/cpu_time_ab.py --a OLD_KILN --b NEW_KILN [--rounds 3] FILE.hlo[:ITERS]...
"""
import argparse
import os
import resource
import subprocess


def cpu_seconds(kiln, path, iters, warmup, env):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(["nice", "-n", "10", kiln, "bench", path, "--backend", "cpu", "--iters",
                    str(iters), "--warmup", str(warmup)], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", required=True, help="the first kiln binary (before)")
    ap.add_argument("--b", required=True, help="the second kiln binary (after)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("files", nargs="+", metavar="FILE.hlo[:ITERS]")
    args = ap.parse_args()
    env = dict(os.environ, KILN_CPU_THREADS="1")
    print("| workload | a CPU ms/run | b CPU ms/run | a/b |")
    print("|---|---|---|---|")
    for spec in args.files:
        path, _, n = spec.partition(":")
        n = int(n or 50)
        best = {"a": float("inf"), "b": float("inf")}
        for _ in range(args.rounds):
            for key, kiln in (("a", args.a), ("b", args.b)):
                t = cpu_seconds(kiln, path, n, 1, env) - cpu_seconds(kiln, path, 1, 0, env)
                best[key] = min(best[key], t / n * 1000)
        name = os.path.splitext(os.path.basename(path))[0]
        print(f"| {name} | {best['a']:.3f} | {best['b']:.3f} | {best['a'] / best['b']:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
