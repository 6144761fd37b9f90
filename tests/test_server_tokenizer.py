"""Tokenizers: the byte-level fallback and an HF tokenizer.json; streamed decoding equals the
full decode however the ids are split, including mid-character."""

from __future__ import annotations

import pytest
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.model.config import preset_config
from cbbench.reference_engine.model.tokenizer import (
    BYTE_OFFSET,
    ByteTokenizer,
    HFTokenizer,
    apply_chat_template,
    load_tokenizer,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

TINY = preset_config("tiny")
BYTES = load_tokenizer("tiny", TINY)


def stream_decode(tok, ids: list[int], cuts: list[int]) -> str:
    detok = tok.new_detokenizer()
    bounds = sorted({0, len(ids), *(c % (len(ids) + 1) for c in cuts)})
    text = "".join(detok.push(ids[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))
    return text + detok.flush()


def test_byte_tokenizer_is_the_fallback_and_documented_layout():
    assert isinstance(BYTES, ByteTokenizer)
    assert BYTES.encode("A") == [ord("A") + BYTE_OFFSET]
    assert BYTES.encode("é") == [0xC3 + BYTE_OFFSET, 0xA9 + BYTE_OFFSET]
    assert BYTES.eos_token_ids == (2,)
    assert BYTES.decode([1, 2, 0, 400, ord("h") + 3, ord("i") + 3]) == "hi"  # specials: no text


@given(st.text())
def test_byte_round_trip(text):
    assert BYTES.decode(BYTES.encode(text)) == text


@given(st.text(), st.lists(st.integers(0, 10_000), max_size=6))
def test_byte_stream_decode_holds_partial_characters(text, cuts):
    ids = BYTES.encode(text)
    detok = BYTES.new_detokenizer()
    pieces = []
    for tid in ids:  # one byte at a time: never a replacement character mid-stream
        pieces.append(detok.push([tid]))
    assert "\ufffd" not in "".join(pieces)
    assert "".join(pieces) + detok.flush() == text
    assert stream_decode(BYTES, ids, cuts) == text


@given(st.lists(st.integers(0, 511), max_size=40), st.lists(st.integers(0, 100), max_size=5))
def test_byte_stream_decode_of_random_ids_equals_full_decode(ids, cuts):
    assert stream_decode(BYTES, ids, cuts) == BYTES.decode(ids)


def test_special_ids_may_not_collide_with_bytes():
    with pytest.raises(EngineError, match="collides"):
        ByteTokenizer(512, bos_token_id=1, eos_token_ids=(65,))
    with pytest.raises(EngineError, match="vocab_size"):
        ByteTokenizer(200, None, ())


def test_chat_template():
    text = apply_chat_template([("system", "Be brief."), ("user", "Hi")])
    assert text == "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n"


CORPUS = [
    "hello world, the quick brown fox jumps over the lazy dog",
    "naïve café — déjà vu; 日本語のテキスト; emoji 🙂🚀 and more 🙂",
    "streaming tokens one by one: hello hello world world",
] * 20


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    folder = tmp_path_factory.mktemp("hf-model")
    tok.save(str(folder / "tokenizer.json"))
    return folder


def test_hf_tokenizer_json_is_used_when_present(hf_folder):
    tok = load_tokenizer(str(hf_folder), TINY)
    assert isinstance(tok, HFTokenizer)
    text = "hello 🙂 café"
    ids = tok.encode(text)
    assert len(ids) < len(text.encode())  # merges, not bytes
    assert tok.decode(ids) == text


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="helowrd 🙂éü日本", max_size=30), st.lists(st.integers(0, 100), max_size=5))
def test_hf_stream_decode_equals_full_decode(hf_folder, text, cuts):
    tok = load_tokenizer(str(hf_folder), TINY)
    ids = tok.encode(text)
    assert stream_decode(tok, ids, cuts) == tok.decode(ids) == text


def test_bad_tokenizer_file_is_an_engine_error(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(EngineError, match="cannot load tokenizer"):
        load_tokenizer(str(tmp_path), TINY)


def test_server_uses_the_model_folders_tokenizer(hf_folder):
    import openai
    from cbbench.reference_engine.config.engine_config import EngineConfig
    from cbbench.reference_engine.model.loader import save_random_model

    from tests.server_support import serve

    save_random_model("tiny", hf_folder)  # config.json + model.safetensors next to it
    tok = load_tokenizer(str(hf_folder), TINY)
    with serve(EngineConfig(model=str(hf_folder), max_model_len=64)) as (url, stack):
        assert isinstance(stack.tokenizer, HFTokenizer)
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        r = client.completions.create(
            model=str(hf_folder),
            prompt="hello world 🙂",
            max_tokens=8,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
        choice = r.choices[0]
        assert choice.prompt_token_ids == tok.encode("hello world 🙂")
        assert (
            r.usage.prompt_tokens == len(choice.prompt_token_ids) < len("hello world 🙂".encode())
        )
        assert choice.text == tok.decode(choice.token_ids)
