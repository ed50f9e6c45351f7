"""The search query language: text in, a tree of nodes out, or an error that says where.

A query mixes full text with fields, config parameters and metrics::

    outcome:did_not_work label:moe recipe:tiny-moe weight_decay>0.05 eval/loss<3.2

Grammar (AND binds tighter than OR; NOT and a leading "-" bind tightest; the keywords AND,
OR, NOT and IN are upper case, except that ``name in (...)`` is also understood)::

    query    := or_expr?
    or_expr  := and_expr ("OR" and_expr)*
    and_expr := not_expr (["AND"] not_expr)*        two terms side by side: AND
    not_expr := ("NOT" | "-")* primary
    primary  := "(" or_expr ")" | term
    term     := FIELD ":" (value | list)             FIELD: state outcome confidence label
              | FIELD ("=" | "!=") value                    recipe author run failure
              | NAME "IN" list                       NAME: a FIELD, parameter or metric
              | NAME ("=" | "!=" | "<" | "<=" | ">" | ">=") value
              | word | "quoted phrase"               full text
    list     := "(" value ("," value)* ")"
    value    := word | "quoted phrase"

A NAME that is not a field is a config parameter (``data_mix.docs`` for a nested key) or, when
it contains "/", a metric key. ``parse_query`` turns text into a tree of nodes and raises
``QuerySyntaxError`` (with the position and what was expected) on anything it cannot read;
``proposals.search`` turns the tree into one filtered, ordered queryset.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from proposals.models import Confidence, Outcome, State
from runs.models import FailureKind, RunState

MAX_QUERY_LENGTH = 500
MAX_DEPTH = 8  # nested parentheses
MAX_TERMS = 24  # each parameter or metric term is a subquery: keep the work bounded
MAX_LIST = 20

# Field -> the values it takes (None: any). Values are compared lower case, "-" read as "_".
FIELDS: dict[str, tuple[str, ...] | None] = {
    "state": tuple(State.values),
    "outcome": (*Outcome.values, "none"),
    "confidence": (*Confidence.values, "none"),
    "label": None,
    "recipe": None,
    "author": None,
    "run": tuple(RunState.values),
    "failure": tuple(v for v in FailureKind.values if v),
}
COMPARISONS = ("=", "!=", "<", "<=", ">", ">=")
KEYWORDS = ("AND", "OR", "NOT", "IN")
NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
PARAMETER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
METRIC = re.compile(r"[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)+")
WORD_STOP = frozenset(' \t\r\n\f\v()",:<>=!')


class QuerySyntaxError(ValueError):
    """A query that cannot be read: where (0-based ``position``), what was expected."""

    def __init__(
        self,
        message: str,
        *,
        position: int,
        expected: Sequence[str] = (),
        found: str | None = None,
        query: str = "",
    ) -> None:
        self.message = message
        self.position = position
        self.expected = list(expected)
        self.found = found
        self.query = query
        super().__init__(f"{message} (column {self.column})")

    @property
    def column(self) -> int:
        return self.position + 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "detail": str(self),
            "message": self.message,
            "column": self.column,
            "position": self.position,
            "expected": self.expected,
            "found": self.found,
            "query": self.query,
        }


# ------------------------------------------------------------------------------ tokens


@dataclass(frozen=True)
class Token:
    kind: str  # WORD PHRASE LPAREN RPAREN COMMA COLON OP AND OR NOT IN EOF
    text: str
    start: int
    end: int

    def describe(self) -> str:
        if self.kind == "EOF":
            return "the end of the query"
        if self.kind == "PHRASE":
            return f'the phrase "{self.text}"'
        return f"'{self.text}'"


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    i, n = 0, len(text)
    singles = {"(": "LPAREN", ")": "RPAREN", ",": "COMMA", ":": "COLON", "=": "OP"}
    while i < n:
        char = text[i]
        if char.isspace():
            i += 1
        elif not char.isprintable():
            raise QuerySyntaxError(
                f"unexpected control character {char!r}", position=i, found=repr(char)
            )
        elif char in singles:
            tokens.append(Token(singles[char], char, i, i + 1))
            i += 1
        elif char in "<>!":
            operator = text[i : i + 2] if text[i + 1 : i + 2] == "=" else char
            if operator == "!":
                raise QuerySyntaxError(
                    "'!' must be followed by '=' (to exclude a term, put NOT or '-' before it)",
                    position=i,
                    expected=["'!='"],
                    found="'!'",
                )
            tokens.append(Token("OP", operator, i, i + len(operator)))
            i += len(operator)
        elif char == '"':
            i = _phrase(text, i, tokens)
        else:
            start = i
            while i < n and text[i] not in WORD_STOP and text[i].isprintable():
                i += 1
            word = text[start:i]
            tokens.append(Token(word if word in KEYWORDS else "WORD", word, start, i))
    tokens.append(Token("EOF", "", n, n))
    return tokens


def _phrase(text: str, start: int, tokens: list[Token]) -> int:
    chars: list[str] = []
    i = start + 1
    while i < len(text):
        char = text[i]
        if char == "\\" and i + 1 < len(text) and text[i + 1] in '"\\':
            chars.append(text[i + 1])
            i += 2
        elif char == '"':
            tokens.append(Token("PHRASE", "".join(chars), start, i + 1))
            return i + 1
        else:
            chars.append(char)
            i += 1
    raise QuerySyntaxError(
        "this quote is never closed",
        position=start,
        expected=["a closing '\"'"],
        found="the end of the query",
    )


# ------------------------------------------------------------------------------- nodes


@dataclass(frozen=True)
class Text:
    """A word or a quoted phrase, matched against title, summary, description, hypothesis."""

    text: str
    phrase: bool
    position: int

    def describe(self) -> str:
        return (
            '"' + self.text.replace("\\", "\\\\").replace('"', '\\"') + '"'
            if self.phrase
            else self.text
        )


@dataclass(frozen=True)
class FieldMatch:
    """``field:value`` or ``field IN (a, b)``: a proposal matching any of the values."""

    field: str
    values: tuple[str, ...]
    position: int

    def describe(self) -> str:
        shown = [_show(v) for v in self.values]
        return (
            f"{self.field}:{shown[0]}" if len(shown) == 1 else f"{self.field}:({', '.join(shown)})"
        )


@dataclass(frozen=True)
class Compare:
    """A config parameter or a metric compared with a value (IN: equal to any of them)."""

    kind: str  # "parameter" or "metric"
    name: str
    op: str  # one of COMPARISONS, or "IN"
    values: tuple[Any, ...]
    position: int

    def describe(self) -> str:
        shown = [_show(v) for v in self.values]
        if self.op == "IN":
            return f"{self.name} IN ({', '.join(shown)})"
        return f"{self.name}{self.op}{shown[0]}"


@dataclass(frozen=True)
class Not:
    child: Node

    def describe(self) -> str:
        inner = self.child.describe()
        return f"NOT ({inner})" if isinstance(self.child, And | Or) else f"NOT {inner}"


@dataclass(frozen=True)
class And:
    children: tuple[Node, ...]

    def describe(self) -> str:
        return " AND ".join(
            f"({c.describe()})" if isinstance(c, Or) else c.describe() for c in self.children
        )


@dataclass(frozen=True)
class Or:
    children: tuple[Node, ...]

    def describe(self) -> str:
        return " OR ".join(c.describe() for c in self.children)


Node = Text | FieldMatch | Compare | Not | And | Or


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value)
    if text and all(c not in WORD_STOP for c in text) and text not in KEYWORDS:
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass
class ParsedQuery:
    text: str
    root: Node | None
    texts: list[Text] = field(default_factory=list)

    def describe(self) -> str:
        return self.root.describe() if self.root is not None else ""


# ------------------------------------------------------------------------------ parser


def parse_query(text: str) -> ParsedQuery:
    """Read a query; raises QuerySyntaxError naming the position and what was expected."""
    try:
        if len(text) > MAX_QUERY_LENGTH:
            raise QuerySyntaxError(
                f"the query is too long ({len(text)} characters; at most {MAX_QUERY_LENGTH})",
                position=MAX_QUERY_LENGTH,
            )
        parser = _Parser(tokenize(text))
        root = parser.parse()
    except QuerySyntaxError as exc:
        exc.query = text
        raise
    return ParsedQuery(text=text, root=root, texts=parser.texts)


class _Parser:
    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.index = 0
        self.depth = 0
        self.terms = 0
        self.texts: list[Text] = []

    @property
    def peek(self) -> Token:
        return self.tokens[self.index]

    def advance(self) -> Token:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def fail(self, message: str, token: Token, expected: Sequence[str] = ()) -> QuerySyntaxError:
        return QuerySyntaxError(
            message, position=token.start, expected=expected, found=token.describe()
        )

    def parse(self) -> Node | None:
        if self.peek.kind == "EOF":
            return None
        node = self.or_expr()
        token = self.peek
        if token.kind == "RPAREN":
            raise self.fail("this ')' closes no '('", token, ["a term", "AND", "OR"])
        if token.kind != "EOF":
            raise self.fail(
                f"unexpected {token.describe()}", token, ["a term", "AND", "OR", "the end"]
            )
        return node

    def or_expr(self) -> Node:
        children = [self.and_expr()]
        while self.peek.kind == "OR":
            self.advance()
            children.append(self.and_expr())
        return children[0] if len(children) == 1 else Or(tuple(children))

    def and_expr(self) -> Node:
        children = [self.not_expr()]
        while True:
            kind = self.peek.kind
            if kind == "AND":
                self.advance()
            elif kind not in {"WORD", "PHRASE", "LPAREN", "NOT"}:
                break
            children.append(self.not_expr())
        flat: list[Node] = []
        for child in children:
            flat.extend(child.children if isinstance(child, And) else [child])
        return flat[0] if len(flat) == 1 else And(tuple(flat))

    def not_expr(self) -> Node:
        negate = False
        while True:
            token = self.peek
            if token.kind == "NOT" or (token.kind == "WORD" and token.text == "-"):
                self.advance()
                negate = not negate
            elif token.kind == "WORD" and token.text.startswith("-"):
                # "-label:moe": the minus excludes, the rest is the term
                self.tokens[self.index] = Token("WORD", token.text[1:], token.start + 1, token.end)
                negate = not negate
            else:
                break
        node = self.primary()
        return Not(node) if negate else node

    def primary(self) -> Node:
        token = self.peek
        if token.kind == "LPAREN":
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise self.fail(f"parentheses nest deeper than {MAX_DEPTH} levels", token)
            self.advance()
            if self.peek.kind == "RPAREN":
                raise self.fail("empty parentheses", self.peek, ["a term"])
            node = self.or_expr()
            closing = self.peek
            if closing.kind != "RPAREN":
                raise self.fail(
                    f"expected ')' to close the '(' at column {token.start + 1}, found "
                    f"{closing.describe()}",
                    closing,
                    ["')'", "AND", "OR", "a term"],
                )
            self.advance()
            self.depth -= 1
            return node
        if token.kind in {"WORD", "PHRASE"}:
            self.terms += 1
            if self.terms > MAX_TERMS:
                raise self.fail(f"too many terms (at most {MAX_TERMS})", token)
            return self.term()
        previous = self.tokens[self.index - 1] if self.index else None
        after = f" after {previous.describe()}" if previous else ""
        raise self.fail(
            f"expected a term{after}, found {token.describe()}",
            token,
            ["a word", "a quoted phrase", "field:value", "name<op>value", "'('"],
        )

    def term(self) -> Node:
        name = self.advance()
        following = self.peek
        if name.kind == "PHRASE":
            return self._text(name)
        if following.kind == "COLON":
            self.advance()
            return self._field_colon(
                name, Token("COLON", f"{name.text}:", name.start, following.end)
            )
        if following.kind == "IN" or (
            following.kind == "WORD"
            and following.text.lower() == "in"
            and self.tokens[self.index + 1].kind == "LPAREN"
        ):
            self.advance()
            values = self._list(following)
            return self._named_in(name, values)
        if following.kind == "OP":
            self.advance()
            return self._comparison(name, following)
        return self._text(name)

    def _text(self, token: Token) -> Text:
        node = Text(token.text, token.kind == "PHRASE", token.start)
        self.texts.append(node)
        return node

    def _value(self, after: Token) -> Token:
        token = self.peek
        if token.kind not in {"WORD", "PHRASE"}:
            raise self.fail(
                f"expected a value after {after.describe()}, found {token.describe()}",
                token,
                ["a value", "a quoted phrase"],
            )
        self.advance()
        if token.kind == "PHRASE":
            return token
        # label names may hold ':' (area:moe); glue "a:b" written without spaces
        text, end = token.text, token.end
        while (
            self.peek.kind == "COLON"
            and self.peek.start == end
            and self.tokens[self.index + 1].kind == "WORD"
            and self.tokens[self.index + 1].start == end + 1
        ):
            self.advance()
            part = self.advance()
            text, end = f"{text}:{part.text}", part.end
        return Token("WORD", text, token.start, end)

    def _list(self, after: Token) -> list[Token]:
        opening = self.peek
        if opening.kind != "LPAREN":
            raise self.fail(
                f"expected '(' after {after.describe()}, found {opening.describe()}",
                opening,
                ["'('"],
            )
        self.advance()
        values = [self._value(opening)]
        while self.peek.kind == "COMMA":
            comma = self.advance()
            values.append(self._value(comma))
            if len(values) > MAX_LIST:
                raise self.fail(f"a list holds at most {MAX_LIST} values", values[-1])
        closing = self.peek
        if closing.kind != "RPAREN":
            raise self.fail(
                f"expected ',' or ')' in the list opened at column {opening.start + 1}, found "
                f"{closing.describe()}",
                closing,
                ["','", "')'"],
            )
        self.advance()
        return values

    def _field_colon(self, name: Token, colon: Token) -> Node:
        field_name = name.text.lower()
        if field_name not in FIELDS:
            raise self._unknown_field(name)
        values = self._list(colon) if self.peek.kind == "LPAREN" else [self._value(colon)]
        return self._field_match(field_name, name, values)

    def _named_in(self, name: Token, values: list[Token]) -> Node:
        if name.text.lower() in FIELDS:
            return self._field_match(name.text.lower(), name, values)
        kind = self._kind_of(name)
        typed = [self._typed(v, kind=kind, op="=") for v in values]
        return Compare(kind, name.text, "IN", tuple(typed), name.start)

    def _comparison(self, name: Token, op: Token) -> Node:
        value = self._value(op)
        if name.text.lower() in FIELDS:
            if op.text not in {"=", "!="}:
                raise self.fail(
                    f"{name.text} takes ':', '=', '!=' or IN, not {op.describe()} "
                    "(compare numbers on config parameters and metrics)",
                    op,
                    ["':'", "'='", "'!='", "IN"],
                )
            match = self._field_match(name.text.lower(), name, [value])
            return Not(match) if op.text == "!=" else match
        kind = self._kind_of(name)
        return Compare(
            kind, name.text, op.text, (self._typed(value, kind=kind, op=op.text),), name.start
        )

    def _field_match(self, field_name: str, name: Token, values: list[Token]) -> FieldMatch:
        allowed = FIELDS[field_name]
        cleaned: list[str] = []
        for token in values:
            value = token.text.strip()
            if allowed is not None:
                value = value.lower().replace("-", "_").replace(" ", "_")
                if value not in allowed:
                    close = difflib.get_close_matches(value, allowed, n=1)
                    hint = f" Did you mean {close[0]}?" if close else ""
                    raise self.fail(
                        f"{field_name} cannot be {token.describe()}.{hint} "
                        f"It takes: {', '.join(allowed)}",
                        token,
                        list(allowed),
                    )
            elif field_name in {"label", "recipe"}:
                value = value.lower()
            if not value:
                raise self.fail(f"{field_name} needs a value", token, ["a value"])
            cleaned.append(value)
        return FieldMatch(field_name, tuple(dict.fromkeys(cleaned)), name.start)

    def _kind_of(self, name: Token) -> str:
        if "/" in name.text:
            if not METRIC.fullmatch(name.text):
                raise self.fail(
                    f"{name.describe()} is not a metric key (words separated by '/', "
                    "e.g. eval/loss)",
                    name,
                    ["a metric key"],
                )
            return "metric"
        if not PARAMETER.fullmatch(name.text) or "__" in name.text:
            raise self.fail(
                f"{name.describe()} is not a field, a config parameter (letters, digits, '_', "
                "dots for nested keys) or a metric key (with '/')",
                name,
                ["a field", "a config parameter", "a metric key"],
            )
        return "parameter"

    def _typed(self, token: Token, *, kind: str, op: str) -> Any:
        text = token.text
        if token.kind == "WORD" and NUMBER.fullmatch(text):
            number = float(text)
            if not math.isfinite(number):
                raise self.fail(f"{token.describe()} is too large a number", token, ["a number"])
            return int(text) if text.lstrip("+-").isdigit() else number
        if kind == "metric" or op not in {"=", "!="}:
            subject = "a metric" if kind == "metric" else f"'{op}'"
            raise self.fail(
                f"{subject} compares with a number, not {token.describe()}", token, ["a number"]
            )
        if token.kind == "WORD" and text.lower() in {"true", "false"}:
            return text.lower() == "true"
        return text

    def _unknown_field(self, name: Token) -> QuerySyntaxError:
        close = difflib.get_close_matches(name.text.lower(), FIELDS, n=1)
        hint = f" Did you mean {close[0]}?" if close else ""
        return self.fail(
            f"unknown field {name.describe()}.{hint} Fields: {', '.join(FIELDS)}. "
            "Compare a config parameter or a metric with =, <, > (weight_decay>0.05); "
            'put text with a colon in quotes ("a:b")',
            name,
            list(FIELDS),
        )
