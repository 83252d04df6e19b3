"""The ``nnx-ppo`` command line: training runs, their directories, progress and plots."""
