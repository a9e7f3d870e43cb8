"""Parallel plans for the trainer: device mesh, CSBP, the CP baseline, sharding layouts.

Import the submodules directly (`turbo_dllm.train.parallel.csbp`, ...); importing this package
does no work.
"""
