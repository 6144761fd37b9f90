"""The model's own chat template: the server renders chat prompts with it (as transformers
does, sandboxed), and the harness counts chat prompt tokens with it, so counts agree."""

from __future__ import annotations

import io
import json

import openai
import pytest
import transformers
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.model.loader import save_random_model
from cbbench.workloads.loader import build_from_spec
from cbbench.workloads.spec import RequestSpec, Workload
from rich.console import Console
from server_support import serve
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
WORDS = ["user", "assistant", "system"] + [
    f"{a}{b}" for a in "bcdfghjklmnp" for b in ("an", "el", "ix", "op", "ut", "ay", "ow", "ee")
]
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tokenizer_folder(folder, template: str | None = TEMPLATE):
    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()  # joins words with spaces: decode/encode round-trips
    tok.add_special_tokens(SPECIALS)
    tok.save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": {"content": "</s>"}}
    if template is not None:
        config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    save_random_model("tiny", folder)  # vocab 512 >= the tokenizer's
    return folder


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return _tokenizer_folder(tmp_path_factory.mktemp("chat-model"))


@pytest.fixture(scope="module")
def server(model):
    with serve(EngineConfig(model=str(model), max_model_len=512)) as (url, _):
        yield url


MESSAGES = [
    {"role": "system", "content": "bel kan"},
    {"role": "user", "content": "hix dop mut"},
    {"role": "assistant", "content": "gay"},
    {"role": "user", "content": "jow pee"},
]


def test_server_renders_the_models_template_as_transformers_does(model, server):
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(model / "tokenizer.json"), bos_token="<s>", eos_token="</s>"
    )
    expected = hf.apply_chat_template(
        MESSAGES, chat_template=TEMPLATE, add_generation_prompt=True, tokenize=True
    )
    if hasattr(expected, "keys"):  # transformers 5 returns a BatchEncoding
        expected = expected["input_ids"]
    client = openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0)
    r = client.chat.completions.create(
        model=str(model),
        messages=MESSAGES,
        max_tokens=3,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    ids = r.choices[0].model_extra["prompt_token_ids"]
    assert ids == list(expected)
    assert ids[0] == SPECIALS.index("<s>") and ids.count(SPECIALS.index("<|im_start|>")) == 5
    assert r.usage.prompt_tokens == len(ids)
    card = client.models.list().data[0].model_extra["cbbench"]
    assert card["chat_template"] == str(model / "tokenizer_config.json")


def test_template_errors_and_sandbox_are_400s(model, tmp_path):
    client = openai.OpenAI(max_retries=0, api_key="x", base_url="http://127.0.0.1:1/v1")
    with serve(EngineConfig(model=str(model), max_model_len=512)) as (url, _):
        client = client.with_options(base_url=url + "/v1")
        with pytest.raises(openai.BadRequestError, match="no tools here"):
            client.chat.completions.create(
                model=str(model),
                messages=[  # a well-formed tool turn: the template itself refuses it
                    {"role": "user", "content": "hi"},
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{}"},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "c1", "content": "x"},
                ],
                max_tokens=2,
            )
    evil = _tokenizer_folder(tmp_path, "{{ ''.__class__.__mro__[1].__subclasses__() }}")
    with serve(EngineConfig(model=str(evil), max_model_len=512)) as (url, _):
        client = client.with_options(base_url=url + "/v1")
        with pytest.raises(openai.BadRequestError, match="chat template"):
            client.chat.completions.create(
                model=str(evil), messages=[{"role": "user", "content": "x"}], max_tokens=2
            )


def _run(url, wl, tmp_path, **kw):
    cfg = BenchConfig(
        base_url=url, workload=wl, out_dir=tmp_path / "run", live=False, endpoint="chat", **kw
    )
    return run_bench(cfg, console=Console(file=io.StringIO()))


def test_client_and_server_chat_prompt_counts_agree(model, server, tmp_path):
    wl = Workload("t", 0, tuple(RequestSpec(i, 10 + i, 3) for i in range(4)))
    res = _run(server, wl, tmp_path, tokenizer=str(model), concurrency=2)
    assert all(r.ok for r in res.records)
    for r in res.records:  # the template adds its tokens; both sides count them
        assert r.prompt_tokens_client == r.prompt_tokens_server > r.prompt_len
    assert res.summary["counts"]["prompt_token_mismatch"] == 0


def test_session_chat_prompt_counts_agree(model, server, tmp_path):
    spec = {
        "prompt": {"dist": "constant", "value": 12},
        "output": {"dist": "constant", "value": 4},
        "session": {"turns": {"dist": "constant", "value": 3}},
    }
    wl = build_from_spec(spec, "s", "spec", seed=0, num_requests=6)
    res = _run(server, wl, tmp_path, tokenizer=str(model / "tokenizer.json"), concurrency=2)
    assert all(r.ok for r in res.records)
    assert all(r.prompt_tokens_client == r.prompt_tokens_server for r in res.records)
    assert res.summary["counts"]["prompt_token_mismatch"] == 0
    assert max(r.prompt_tokens_server for r in res.records if r.turn == 3) > 3 * 12
