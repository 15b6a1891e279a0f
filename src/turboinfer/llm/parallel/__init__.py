"""One model across several processes: tensor parallelism (attention heads and MLP
channels split over ranks) and expert parallelism (experts split over ranks)."""

from turboinfer.llm.parallel.group import ParallelGroup

__all__ = ["ParallelGroup"]
