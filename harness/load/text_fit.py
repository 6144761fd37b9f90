"""Text prompts of an exact token length on a server that exposes its tokenizer (`POST
/tokenize`, vLLM's shape; the reference engine serves it too), learnt once before a run.

Without a local tokenizer, text prompts are words (harness/load/prompts.py WORDS): about one
token per word on BPE vocabularies, but four or five on a byte tokenizer (the reference
engine's presets). Through /tokenize the client measures what each word costs on this server
(" w w w w" minus " w w", halved: a word with its leading space, in a run of words), what any
text costs beyond its words (a BOS token, the first word's space: `edge`), and what the chat
template adds around one user message (`chat_overhead`). A prompt of n tokens is then the
request's words while they fit, and the largest pieces that fit after (a piece of one token
must exist, so any remainder can be filled). The fit is checked on sample prompts before it is
used: a tokenizer on which costs do not add up gets no fit, and the run measures the mismatch
instead (run summary: prompt_token_mismatch).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import httpx
from cbbench.harness.client.endpoints import is_conversational

FILLERS = (".", ",", " a", " I", " x")  # short pieces to land on the exact length
CHECK_LENGTHS = (37, 256, 1000)  # sample prompts the fit must hit exactly
MAX_UNITS = 24  # words measured (2 calls each): variety enough, a start-up of ~60 calls


@dataclass(frozen=True)
class TextFit:
    units: tuple[tuple[str, int], ...]  # (a word with its leading space, its tokens)
    fillers: tuple[tuple[str, int], ...]  # pieces for the remainder, largest first
    edge: int  # tokens any text costs beyond its pieces (BOS, the start)
    chat_overhead: int | None  # chat prompt tokens - message tokens (None: not measured)
    source: str = "server /tokenize"

    def text(self, ids: Sequence[int], n: int) -> str:
        """Text of exactly `n` tokens (n > edge), its words chosen by `ids` (the request's
        own, deterministic from the seed; shared-prefix ids give a shared leading text)."""
        left = n - self.edge
        if left <= 0:  # shorter than what any text costs: the shortest text there is
            return self.fillers[-1][0]
        out: list[str] = []
        units = self.units
        for i in ids:
            piece, cost = units[i % len(units)]
            if cost > left:
                break
            out.append(piece)
            left -= cost
        while left > 0:
            piece, cost = next((p, c) for p, c in self.fillers if c <= left)
            out.append(piece)
            left -= cost
        return "".join(out)

    def to_dict(self) -> dict:
        return asdict(self)


class _Tokenize:
    def __init__(self, base_url: str, model: str, api_key: str | None, timeout_s: float):
        self.url = base_url.rstrip("/") + "/tokenize"
        self.model = model
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(headers=headers, timeout=timeout_s, trust_env=False)
        self.calls = 0

    def count(self, text: str | None = None, messages: list | None = None) -> int | None:
        body: dict = {"model": self.model}
        if messages is not None:
            body["messages"] = messages
        else:
            body["prompt"] = text
        self.calls += 1
        resp = self.http.post(self.url, json=body)
        if resp.status_code != 200:
            return None
        n = resp.json().get("count")
        return n if isinstance(n, int) else None


def fetch_text_fit(
    base_url: str,
    model: str,
    words: Sequence[str],
    api_key: str | None = None,
    timeout_s: float = 10.0,
) -> tuple[TextFit | None, str]:
    """The server's fit, or None with the reason (no /tokenize, costs that do not add up)."""
    try:
        tk = _Tokenize(base_url, model, api_key, timeout_s)
    except httpx.HTTPError as exc:  # pragma: no cover - bad URL already refused by probe
        return None, f"/tokenize: {exc}"
    try:
        return _fit(tk, words)
    except (httpx.HTTPError, ValueError) as exc:
        return None, f"/tokenize: {type(exc).__name__}: {exc}"
    finally:
        tk.http.close()


def _cost(tk: _Tokenize, piece: str) -> int | None:
    four, two = tk.count(piece * 4), tk.count(piece * 2)
    if four is None or two is None or (four - two) % 2:
        return None
    return (four - two) // 2


def _fit(tk: _Tokenize, words: Sequence[str]) -> tuple[TextFit | None, str]:
    if tk.count("the") is None:
        return None, "the server has no /tokenize"
    units = []
    for w in words[:MAX_UNITS]:
        c = _cost(tk, " " + w)
        if c is not None and c > 0:
            units.append((" " + w, c))
    fillers = []
    for f in FILLERS:
        c = _cost(tk, f)
        if c is not None and c > 0:
            fillers.append((f, c))
    fillers = sorted(set(fillers + units), key=lambda pc: -pc[1])
    if len(units) < 8 or not any(c == 1 for _, c in fillers):
        return None, "no one-token piece to fill a prompt to its exact length"
    fit = TextFit(tuple(units), tuple(fillers), 0, None)
    probe = fit.text(range(CHECK_LENGTHS[0]), CHECK_LENGTHS[0])
    n = tk.count(probe)
    if n is None:
        return None, "/tokenize failed on a sample prompt"
    fit = TextFit(fit.units, fit.fillers, n - CHECK_LENGTHS[0], None)
    for length in CHECK_LENGTHS:  # exact on sample prompts, or no fit at all
        if length <= fit.edge:
            continue
        got = tk.count(fit.text(range(7, 7 + length), length))
        if got != length:
            return None, f"a {length}-token sample prompt counted {got} (costs do not add up)"
    overhead = None
    sample = fit.text(range(3, 103), 100)
    chat = tk.count(messages=[{"role": "user", "content": sample}])
    if chat is not None:
        again = tk.count(messages=[{"role": "user", "content": fit.text(range(9, 309), 300)}])
        if again is not None and again - 300 == chat - 100:
            overhead = chat - 100
    return TextFit(fit.units, fit.fillers, fit.edge, overhead), f"fitted ({tk.calls} calls)"


def fit_text_prompts(cfg, plans: list) -> dict:
    """For a run (`cfg`: a BenchConfig) with text prompts (chat, responses, messages,
    --text-prompts) and no local tokenizer: the server's fit given to every worker plan, a
    line saying whether lengths are exact, and run.json's `text_prompts` entry ({} for
    token-id prompts)."""
    if not (cfg.text_prompts or is_conversational(cfg.endpoint)) or cfg.tokenizer:
        return {}
    from cbbench.harness.load.words import WORDS

    fit, why = fetch_text_fit(cfg.base_url, plans[0].client.model, WORDS, cfg.api_key)
    for p in plans:
        p.text_fit = fit
    if fit is not None:
        print("text prompts: exact lengths, fitted to the server's tokenizer through /tokenize",
              file=sys.stderr)  # fmt: skip
        return {"text_prompts": {"lengths": "exact", "how": f"server /tokenize: {why}",
                                 "fit": fit.to_dict()}}  # fmt: skip
    print(
        f"text prompts: approximate lengths (about one token per word): {why} and no "
        "--tokenizer was given; the summary reports the mismatch with the server's counts",
        file=sys.stderr,
    )
    return {"text_prompts": {"lengths": "approximate", "how": why}}
