"""`mpiemu devices`: the presets' numbers beside their sources, assumptions marked."""
from __future__ import annotations

from ..hw.presets import all_quantities, list_presets, load_device, read_preset


def _summary_row(name: str) -> str:
    d = load_device(name)
    fp16 = d.peak_flops_per_s.get("fp16", 0.0) / 1e12
    fp32 = d.peak_flops_per_s.get("fp32", 0.0) / 1e12
    return (f"{d.name:<18}{d.kind:<8}{d.compute_units:>5}{d.clock_hz / 1e9:>7.2f}"
            f"{fp16:>9.1f}{fp32:>9.1f}{d.dram_bw_bytes_per_s / 1e9:>11.0f}"
            f"{d.dram_capacity_bytes / 2**30:>6.0f}{d.llc_bytes / 2**20:>9.0f}"
            f"{d.link.bw_bytes_per_s / 1e9:>11.1f}{d.link.latency_s * 1e9:>8.0f}  {d.link.topology}")


def _source_lines(name: str) -> list[str]:
    raw = read_preset(name)
    lines = [f"{name}: {raw.get('description', '')}"]
    for sec, qs in all_quantities(raw).items():
        for key, q in qs.items():
            flag = "ASSUMPTION" if q.is_assumption else "sourced"
            src = q.source.removeprefix("ASSUMPTION:").strip()
            lines.append(f"  {sec}.{key:<24} {q.value:<14.6g} [{flag}] {src}")
    return lines


def format_devices(name: str | None = None, brief: bool = False) -> list[str]:
    """Summary table of presets, then every number with its source (SI units)."""
    names = [name] if name else list_presets()
    lines = [f"{'preset':<18}{'kind':<8}{'CUs':>5}{'GHz':>7}{'fp16 TF':>9}{'fp32 TF':>9}"
             f"{'DRAM GB/s':>11}{'GiB':>6}{'LLC MiB':>9}{'link GB/s':>11}{'lat ns':>8}  topology"]
    lines += [_summary_row(n) for n in names]
    if not brief:
        lines.append("")
        lines.append("values in SI units (flop/s, bytes, bytes/s, s, Hz); "
                     "[ASSUMPTION] = not stated by any source, reasoning given")
        for n in names:
            lines += _source_lines(n)
    return lines
