"""Mixture of Experts: the router, the experts and expert parallelism's token exchange
(Megatron-Core `megatron/core/transformer/moe/`)."""
