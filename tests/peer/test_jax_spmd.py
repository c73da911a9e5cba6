"""JAX as the peer for SPMD partitioning: sharded programs over 8 CPU devices.

Each test jits a JAX function with NamedSharding in/out shardings over a mesh
of the 8 host devices JAX gets from
XLA_FLAGS=--xla_force_host_platform_device_count=8, exports it with
jax.jit(f).lower(*args).as_text(dialect="hlo") (an ENTRY whose parameters and
result carry shardings over global shapes), and runs it with
`kiln run FILE --partitions P --arg ... --out DIR` on global arrays, on the
interp and the cpu backends: every output leaf must equal JAX's (float32
within rtol 1e-4 / atol 1e-5). `kiln compile FILE --partitions P` must report
the collectives expected of the sharding: exactly one all-reduce in a
Megatron (column- then row-parallel) MLP forward pass, none in a
data-parallel forward pass, and never more bytes per device than XLA's own
partitioner moves on the same program (counted in compile().as_text()).

The kiln binary is $KILN_BIN, else build/kiln. Exits 77 (skipped) when jax
cannot be imported.
"""

import os
import re
import subprocess
import sys
import tempfile
import unittest

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
try:
    import numpy as np
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"jax_spmd: skipped, cannot import jax/numpy ({e})")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN = os.environ.get("KILN_BIN") or os.path.join(ROOT, "build", "kiln")


def mesh(shape, names):
    types = (jax.sharding.AxisType.Auto,) * len(names)
    return jax.make_mesh(shape, names, axis_types=types)


