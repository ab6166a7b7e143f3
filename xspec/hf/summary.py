"""`xspec show` of a run directory `xspec import` wrote: where it came from, what each config attribute
became or why it changes nothing, the tokenizer, the verification, and the commands that go on from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xspec.base.errors import UserError
from xspec.base.text import printable, shown
from xspec.base.strict_json import read_json
from xspec.hf.spec_text import literal

IMPORT_FILE = "import.json"
MAX_RECORD_BYTES = 4 << 20


def is_import(run_dir: Path) -> bool:
    return (run_dir / IMPORT_FILE).is_file()


def import_summary(run_dir: Path) -> dict[str, Any]:
    path = run_dir / IMPORT_FILE
    record = read_json(path, MAX_RECORD_BYTES)
    if not (isinstance(record, dict) and isinstance(record.get("set"), list)):
        raise UserError(f"{shown(path)}: not an import record xspec wrote")
    import xspec

    spec = xspec.compile(run_dir)
    return {"run": str(run_dir), "imported_from": record.get("source"), "model_type": record.get("model_type"),
            "spec": {"name": spec.name, "extends": f"specs/modern/{record.get('family')}.xspec",
                     "parameters": spec.parameters},
            "set": record["set"], "not_architectural": record.get("not_architectural", {}),
            "tokenizer": record.get("tokenizer"), "verification": record.get("verification"),
            "commands": {"viz": f"xspec viz {run_dir}", "stats": f"xspec stats {run_dir}",
                         "generate": f"xspec generate {run_dir} --prompt \"...\" --beam 1",
                         "fine-tune": f"xspec train --init {run_dir} --train TEXT --valid TEXT -o RUN",
                         "export": f"xspec export {run_dir} --format hf -o DIR"}}


def render(summary: dict[str, Any]) -> str:
    lines = [f"import {summary['run']}",
             f"  from        {summary['imported_from']} (model_type {summary['model_type']})",
             f"  spec        {summary['spec']['name']}, extends {summary['spec']['extends']}, "
             f"{summary['spec']['parameters']:,} parameters"]
    for setting in summary["set"]:
        lines.append(f"  set         {setting['param']} = {literal(setting['value'])}   "
                     f"(config.json {setting['source']})")
    for key, reason in summary["not_architectural"].items():
        lines.append(f"  unchanged   {key}: {reason}")
    tokenizer = summary["tokenizer"] or {}
    settings = (tokenizer.get("hf_files") or {}).get("tokenizer_config.json") or {}
    chat = "its chat template kept (xspec generate --chat)" if settings.get("chat_template") else "no chat template"
    lines.append(f"  tokenizer   {tokenizer.get('kind')} (bos {tokenizer.get('bos_id')}, "
                 f"eos {tokenizer.get('eos_ids')}); {chat}")
    check = summary["verification"]
    if check and check.get("verified"):
        lines.append(f"  verified    max |Δlogit| {check['max_abs_logit_difference']:.3g}, KL {check['kl']:.3g} over "
                     f"{check['positions']} positions")
    else:
        lines.append(f"  verified    no ({(check or {}).get('reason', '--no-verify')})")
    lines += [f"  {name:<11} {command}" for name, command in summary["commands"].items()]
    return "\n".join(printable(line) for line in lines) + "\n"    # values come from files: escaped
