"""kiln: a thin client of kilnd with JAX's names and semantics.

    import kiln as jax
    import kiln.numpy as jnp

jax.jit, grad, value_and_grad, vmap, jvp, vjp and checkpoint stage
functions out to a Kiln server (KILN_SERVER, or kiln.connect(address)),
which compiles them, applies the transforms and runs them on arrays that
stay on the server until np.asarray fetches them.
"""
from . import _proto  # noqa: F401  (the stubs, generated if need be)
from ._api import (checkpoint, checkpoint_policies, custom_jvp, custom_vjp, grad, hessian,
                   jacfwd, jacrev, jit, jvp, pmap, remat, value_and_grad, vjp, vmap)
from ._client import (Array, CompileProgress, Device, connect, connection, device_get,
                      device_put, devices, register_kernel)
from .errors import (ConcretizationTypeError, KilnError, TracerArrayConversionError,
                     UnexpectedTracerError)
from . import errors, lax, nn, stages, tree_util  # noqa: E402
from . import numpy  # noqa: E402

__version__ = "0.1.0"
__all__ = [
    "Array", "CompileProgress", "Device", "stages", "connect", "connection", "devices", "device_put", "device_get", "jit",
    "grad", "value_and_grad", "vmap", "jvp", "vjp", "checkpoint", "remat",
    "checkpoint_policies", "hessian", "jacfwd", "jacrev", "custom_jvp", "custom_vjp", "pmap",
    "lax", "nn", "numpy", "tree_util", "errors", "KilnError", "ConcretizationTypeError",
    "TracerArrayConversionError", "UnexpectedTracerError", "ops", "random", "from_jax",
    "register_kernel",
]


from . import ops, random  # noqa: E402
from ._from_jax import from_jax  # noqa: E402


def block_until_ready(x):
    return tree_util.tree_map(lambda v: v.block_until_ready() if hasattr(
        v, "block_until_ready") else v, x)
