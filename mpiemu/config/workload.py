"""Workload configuration: TOML -> validated frozen dataclasses (Megatron-style __post_init__).

Units live in key names (`bw_GBps`, `latency_ns`); every check raises a ConfigError naming the
field, the value and what is allowed.
"""
from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from .._digest import sha256_hex
from ..devices.caps import CapError, apply_overrides, check_path
from ..devices.presets import PresetError, list_presets, load_device
from ..devices.specs import DeviceSpec
from ..comm.tuner import allowed_on
from ..net import (ALGORITHMS, PROTOCOLS, TOPOLOGIES, Network, NetworkSpec, list_networks,
                   load_network)
from .errors import ConfigError
from .fp8_section import Fp8Section
from .run_section import RunSection
from .overlap_section import OverlapSection, SublayersSection
from .parallel_section import ParallelSection
from .moe_section import MoeSection
from .sunway_section import SunwaySection
from .sweep_section import LayerSweepSection
from .train_section import ModelSection, OptimizerSection, TrainSection
from .schema import (apply_override, as_table, did_you_mean, dotted_keys, from_table,
                     parse_override, parse_size)

COLLECTIVE_OPS = ("reduce_scatter", "all_gather", "all_reduce", "all_to_all")
RING_OPS = COLLECTIVE_OPS[:3]       # what a sweep runs unless it names its ops


