"""apt_hold: the fact parser on real `apt-mark showhold` output and the commands of
`held()` for given facts. tests/sandbox/test_apt_hold_rootfs.py runs both for real in
a Debian 13 root filesystem."""

import pytest
from fakehost import FakeHost, commands, on, render
from pyinfra.api import OperationValueError
from pyinfra.api.exceptions import FactProcessError

from roles.facts.apt import AptHeldPackages
from roles.operations.apt_hold import held, validate_packages
from roles.operations.packages import retried_while_locked


def locked(mark: str) -> str:
    """apt-mark retried while dpkg's lock is held (roles/operations/packages.py)."""
    return retried_while_locked(mark)


# Output of `apt-mark showhold` in a trixie rootfs after `apt-mark hold sed hostname libc6:amd64`.
SHOWHOLD = ["hostname", "libc6", "sed"]


def test_parse_showhold():
    assert AptHeldPackages.parse(SHOWHOLD) == ["hostname", "libc6", "sed"]


def test_parse_nothing_held_and_blank_lines():
    assert AptHeldPackages.parse([]) == []
    assert AptHeldPackages.parse(["", "  "]) == []


def test_parse_foreign_arch_and_duplicates():
    assert AptHeldPackages.parse(["libcuda1:i386", "sed", "sed"]) == ["libcuda1:i386", "sed"]


def test_parse_refuses_output_that_is_not_package_names():
    with pytest.raises(FactProcessError):
        AptHeldPackages.parse(["E: Could not open lock file /var/lib/dpkg/lock-frontend"])


def test_fact_command():
    assert AptHeldPackages().command() == "apt-mark showhold"
    assert AptHeldPackages().requires_command() == "apt-mark"


def test_hold_only_packages_not_held():
    assert commands(held, {AptHeldPackages: ["sed"]}, packages=["sed", "hostname", "libcuda1"]) == [
        locked("apt-mark hold hostname libcuda1")
    ]


def test_all_held_yields_nothing():
    fake = FakeHost({AptHeldPackages: ["hostname", "sed"]})
    with on(fake):
        assert [render(c) for c in held._inner(packages=["sed", "hostname"])] == []
    assert fake.noops == ["sed, hostname already held"]


def test_unhold_only_held_packages():
    assert commands(
        held, {AptHeldPackages: ["sed", "libc6"]}, packages=["sed", "hostname", "libc6:amd64"], present=False
    ) == [locked("apt-mark unhold sed libc6:amd64")]


def test_unhold_nothing_held_yields_nothing():
    assert commands(held, {AptHeldPackages: []}, packages=["sed"], present=False) == []


def test_native_arch_qualified_name_counts_as_held():
    # apt-mark prints native packages bare, even when held as name:arch
    assert commands(held, {AptHeldPackages: ["libc6"]}, packages=["libc6:amd64"]) == []
    assert commands(held, {AptHeldPackages: ["libc6:i386"]}, packages=["libc6"]) == [locked("apt-mark hold libc6")]


def test_single_name_and_duplicates():
    assert commands(held, {AptHeldPackages: []}, packages="sed") == [locked("apt-mark hold sed")]
    assert commands(held, {AptHeldPackages: []}, packages=["sed", "sed"]) == [locked("apt-mark hold sed")]


def test_empty_list_reads_no_fact():
    assert commands(held, {}, packages=[]) == []


@pytest.mark.parametrize("bad", [["Sed"], ["sed; reboot"], [""], ["-f"], [None], [3], "x", {"sed": 1}])
def test_bad_input_refused_before_any_fact(bad):
    with pytest.raises(OperationValueError):
        commands(held, {}, packages=bad)


def test_present_must_be_bool():
    with pytest.raises(OperationValueError, match="present"):
        commands(held, {}, packages=["sed"], present="no")


def test_validate_keeps_order():
    assert validate_packages(["bb", "a1", "bb", "libc6:amd64"]) == ["bb", "a1", "libc6:amd64"]
