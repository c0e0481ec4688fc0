"""Which layers each pipeline stage holds: even, Megatron-Core's first/last stage counts, and
the embedding and loss counted as layers (Llama 3's 405B layout)."""
from __future__ import annotations

import pytest

from mpiemu.model.pipeline_split import (LayerSplit, chunk_layers, problem, stage_layer_count,
                                         virtual_sizes)


def test_even_split_is_megatron_interleaved_placement() -> None:
    # 8 layers, pp 2, 2 chunks: stage 0 holds 0-1 and 4-5, stage 1 holds 2-3 and 6-7
    assert [list(chunk_layers(8, 2, 2, 0, c)) for c in range(2)] == [[0, 1], [4, 5]]
    assert [list(chunk_layers(8, 2, 2, 1, c)) for c in range(2)] == [[2, 3], [6, 7]]


def test_llama3_405b_on_16_stages_one_layer_fewer_at_each_end() -> None:
    """Llama 3 paper 3.3.2: 126 layers, 16 stages, the first and last with one fewer."""
    split = LayerSplit(embedding=True, loss=True)
    assert problem(126, 16, 1, split) is None
    assert virtual_sizes(126, 16, 1, split) == [7] + [8] * 14 + [7]
    assert problem(126, 16, 1, LayerSplit()) is not None      # even: 16 does not divide 126


def test_nemo_405b_interleaved_layout() -> None:
    """NeMo 2.0's Llama 3.1 405B (pp 8, vp 8): 128 slots on 64 virtual stages."""
    split = LayerSplit(embedding=True, loss=True)
    sizes = virtual_sizes(126, 8, 8, split)
    assert sizes[0] == 1 and sizes[-1] == 1 and set(sizes[1:-1]) == {2}
    assert sum(stage_layer_count(126, 8, 8, s, split) for s in range(8)) == 126


def test_first_and_last_stage_counts() -> None:
    split = LayerSplit(first=3, last=5)
    assert virtual_sizes(24, 4, 1, split) == [3, 8, 8, 5]
    covered = [i for s in range(4) for i in chunk_layers(24, 4, 1, s, 0, split)]
    assert covered == list(range(24))


@pytest.mark.parametrize("layers, pp, chunks, split", [
    (24, 4, 1, LayerSplit(first=3, last=4)),            # 17 left for 2 stages
    (24, 1, 1, LayerSplit(first=3)),                    # one stage
    (8, 2, 1, LayerSplit(first=2, embedding=True)),     # both kinds
    (7, 2, 2, LayerSplit(embedding=True, loss=True)),   # 9 slots on 4 virtual stages
])
def test_impossible_splits_say_why(layers: int, pp: int, chunks: int,
                                   split: LayerSplit) -> None:
    assert problem(layers, pp, chunks, split)
