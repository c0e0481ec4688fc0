"""Which layers each pipeline stage (and each of its interleaved model chunks) holds.

Even by default: virtual stage v = chunk * pp + stage holds L / (pp chunks) consecutive
layers (Megatron-LM's interleaved placement, Narayanan et al. 2021 Fig. 4). Megatron-Core
can also take layers off the first and last stage, whose embedding and loss cost time too:

* `first`, `last` (--decoder-first-pipeline-num-layers, --decoder-last-pipeline-num-layers):
  the first / last stage holds that many layers, the stages between share the rest evenly;
  with interleaving each stage's layers are split evenly over its chunks
  (megatron/core/transformer/transformer_block.py, `get_num_layers_to_build`);
* `embedding`, `loss` (--account-for-embedding-in-pipeline-split,
  --account-for-loss-in-pipeline-split): the embedding and the loss each count as one layer
  in an even split, so the first and the last virtual stage hold one layer fewer. Llama 3's
  405B layout (Llama 3 paper 3.3.2: 126 layers on 16 stages, one fewer on the first and
  the last) is this split.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerSplit:
    """How the stages divide the layers; the default is even."""

    first: int = 0          # layers of the first stage (0: as the others)
    last: int = 0           # layers of the last stage (0: as the others)
    embedding: bool = False  # the embedding counts as a layer of the first virtual stage
    loss: bool = False       # the loss counts as a layer of the last virtual stage

    @property
    def even(self) -> bool:
        return self == LayerSplit()


def problem(layers: int, pp: int, chunks: int, split: LayerSplit) -> str | None:
    """Why this split cannot place `layers` (None: it can)."""
    if (split.first or split.last) and (split.embedding or split.loss):
        return "first/last stage layers and the embedding/loss accounting exclude each other"
    if split.first or split.last:
        if pp < 2:
            return "uneven first/last stages need parallel.pp >= 2"
        inner = layers - split.first - split.last
        between = pp - (split.first > 0) - (split.last > 0)
        if inner < 0 or (between == 0 and inner) or (between and inner % between):
            return (f"the {inner} layers left do not split evenly over the {between} other "
                    "stages")
        sizes = _stage_sizes(layers, pp, split)
        if any(n % chunks for n in sizes):
            return f"stage sizes {sizes} do not split into {chunks} chunks each"
        return None
    total = layers + split.embedding + split.loss
    if total % (pp * chunks):
        what = " (with the embedding and loss counted as layers)" if not split.even else ""
        return f"{pp * chunks} virtual stages do not divide {total} layers{what}"
    if min(virtual_sizes(layers, pp, chunks, split)) < 1:
        return "a virtual stage would hold no layer"
    return None


def _stage_sizes(layers: int, pp: int, split: LayerSplit) -> list[int]:
    """Layers per stage with explicit first / last counts."""
    between = pp - (split.first > 0) - (split.last > 0)
    each = (layers - split.first - split.last) // between if between else 0
    return [split.first if s == 0 and split.first else
            split.last if s == pp - 1 and split.last else each for s in range(pp)]


def virtual_sizes(layers: int, pp: int, chunks: int, split: LayerSplit) -> list[int]:
    """Layers of each virtual stage, in order v = chunk * pp + stage (checked: `problem`)."""
    if split.first or split.last:
        per_stage = _stage_sizes(layers, pp, split)
        return [per_stage[v % pp] // chunks for v in range(pp * chunks)]
    n = (layers + split.embedding + split.loss) // (pp * chunks)
    sizes = [n] * (pp * chunks)
    sizes[0] -= split.embedding
    sizes[-1] -= split.loss
    return sizes


def chunk_layers(layers: int, pp: int, chunks: int, stage: int, chunk: int,
                 split: LayerSplit = LayerSplit()) -> range:
    """The consecutive layers of virtual stage chunk * pp + stage."""
    sizes = virtual_sizes(layers, pp, chunks, split)
    v = chunk * pp + stage
    start = sum(sizes[:v])
    return range(start, start + sizes[v])


def stage_layer_count(layers: int, pp: int, chunks: int, stage: int,
                      split: LayerSplit = LayerSplit()) -> int:
    """Layers pipeline stage `stage` holds over all its chunks."""
    return sum(len(chunk_layers(layers, pp, chunks, stage, c, split)) for c in range(chunks))
