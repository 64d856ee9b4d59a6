"""Model execution: the executors (`executor.TorchExecutor`, `mock_executor.MockExecutor`), a step's model inputs
(`inputs`), the CUDA-graph decode runner (`cuda_graphs`), the attention backends (`attention/`), the models
(`models/`), weight loading (`loader`) and the sampler (`sampler`)."""
