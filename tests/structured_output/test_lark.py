"""Lark grammars (vLLM's ``guided_grammar`` takes them) converted to xgrammar's EBNF: the conversion, and generation
under a converted grammar with the default model."""

from __future__ import annotations

import pytest

from attnserve.structured_output.lark import LarkError, is_lark, lark_to_ebnf

SQL = """
// vLLM's example, with a comment and a continuation line
?start: select_statement
select_statement: "SELECT " column " from " table
    | "SELECT * from " table  // every column
column: "col_1" | "col_2"
table: "table_1" | "table_2"
"""


def test_lark_converts_to_ebnf():
    assert is_lark(SQL) and not is_lark('root ::= "a"')
    assert lark_to_ebnf(SQL).splitlines() == [
        "root ::= select_statement",
        'select_statement ::= "SELECT " column " from " table | "SELECT * from " table',
        'column ::= "col_1" | "col_2"',
        'table ::= "table_1" | "table_2"',
    ]
    assert lark_to_ebnf('start: "x" LETTER+\nLETTER: "a".."f"') == 'root ::= "x" LETTER+\nLETTER ::= [a-f]'
    assert lark_to_ebnf('start: "a//b" // note') == 'root ::= "a//b"'
    # string literals stay as written: neither renamed (start) nor read as a regex (/)
    assert lark_to_ebnf('start: "start" | "a /b" | start_x') == 'root ::= "start" | "a /b" | start_x'


@pytest.mark.parametrize(
    "grammar, says",
    [
        ("start: NUM\nNUM: /[0-9]+/", "line 2: a regex terminal"),
        ('%import common.WS\nstart: "a"', "line 1: the directive '%import'"),
        ('rule: "a"', "no 'start' rule"),
        ('start: "a"\n"b"', "line 2: '\"b\"' is neither"),
    ],
    ids=["regex", "import", "no_start", "stray_line"],
)
def test_what_has_no_ebnf_form_is_named(grammar, says):
    with pytest.raises(LarkError) as e:
        lark_to_ebnf(grammar)
    assert str(e.value).startswith(says)


def test_generation_under_a_lark_grammar(default_llm):
    from attnserve import SamplingParams
    from attnserve.core.structured_outputs import StructuredOutputsParams
    from attnserve.refusals import Refused

    params = SamplingParams(temperature=0, max_tokens=20, structured_outputs=StructuredOutputsParams(grammar=SQL))
    text = default_llm.generate(["A SQL query:"], params)[0].outputs[0].text
    tables, columns = ("table_1", "table_2"), ("col_1", "col_2", "*")
    assert any(text == f"SELECT {c} from {t}" for c in columns for t in tables), text
    bad = SamplingParams(max_tokens=2, structured_outputs=StructuredOutputsParams(grammar="start: /a+/"))
    with pytest.raises(Refused) as e:
        default_llm.generate(["x"], bad)
    assert e.value.path == ("structured_outputs", "grammar") and "regex terminal" in str(e.value)
