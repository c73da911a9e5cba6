"""The digits example through kilnd against the same model, optimizer and
batches in local JAX."""
import os
import sys

import numpy as np
import pytest

import kiln
import kiln.numpy as knp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "python"))
pytest.importorskip("sklearn")
jax = pytest.importorskip("jax")
import train_digits  # noqa: E402


def test_digits_matches_jax():
    steps = 150
    k_losses, k_acc = train_digits.train(kiln, knp, steps=steps, progress=False)
    j_losses, j_acc = train_digits.train(jax, jax.numpy, steps=steps, progress=False)
    assert k_losses[-1] < k_losses[0] * 0.5
    np.testing.assert_allclose(k_losses, j_losses, rtol=1e-3, atol=1e-3)
    assert k_acc >= j_acc - 0.01, (k_acc, j_acc)
    assert k_acc > 0.85
