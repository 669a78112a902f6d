"""Skiff's own kernels: fused fp32 CPU ops (cpu.py, cpu_kernels.cpp)."""
