"""cbbench.harness"""
