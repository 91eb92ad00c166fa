"""Reading another codebase's source: name resolution across modules, module-level blocks,
declaration forms and ops declared in the configuration (synthetic packages, no TE needed)."""

from __future__ import annotations

import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from codegen.config import ConfiguredOp, DeclarationForm, Reading
from codegen.errors import CodegenError
from codegen.reader import read_source

FORM = DeclarationForm(
    "pkg.dynamo.custom_op.register_custom_op",
    {
        "op_name": "name",
        "fwd_arg_type": "forward",
        "bwd_arg_type": "backward",
        "input_tensors_for_grad": "grad_fields",
        "fwd_impl": "forward_impl",
        "fwd_fake_impl": "forward_spec",
        "setup_context": "setup_context",
        "bwd_impl": "backward_impl",
        "bwd_fake_impl": "backward_spec",
    },
    registration=False,
)

PACKAGE = {
    "pkg/__init__.py": "",
    "pkg/constants.py": "import torch.distributed\ngroup_type = torch.distributed.ProcessGroup\n",
    "pkg/dynamo/__init__.py": "from .custom_op import register_custom_op, TensorOrQuantized\n",
    "pkg/dynamo/custom_op.py": (
        "from typing import Union\nimport torch\n"
        "TensorOrQuantized = Union[torch.Tensor, int]\n"
        "def register_custom_op(**kw):\n    return None\n"
    ),
}

MODULE = """
from dataclasses import dataclass
from typing import Optional
import torch
from ..constants import group_type
from ..dynamo import TensorOrQuantized, register_custom_op

if torch.cuda.is_available():
    import os
elif False:
    import sys
else:
    FLAG = 1
try:
    import flash
except ImportError:
    flash = None
else:
    HAVE = True
finally:
    DONE = True
with open(__file__) as f:
    pass

@dataclass(slots=True)
class FwdArgs:
    weight: TensorOrQuantized
    group: Optional[group_type]
    scale: float = DEFAULT_SCALE

    def reason(self) -> Optional[str]:
        return None

@dataclass(slots=True)
class BwdArgs:
    grad_output: Optional[torch.Tensor] = None
    inp: Optional[torch.Tensor] = None

def fwd(a): ...
def fake(a): ...
def setup(*a): ...
def bwd(a): ...
def bwd_fake(a): ...

_op = register_custom_op(
    op_name="mine", input_tensors_for_grad=["weight"], fwd_arg_type=FwdArgs,
    fwd_impl=fwd, fwd_fake_impl=fake, setup_context=setup, bwd_arg_type=BwdArgs,
    bwd_impl=bwd, bwd_fake_impl=bwd_fake,
)
"""


@pytest.fixture
def source_root(tmp_path: Path) -> Path:
    for rel, text in PACKAGE.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")
    return tmp_path


def _config(repo_config, root: Path, **reading):
    kinds = dict(repo_config.kinds)
    kinds["pkg.dynamo.custom_op.TensorOrQuantized"] = "tensor_or_quantized"
    return replace(
        repo_config,
        kinds=kinds,
        reading=Reading(source_root=root, forms=(*Reading().forms, FORM), **reading),
    )


def test_te_style_module_resolves_reexports_and_aliases_and_reads_its_declaration(
    repo_config, source_root: Path
) -> None:
    config = _config(repo_config, source_root)
    text = MODULE.replace("DEFAULT_SCALE", "1.0")
    (op,) = read_source("pkg/module/mod.py", text, config).ops
    kinds = {f.name: f.type.kind.value for f in op.forward.fields}
    assert kinds == {"weight": "tensor-or-quantized", "group": "process group", "scale": "scalar"}
    assert op.name == "mine" and op.grad_fields == ("weight",)
    assert op.impls is None  # TE's contracts: boundary only
    assert op.backward.field("grad_output").type.kind.value == "tensor"


def test_a_default_naming_an_imported_constant_is_accepted(repo_config, source_root) -> None:
    config = _config(repo_config, source_root)
    text = MODULE.replace("DEFAULT_SCALE", "group_type")
    (op,) = read_source("pkg/module/mod.py", text, config).ops
    assert op.forward.field("scale") is not None


def test_an_unmapped_keyword_of_a_declaration_form_is_positioned(repo_config, source_root):
    config = _config(repo_config, source_root)
    text = MODULE.replace("DEFAULT_SCALE", "1.0").replace('op_name="mine"', 'opname="mine"')
    with pytest.raises(CodegenError) as info:
        read_source("pkg/module/mod.py", text, config)
    assert "unknown register_custom_op argument `opname`" in str(info.value)
    assert str(info.value.location).startswith("pkg/module/mod.py:")


def test_an_alias_expanding_to_a_mixed_union_is_reported_where_it_is_defined(
    repo_config, source_root: Path
) -> None:
    config = replace(_config(repo_config, source_root), kinds=dict(repo_config.kinds))
    with pytest.raises(CodegenError) as info:
        read_source("pkg/module/mod.py", MODULE.replace("DEFAULT_SCALE", "1.0"), config)
    assert str(info.value.location) == "pkg/dynamo/custom_op.py:3:21"
    assert "mixed union" in info.value.message


def test_an_op_declared_in_the_configuration_is_boundary_only(repo_config, source_root):
    text = textwrap.dedent(
        """
        from dataclasses import dataclass
        from typing import Optional
        import torch
        try:
            import flash
        except ImportError:
            pass
        else:
            X = 1

        @dataclass(slots=True)
        class AttnFwd:
            q: torch.Tensor
            p: float

        @dataclass(slots=True)
        class AttnBwd:
            grad_output: Optional[torch.Tensor] = None
        """
    )
    op = ConfiguredOp("pkg/attn.py", "attn", "AttnFwd", "AttnBwd", ("q",))
    config = _config(repo_config, source_root, ops=(op,))
    (read,) = read_source("pkg/attn.py", text, config).ops
    assert (read.name, read.forward.name, read.backward.name, read.impls) == (
        "attn",
        "AttnFwd",
        "AttnBwd",
        None,
    )
    bad = ConfiguredOp("pkg/attn.py", "attn", "AttnFwd", "AttnBwd", ("p",))
    with pytest.raises(CodegenError, match="`AttnFwd.p` is a scalar"):
        read_source("pkg/attn.py", text, _config(repo_config, source_root, ops=(bad,)))
