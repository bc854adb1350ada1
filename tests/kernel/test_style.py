"""Our kernel modules as a linux-block reviewer reads them: sparse over every source as it
builds (against the lab kernel's headers) and `checkpatch.pl --strict` from the linux-source of
the same version — both clean, and both shown to catch what they are there to catch."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kernel.lab import build, packages

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def lab() -> tuple[packages.KernelTrio, Path]:
    trio = packages.select_trio()
    return trio, packages.fetch(trio, with_build=True)


def test_our_modules_build_sparse_clean_and_pass_checkpatch_strict(
    lab: tuple[packages.KernelTrio, Path], tmp_path: Path
) -> None:
    trio, root = lab
    for name in build.MODULES:
        assert build.build_module(name, root, trio, tmp_path).exists()
    sources = [p for m in build.MODULES for p in build.module_sources(m)]
    assert {p.name for p in sources} >= {"fios.c", "flashsim.c"}
    assert build.checkpatch_findings(build.checkpatch_script(root), sources) == []


def test_sparse_and_checkpatch_each_catch_a_seeded_fault(
    lab: tuple[packages.KernelTrio, Path], tmp_path: Path
) -> None:
    """flashsim with a global the module never declares static (sparse: "Should it be
    static?") and a block comment whose */ trails its text (checkpatch --strict)."""
    trio, root = lab
    seeded = tmp_path / "src" / "flashsim"
    shutil.copytree(build.KERNEL_DIR / "flashsim", seeded)
    source = seeded / "flashsim.c"
    source.write_text(
        source.read_text() + "\n/* seeded: a block comment\n * ending on its text */\n"
        "int flashsim_seeded_global;\n"
    )
    with pytest.raises(build.BuildError, match=r"flashsim_seeded_global.*static"):
        build.build_module("flashsim", root, trio, tmp_path / "out", source=seeded)
    findings = build.checkpatch_findings(build.checkpatch_script(root), [source])
    assert any("trailing */" in f for f in findings), findings
