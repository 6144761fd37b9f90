"""cbbench.kernels"""
