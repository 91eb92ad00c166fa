"""What the demos print about the host and about why compiled equals eager.

Compiled and eager agree bit for bit by construction, not by the luck of a summation
order: every reduction, transcendental function and GEMM of the models runs inside an op
(an op node, or a lowered op's exact piece), which computes with the same kernels
compiled as eagerly; what Inductor generates itself is index arithmetic, casts and
additions of two stored tensors, each of which IEEE arithmetic rounds one way on every
host. So the claim holds whatever vector width ATen's kernels and Inductor's code use
(AVX2, AVX-512, scalar), which is why the host's is printed beside it.
"""

from __future__ import annotations

import torch

BASIS = "bitwise by construction"
BASIS_NOTE = (
    "basis: every reduction, transcendental function and GEMM runs inside an op (the same "
    "kernels compiled and eager); Inductor's own code is index arithmetic, casts and "
    "single-rounding additions"
)


def inductor_vector_isa() -> str:
    """The vector ISA Inductor's CPU code is generated for (``"none"``: scalar code)."""
    from torch._inductor import cpu_vec_isa

    isa = cpu_vec_isa.pick_vec_isa()
    return str(isa) if isa else "none"


def host_line() -> str:
    """One line naming the CPU's vector capabilities as ATen and Inductor use them."""
    return (
        f"host: torch {torch.__version__}, ATen CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}, Inductor vector ISA "
        f"{inductor_vector_isa()}"
    )
