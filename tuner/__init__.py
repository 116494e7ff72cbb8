"""cgtune: measure and tune vLLM's CUDA-graph capture sizes for one GPU, model and workload."""

__version__ = "0.1.0"
