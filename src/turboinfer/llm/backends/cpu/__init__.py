"""What only a CPU runs: the linear kernels measured per machine at load (``kernels``,
``kernel_candidates``), the thread count measured the same way (``threads``), the
hand-written C kernels and step (``native/``), and the decode steps built on them
(``native_decode`` for a lone sequence, ``batch_decode`` for several)."""