@dataclass(frozen=True)
class DeviceSection:
    """Which hardware every rank plays (`rank_presets`: one preset per rank instead), and
    `overrides` of its capabilities: every other key under [device] (`--set
    device.gemm.efficiency=0.9`, `device.scale.compute=2`), a dotted field path of the device
    spec (`mpiemu devices NAME` lists them) in its SI unit, or with a preset unit
    (`device.dram_bw_GBps=2000`)."""

    preset: str = "t3-gpu"
    rank_presets: tuple[str, ...] = ()
    overrides: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for i, name in enumerate((self.preset, *self.rank_presets)):
            field = "device.preset" if i == 0 else f"device.rank_presets[{i - 1}]"
            if not Path(name).suffix and name not in list_presets():
                raise ConfigError(field, name, list_presets())
        for path, value in self.overrides.items():
            try:
                check_path(DeviceSpec, path, value)
            except CapError as exc:
                raise ConfigError(exc.field, exc.value, exc.allowed) from None

    def preset_of(self, rank: int) -> str:
        return self.rank_presets[rank] if self.rank_presets else self.preset


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'gemm': {'efficiency': 0.9}} -> {'gemm.efficiency': 0.9}."""
    out: dict[str, Any] = {}
    for k, v in table.items():
        if isinstance(v, Mapping):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def _gather_overrides(table: dict[str, Any], section: str, own: set[str]) -> None:
    """Move every [section] key that is not a field of its section class into `overrides`."""
    sec = table.get(section)
    if not isinstance(sec, dict):
        return
    caps = {k: sec.pop(k) for k in [k for k in sec if k not in own]}
    if caps:
        sec["overrides"] = {**_flatten(sec.get("overrides", {})), **_flatten(caps)}


@dataclass(frozen=True)
class NetworkSection:
    """Which network joins the devices (`preset`: a bundled network or a TOML path; "" = the
    device preset's), how many devices share a node (`devices_per_node`: -1 = the preset's,
    0 = one node) and `overrides` of its fields: every other key under [network]
    (`--set network.intra.bw_GBps=75`, `network.scale.bw=2`; `mpiemu devices --network NAME`
    lists them), in SI units or with a preset unit."""

    preset: str = ""
    devices_per_node: int = -1
    topology: str = ""
    overrides: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.preset and not Path(self.preset).suffix and self.preset not in list_networks():
            raise ConfigError("network.preset", self.preset, list_networks())
        if self.topology and self.topology not in TOPOLOGIES:
            raise ConfigError("network.topology", self.topology, TOPOLOGIES)
        if self.devices_per_node < -1:
            raise ConfigError("network.devices_per_node", self.devices_per_node,
                              "an integer >= 1 (0: one node; -1: the preset's)")
        for path, value in self.overrides.items():
            try:
                check_path(NetworkSpec, path, value, root="network")
            except CapError as exc:
                raise ConfigError(exc.field, exc.value, exc.allowed) from None


@dataclass(frozen=True)
class CollectivesSection:
    """A sweep of collectives over message sizes (all_to_all: the size is a rank's whole
    send buffer, as nccl-tests' alltoall_perf)."""

    ops: tuple[str, ...] = RING_OPS
    sizes: tuple[str | int, ...] = ("1KiB", "64KiB", "1MiB", "16MiB")
    bidirectional: bool = False
    group: str = "tp"
    algorithm: str = ""              # "" : the lowest predicted, as NCCL's tuner picks
    protocol: str = ""

    def __post_init__(self) -> None:
        for i, op in enumerate(self.ops):
            if op not in COLLECTIVE_OPS:
                raise ConfigError(f"collectives.ops[{i}]", op, COLLECTIVE_OPS)
        for i, s in enumerate(self.sizes):
            if self.size_bytes[i] <= 0:
                raise ConfigError(f"collectives.sizes[{i}]", s, "a size > 0, e.g. '64MiB'")
        if self.group not in ("tp", "dp"):
            raise ConfigError("collectives.group", self.group, ("tp", "dp"))
        if self.algorithm and self.algorithm not in ALGORITHMS:
            raise ConfigError("collectives.algorithm", self.algorithm, ALGORITHMS)
        if self.protocol and self.protocol not in PROTOCOLS:
            raise ConfigError("collectives.protocol", self.protocol, PROTOCOLS)

    @property
    def size_bytes(self) -> list[int]:
        return [parse_size(f"collectives.sizes[{i}]", s) for i, s in enumerate(self.sizes)]


FAIL_AT = ("start", "collective", "flush", "sigkill")


@dataclass(frozen=True)
class DebugSection:
    """Fault injection for testing the job's failure behaviour."""

    fail_rank: int = -1              # this rank fails ...
    fail_iteration: int = 0          # ... when it reaches this iteration / sweep point ...
    fail_at: str = "start"           # ... raising there, in its next message ("collective"),
                                     # in a trace flush ("flush"), or by SIGKILL ("sigkill")

    def __post_init__(self) -> None:
        if self.fail_at not in FAIL_AT:
            raise ConfigError("debug.fail_at", self.fail_at, FAIL_AT)


MAX_GLOBAL_BATCH = 1 << 24          # 16.8M sequences: 100x the largest published batches
MAX_MICRO_BATCHES = 1 << 16         # per DP rank and step (Llama 3 405B: 16 x its stages)


@dataclass(frozen=True)
class Workload:
    """A whole experiment, as resolved from TOML plus `--set` overrides."""

    name: str = "workload"
    run: RunSection = field(default_factory=RunSection)
    device: DeviceSection = field(default_factory=DeviceSection)
    network: NetworkSection = field(default_factory=NetworkSection)
    parallel: ParallelSection = field(default_factory=ParallelSection)
    collectives: CollectivesSection = field(default_factory=CollectivesSection)
    model: ModelSection = field(default_factory=ModelSection)
    moe: MoeSection = field(default_factory=MoeSection)
    train: TrainSection = field(default_factory=TrainSection)
    optimizer: OptimizerSection = field(default_factory=OptimizerSection)
    overlap: OverlapSection = field(default_factory=OverlapSection)
    sublayers: SublayersSection = field(default_factory=SublayersSection)
    sunway: SunwaySection = field(default_factory=SunwaySection)
    layer_sweep: LayerSweepSection = field(default_factory=LayerSweepSection)
    fp8: Fp8Section = field(default_factory=Fp8Section)
    debug: DebugSection = field(default_factory=DebugSection)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9._+-][A-Za-z0-9._+ -]{0,99}", self.name):
            raise ConfigError("name", self.name, "1-100 letters, digits, '._+-' or spaces "
                              "(it names the run directory)")
        self._check_batch()

    def _check_batch(self) -> None:
        """A global batch an emulation can step through: at most MAX_GLOBAL_BATCH sequences
        and MAX_MICRO_BATCHES micro-batches per DP rank (a schedule's passes are walked one
        by one, to place them and to size the memory they keep)."""
        gb, mb = self.train.global_batch, self.train.micro_batch
        if gb > MAX_GLOBAL_BATCH:
            raise ConfigError("train.global_batch", gb, f"at most {MAX_GLOBAL_BATCH} sequences "
                              "(100 times the largest published global batches; 0 for the "
                              "preset's)")
        micro = gb // (self.parallel.dp * max(mb, 1)) if mb else 1
        if micro > MAX_MICRO_BATCHES:
            raise ConfigError("train.micro_batch", mb, f"gives {micro} micro-batches per DP "
                              f"rank; at most {MAX_MICRO_BATCHES} (the emulator walks every "
                              "pass, about a millisecond per micro-batch and layer even timing "
                              "only: more would run for hours): a larger micro-batch or "
                              "global batch / DP")

    def check_world(self, world_size: int) -> None:
        """tp * cp * dp * pp must equal the number of ranks the job was launched with."""
        resolve_network(self, resolve_device(self, 0))      # its values first: any world
        self._check_debug(world_size)
        par = self.parallel
        if par.devices != world_size:
            raise ConfigError(par.grid_field, par.grid_value,
                              f"must equal the {world_size} ranks of this job")
        presets = self.device.rank_presets
        if presets and len(presets) != world_size:
            raise ConfigError("device.rank_presets", list(presets),
                              f"one preset per rank: {world_size} entries")
        kinds = {resolve_device(self, r).kind for r in range(len(presets))} if presets else set()
        if len(kinds) > 1:
            raise ConfigError("device.rank_presets", list(presets),
                              "GPU and Sunway ranks cannot share a job: their collective rings "
                              "would cross two interconnects that have no common link model; "
                              "use presets of one kind")

        self.network_of(world_size)

    def _check_debug(self, world_size: int) -> None:
        """An injected fault must name a rank of the job and a point the run reaches."""
        d = self.debug
        if d.fail_rank == -1:
            return
        if not 0 <= d.fail_rank < world_size:
            raise ConfigError("debug.fail_rank", d.fail_rank,
                              f"-1 (none) or a rank of this job, 0..{world_size - 1}")
        points = {"train": self.run.iterations,
                  "collectives": len(self.collectives.ops) * len(self.collectives.sizes)
                  }.get(self.run.kind)
        if d.fail_iteration < 0 or (points is not None and d.fail_iteration >= points):
            allowed = f"0..{points - 1}" if points is not None else ">= 0"
            raise ConfigError("debug.fail_iteration", d.fail_iteration,
                              f"a point the run reaches: {allowed}")
        if d.fail_at == "collective" and world_size == 1:
            raise ConfigError("debug.fail_at", "collective", "needs a job of more than one "
                              "rank (a single rank sends no message)")

    def network_of(self, world_size: int, hosts: Sequence[str] = ()) -> Network:
        """The job's network over its devices (rank 0's device names the default preset).

        `hosts` (each rank's host name): a job that really spans several hosts, with no
        `network.devices_per_node` in its config (the config wins when given), is emulated
        on its real placement (`Network.placement`: the node of rank r is its host's index)
        when the network is hierarchical and the hosts hold equal numbers of ranks."""
        spec = resolve_network(self, resolve_device(self, 0))
        g = spec.devices_per_node
        try:
            net = Network(spec, world_size, self._placement(spec.topology, hosts))
        except ValueError as exc:
            field = "network.devices_per_node" if g and world_size % g else "network.topology"
            value = g if field.endswith("node") else spec.topology
            raise ConfigError(field, value, str(exc).split("; ", 1)[-1]) from None
        self._check_algorithm(net, world_size)
        return net

    def _placement(self, topology: str, hosts: Sequence[str]) -> tuple[int, ...]:
        names = list(dict.fromkeys(hosts))
        if self.network.devices_per_node != -1 or len(names) < 2 or \
                topology != "hierarchical" or len({hosts.count(h) for h in names}) > 1:
            return ()
        return tuple(names.index(h) for h in hosts)

    def _check_algorithm(self, net: Network, world_size: int) -> None:
        """`collectives.algorithm` must run on every group that all-reduces with it."""
        algo = self.collectives.algorithm
        if not algo:
            return
        tp = self.parallel.tp
        groups = {"tp": [list(range(d * tp, (d + 1) * tp)) for d in range(world_size // tp)],
                  "dp": [list(range(t, world_size, tp)) for t in range(tp)]}
        names = [self.collectives.group] if self.run.kind == "collectives" else ["tp", "dp"]
        for name in names:
            for devs in groups[name]:
                ok = allowed_on(net, devs, "all_reduce")
                if len(devs) > 1 and algo not in ok:
                    raise ConfigError("collectives.algorithm", algo,
                                      f"the {name} group {devs[:4]}{'...' if len(devs) > 4 else ''}"
                                      f" on network {net.spec.name} can run {ok}")

    def as_dict(self) -> dict[str, Any]:
        return as_table(self)  # type: ignore[no-any-return]

    def config_hash(self) -> str:
        blob = json.dumps(self.as_dict(), sort_keys=True).encode()
        return sha256_hex(blob)[:16]


def load_workload(path: str | Path | None, overrides: Sequence[str] = ()) -> Workload:
    """Read a workload TOML (or start from defaults), apply `--set` overrides, validate."""
    table: dict[str, Any] = {}
    if path is not None:
        p = _bundled_or(Path(path))
        if not p.exists():
            raise ConfigError("workload", str(path), "an existing .toml file, or a bundled "
                              "workload's name (mpiemu workloads)")
        if not p.is_file():
            raise ConfigError("workload", str(path), "a .toml file (this is a directory)")
        try:
            with p.open("rb") as f:
                table = tomllib.load(f)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("workload", str(path), f"valid TOML ({exc})") from None
        except UnicodeDecodeError:
            raise ConfigError("workload", str(path), "a UTF-8 TOML file") from None
        except (OSError, RecursionError) as exc:
            raise ConfigError("workload", str(path),
                              f"a readable TOML file ({type(exc).__name__})") from None
        table.setdefault("name", p.stem)
    for item in overrides:
        keys, value = parse_override(item)
        apply_override(table, keys, value)
    _gather_overrides(table, "device", {f.name for f in fields(DeviceSection)})
    _gather_overrides(table, "network", {f.name for f in fields(NetworkSection)})
    try:
        return from_table(Workload, table, "")
    except ConfigError as exc:
        guesses = did_you_mean(exc.field, dotted_keys(Workload)) \
            if exc.allowed.startswith("unknown key") else []
        if not guesses:
            raise
        raise ConfigError(exc.field, exc.value, f"unknown key; did you mean "
                          f"{' or '.join(guesses)}? ({exc.allowed[len('unknown key; '):]})"
                          ) from None


def _bundled_or(p: Path) -> Path:
    """A path as given, or the bundled workload of that name (`quickstart`,
    `quickstart.toml`) when no such file exists here."""
    if p.exists() or len(p.parts) > 1:
        return p
    from ..workloads import DIR  # noqa: PLC0415
    bundled = DIR / (p.name if p.suffix == ".toml" else f"{p.name}.toml")
    return bundled if bundled.exists() else p


def resolve_device(w: Workload, rank: int = 0) -> DeviceSpec:
    """The DeviceSpec a rank plays: its preset, the [device] overrides and scale knobs."""
    name = w.device.preset_of(rank)
    try:
        return apply_overrides(load_device(name), w.device.overrides)  # type: ignore[no-any-return]
    except PresetError as exc:
        raise ConfigError("device.preset", name, str(exc)) from None
    except CapError as exc:
        raise ConfigError(exc.field, exc.value, exc.allowed) from None


def resolve_network(w: Workload, device: DeviceSpec) -> NetworkSpec:
    """The job's NetworkSpec: [network] preset (else the device's), node size, topology and
    overrides applied."""
    net = w.network
    name = net.preset or device.network
    if not name:
        raise ConfigError("network.preset", "", f"device {device.name} names no network; "
                          f"choose one of {list_networks()}")
    try:
        spec = load_network(name)
        extra: dict[str, Any] = dict(net.overrides)
        if net.devices_per_node >= 0:
            extra["devices_per_node"] = net.devices_per_node
        spec = apply_overrides(spec, extra, root="network")
        return replace(spec, topology=net.topology) if net.topology else spec
    except PresetError as exc:
        raise ConfigError("network.preset", name, str(exc)) from None
    except CapError as exc:
        raise ConfigError(exc.field, exc.value, exc.allowed) from None
    except ValueError as exc:
        raise ConfigError("network", name, str(exc)) from None
