"""The grammar engine: xgrammar compiles a constraint against the tokenizer's vocabulary and makes matchers.

Compiled grammars are cached by (kind, source, whitespace option): the requests of one schema compile it once.
An invalid schema, regex or grammar is a :class:`~attnserve.refusals.Refused` naming the field and the grammar
engine's reason; a missing xgrammar is a refusal naming the extra that installs it.
"""

from __future__ import annotations

import json
import re
import threading

from attnserve.core.structured_outputs import StructuredOutputsParams
from attnserve.structured_output.lark import is_lark, lark_to_ebnf
from attnserve.refusals import Refused
from attnserve.refusals.sampling import NO_XGRAMMAR, invalid_constraint
from attnserve.refusals.sampling import STRUCTURED_EXTRA as EXTRA  # noqa: F401 (re-exported)

_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


def _reason(e: Exception) -> str:
    """The first line of a grammar engine's error, without xgrammar's ``[12:00:00] /project/cpp/x.cc:94: `` prefix
    (the exception's type name when it says nothing)."""
    text = str(e).strip()
    return _LOG_PREFIX.sub("", text.splitlines()[0]) if text else type(e).__name__


def import_xgrammar():
    """The xgrammar module; :class:`Refused` naming the extra when it is not installed."""
    try:
        import xgrammar
    except ImportError:
        raise Refused(NO_XGRAMMAR) from None
    return xgrammar


def choice_grammar(choices: list[str]) -> str:
    """EBNF whose language is exactly ``choices`` (JSON string escapes are EBNF's too)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


class XgrammarBackend:
    """Compiles constraints for one tokenizer (thread-safe: the server compiles on its tokenizer thread while the
    engine's thread adds requests); the matchers run in the grammar process (``grammar_process.py``)."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int]) -> None:
        xgr = import_xgrammar()
        self.xgr = xgr
        # the tokens the matchers and bitmasks cover: the tokenizer's, when the model's vocabulary (the logits'
        # width, ``vocab_size``) pads past them; the padding ids are then never allowed (bitmask.py masks them
        # on the device). Covering them here would make each of them an xgrammar "special token", which its
        # accept_token looks up linearly (see docs/benchmarks.md, structured outputs).
        self.vocab_size = min(vocab_size, tokenizer_size(tokenizer))
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size, stop_token_ids=stop_token_ids)
        self.info = info
        self.compiler = xgr.GrammarCompiler(info, max_threads=8)
        # a matcher (terminate_without_stop_token off, xgrammar's default) terminates only by accepting one of these
        self.stop_token_ids = frozenset(info.stop_token_ids)
        self._cache: dict[tuple[str, str, bool], object] = {}
        self._lock = threading.Lock()

    def compile(self, params: StructuredOutputsParams):
        """The compiled grammar of ``params`` (cached); Refused for a constraint xgrammar rejects."""
        key = (params.kind, params.source, params.disable_any_whitespace)
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None:
            return hit
        kind = params.kind
        c = self.compiler
        try:
            if kind == "json":
                schema = params.json if isinstance(params.json, str) else json.dumps(params.json)
                bad = self._unsupported_pattern(json.loads(schema))
                if bad is not None:  # xgrammar would drop the feature from the pattern, and constrain less
                    raise ValueError(bad)
                compiled = c.compile_json_schema(schema, any_whitespace=not params.disable_any_whitespace)
            elif kind == "json_object":  # an object, not any JSON value (vLLM compiles the same schema)
                compiled = c.compile_json_schema('{"type": "object"}', any_whitespace=not params.disable_any_whitespace)
            elif kind == "regex":
                compiled = c.compile_regex(params.regex)
            elif kind == "choice":
                compiled = c.compile_grammar(choice_grammar(params.choice))
            else:  # xgrammar's EBNF, or Lark (vLLM takes either): converted, or LarkError says what cannot be
                grammar = lark_to_ebnf(params.grammar) if is_lark(params.grammar) else params.grammar
                compiled = c.compile_grammar(grammar)
        except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError / ValueError / its own errors
            raise Refused(invalid_constraint(kind, getattr(params, kind), _reason(e))) from None
        with self._lock:
            self._cache[key] = compiled
        return compiled

    def _unsupported_pattern(self, schema) -> str | None:
        """The first ``pattern`` of a JSON schema that xgrammar's regex reader refuses (a lookahead, a word boundary),
        as ``pattern '(?=a)b': <its reason>``; None when there is none. A schema's patterns compile without those
        features (xgrammar logs that it ignores them), so the output would not match the pattern."""
        nodes = [schema]
        while nodes:
            node = nodes.pop()
            if isinstance(node, list):
                nodes.extend(node)
            elif isinstance(node, dict):
                pattern = node.get("pattern")
                if isinstance(pattern, str):
                    try:
                        self.xgr.Grammar.from_regex(pattern)
                    except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError / its own errors
                        return f"pattern {pattern!r}: {_reason(e)}"
                nodes.extend(node.values())
        return None

    def tokenizer_info_json(self) -> str:
        """The tokenizer's vocabulary and stop tokens as xgrammar serializes them (for the grammar process)."""
        return self.info.serialize_json()


def batch_accept(xgr, matchers: list, tokens: list[int], stop_token_ids: frozenset[int]) -> list[int]:
    """Advance ``matchers[i]`` by ``tokens[i]`` in one batched call; the indices whose matcher rejected its token
    or terminated (accepted a stop token).

    The all-accepted case, every step's, costs one membership test on the results instead of a conversion of each
    (xgrammar's own batched accept over matcher handles; its Python wrapper converts each result, one foreign call
    apiece), and termination is asked only of the matchers that took a stop token."""
    core = getattr(getattr(xgr, "base", None), "_core", None)
    raw = getattr(getattr(core, "BatchGrammarMatcher", None), "batch_accept_token", None)
    if callable(raw) and hasattr(xgr.GrammarMatcher, "_handle"):
        results = raw([m._handle for m in matchers], tokens, False)
    elif hasattr(xgr.BatchGrammarMatcher, "batch_accept_token"):  # xgrammar >= 0.2's wrapper
        results = xgr.BatchGrammarMatcher.batch_accept_token(matchers, tokens)
    else:
        results = [m.accept_token(t) for m, t in zip(matchers, tokens)]
    if 0 in results:  # a rejection (False == 0 in the list of older xgrammar versions)
        results = [bool(r) for r in results]
        return [i for i, (m, ok) in enumerate(zip(matchers, results)) if not ok or m.is_terminated()]
    return [i for i, t in enumerate(tokens) if t in stop_token_ids and matchers[i].is_terminated()]


def tokenizer_size(tokenizer) -> int:
    """1 + the largest token id the tokenizer knows (added tokens included)."""
    return max(len(tokenizer), 1 + max(tokenizer.get_vocab().values(), default=-1))
