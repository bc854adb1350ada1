"""The layout's rules hold, and would catch a break: the import contracts (lint-imports, run on
a copy of the tree with a deliberate violation added), and SQL only in repositories."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "service", "models", "kernel", "bench", "migrations")
SQL_BUILDERS = {"select", "insert", "update", "delete", "text"}
SQL_METHODS = {"execute", "scalar", "scalars"}


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [shutil.which("lint-imports") or "lint-imports", "--no-cache"],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_contracts_hold_on_this_tree() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("tree")
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__", "results")
        )
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    return copy


@pytest.mark.parametrize(
    ("module", "source", "contract"),
    [
        (
            "models/probe.py",
            "from service.tables import Device\n",
            "models is a pure library",
        ),
        (
            "models/probe.py",
            "from agent.applier import Applier\n",
            "models takes only the shared contract from the agent",
        ),
        (
            "agent/probe.py",
            "from models.features import config_key\n",
            "The agent imports neither",
        ),
        (
            "service/devices/probe.py",
            "",  # placeholder: the endpoint below imports a repository
            "Endpoints call services, never repositories",
        ),
    ],
)
def test_a_broken_contract_fails(tree_copy: Path, module: str, source: str, contract: str) -> None:
    path = tree_copy / module
    endpoints = tree_copy / "service/devices/endpoints.py"
    original = endpoints.read_text()
    try:
        if contract.startswith("Endpoints"):
            endpoints.write_text(original + "\nfrom service.devices import repository  # noqa\n")
        else:
            path.write_text(source)
        result = lint_imports(tree_copy)
    finally:
        path.unlink(missing_ok=True)
        endpoints.write_text(original)
    assert result.returncode != 0
    broken = [line for line in result.stdout.splitlines() if "BROKEN" in line]
    assert any(contract in line for line in broken), result.stdout


def _sql_calls(path: Path) -> list[str]:
    """Calls that build or run SQL: sqlalchemy's select/insert/update/delete/text imported by
    name, and session.execute/scalar/scalars."""
    tree = ast.parse(path.read_text())
    builders = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sqlalchemy")
        for alias in node.names
        if alias.name in SQL_BUILDERS
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in builders:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {func.id}(")
        elif (
            isinstance(func, ast.Attribute)
            and func.attr in SQL_METHODS
            and isinstance(func.value, ast.Name)
            and func.value.id in {"session", "connection"}
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {func.value.id}.{func.attr}(")
    return found


def test_only_repositories_issue_sql() -> None:
    offenders = [
        call
        for package in ("service", "models", "agent", "kernel", "bench")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.name != "repository.py"
        for call in _sql_calls(path)
    ]
    assert offenders == []


def test_the_sql_check_sees_sql() -> None:
    """The check above would fail: it finds the SQL in a repository."""
    assert _sql_calls(ROOT / "service/recommendations/repository.py")


def _imported(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_no_learning_module_imports_the_service() -> None:
    named = [
        f"{path.name}: {module}"
        for path in sorted((ROOT / "models").rglob("*.py"))
        for module in _imported(path)
        if module.split(".")[0] == "service"
    ]
    assert named == []


def _mkdocs(site: Path, root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [shutil.which("mkdocs") or "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def test_the_docs_build_strictly_and_a_broken_link_fails(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    assert _mkdocs(tmp_path / "site", tmp_path).returncode == 0
    page = tmp_path / "docs" / "agent.md"
    page.write_text(page.read_text() + "\nSee [the missing page](missing.md).\n")
    result = _mkdocs(tmp_path / "site2", tmp_path)
    assert result.returncode != 0
    assert "missing.md" in result.stdout + result.stderr


def test_every_docs_page_is_in_the_nav() -> None:
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed = {next(iter(entry.values())) for entry in config["nav"]}
    assert listed == {p.name for p in (ROOT / "docs").glob("*.md")}


def test_the_readme_is_short_and_links_only_existing_pages() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 200
    links = re.findall(r"\]\((docs/[^)#]+)", text)
    assert links
    assert [link for link in links if not (ROOT / link).exists()] == []
