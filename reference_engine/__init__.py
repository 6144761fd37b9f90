"""cbbench.reference_engine"""
