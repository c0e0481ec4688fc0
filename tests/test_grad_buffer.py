"""Megatron-LM's gradient buffer: its dtype per precision, what its hooks and fused GEMMs move,
and where the rest of the step follows it (optimizer passes, memory, which ranks keep one)."""
from __future__ import annotations

import pytest

from mpiemu.devices.gemm import NO_EPILOGUE
from mpiemu.training.adam import main_grad_bytes, mixed_precision_passes
from mpiemu.training.grad_buffer import GradBuffer
from mpiemu.config.workload import load_workload
from mpiemu.runner.train_setup import grad_buffer, train_memory


@pytest.mark.parametrize("dtype, e, main", [("fp16", 2, 2), ("bf16", 2, 4)])
def test_the_buffer_keeps_fp16_as_is_and_bf16_in_fp32(dtype: str, e: int, main: int) -> None:
    buf = GradBuffer.megatron(dtype, fused_wgrad=True)
    assert buf == GradBuffer(e, main, True) and main_grad_bytes(dtype) == main
    hook = buf.hook_cost(1000)
    assert (hook.read_bytes, hook.write_bytes) == (1000 * (e + main), 1000 * main)
    epi = buf.wgrad_epilogue(10, 20)          # C read in the buffer's dtype, written wider
    assert (epi.extra_read_bytes, epi.extra_write_bytes) == (200 * main, 200 * (main - e))
    assert GradBuffer.megatron(dtype, fused_wgrad=False).wgrad_epilogue(10, 20) == NO_EPILOGUE
    assert GradBuffer.megatron("fp32", fused_wgrad=True) is None


def test_the_optimizer_copies_only_a_half_precision_buffer_to_fp32() -> None:
    n = 1000
    before16, after16 = mixed_precision_passes([400, 600], 2, "fp16")
    before_bf, after_bf = mixed_precision_passes([400, 600], 2, "bf16")
    assert before16 == [("main_grad", 800, 1600), ("main_grad", 1200, 2400),   # per tensor
                        ("unscale", 4 * n, 4 * n)]
    assert before_bf == []                       # `.float()` of an fp32 buffer is itself
    assert after16[-1] == ("zero_grad", 0, 2 * n) and after_bf[-1] == ("zero_grad", 0, 4 * n)


@pytest.mark.parametrize("sets, main", [
    ((), 2),                                               # fp16 Adam: the model's dtype
    (("run.emulated_dtype='bf16'",), 4),
    (("optimizer.name='lamb'",), 0),                       # the thesis's LAMB: no buffer
    (("run.emulated_dtype='fp32'",), 0),
])
def test_which_workloads_keep_a_buffer_and_what_their_gradients_weigh(
        sets: tuple[str, ...], main: int) -> None:
    w = load_workload("workloads/quickstart.toml", ["run.emulated_dtype='fp16'", *sets])
    buf = grad_buffer(w, "gpu")
    assert (buf.main if buf is not None else 0) == main
    assert grad_buffer(w, "sunway") is None
    mem = train_memory(w, 80 * 2**30, 0)
    e = 4 if "fp32" in "".join(sets) else 2
    assert mem.grads_bytes == mem.params_bytes / e * (main or e)
