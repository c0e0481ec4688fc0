"""Timed MPI communication: the communicator with emulated time (`p2p`), the grid (`grid`,
`shape`), folding's communicators (`folded`), the ring (`ring`, `lanes`), NCCL's trees
(`tree`, `nvls_tree`), the collectives (`collectives`), their closed forms (`cost`) and
NCCL's tuner (`tuner`).

Nothing is imported here: `comm.shape` (pure grid arithmetic) must load without MPI.
"""
