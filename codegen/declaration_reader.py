"""Read an op declaration: its keywords, gradient fields, eager conditions and plain call."""

from __future__ import annotations

import re
from collections.abc import Sequence

import libcst as cst

from . import kinds
from . import setup_context as contract
from .bundle_reader import BundleReader
from .config import ConfiguredOp, DeclarationForm
from .errors import CodegenError, Location
from .model import GRAD_OUTPUT_FIELD, GRAD_OUTPUTS_FIELD, Bundle, EagerWhen, Impls, Op, Problem
from .names import SourceFile, code_of
from .parsing import LibcstBudgetExceeded

_IMPL_KEYS = ("forward_impl", "backward_impl", "forward_spec", "backward_spec", "setup_context")


def _literal_strings(file: SourceFile, node: cst.BaseExpression, key: str) -> tuple[str, ...]:
    if isinstance(node, cst.Tuple | cst.List):
        values = []
        for element in node.elements:
            if not isinstance(element.value, cst.SimpleString):
                break
            values.append(str(element.value.evaluated_value))
        else:
            return tuple(values)
    raise CodegenError(
        file.loc(node), f"`{key}` must be a tuple of string literals", f'write {key}=("a", "b")'
    )


def _literal_reason(file: SourceFile, node: cst.BaseExpression, key: str) -> str:
    if isinstance(node, cst.SimpleString | cst.ConcatenatedString):
        value = node.evaluated_value
        if isinstance(value, str) and value.strip():
            return value
    raise CodegenError(
        file.loc(node),
        f"`{key}` must be a non-empty string literal (the reason)",
        f'write {key}="why a CUDA graph must not capture this op"',
    )


def _literal_bool(file: SourceFile, node: cst.BaseExpression, key: str) -> bool:
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return node.value == "True"
    raise CodegenError(file.loc(node), f"`{key}` must be True or False", f"write {key}=True")


def _check_grad_fields(
    forward: Bundle, grad_fields: tuple[str, ...], places: Sequence[Location], whole: Location
) -> None:
    for grad, where in zip(grad_fields, places, strict=True):
        field = forward.field(grad)
        if field is None:
            raise CodegenError(
                where,
                f"gradient field `{grad}` is not a field of `{forward.name}`",
                f"name fields of {forward.name}",
            )
        if not kinds.may_receive_gradient(field.type):
            raise CodegenError(
                where,
                f"gradient field `{forward.name}.{grad}` is a {field.type.kind.value}, "
                "which cannot receive a gradient",
                "only tensor and tensor-or-quantized fields, and lists of them, receive gradients",
            )
    if len(set(grad_fields)) != len(grad_fields):
        raise CodegenError(whole, "`grad_fields` repeats a field", "name each gradient field once")


def _check_grad_receiver(backward: Bundle) -> None:
    """Exactly one backward field receives the forward outputs' gradients.

    ``grad_outputs: List[torch.Tensor]`` receives all of them; TE's form,
    ``grad_output: Optional[torch.Tensor]``, the first output's.
    """
    grad_outputs = backward.field(GRAD_OUTPUTS_FIELD)
    grad_output = backward.field(GRAD_OUTPUT_FIELD)
    all_grads = grad_outputs is not None and (
        grad_outputs.type.kind is kinds.Kind.TENSOR_LIST and not grad_outputs.type.optional
    )
    first_grad = grad_output is not None and grad_output.type.kind is kinds.Kind.TENSOR
    if all_grads == first_grad:  # neither, both, or a wrong kind
        raise CodegenError(
            backward.location,
            f"backward bundle `{backward.name}` needs one field receiving the forward "
            f"outputs' gradients: `{GRAD_OUTPUTS_FIELD}: List[torch.Tensor]` (all of "
            f"them) or `{GRAD_OUTPUT_FIELD}: Optional[torch.Tensor]` (the first)",
            f"add `{GRAD_OUTPUTS_FIELD}: List[torch.Tensor]` to {backward.name}",
        )


