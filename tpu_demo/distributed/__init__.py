"""Tensor parallelism over chips: the process group and mesh, lockstep serving, the CPU test shim."""
