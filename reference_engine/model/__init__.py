"""The model: a Llama-family decoder over a flattened varlen batch (`llama`), its
mixture-of-experts variants Mixtral and Qwen2-MoE (`mixtral`, the expert block `moe`), its
config from an HF `config.json` and named random-weight shapes (`config`), HF-format loading
(`loader`), RoPE (`rope`), the tokenizer and chat template.

Layer: model (torch modules and weights; no scheduling).
Imports: kernels.
"""