def read_declaration(
    file: SourceFile,
    call: cst.Call,
    form: DeclarationForm,
    read_bundle: BundleReader,
    functions: dict[str, cst.FunctionDef],
) -> Op:
    where = file.loc(call)
    callee = form.short
    given: dict[str, cst.BaseExpression] = {}
    for arg in call.args:
        if arg.keyword is None:
            raise CodegenError(
                file.loc(arg),
                f"{callee} takes keyword arguments only",
                f"name each argument: {', '.join(form.keywords)}",
            )
        key = form.keywords.get(arg.keyword.value)
        if key is None:
            raise CodegenError(
                file.loc(arg.keyword),
                f"unknown {callee} argument `{arg.keyword.value}`",
                f"expected one of: {', '.join(form.keywords)}",
            )
        given[key] = arg.value
    kw = form.keyword_for
    for key in ("name", "forward", "backward", "grad_fields"):
        if key not in given:
            raise CodegenError(
                where, f"{callee} lacks `{kw(key)}`", f"add {kw(key)}=... to the declaration"
            )
    name_node = given["name"]
    if (
        not isinstance(name_node, cst.SimpleString)
        or not str(name_node.evaluated_value).isidentifier()
    ):
        raise CodegenError(
            file.loc(name_node),
            f"`{kw('name')}` must be a string literal identifier",
            f'write {kw("name")}="my_op"',
        )
    op_name = str(name_node.evaluated_value)

    def bundle(key: str) -> Bundle:
        node = given[key]
        if not isinstance(node, cst.Name):
            raise CodegenError(
                file.loc(node), f"`{kw(key)}` must name a bundle class", f"write {kw(key)}=MyArgs"
            )
        return read_bundle(kw(key), node.value, file.loc(node))

    forward, backward = bundle("forward"), bundle("backward")
    grad_fields = _literal_strings(file, given["grad_fields"], kw("grad_fields"))
    # _literal_strings checked the node: a tuple/list of strings, one element per name.
    grad_nodes = given["grad_fields"].elements  # type: ignore[attr-defined]
    _check_grad_fields(
        forward,
        grad_fields,
        [file.loc(g.value) for g in grad_nodes],
        file.loc(given["grad_fields"]),
    )
    impl_keys = [k for k in _IMPL_KEYS if k in form.keywords.values()]
    present = [k for k in impl_keys if k in given]
    impls = None
    if present:
        # setup_context may go unnamed: checked below, once the copies are known.
        missing = [kw(k) for k in impl_keys if k not in given and k != "setup_context"]
        if missing:
            raise CodegenError(
                where,
                f"{callee} names {', '.join(kw(k) for k in present)} but not {', '.join(missing)}",
                "give every implementation function (setup_context only where a backward "
                "field is not a copy), or none",
            )
        names = {}
        for key in impl_keys:
            if key not in given:
                continue
            node = given[key]
            if not isinstance(node, cst.Name) or node.value not in functions:
                raise CodegenError(
                    file.loc(node),
                    f"`{kw(key)}` must name a function defined in this file",
                    f"define `def {code_of(node)}(...)` at module level",
                )
            names[key] = node.value
        _check_grad_receiver(backward)
        if form.registration:
            impls = Impls(**names)
    derived: tuple[str, ...] = ()
    if "derived" in given:
        derived = _literal_strings(file, given["derived"], kw("derived"))
        if impls is None:
            raise CodegenError(
                file.loc(given["derived"]),
                f"`{kw('derived')}` without the implementation functions",
                f"give {', '.join(kw(k) for k in impl_keys)}, or drop {kw('derived')}",
            )
        contract.check_derived(
            forward,
            backward,
            derived,
            [file.loc(d.value) for d in given["derived"].elements],  # type: ignore[attr-defined]
            kw("derived"),
        )
    copied: tuple[str, ...] = ()
    made: tuple[str, ...] = ()
    if impls is not None:
        copied = contract.copied_fields(forward, backward, derived)
        made = contract.made_fields(backward, copied)
        if impls.setup_context is not None:
            contract.check_returns(
                functions[impls.setup_context], forward, backward, copied, made, file.loc
            )
        elif made:
            raise CodegenError(
                where,
                f"{callee} names no `{kw('setup_context')}`, but {backward.name} has fields "
                f"that are not copies of {forward.name} fields: {', '.join(made)}",
                f"give `{kw('setup_context')}=` a function returning dict({made[0]}=..., ...), "
                f"or make each a copy (a {forward.name} field of the same name and type)",
            )
    lowers = _literal_bool(file, given["lowers"], kw("lowers")) if "lowers" in given else False
    if lowers and impls is None and form.registration:
        raise CodegenError(
            file.loc(given["lowers"]),
            f"`{kw('lowers')}=True` needs the implementation functions Inductor would trace",
            f"give {', '.join(kw(k) for k in impl_keys)}, or drop {kw('lowers')}",
        )
    eager_when = (
        _eager_conditions(file, given["eager_when"], kw("eager_when"), forward)
        if "eager_when" in given
        else ()
    )
    cudagraph_unsafe = (
        _literal_reason(file, given["cudagraph_unsafe"], kw("cudagraph_unsafe"))
        if "cudagraph_unsafe" in given
        else None
    )
    if cudagraph_unsafe is not None and lowers:
        raise CodegenError(
            file.loc(given["cudagraph_unsafe"]),
            f"`{kw('cudagraph_unsafe')}` on an op with `{kw('lowers')}=True`: a lowered op is "
            "traced into Inductor's graph, so no op node is left to keep out of a CUDA graph",
            f"drop `{kw('lowers')}=True`, or make the kernel graph-safe and drop "
            f"`{kw('cudagraph_unsafe')}`",
        )
    plain_call = None
    plain_fields: tuple[str, ...] = ()
    plain_problem = None
    if "plain_call" in given:
        node = given["plain_call"]
        if impls is None or not isinstance(node, cst.Name) or node.value not in functions:
            raise CodegenError(
                file.loc(node),
                f"`{kw('plain_call')}` must name a function defined in this file, beside the "
                "implementation functions",
                f"define `def {code_of(node)}(*, field, ...)` at module level and give the impls",
            )
        plain_call = node.value
        try:
            plain_fields = _plain_call_fields(file, functions[plain_call], forward)
        except LibcstBudgetExceeded:
            raise
        except CodegenError as e:
            plain_problem = Problem(e.location, e.message, e.hint)
    return Op(
        op_name,
        forward,
        backward,
        grad_fields,
        impls,
        where,
        lowers=lowers,
        eager_when=eager_when,
        plain_call=plain_call,
        plain_fields=plain_fields,
        plain_problem=plain_problem,
        cudagraph_unsafe=cudagraph_unsafe,
        copied=copied,
        made=made,
    )


