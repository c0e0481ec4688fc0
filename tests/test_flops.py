"""Megatron-LM's FLOP counts for MFU and HFU, from our general per-GEMM sum."""
from __future__ import annotations

import pytest

from mpiemu.training.flops import hardware_flops, model_flops, utilization
from mpiemu.model.presets import load_model_preset


@pytest.mark.parametrize("name, batch", [("megatron-22b", 4), ("megatron-175b", 64),
                                         ("megatron-530b", 280), ("megatron-1t", 512)])
def test_model_and_hardware_flops_are_the_papers_formulas(name: str, batch: int) -> None:
    cfg = load_model_preset(name).config
    B, s, L, h, V = batch, cfg.seq_len, cfg.layers, cfg.hidden, cfg.padded_vocab
    eq7 = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))    # Korthikanti Eq. 7
    eq8 = 72 * B * s * L * h * h * (1 + s / (3 * h) + V / (12 * h * L))    # Korthikanti Eq. 8
    eq3 = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))    # Narayanan Eq. 3
    assert model_flops(cfg, B) == pytest.approx(eq7, rel=1e-12)
    assert hardware_flops(cfg, B, "none") == pytest.approx(eq7, rel=1e-12)
    assert hardware_flops(cfg, B, "selective") == pytest.approx(eq8, rel=1e-12)
    assert hardware_flops(cfg, B, "full") == pytest.approx(eq3, rel=1e-12)


def test_utilization_is_flops_over_time_devices_and_peak() -> None:
    assert utilization(312e12 * 8 * 2.0 * 0.5, 2.0, 8, 312e12) == pytest.approx(0.5)
