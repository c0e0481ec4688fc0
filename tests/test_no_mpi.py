"""What needs no MPI loads without it: reading traces back (`mpiemu.analysis`), the
configuration and the preset listings (`mpiemu devices`), in a process where mpi4py cannot
be imported at all."""
from __future__ import annotations

import subprocess
import sys

import pytest

BLOCK = "import sys; sys.modules['mpi4py'] = None; "


@pytest.mark.parametrize("code", [
    "import mpiemu.analysis",
    "from mpiemu.config.listing import format_devices; print(format_devices('h100-sxm5')[0])",
    "from mpiemu.config.workload import load_workload; "
    "load_workload('workloads/quickstart.toml', [])",
    "from mpiemu.cli import main; main(['devices', '--network', 'dgx-h100'])",
])
def test_loads_where_mpi4py_cannot_be_imported(code: str) -> None:
    res = subprocess.run([sys.executable, "-c", BLOCK + code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
