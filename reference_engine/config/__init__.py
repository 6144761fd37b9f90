"""Engine settings in one place: `EngineConfig` and its per-policy sub-configs
(`engine_config`, `policy_config`, `speculative_config`), the metadata that makes a field a
flag (`flags`) and the one flag registry every command uses (`options`).

Layer: engine settings (the bottom of the engine).
Imports: nothing.
"""
