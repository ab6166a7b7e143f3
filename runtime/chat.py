"""Chat templates: an imported checkpoint's conversation format (tokenizer_config.json's chat_template, or
chat_template.jinja), rendered as transformers renders it, in jinja2's immutable sandbox.

A template is untrusted: it comes with the checkpoint. The sandbox gives it no file loader and no attribute
that reaches Python's internals, and it cannot change the messages it reads; a template that tries is
refused, naming what it tried. It renders within a time budget and a size bound, so a template that loops
or grows without end is refused too, never a hang. What it can use is what transformers gives it: the
loop controls, `raise_exception`, `strftime_now`, `tojson` without HTML escaping, `dict`, `namespace`
(no names starting with "_"), the `{% generation %}` block, and the special tokens as strings."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Callable, Sequence

from xspec.base.errors import UserError
from xspec.base.text import printable

MAX_RENDERED_CHARACTERS = 1 << 20         # a rendered conversation: xspec's longest line
RENDER_BUDGET_S = 5.0
# tokenizer_config.json's keys of the special tokens a template may write (transformers passes each one
# it has as a string: `{{ bos_token }}`).
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
DEFAULT_NAME = "default"


class ChatTemplate:
    """A compiled template; `origin` names it in errors ("DIR/tokenizer_config.json: chat_template")."""

    def __init__(self, source: str, origin: str, special_tokens: dict[str, str]) -> None:
        import jinja2

        self.source, self.origin, self.special_tokens = source, origin, special_tokens
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as error:
            raise UserError(f"{origin}: line {error.lineno}: {printable(error.message or 'not a template')}") \
                from None

    def render(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The conversation as the model reads it (the template writes any special tokens itself)."""
        from .bounded_calls import CallFailed, Overtime, bounded

        try:
            text, problem = bounded(lambda: self._render(messages, add_generation_prompt), RENDER_BUDGET_S)
        except Overtime:
            raise UserError(f"{self.origin}: rendering a conversation took more than {RENDER_BUDGET_S:g} s "
                            "(a template that loops without end?)") from None
        except CallFailed as failed:
            raise UserError(f"{self.origin}: cannot render the conversation ({failed.reason})") from None
        if problem is not None:
            raise UserError(f"{self.origin}: {problem}")
        return text

    def _render(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool) -> tuple[str, str | None]:
        """(the text, None), or ("", what stopped it)."""
        import jinja2
        from jinja2.sandbox import SecurityError

        pieces, size = [], 0
        context = {**self.special_tokens, "messages": [dict(m) for m in messages], "tools": None,
                   "documents": None, "add_generation_prompt": add_generation_prompt}
        try:
            for piece in self._template.generate(**context):
                size += len(piece)
                if size > MAX_RENDERED_CHARACTERS:
                    return "", f"renders a conversation of more than {MAX_RENDERED_CHARACTERS:,} characters"
                pieces.append(piece)
        except SecurityError as error:
            return "", (f"refused: the template tried what jinja2's sandbox forbids ({printable(str(error))}); "
                        "it may read its messages, not change them or reach Python's internals")
        except TypeError as error:
            if "no loader" in str(error):
                return "", ("refused: the template includes or imports another template (a file), which xspec "
                            "never reads")
            return "", f"cannot render the conversation ({printable(str(error))})"
        except jinja2.UndefinedError as error:
            return "", f"cannot render the conversation ({printable(str(error))})"
        except jinja2.TemplateError as error:       # the template's own raise_exception(...)
            return "", printable(str(error))
        except (ValueError, KeyError, AttributeError, IndexError, ZeroDivisionError, OverflowError,
                RecursionError) as error:
            return "", f"cannot render the conversation ({type(error).__name__}: {printable(str(error))})"
        return "".join(pieces), None


def chat_template(settings: dict, origin: str) -> ChatTemplate | None:
    """tokenizer_config.json's (`settings`) chat template, or None; a list of named templates gives its
    "default" one, as transformers' apply_chat_template takes it."""
    value = settings.get("chat_template")
    if value is None:
        return None
    where = f"{origin}: chat_template"
    if isinstance(value, list):
        named = {}
        for i, entry in enumerate(value):
            if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)
                    and isinstance(entry.get("template"), str)):
                raise UserError(f"{where}[{i}]: expected an object with a name and a template")
            named[entry["name"]] = entry["template"]
        if DEFAULT_NAME not in named:
            raise UserError(f"{where}: named templates ({', '.join(map(printable, named))}) and none named "
                            f"{DEFAULT_NAME!r}, which transformers uses without a name given")
        value, where = named[DEFAULT_NAME], f"{where} {DEFAULT_NAME!r}"
    if not isinstance(value, str):
        raise UserError(f"{where}: expected a template (a string) or a list of named templates")
    return ChatTemplate(value, where, special_tokens(settings, origin))


def special_tokens(settings: dict, origin: str) -> dict[str, str]:
    """The special tokens' text, as tokenizer_config.json gives them (a string, or an object whose content
    is one)."""
    found = {}
    for key in SPECIAL_TOKENS:
        value = settings.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if value is None:
            continue
        if not isinstance(value, str):
            raise UserError(f"{origin}: {key}: expected a token's text")
        found[key] = value
    return found


def _environment():
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

    class Generation(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}`: marks an assistant's tokens for training masks in
        transformers; rendered as its body."""

        tags = {"generation"}

        def parse(self, parser):
            line = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(line)

        def _body(self, caller: Callable[[], str]) -> str:
            return caller()

    class Namespace(jinja2.utils.Namespace):
        """jinja2's namespace, refusing names that start with "_"."""

        def __init__(*args: Any, **kwargs: Any) -> None:
            self, values = args[0], dict(*args[1:], **kwargs)
            for name in values:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, values)

        def __setitem__(self, name: str, value: Any) -> None:
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: object) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise SecurityError(f"a namespace attribute named {name!r}")

    def raise_exception(message: object) -> None:
        raise jinja2.TemplateError(str(message))

    def tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[Generation, jinja2.ext.loopcontrols])
    environment.filters["tojson"] = tojson
    environment.globals.update(raise_exception=raise_exception, namespace=Namespace,
                               strftime_now=lambda form: datetime.now().strftime(form),
                               dict=lambda *args, **kwargs: dict(*args, **kwargs))
    return environment
