"""cbbench.workloads"""
