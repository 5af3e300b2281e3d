"""The layers import downwards only: asr, diarize and decoding never import the fronts (app/,
installed as `specscribe`). An installed console script has no `app` package to import, so
such an import fails for users only (`specscribe distill` did) while a checkout's tests pass."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FRONTS = ("app", "specscribe")


def imported_modules(path: Path) -> list[str]:
    """Every module an import statement in `path` names, function-level imports included."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


@pytest.mark.parametrize("layer", ["asr", "diarize", "decoding"])
def test_a_lower_layer_imports_no_front(layer):
    offending = [
        f"{path.relative_to(ROOT)}: {module}"
        for path in sorted((ROOT / layer).rglob("*.py"))
        for module in imported_modules(path)
        if module.split(".")[0] in FRONTS
    ]
    assert not offending, offending


def test_the_check_sees_imports_inside_functions(tmp_path):
    source = tmp_path / "late.py"
    source.write_text("def f():\n    from app.llm import load_language_model\n")
    assert imported_modules(source) == ["app.llm"]


def test_the_fronts_import_each_other_relatively():
    # app/api/errors.py imported `app.out_of_memory`: in the installed server there is no `app`
    # package, so its handler of unexpected errors raised ModuleNotFoundError and every such
    # error reached the client as Starlette's plain-text 500, not OpenAI's JSON shape.
    offending = [
        f"{path.relative_to(ROOT)}: {module}"
        for path in sorted((ROOT / "app").rglob("*.py"))
        for module in imported_modules(path)
        if module.split(".")[0] == "app"
    ]
    assert not offending, offending
