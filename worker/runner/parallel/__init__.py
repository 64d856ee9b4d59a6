"""Tensor parallelism (Megatron-style): one model split over N ranks, one process each (docs/tensor-parallel.md).

`group`: the rank's collectives and the model-building context; `sharding`: which slice of each checkpoint tensor a
rank holds and the start-up checks; `rank`: a rank process's main; `executor`: rank 0's executor in the engine."""
