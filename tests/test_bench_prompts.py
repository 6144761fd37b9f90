import pytest
from cbbench.harness.errors import CbbenchError
from cbbench.harness.load.prompts import PromptBuilder
from tokenizers import Tokenizer, decoders, models, pre_tokenizers


def test_token_ids_exact_length_and_deterministic():
    a, b = PromptBuilder(seed=1), PromptBuilder(seed=1)
    for n in (1, 7, 300):
        ids = a.token_ids(5, n)
        assert len(ids) == n and ids == b.token_ids(5, n)
        assert all(10 <= i < 500 for i in ids)
    assert a.token_ids(5, 50) != a.token_ids(6, 50)
    assert a.token_ids(5, 50) != PromptBuilder(seed=2).token_ids(5, 50)


def test_shared_prefix_ids_give_a_shared_token_prefix():
    pb = PromptBuilder(seed=0, prefix_block_size=16)
    x = pb.token_ids(0, 40, prefix_ids=(7, 8))
    y = pb.token_ids(1, 50, prefix_ids=(7, 8, 9))
    z = pb.token_ids(2, 40, prefix_ids=(7, 3))
    assert x[:32] == y[:32]
    assert x[:16] == z[:16] and x[16:32] != z[16:32]
    assert x[32:] != y[32:40]  # request-own tail differs
    assert len(pb.token_ids(3, 10, prefix_ids=(7, 8))) == 10  # prefix truncated to fit


def test_text_without_tokenizer_is_one_word_per_token():
    text = PromptBuilder(seed=0).text(3, 25)
    assert len(text.split()) == 25


def _word_tokenizer(path):
    words = [a + b for a in "bcdfghklm" for b in "aeiou"]  # 45 plain words, + 20 below
    words += [a + "o" + b for a in "ptrs" for b in "dgnst"]
    vocab = {"[UNK]": 0} | {w: i + 1 for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.save(str(path))
    return tok


def test_text_with_tokenizer_encodes_to_exact_length(tmp_path):
    tok = _word_tokenizer(tmp_path / "tokenizer.json")
    pb = PromptBuilder(seed=0, tokenizer_path=str(tmp_path))
    for n in (1, 33, 128):
        text = pb.text(4, n, prefix_ids=(1,))
        assert len(tok.encode(text, add_special_tokens=False).ids) == n
        assert pb.count(text) == n


def test_missing_tokenizer_is_a_clear_error(tmp_path):
    with pytest.raises(CbbenchError, match="no tokenizer.json"):
        PromptBuilder(tokenizer_path=str(tmp_path))
