"""The kernels measured on this project's H100 (`mpiemu/studies/kernels_h100_here.csv`)
against the GPU model: every measured row is compared, and the model's reading of
Megatron-LM's causal softmax (a dense row's time, the triangle's bytes) holds."""
from __future__ import annotations

from mpiemu.studies import kernels_here as kh


def test_every_measured_kernel_row_meets_a_model() -> None:
    _, raw = kh.raw()
    t = kh.all_rows()
    assert len(t["kernel"]) == sum(r["kind"] in ("kernel", "megatron") for r in raw)
    assert len(t["flash"]) == sum(r["kind"] == "flash" for r in raw)
    layer_gemms = [r for r in raw if r["kind"] == "gemm" and r["group"] in kh.LAYER_GROUPS]
    assert len([r for r in t["gemm"] if r["group"] in kh.LAYER_GROUPS]) == len(layer_gemms)


def test_megatrons_causal_softmax_takes_a_dense_rows_time() -> None:
    rows = [r for r in kh.all_rows()["kernel"] if r["op"].startswith("causal softmax")]
    assert len(rows) == 4
    for r in rows:
        assert abs(r["error"]) < 0.10, r                      # dense row's time: measured
        assert r["full_rate_us"] < 0.85 * r["measured_us"], r  # triangle's bytes: too fast