def xla_collective_bytes(text):
    """Bytes per device XLA's partitioned module moves (as kiln counts:
    all-reduce operand, all-gather result, all-to-all / collective-permute
    operand)."""
    sizes = {"f32": 4, "f64": 8, "s32": 4, "bf16": 2, "f16": 2, "pred": 1, "s64": 8, "u32": 4}
    total = 0
    op = re.compile(r"= (.*?) (all-reduce|all-gather|all-to-all|collective-permute|"
                    r"reduce-scatter)(-start)?\(")
    for line in text.splitlines():
        m = op.search(line)
        if not m:
            continue
        shapes = re.findall(r"([a-z0-9]+)\[([0-9,]*)\]", m.group(1))
        if m.group(3) and m.group(2) != "all-reduce" and len(shapes) > 1:
            shapes = shapes[len(shapes) // 2:]  # (operands, results) of a -start
        scale = 1
        if m.group(2) == "reduce-scatter":  # kiln counts what is sent: the operand
            gi = re.search(r"replica_groups=\[\d+,(\d+)\]<=", line)
            gl = re.search(r"replica_groups=\{\{([0-9,]*)\}", line)
            scale = int(gi.group(1)) if gi else len(gl.group(1).split(",")) if gl else 1
        for ty, dims in shapes:
            n = 1
            for d in filter(None, dims.split(",")):
                n *= int(d)
            total += n * sizes.get(ty, 4) * scale
    return total


def kiln_collectives(path, parts, flags=()):
    out = subprocess.run([KILN, "compile", path, "--partitions", str(parts)] + list(flags),
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise AssertionError(f"kiln compile failed: {out.stderr}")
    kinds = {}
    for line in out.stdout.splitlines():
        m = re.match(r"\s+([a-z-]+): (\d+), (\d+) bytes", line)
        if m:
            kinds[m.group(1)] = (int(m.group(2)), int(m.group(3)))
    return kinds


class JaxSpmdTest(unittest.TestCase):
    def run_peer(self, name, fn, in_sh, out_sh, args, parts, backends=("interp", "cpu"),
                 windowed=None):
        """windowed: "on" or "off" forces windowed einsum (KILN_SPMD_WINDOWED for
        run, --windowed-einsum for compile)."""
        env = dict(os.environ)
        if windowed:
            env["KILN_SPMD_WINDOWED"] = windowed
        jitted = jax.jit(fn, in_shardings=in_sh, out_shardings=out_sh)
        lowered = jitted.lower(*args)
        hlo = lowered.as_text(dialect="hlo")
        want = [np.asarray(v) for v in jax.tree_util.tree_leaves(jitted(*args))]
        xla_bytes = xla_collective_bytes(lowered.compile().as_text())
        with tempfile.TemporaryDirectory(prefix=f"kiln_spmd_{name}_") as tmp:
            path = os.path.join(tmp, f"{name}.hlo")
            with open(path, "w") as f:
                f.write(hlo)
            cmd_args = []
            for i, a in enumerate(args):
                p = os.path.join(tmp, f"a{i}.npy")
                np.save(p, np.asarray(a))
                cmd_args += ["--arg", p]
            for backend in backends:
                out_dir = os.path.join(tmp, f"out_{backend}")
                r = subprocess.run([KILN, "run", path, "--partitions", str(parts), "--backend",
                                    backend, "--out", out_dir] + cmd_args,
                                   capture_output=True, text=True, timeout=600, env=env)
                self.assertEqual(r.returncode, 0, f"{name} on {backend}: {r.stderr}")
                for i, w in enumerate(want):
                    got = np.load(os.path.join(out_dir, f"{i}.npy"))
                    self.assertEqual(got.shape, w.shape, f"{name} {backend} output {i}")
                    np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-5,
                                               err_msg=f"{name} on {backend}, output {i}")
            kinds = kiln_collectives(path, parts,
                                     ["--windowed-einsum", windowed] if windowed else [])
        kiln_bytes = sum(b for _, b in kinds.values())
        if os.environ.get("KILN_SPMD_VERBOSE"):
            print(f"{name}: kiln {kinds} = {kiln_bytes} bytes, XLA {xla_bytes} bytes")
        self.assertLessEqual(kiln_bytes, xla_bytes,
                             f"{name}: kiln moves {kiln_bytes} bytes per device, XLA {xla_bytes}")
        return kinds

    def test_data_parallel_mlp_step(self):
        m = mesh((8,), ("b",))
        rng = np.random.default_rng(0)
        w1 = rng.standard_normal((16, 32)).astype(np.float32) * 0.3
        w2 = rng.standard_normal((32, 4)).astype(np.float32) * 0.3
        x = rng.standard_normal((64, 16)).astype(np.float32)
        y = rng.standard_normal((64, 4)).astype(np.float32)

        def loss(w1, w2, x, y):
            h = jnp.tanh(x @ w1)
            return jnp.mean((h @ w2 - y) ** 2)

        def step(w1, w2, x, y):
            l, (g1, g2) = jax.value_and_grad(loss, argnums=(0, 1))(w1, w2, x, y)
            return l, w1 - 0.1 * g1, w2 - 0.1 * g2

        rep, bat = NamedSharding(m, P()), NamedSharding(m, P("b", None))
        kinds = self.run_peer("dp_step", step, (rep, rep, bat, bat), (rep, rep, rep),
                              (w1, w2, x, y), 8)
        self.assertGreaterEqual(kinds.get("all-reduce", (0, 0))[0], 1)
        self.assertNotIn("all-gather", kinds)

    def test_data_parallel_forward_no_communication(self):
        m = mesh((8,), ("b",))
        rng = np.random.default_rng(1)
        w = rng.standard_normal((16, 8)).astype(np.float32)
        x = rng.standard_normal((32, 16)).astype(np.float32)
        rep, bat = NamedSharding(m, P()), NamedSharding(m, P("b", None))
        kinds = self.run_peer("dp_fwd", lambda w, x: jax.nn.relu(x @ w), (rep, bat), bat, (w, x),
                              8)
        self.assertEqual(kinds, {})

    def test_megatron_mlp_one_all_reduce(self):
        m = mesh((4,), ("t",))
        rng = np.random.default_rng(2)
        x = rng.standard_normal((8, 16)).astype(np.float32)
        w1 = rng.standard_normal((16, 64)).astype(np.float32) * 0.3
        b1 = rng.standard_normal((64,)).astype(np.float32)
        w2 = rng.standard_normal((64, 16)).astype(np.float32) * 0.3

        def mlp(x, w1, b1, w2):
            return jax.nn.gelu(x @ w1 + b1) @ w2

        rep = NamedSharding(m, P())
        col, colb = NamedSharding(m, P(None, "t")), NamedSharding(m, P("t"))
        row = NamedSharding(m, P("t", None))
        kinds = self.run_peer("megatron", mlp, (rep, col, colb, row), rep, (x, w1, b1, w2), 4)
        self.assertEqual(kinds, {"all-reduce": (1, 8 * 16 * 4)})

    def test_windowed_einsum(self):
        """A column-parallel matmul of sequence-split activations (XLA gathers
        them) and a row-split result of a column-split weight (the weight
        gathered), as windowed einsums: 7 permutes of one block each around
        the ring of 8, no all-gather; then on a 2x4 mesh, batch over one axis
        and the ring along the other."""
        m = mesh((8,), ("x",))
        rng = np.random.default_rng(11)
        x = rng.standard_normal((64, 32)).astype(np.float32)
        w = rng.standard_normal((32, 48)).astype(np.float32) * 0.3
        row, col = NamedSharding(m, P("x", None)), NamedSharding(m, P(None, "x"))
        wide = rng.standard_normal((32, 256)).astype(np.float32) * 0.3
        kinds = self.run_peer("window_lhs", lambda x, w: jnp.tanh(x @ w), (row, col), col,
                              (x, wide), 8, windowed="on")
        self.assertEqual(kinds, {"collective-permute": (7, 7 * 8 * 32 * 4)})
        kinds = self.run_peer("window_rhs", lambda x, w: x @ w, (row, col), row, (x, w), 8,
                              windowed="on")
        self.assertEqual(kinds, {"collective-permute": (7, 7 * 32 * 6 * 4)})
        kinds = self.run_peer("window_off", lambda x, w: x @ w, (row, col), row, (x, w), 8,
                              windowed="off")
        self.assertEqual(kinds, {"all-gather": (1, 32 * 48 * 4)})
        m2 = mesh((2, 4), ("b", "s"))
        xb = rng.standard_normal((4, 16, 8)).astype(np.float32)
        wb = rng.standard_normal((4, 8, 64)).astype(np.float32)
        kinds = self.run_peer("window_batched", lambda x, w: jnp.einsum("bmk,bkn->bmn", x, w),
                              (NamedSharding(m2, P("b", "s", None)),
                               NamedSharding(m2, P("b", None, "s"))),
                              NamedSharding(m2, P("b", None, "s")), (xb, wb), 8, windowed="on")
        self.assertEqual(kinds, {"collective-permute": (3, 3 * 2 * 4 * 8 * 4)})

    def test_row_parallel_sequence_split(self):
        """Row-parallel matmul whose result stays split by rows on the same
        devices (sequence parallelism): one reduce-scatter."""
        m = mesh((4,), ("t",))
        rng = np.random.default_rng(7)
        h = rng.standard_normal((8, 64)).astype(np.float32)
        w = rng.standard_normal((64, 16)).astype(np.float32)
        kinds = self.run_peer("rowpar", lambda h, w: h @ w,
                              (NamedSharding(m, P(None, "t")), NamedSharding(m, P("t", None))),
                              NamedSharding(m, P("t", None)), (h, w), 4)
        self.assertEqual(kinds, {"reduce-scatter": (1, 8 * 16 * 4)})

    def test_embedding_lookup_split_ids(self):
        """jnp.take of batch-split ids from a replicated table: no communication."""
        m = mesh((4,), ("b",))
        rng = np.random.default_rng(8)
        table = rng.standard_normal((50, 16)).astype(np.float32)
        ids = rng.integers(0, 50, size=(32,)).astype(np.int32)
        rep, bat = NamedSharding(m, P()), NamedSharding(m, P("b"))
        kinds = self.run_peer("embed", lambda t, i: jnp.tanh(jnp.take(t, i, axis=0)),
                              (rep, bat), NamedSharding(m, P("b", None)), (table, ids), 4)
        self.assertEqual(kinds, {})

    def test_shard_map_psum(self):
        """A shard_map over every axis (Shardy's GlobalToLocalShape /
        LocalToGlobalShape around a per-device body with its own psum): the
        body runs per device as written, its all-reduce the only
        collective."""
        m = mesh((4,), ("x",))
        rng = np.random.default_rng(11)
        a = rng.standard_normal((8, 16)).astype(np.float32)
        b = rng.standard_normal((16, 4)).astype(np.float32)

        def f(a, b):
            def body(a, b):
                return jax.lax.psum(jnp.tanh(a) @ b, "x")
            return jax.shard_map(body, mesh=m, in_specs=(P(None, "x"), P("x", None)),
                                 out_specs=P())(a, b)

        kinds = self.run_peer("shard_map", f,
                              (NamedSharding(m, P(None, "x")), NamedSharding(m, P("x", None))),
                              NamedSharding(m, P()), (a, b), 4)
        self.assertEqual(kinds, {"all-reduce": (1, 8 * 4 * 4)})

    def test_shard_map_split_out(self):
        """shard_map whose result stays split (out_specs P("x")), fed by a
        replicated input the region's entry slices locally."""
        m = mesh((4,), ("x",))
        rng = np.random.default_rng(12)
        a = rng.standard_normal((16, 8)).astype(np.float32)

        def f(a):
            def body(a):
                return a * 2.0 + jax.lax.axis_index("x").astype(jnp.float32)
            return jax.shard_map(body, mesh=m, in_specs=P("x", None), out_specs=P("x", None))(a)

        self.run_peer("shard_map_out", f, (NamedSharding(m, P()),),
                      NamedSharding(m, P("x", None)), (a,), 4)

    def test_shard_map_partially_manual(self):
        """jax.shard_map manual over x only of a (2, 4) mesh (axis_names=
        {"x"}; y stays automatic): Shardy's region with manual_axes {"x"},
        whose body sees its shard along x and the whole along y and psums
        over x alone."""
        m = mesh((2, 4), ("x", "y"))
        rng = np.random.default_rng(14)
        a = rng.standard_normal((8, 16)).astype(np.float32)
        w = rng.standard_normal((16, 8)).astype(np.float32) * 0.3

        def f(a, w):
            def body(a, w):
                return jax.lax.psum(jnp.tanh(a) @ w, "x")
            return jax.shard_map(body, mesh=m, in_specs=(P("x", None), P()), out_specs=P(),
                                 axis_names={"x"})(a, w)

        rep = NamedSharding(m, P())
        kinds = self.run_peer("shard_map_partial", f, (NamedSharding(m, P("x", None)), rep),
                              rep, (a, w), 8)
        self.assertEqual(kinds, {"all-reduce": (1, 4 * 8 * 4)})

    def test_shard_map_partially_manual_split_body(self):
        """The same region over an input split along both axes, its result
        split along the automatic one: the body is split along y as the
        input is (as XLA's Shardy partitioner does), so nothing moves on the
        way in or out and the psum over x moves only the shard."""
        m = mesh((2, 4), ("x", "y"))
        rng = np.random.default_rng(21)
        a = rng.standard_normal((8, 16)).astype(np.float32)

        def f(a):
            def body(a):
                return jax.lax.psum(jnp.tanh(a) * 2.0 + 1.0, "x")
            return jax.shard_map(body, mesh=m, in_specs=P("x", None), out_specs=P(),
                                 axis_names={"x"})(a)

        kinds = self.run_peer("shard_map_split_body", f, (NamedSharding(m, P("x", "y")),),
                              NamedSharding(m, P(None, "y")), (a,), 8)
        self.assertEqual(kinds, {"all-reduce": (1, 4 * 4 * 4)})

        # a body whose matmul contracts along the split automatic dim (a
        # partial product, all-reduced along y inside the body), with an
        # all_gather over x, a row sum and a max along y
        w = rng.standard_normal((16, 8)).astype(np.float32)

        def g(a, w):
            def body(a, w):
                h = jnp.tanh(a) @ w
                t = jax.lax.all_gather(h, "x", axis=0, tiled=True)
                r = jnp.sum(a, axis=1, keepdims=True)[:1] - jnp.max(a)
                return jax.lax.psum(t + r, "x")
            return jax.shard_map(body, mesh=m, in_specs=(P("x", None), P()), out_specs=P(),
                                 axis_names={"x"})(a, w)

        self.run_peer("shard_map_split_body_dot", g,
                      (NamedSharding(m, P("x", "y")), NamedSharding(m, P("y", None))),
                      NamedSharding(m, P()), (a, w), 8)

    def test_shard_map_two_outputs(self):
        """shard_map bodies of two results (a LocalToGlobalShape of two
        operands), manual over every axis and over x only (the latter's
        body split along y as its input is)."""
        m = mesh((2, 4), ("x", "y"))
        rng = np.random.default_rng(22)
        a = rng.standard_normal((8, 16)).astype(np.float32)

        def partial(a):
            def body(a):
                return jax.lax.psum(jnp.tanh(a), "x"), a * 2.0
            return jax.shard_map(body, mesh=m, in_specs=P("x", None),
                                 out_specs=(P(), P("x", None)), axis_names={"x"})(a)

        def full(a):
            def body(a):
                return jax.lax.psum(jnp.tanh(a), ("x", "y")), a * 2.0
            return jax.shard_map(body, mesh=m, in_specs=P("x", "y"),
                                 out_specs=(P(), P("x", "y")))(a)

        split = NamedSharding(m, P("x", "y"))
        kinds = self.run_peer("shard_map_two_partial", partial, (split,),
                              (NamedSharding(m, P(None, "y")), split), (a,), 8)
        self.assertEqual(kinds, {"all-reduce": (1, 4 * 4 * 4)})
        kinds = self.run_peer("shard_map_two_full", full, (split,),
                              (NamedSharding(m, P()), split), (a,), 8)
        self.assertEqual(kinds, {"all-reduce": (1, 4 * 4 * 4)})

    def test_shard_map_gspmd_form(self):
        """The same regions as XLA's GSPMD form writes them (JAX with
        jax_use_shardy_partitioner off): SPMDFullToShardShape with {manual}
        for a region over every axis, with last_tile_dims={manual,
        replicated} for one over some."""
        m = mesh((2, 4), ("x", "y"))
        rng = np.random.default_rng(15)
        a = rng.standard_normal((8, 16)).astype(np.float32)

        def partial(a):
            def body(a):
                return jax.lax.psum(jnp.tanh(a), "x")
            return jax.shard_map(body, mesh=m, in_specs=P("x", None), out_specs=P(),
                                 axis_names={"x"})(a)

        def full(a):
            def body(a):
                return jax.lax.psum(jnp.tanh(a), ("x", "y")) * 2.0
            return jax.shard_map(body, mesh=m, in_specs=P("x", "y"), out_specs=P())(a)

        old = jax.config.jax_use_shardy_partitioner
        jax.config.update("jax_use_shardy_partitioner", False)
        try:
            split = NamedSharding(m, P("x", "y"))
            for name, fn in (("gspmd_partial", partial), ("gspmd_full", full)):
                hlo = jax.jit(fn, in_shardings=split).lower(a).as_text(dialect="hlo")
                self.assertIn("SPMDFullToShardShape", hlo)
                self.assertIn("manual", hlo)
                self.run_peer(name, fn, (split,), NamedSharding(m, P()), (a,), 8)
        finally:
            jax.config.update("jax_use_shardy_partitioner", old)

    def test_halo_pooling_and_conv(self):
        """A 1-D convolution and a "same" max-pool on activations split
        along their spatial dim: halos by collective-permute, no
        all-gather."""
        m = mesh((4,), ("s",))
        rng = np.random.default_rng(13)
        x = rng.standard_normal((2, 32, 3)).astype(np.float32)
        k = rng.standard_normal((3, 3, 5)).astype(np.float32) * 0.5

        def f(x, k):
            y = jax.lax.conv_general_dilated(x, k, (1,), [(1, 1)],
                                             dimension_numbers=("NWC", "WIO", "NWC"))
            return jax.lax.reduce_window(jnp.tanh(y), -jnp.inf, jax.lax.max, (1, 3, 1),
                                         (1, 1, 1), [(0, 0), (1, 1), (0, 0)])

        sp = NamedSharding(m, P(None, "s", None))
        kinds = self.run_peer("halo", f, (sp, NamedSharding(m, P())), sp, (x, k), 4)
        self.assertNotIn("all-gather", kinds)
        self.assertIn("collective-permute", kinds)

    def test_fsdp_matmul(self):
        m = mesh((8,), ("d",))
        rng = np.random.default_rng(3)
        x = rng.standard_normal((16, 32)).astype(np.float32)
        w = rng.standard_normal((32, 24)).astype(np.float32)
        bat = NamedSharding(m, P("d", None))
        kinds = self.run_peer("fsdp", lambda x, w: x @ w, (bat, bat), bat, (x, w), 8)
        self.assertEqual(kinds.get("all-gather", (0, 0))[0], 1)
        self.assertNotIn("all-reduce", kinds)

    def test_2d_sharded_matmul(self):
        m = mesh((2, 4), ("x", "y"))
        rng = np.random.default_rng(4)
        a = rng.standard_normal((8, 16)).astype(np.float32)
        b = rng.standard_normal((16, 12)).astype(np.float32)
        sa = NamedSharding(m, P("x", "y"))
        sb = NamedSharding(m, P("y", None))
        so = NamedSharding(m, P("x", None))
        kinds = self.run_peer("mm2d", lambda a, b: a @ b, (sa, sb), so, (a, b), 8)
        self.assertEqual(kinds.get("all-reduce", (0, 0))[0], 1)

    def test_2d_sharded_output(self):
        m = mesh((2, 4), ("x", "y"))
        rng = np.random.default_rng(5)
        a = rng.standard_normal((8, 16)).astype(np.float32)
        b = rng.standard_normal((16, 12)).astype(np.float32)
        sa = NamedSharding(m, P("x", None))
        sb = NamedSharding(m, P(None, "y"))
        so = NamedSharding(m, P("x", "y"))
        kinds = self.run_peer("mm2d_out", lambda a, b: jnp.sum(a @ b, axis=0) + (a @ b),
                              (sa, sb), so, (a, b), 8)
        self.assertGreaterEqual(kinds.get("all-reduce", (0, 0))[0], 1)

    def test_loop_with_split_state(self):
        """A fori_loop whose state stays batch-split: no gathers, one
        all-reduce (the running sum) per trip."""
        m = mesh((4,), ("b",))
        rng = np.random.default_rng(6)
        x = rng.standard_normal((16, 8)).astype(np.float32)
        w = rng.standard_normal((8, 8)).astype(np.float32) * 0.5

        def f(x, w):
            def body(i, c):
                x, s = c
                x = jnp.tanh(x @ w)
                return x, s + jnp.sum(x)
            return jax.lax.fori_loop(0, 3, body, (x, jnp.float32(0)))

        rep, bat = NamedSharding(m, P()), NamedSharding(m, P("b", None))
        kinds = self.run_peer("loop", f, (bat, rep), (bat, rep), (x, w), 4)
        self.assertEqual(kinds, {"all-reduce": (1, 4)})


    def test_cond_on_split_operands(self):
        """lax.cond over batch-split activations and a replicated weight:
        each branch runs on the shards (the predicate whole), no
        communication."""
        m = mesh((4,), ("b",))
        rng = np.random.default_rng(16)
        x = rng.standard_normal((16, 8)).astype(np.float32)
        w = rng.standard_normal((8, 8)).astype(np.float32) * 0.5
        rep, bat = NamedSharding(m, P()), NamedSharding(m, P("b", None))
        for p in (1.0, -1.0):
            def f(p, x, w):
                return jax.lax.cond(p > 0, lambda x: jnp.tanh(x @ w), lambda x: x @ w * 2.0, x)
            kinds = self.run_peer("cond", f, (rep, bat, rep), bat, (np.float32(p), x, w), 4)
            self.assertEqual(kinds, {})

    def test_switch_with_reduction(self):
        """lax.switch whose branches reduce over the split batch (a partial
        sum and an all-reduce inside the branch) and return a tuple."""
        m = mesh((4,), ("b",))
        rng = np.random.default_rng(17)
        x = rng.standard_normal((16, 8)).astype(np.float32)
        rep, bat = NamedSharding(m, P()), NamedSharding(m, P("b", None))
        for i in (0, 1, 2):
            def f(i, x):
                return jax.lax.switch(i, [lambda x: (x + 1.0, jnp.sum(x, axis=0)),
                                          lambda x: (jnp.sin(x), jnp.max(x, axis=0)),
                                          lambda x: (x * x, jnp.zeros((8,), jnp.float32))], x)
            self.run_peer("switch", f, (rep, bat), (bat, rep), (np.int32(i), x), 4)

    def test_while_array_state(self):
        """lax.while_loop over one split array (the while's state is the
        array itself, not a tuple): the state stays split, the condition's
        sum is one all-reduce per trip."""
        m = mesh((4,), ("b",))
        rng = np.random.default_rng(18)
        x = (rng.standard_normal((16, 8)).astype(np.float32) + 4.0) * 2.0

        def f(x):
            return jax.lax.while_loop(lambda c: jnp.sum(c) > 64.0, lambda c: c * 0.5 + 0.25, x)

        bat = NamedSharding(m, P("b", None))
        kinds = self.run_peer("while_array", f, (bat,), bat, (x,), 4)
        self.assertEqual(kinds, {"all-reduce": (1, 4)})


    def test_embedding_split_vocabulary(self):
        """jnp.take from a table split along its vocabulary, with ids out of
        range too (clamped, as jnp.take's fill mode masks them): each device
        gathers the ids in its shard, zeros the others, one all-reduce sums
        the rows (XLA's masked local gather) instead of gathering the
        table."""
        m = mesh((4,), ("v",))
        rng = np.random.default_rng(19)
        table = rng.standard_normal((64, 16)).astype(np.float32)
        ids = rng.integers(-8, 72, size=(24,)).astype(np.int32)
        rep, voc = NamedSharding(m, P()), NamedSharding(m, P("v", None))
        for mode in ("fill", "clip"):
            kinds = self.run_peer(f"embed_vocab_{mode}",
                                  lambda t, i: jnp.tanh(jnp.take(t, i, axis=0, mode=mode)),
                                  (voc, rep), rep, (table, ids), 4)
            self.assertEqual(kinds, {"all-reduce": (1, 24 * 16 * 4)})

    def test_embedding_gradient_split_vocabulary(self):
        """The gradient of a loss through that lookup (the lookup, then a
        scatter-add into zeros split along the vocabulary, repeated ids
        included): each device scatters the updates whose ids fall in its
        shard; the lookup's all-reduce is the only communication."""
        m = mesh((4,), ("v",))
        rng = np.random.default_rng(20)
        table = rng.standard_normal((64, 16)).astype(np.float32)
        ids = rng.integers(0, 64, size=(40,)).astype(np.int32)
        g = rng.standard_normal((40, 16)).astype(np.float32)

        def grad(t, i, g):
            return jax.grad(lambda t: jnp.sum(jnp.tanh(jnp.take(t, i, axis=0)) * g))(t)

        rep, voc = NamedSharding(m, P()), NamedSharding(m, P("v", None))
        kinds = self.run_peer("embed_grad", grad, (voc, rep, rep), voc, (table, ids, g), 4)
        self.assertEqual(kinds, {"all-reduce": (1, 40 * 16 * 4)})

    def test_embedding_split_features(self):
        """jnp.take from a table split along its features (axis 1), ids out
        of range too (fill and clip): each device gathers its columns of
        the rows, the split passes through to the result: no
        communication."""
        m = mesh((8,), ("f",))
        rng = np.random.default_rng(21)
        table = rng.standard_normal((50, 32)).astype(np.float32)
        ids = rng.integers(-4, 54, size=(24,)).astype(np.int32)
        rep, feat = NamedSharding(m, P()), NamedSharding(m, P(None, "f"))
        for mode in ("fill", "clip"):
            kinds = self.run_peer(f"embed_feat_{mode}",
                                  lambda t, i: jnp.tanh(jnp.take(t, i, axis=0, mode=mode)),
                                  (feat, rep), feat, (table, ids), 8)
            self.assertEqual(kinds, {})
        # asked for whole: at most what XLA moves (run_peer checks the bytes)
        self.run_peer("embed_feat_whole", lambda t, i: jnp.take(t, i, axis=0, mode="clip"),
                      (feat, rep), rep, (table, ids), 8, backends=("interp",))

    def test_embedding_batch_ids_split_features(self):
        """Batch-split ids (one mesh axis) from a table split along its
        features (the other), on a 2x4 mesh, and the gradient's scatter-add
        into the feature-split table: no communication."""
        m = mesh((2, 4), ("b", "f"))
        rng = np.random.default_rng(22)
        table = rng.standard_normal((40, 16)).astype(np.float32)
        ids = rng.integers(0, 40, size=(32,)).astype(np.int32)
        g = rng.standard_normal((32, 16)).astype(np.float32)
        feat, bat = NamedSharding(m, P(None, "f")), NamedSharding(m, P("b"))
        kinds = self.run_peer("embed_2d", lambda t, i: jnp.tanh(jnp.take(t, i, axis=0)),
                              (feat, bat), NamedSharding(m, P("b", "f")), (table, ids), 8)
        self.assertEqual(kinds, {})

        def grad(t, i, g):
            return jax.grad(lambda t: jnp.sum(jnp.tanh(jnp.take(t, i, axis=0)) * g))(t)

        m1 = mesh((8,), ("f",))
        feat1, rep1 = NamedSharding(m1, P(None, "f")), NamedSharding(m1, P())
        kinds = self.run_peer("embed_feat_grad", grad, (feat1, rep1, feat1), feat1,
                              (table, ids, g), 8)
        self.assertEqual(kinds, {})

    def test_embedding_split_vocabulary_and_features(self):
        """jnp.take from a table split along its vocabulary on one mesh axis
        and its features on the other (2x4), ids out of range too: the
        masked local gather keeps the feature split and all-reduces over
        the vocabulary only."""
        m = mesh((2, 4), ("v", "f"))
        rng = np.random.default_rng(23)
        table = rng.standard_normal((64, 32)).astype(np.float32)
        ids = rng.integers(-8, 72, size=(24,)).astype(np.int32)
        rep, both = NamedSharding(m, P()), NamedSharding(m, P("v", "f"))
        feat = NamedSharding(m, P(None, "f"))
        for mode in ("fill", "clip"):
            kinds = self.run_peer(f"embed_vf_{mode}",
                                  lambda t, i: jnp.tanh(jnp.take(t, i, axis=0, mode=mode)),
                                  (both, rep), feat, (table, ids), 8)
            self.assertEqual(kinds, {"all-reduce": (1, 24 * 8 * 4)})

    def test_embedding_gradient_batch_split_ids(self):
        """The gradient of a lookup of batch-split ids into a replicated
        table (data parallelism): into a small table, partial scatter-adds
        and one all-reduce of the table, as XLA; into a larger one, the
        updates and ids gathered, fewer bytes than XLA's all-reduce."""
        m = mesh((4,), ("b",))
        rng = np.random.default_rng(24)
        ids = rng.integers(0, 64, size=(32,)).astype(np.int32)
        g = rng.standard_normal((32, 16)).astype(np.float32)

        def grad(t, i, g):
            return jax.grad(lambda t: jnp.sum(jnp.tanh(jnp.take(t, i, axis=0)) * g))(t)

        rep, bat = NamedSharding(m, P()), NamedSharding(m, P("b"))
        for vocab in (64, 8):
            table = rng.standard_normal((vocab, 16)).astype(np.float32)
            i = ids % vocab
            kinds = self.run_peer(f"embed_grad_dp_{vocab}", grad,
                                  (rep, bat, NamedSharding(m, P("b", None))), rep,
                                  (table, i, g), 4)
            if vocab == 8:
                self.assertEqual(kinds, {"all-reduce": (1, 8 * 16 * 4)})
            else:
                self.assertNotIn("all-reduce", kinds)


if __name__ == "__main__":
    unittest.main()
