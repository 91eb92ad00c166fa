"""Generator configuration, read from ``[tool.transformer_engine_ops.codegen]``.

The qualified names that mean "quantizer", "tensor-or-quantized", "process
group" and "value type" are configuration, so the same generator reads another
codebase's bundles (TE's own, say) without a code change.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import tomllib

from .errors import ConfigError
from .safety import check_settings

CONFIG_TABLE = ("tool", "transformer_engine_ops", "codegen")
CONFIGURABLE_KINDS = ("tensor_or_quantized", "quantizer", "process_group", "value", "unsupported")


@dataclass(frozen=True)
class Config:
    root: Path
    namespace: str
    sources: tuple[str, ...]
    output_dir: str
    meta_type: str
    kinds: dict[str, str]  # qualified name -> configurable kind

    def kind_of(self, qualname: str) -> str | None:
        return self.kinds.get(qualname)


def _read_config(root: Path) -> Config:
    pyproject = root / "pyproject.toml"
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{pyproject}: cannot read the generator config: {exc}") from exc
    table = data
    for key in CONFIG_TABLE:
        table = table.get(key, {})
    if not table:
        raise ConfigError(f"{pyproject}: missing [{'.'.join(CONFIG_TABLE)}] table")
    try:
        kinds: dict[str, str] = {}
        for kind, names in table["kinds"].items():
            if kind not in CONFIGURABLE_KINDS:
                raise ConfigError(
                    f"{pyproject}: unknown kind {kind!r} in kinds; "
                    f"expected one of {', '.join(CONFIGURABLE_KINDS)}"
                )
            for name in names:
                kinds[name] = kind
        return Config(
            root=root,
            namespace=table["namespace"],
            sources=tuple(table["sources"]),
            output_dir=table["output_dir"],
            meta_type=table["meta_type"],
            kinds=kinds,
        )
    except KeyError as exc:
        raise ConfigError(f"{pyproject}: generator config lacks key {exc}") from exc


def load_config(root: Path) -> Config:
    """Read the settings and reject any that would reach generated code or paths unchecked."""
    config = _read_config(root)
    check_settings(config, root / "pyproject.toml", ".".join(CONFIG_TABLE))
    return config
