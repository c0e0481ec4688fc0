"""The emulated network follows the job's real placement when it spans several hosts."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from mpi4py import MPI

from mpiemu.net import Network, load_network
from mpiemu.runner.job import run_workload


def test_a_cyclic_placement_puts_neighbouring_ranks_on_different_nodes() -> None:
    spec = load_network("dgx-a100")
    net = Network(spec, 16, placement=tuple(d % 2 for d in range(16)))   # srun cyclic
    assert (net.nodes, net.per_node) == (2, 8)
    assert net.node_of(3) == 1 and net.local(3) == 1 and net.member(1, 1) == 3
    assert net.hop(0, 1).inter_node and net.hop(0, 1).label == "nic.0.out>nic.1.in"
    assert not net.hop(0, 2).inter_node and net.hop(0, 2).label == "port.0.out>port.2.in"
    block = Network(spec, 16)
    assert not block.hop(0, 1).inter_node and block.hop(0, 8).inter_node


def test_a_placement_the_network_cannot_hold_is_refused() -> None:
    spec = load_network("dgx-a100")
    with pytest.raises(ValueError, match="same number of ranks on every node"):
        Network(spec, 4, placement=(0, 0, 0, 1))


@pytest.mark.mpi(min_size=2)
def test_a_job_on_two_hosts_is_emulated_on_its_real_placement(mpi_tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """Ranks alternate between two (pretended) hosts, as `srun --distribution=cyclic`
    places them; with no devices_per_node in the config, rank r sits on node r % 2."""
    world = MPI.COMM_WORLD
    if world.Get_size() % 2:
        pytest.skip("needs an even number of ranks")
    monkeypatch.setattr(socket, "gethostname", lambda: f"host{world.Get_rank() % 2}")
    sets = ["run.kind='collectives'", "run.numerics='off'", "collectives.ops=['all_reduce']",
            "collectives.sizes=['64KiB']", f"parallel.tp={world.Get_size()}",
            "device.preset='a100-sxm4-80gb'"]
    run_workload(None, sets, str(mpi_tmp_path / "cyclic"), [], world=world)
    world.Barrier()                   # every rank's trace is compacted before anyone reads
    manifest = json.loads((mpi_tmp_path / "cyclic" / "manifest.json").read_text())
    assert manifest["placement"] == [r % 2 for r in range(world.Get_size())]
    assert nic_ports(mpi_tmp_path / "cyclic")            # neighbours talk across hosts
    run_workload(None, sets + ["network.devices_per_node=8"], str(mpi_tmp_path / "config"),
                 [], world=world)                          # the config wins when given
    world.Barrier()
    manifest = json.loads((mpi_tmp_path / "config" / "manifest.json").read_text())
    assert manifest["placement"] == "block" and not nic_ports(mpi_tmp_path / "config")


def nic_ports(run_dir: Path) -> set[str]:
    """The NIC ports this rank's messages crossed."""
    from mpiemu.analysis import load
    rt = load(run_dir).ranks[MPI.COMM_WORLD.Get_rank()]
    return {r for r in rt.resources.astype(str) if "nic." in r}
