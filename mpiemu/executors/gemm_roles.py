"""What a GEMM of a layer is, by its name: its role (fprop, dgrad, wgrad), its operands
(activation, weight, gradient) and the linear layer it belongs to (`l3.fc1.bwd.gemm` ->
`l3.fc1`: one FP8 state for that layer's fprop, dgrad and wgrad, `precision.fp8_gemm`)."""
from __future__ import annotations


def role(name: str) -> str:
    """A GEMM's role by its name: `<op>.wgrad` the weight gradient, a backward pass's other
    GEMMs (`<op>.bwd...`) the dgrad, the rest the forward."""
    if name.endswith(".wgrad"):
        return "wgrad"
    return "dgrad" if ".bwd" in name else "fprop"


# the operands of each role of a linear layer's GEMMs (`precision.fp8_gemm`)
OPERANDS = {"fprop": ("act", "weight"), "dgrad": ("grad", "weight"), "wgrad": ("act", "grad")}
_PASS_SUFFIXES = ("fwd", "bwd", "wgrad", "gemm")


def tensor_key(name: str) -> str:
    """The linear layer a GEMM belongs to (`l3.fc1.bwd.gemm` -> `l3.fc1`): one FP8 state
    for its fprop, dgrad and wgrad."""
    parts = name.split(".")
    while parts and parts[-1] in _PASS_SUFFIXES:
        parts.pop()
    return ".".join(parts)
