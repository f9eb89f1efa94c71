"""What people read about the keys: ``--help`` and README's key table, made from the schema
(engine/config/schema.py through :mod:`shardmd.engine.config.compose`'s ``SCHEMA``)."""
from __future__ import annotations

from shardmd.engine.config import schema
from shardmd.engine.config.compose import _OWN, DEFAULT_CHOICES, GROUPS, SCHEMA, KeyInfo, _flat, hydra_value


def _group_help(group: str) -> str:
    text = f"{schema.GROUP_HELP[group]}: " + ", or ".join(
        f"{name} ({cls.__doc__.strip()})" if name != schema.OPEN_CHOICES.get(group) else cls.__doc__.strip()
        for name, cls in schema.GROUPS[group].items())
    for (g, choice), changes in schema.GROUP_DEFAULTS.items():
        if g == group:
            text += f"; {group}={choice} also sets " + " ".join(f"{k}={hydra_value(v)}" for k, v in _flat(changes))
    return text


def _default_text(info: KeyInfo) -> str:
    return hydra_value(info.default, spaced=True)


def _key_text(info: KeyInfo) -> tuple[str, str]:
    """(default, description) of a key for --help and README; a key several choices share
    shows each choice's own default and help where they differ."""
    if not info.owners:
        return _default_text(info), info.help
    own = [(o.split("=")[1], _OWN[(info.path, o)]) for o in info.owners]
    defaults = {_default_text(k) for _, k in own}
    default = defaults.pop() if len(defaults) == 1 else ", ".join(f"{_default_text(k)} ({c})" for c, k in own)
    if len({k.help for _, k in own}) == 1:
        return default, ", ".join(c for c, _ in own) + ": " + info.help
    return default, "; ".join(f"{c}: {k.help}" for c, k in own)


#: every key users may set: (default shown in help, description)
KEYS: dict[str, tuple[str, str]] = {
    **{g: ("(required)" if DEFAULT_CHOICES.get(g) is None else DEFAULT_CHOICES[g], _group_help(g)) for g in GROUPS},
    **{k: _key_text(i) for k, i in SCHEMA.items()},
}
def help_text(width: int = 100) -> str:
    import textwrap

    kw = max(len(k) for k in KEYS)
    dw = 18
    lines = []
    for k, (d, desc) in KEYS.items():
        head = f"  {k:<{kw}}  {d:<{dw}} "
        if len(head) > kw + dw + 5:
            lines.append(head.rstrip())
            head = " " * (kw + dw + 5)
        lines += textwrap.wrap(desc, width, initial_indent=head, subsequent_indent=" " * (kw + dw + 5)) or [head]
    return "\n".join(lines)


def readme_table() -> str:
    """README's key table (tests/test_readme.py checks README holds exactly this)."""
    rows = ["| key | default | meaning |", "|---|---|---|"]
    rows += [f"| `{k}` | `{d}` | {desc} |" if not d.startswith("(") else f"| `{k}` | {d} | {desc} |"
             for k, (d, desc) in KEYS.items()]
    return "\n".join(rows)
