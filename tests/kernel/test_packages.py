"""Which Debian kernel packages the lab takes: everything `fetch` downloads must be in the
archive at the versions chosen. The archive moves on under us — on 2026-11-28 the security
archive carried linux-kbuild-6.1 6.1.192-3 alone while the newest signed image was still
6.1.192-2, and the lab (which asked for kbuild at the image's version) could not be set up.
Pure: apt-cache's answers are given, not asked."""

from __future__ import annotations

from collections.abc import Callable

from kernel.lab.packages import KBUILD, KernelTrio, choose_trio, kbuild_for

ABIS = ["6.1.0-57-amd64", "6.1.0-56-amd64", "6.1.0-44-amd64"]

# 2026-11-28 as apt-cache madison answered: image 57 not published yet, kbuild moved to -3
ARCHIVE = {
    "linux-headers-6.1.0-57-amd64": ["6.1.192-3"],
    "linux-image-6.1.0-56-amd64": ["6.1.192-2"],
    "linux-headers-6.1.0-56-amd64": ["6.1.192-2"],
    "linux-image-6.1.0-44-amd64": ["6.1.176-1"],
    "linux-headers-6.1.0-44-amd64": ["6.1.176-1"],
}
SOURCES = ["6.1.192-3", "6.1.192-2", "6.1.192-1", "6.1.190-1", "6.1.176-1"]


def _versions(archive: dict[str, list[str]]) -> Callable[[str], list[str]]:
    return lambda package: archive.get(package, [])


def test_kbuild_a_debian_revision_ahead_of_the_image_goes_with_it() -> None:
    trio = choose_trio(ABIS, _versions(ARCHIVE), SOURCES, ["6.1.192-3", "6.1.176-1"])
    assert trio == KernelTrio("6.1.0-56-amd64", "6.1.192-2", "6.1.192-3")
    assert trio.version_of(KBUILD) == "6.1.192-3"
    assert trio.version_of(trio.image) == "6.1.192-2"
    assert trio.version_of(trio.headers[0]) == "6.1.192-2"


def test_kbuild_at_the_images_version_is_taken_first() -> None:
    assert kbuild_for("6.1.192-2", ["6.1.192-3", "6.1.192-2"]) == "6.1.192-2"
    assert kbuild_for("6.1.192-2", ["6.1.192-3", "6.1.192-1"]) == "6.1.192-3"  # newest listed
    assert kbuild_for("6.1.192-2", ["6.1.193-1", "6.1.176-1"]) is None  # another release


def test_a_version_without_a_kbuild_of_its_release_is_passed_over() -> None:
    trio = choose_trio(ABIS, _versions(ARCHIVE), SOURCES, ["6.1.193-1", "6.1.176-1"])
    assert trio == KernelTrio("6.1.0-44-amd64", "6.1.176-1", "6.1.176-1")


def test_an_image_without_its_source_or_headers_is_passed_over() -> None:
    archive = dict(ARCHIVE)
    archive["linux-headers-6.1.0-56-amd64"] = ["6.1.192-1"]
    trio = choose_trio(ABIS, _versions(archive), SOURCES, ["6.1.192-3", "6.1.176-1"])
    assert trio is not None
    assert trio.abi == "6.1.0-44-amd64"
    assert choose_trio(ABIS, _versions(ARCHIVE), ["6.1.170-3"], ["6.1.192-3"]) is None