def _plain_call_fields(file: SourceFile, fn: cst.FunctionDef, forward: Bundle) -> tuple[str, ...]:
    """The forward fields a ``plain_call`` reads: its parameters, in its order, each
    named after a field (the generated entry passes them positionally, a keyword call
    costing ~3x as much, before any bundle is built)."""
    params = fn.params
    hint = f"write `def {fn.name.value}({', '.join(f.name for f in forward.fields[:2])}, ...)`"
    if params.kwonly_params or not isinstance(params.star_arg, cst.MaybeSentinel):
        raise CodegenError(
            file.loc(fn.name),
            f"plain call `{fn.name.value}` must take plain parameters named after fields of "
            f"{forward.name} (no `*`: the entry passes them positionally)",
            hint,
        )
    if params.star_kwarg is not None:
        raise CodegenError(
            file.loc(params.star_kwarg),
            f"plain call `{fn.name.value}` must name each field it reads, not take **kwargs",
            hint,
        )
    names = []
    for param in (*params.posonly_params, *params.params):
        name = param.name.value
        if forward.field(name) is None:
            raise CodegenError(
                file.loc(param.name),
                f"plain call parameter `{name}` is no field of {forward.name}",
                f"name a field of {forward.name}, or read it another way",
            )
        if param.default is not None:
            raise CodegenError(
                file.loc(param.default),
                f"plain call parameter `{name}` has a default: the entry always passes the field",
                f"drop the default of `{name}`",
            )
        names.append(name)
    return tuple(names)


_QUANTIZED_TERM = re.compile(r"quantized\((\w+)\)")


def _eager_conditions(
    file: SourceFile, node: cst.BaseExpression, key: str, forward: Bundle
) -> tuple[EagerWhen, ...]:
    """``eager_when``: a tuple of ``("condition", "reason")`` string pairs; a condition is
    forward fields joined by `` and ``, each bare (truthy) or ``quantized(field)``."""
    hint = f'write {key}=(("fp8_output and is_grad_enabled", "why"), ...)'
    if not isinstance(node, cst.Tuple | cst.List):
        raise CodegenError(file.loc(node), f"`{key}` must be a tuple of (condition, reason)", hint)
    entries = []
    for element in node.elements:
        pair = element.value
        if not (
            isinstance(pair, cst.Tuple)
            and len(pair.elements) == 2
            and all(
                isinstance(e.value, cst.SimpleString | cst.ConcatenatedString)
                for e in pair.elements
            )
        ):
            raise CodegenError(
                file.loc(pair),
                f"each `{key}` entry must be a (condition, reason) string pair",
                hint,
            )
        condition, reason = (str(e.value.evaluated_value) for e in pair.elements)  # type: ignore[attr-defined]
        terms = []
        for term in condition.split(" and "):
            term = term.strip()
            match = _QUANTIZED_TERM.fullmatch(term)
            name = match.group(1) if match else term
            if not name.isidentifier() or forward.field(name) is None:
                raise CodegenError(
                    file.loc(pair.elements[0].value),
                    f"`{key}` condition term `{term}` is not a field of `{forward.name}`",
                    "join forward fields with ` and `; `quantized(field)` tests for a quantized value",
                )
            terms.append((name, match is not None))
        if not reason.strip():
            raise CodegenError(file.loc(pair.elements[1].value), f"`{key}` reason is empty", hint)
        entries.append(EagerWhen(tuple(terms), reason))
    return tuple(entries)


def configured_op(file: SourceFile, op: ConfiguredOp, read_bundle: BundleReader) -> Op:
    """An op the configuration declares for this file: boundary only, positioned at its bundles."""
    top = Location(file.path, 1, 1)
    forward = read_bundle("forward", op.forward, top)
    backward = read_bundle("backward", op.backward, top)
    _check_grad_fields(forward, op.grad_fields, [forward.location] * len(op.grad_fields), top)
    return Op(op.name, forward, backward, op.grad_fields, None, forward.location)
