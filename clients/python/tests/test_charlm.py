"""The character-level transformer LM example through kilnd: the loss falls,
and it follows the same model, optimizer and batches in local JAX."""
import os
import sys

import numpy as np
import pytest

import kiln
import kiln.numpy as knp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "python"))
import train_charlm  # noqa: E402

# small enough for the interpreter backend (one block, short windows)
CONFIG = dict(steps=25, batch=8, seq=16, d=32, layers=1, progress=False)


def test_charlm_loss_decreases():
    losses = train_charlm.train(kiln, knp, **CONFIG)
    assert len(losses) == CONFIG["steps"]
    assert np.isfinite(losses).all()
    first, last = np.mean(losses[:5]), np.mean(losses[-5:])
    assert last < first - 0.5, (first, last)


def test_charlm_matches_jax():
    jax = pytest.importorskip("jax")
    cfg = dict(CONFIG, steps=8)
    k = train_charlm.train(kiln, knp, **cfg)
    j = train_charlm.train(jax, jax.numpy, **cfg)
    np.testing.assert_allclose(k, j, rtol=2e-3, atol=2e-3)


def test_charlm_text_ships_with_the_repository():
    ids, vocab = train_charlm.load_text()
    assert 1000 < len(ids) < 20000 and 20 < len(vocab) < 80
