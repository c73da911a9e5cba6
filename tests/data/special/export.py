"""Writes special_f32.hlo: jax.scipy.special's gammaln, digamma, erfinv, erf,
i0e and logit of one f32[8192] argument, as JAX 0.10 lowers them (the
elementwise expansions with floor, reflection through sin/cos, is-finite
and selects), for test_cpu_special.c. Run from the repository root:
    .venv/bin/python tests/data/special/export.py
"""
import os

import jax
import jax.numpy as jnp
from jax.scipy import special

N = 8192


def f(x):
    return (special.gammaln(x), special.digamma(x), special.erfinv(x), special.erf(x),
            special.i0e(x), special.logit(x))


text = jax.jit(f).lower(jax.ShapeDtypeStruct((N,), jnp.float32)).as_text(dialect="hlo")
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "special_f32.hlo"), "w") as out:
    out.write(text)
