"""One training step: the pipeline step, data-parallel buckets, Megatron's gradient buffer,
Adam / LAMB, the distributed optimizer, memory and FLOPs, the one-process reference."""
