"""`xspec generate --chat`: the checkpoint's chat template rendered as transformers' apply_chat_template renders
it (the same ids, so the same greedy reply), in jinja2's immutable sandbox: a template that reaches for a file
or Python's internals, loops without end or grows without bound is refused by name. The template comes from
tokenizer_config.json or chat_template.jinja, and an export writes it back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import xspec
from hf_checkpoints import BOS, EOS, saved_model
from test_hf_generation import checkpoint
from xspec.base.errors import UserError
from xspec.hf.importer import import_checkpoint

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

# A chat format in the word tokenizer's own words (none holding a special token's text, w1 or w2): w40 opens
# a turn, w41 closes it, w42 / w43 / w44 name the system, the user and the assistant.
TEMPLATE = ("{{ bos_token }} {% for message in messages %}w40 "
            "{{ {'system': 'w42', 'user': 'w43', 'assistant': 'w44'}[message['role']] }} {{ message['content'] }} "
            "w41 {% endfor %}{% if add_generation_prompt %}w40 w44 {% endif %}")
NEW = 8


def chat_checkpoint(tmp_path: Path, template: str = TEMPLATE, as_file: bool = False) -> Path:
    directory = checkpoint(tmp_path, "qwen3", adds_bos=False, generation=None, label="-chat")
    settings = json.loads((directory / "tokenizer_config.json").read_text())
    if as_file:
        (directory / "chat_template.jinja").write_text(template)
        settings["chat_template"] = "w99 {{ messages[0]['content'] }}"     # which chat_template.jinja replaces
    else:
        settings["chat_template"] = template
    (directory / "tokenizer_config.json").write_text(json.dumps(settings))
    return directory


@pytest.mark.parametrize("as_file", [False, True], ids=["tokenizer_config.json", "chat_template.jinja"])
def test_a_chat_prompt_is_the_templates_ids_and_the_reply_is_transformers(tmp_path, as_file, capsys):
    from xspec.cli import main

    directory, run = chat_checkpoint(tmp_path, as_file=as_file), tmp_path / "run"
    assert main(["import", str(directory), "-o", str(run)]) == 0
    assert f"xspec generate {run} --chat --prompt" in capsys.readouterr().out
    assert main(["show", str(run)]) == 0
    assert "its chat template kept (xspec generate --chat)" in capsys.readouterr().out
    messages = [{"role": "system", "content": "w35 w36"}, {"role": "user", "content": "w5 w7 w34"}]
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    expected = list(expected["input_ids"] if not isinstance(expected, list) else expected)
    assert expected == [BOS, 40, 42, 35, 36, 41, 40, 43, 5, 7, 34, 41, 40, 44]

    trained = xspec.load(run, device="cpu")
    generator = trained.generator(max_new_tokens=NEW, chat=True, system="w35 w36")
    assert generator.prompt_tokens(["w5 w7 w34"])[0] == [expected]
    with torch.no_grad():
        out = saved_model("qwen3").generate(torch.tensor([expected]), do_sample=False, max_new_tokens=NEW,
                                            eos_token_id=EOS, pad_token_id=0)
    reply = [t for t in out[0, len(expected):].tolist() if t != EOS]
    assert next(iter(generator.stream(["w5 w7 w34"])))[0] == reply
    assert main(["generate", str(run), "--chat", "--system", "w35 w36", "--prompt", "w5 w7 w34", "--max-new-tokens",
                 str(NEW)]) == 0
    assert capsys.readouterr().out.strip() == tokenizer.decode(reply, skip_special_tokens=True).strip()

    exported = tmp_path / "exported"
    assert main(["export", str(run), "--format", "hf", "-o", str(exported)]) == 0
    again = transformers.AutoTokenizer.from_pretrained(exported)
    assert again.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == \
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def test_chat_needs_a_template(tmp_path, capsys):
    from xspec.cli import main

    directory, run = checkpoint(tmp_path, "qwen3", adds_bos=False, generation=None), tmp_path / "run"
    assert main(["import", str(directory), "-o", str(run)]) == 0
    assert main(["show", str(run)]) == 0
    assert "no chat template" in capsys.readouterr().out
    assert main(["generate", str(run), "--chat", "--prompt", "w5"]) != 0
    assert "the checkpoint has no chat template (tokenizer_config.json's chat_template, or chat_template.jinja)" in \
        capsys.readouterr().err
    assert main(["generate", str(run), "--system", "w5", "--prompt", "w5"]) != 0
    assert "--system is a chat's system message: give --chat with it" in capsys.readouterr().err


HOSTILE = [
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "refused: the template tried what jinja2's sandbox forbids"),
    ("{{ cycler.__init__.__globals__.os.popen('id').read() }}", "refused: the template tried what jinja2's sandbox "
                                                               "forbids"),
    ("{% include '/etc/passwd' %}", r"refused: the template includes or imports another template \(a file\), "
                                    "which xspec never reads"),
    ("{% import 'x.j2' as x %}", "refused: the template includes or imports another template"),
    ("{% set _ = messages.append({'role': 'user', 'content': 'x'}) %}", "refused: the template tried what "
                                                                        "jinja2's sandbox forbids"),
    ("{% set ns = namespace(_secret=1) %}", "refused: the template tried what jinja2's sandbox forbids"),
    ("{{ raise_exception('roles must alternate user/assistant') }}", "roles must alternate user/assistant$"),
    # ~4 s of looping (left to finish in the background): past a budget of 0.5 s
    ("{% for i in range(100000) %}{% for j in range(150) %}{% endfor %}{% endfor %}",
     "rendering a conversation took more than 0.5 s .a template that loops without end"),
    ("{% for i in range(100000) %}{{ 'w5 ' * 100 }}{% endfor %}", "renders a conversation of more than 1,048,576 "
                                                                  "characters"),
    ("{{ messages[5]['content'] }}", r"cannot render the conversation \(list object has no element 5\)"),
]


@pytest.mark.parametrize("template, problem", HOSTILE, ids=[f"case{i}" for i in range(len(HOSTILE))])
def test_a_template_that_reaches_out_loops_or_grows_is_refused_by_name(tmp_path, monkeypatch, template, problem):
    from xspec.runtime import chat

    monkeypatch.setattr(chat, "RENDER_BUDGET_S", 0.5)
    directory, run = chat_checkpoint(tmp_path, template), tmp_path / "run"
    import_checkpoint(directory, run, say=lambda _: None)
    trained = xspec.load(run, device="cpu")
    with pytest.raises(UserError, match=f"tokenizer_config.json: chat_template: .*{problem}") as error:
        trained.generate(["w5"], chat=True, max_new_tokens=1)
    assert "\n" not in str(error.value) and "Traceback" not in str(error.value)


def test_a_template_that_does_not_parse_is_refused_at_import_naming_its_line(tmp_path):
    directory = chat_checkpoint(tmp_path, "{% for m in messages %}\n{{ m['content'] }\n{% endfor %}", as_file=True)
    with pytest.raises(UserError, match=r"chat_template.jinja: chat_template: line 2: unexpected '}'"):
        import_checkpoint(directory, tmp_path / "run", say=lambda _: None)
    settings = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "chat_template.jinja").unlink()
    (directory / "tokenizer_config.json").write_text(json.dumps({**settings, "chat_template": [
        {"name": "tool_use", "template": "{{ messages }}"}]}))
    with pytest.raises(UserError, match="tokenizer_config.json: chat_template: named templates .tool_use. and none "
                                        "named 'default'"):
        import_checkpoint(directory, tmp_path / "run2", say=lambda _: None)
