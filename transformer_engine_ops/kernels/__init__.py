"""Triton kernels and their launchers: what the ops and quantizers run on CUDA."""
