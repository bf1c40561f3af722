"""dpkg's unfinished work: what an interrupted install leaves, and the repair.

Captures:
- lab-dpkg-audit-power-cut.txt: DpkgAudit's command on lab host spark-2 (Debian 12, dpkg
  1.21.23) after its power was cut while dpkg, frozen mid-install of nvidia-driver-580-open,
  had unpacked libnvidia-compute-580: dpkg-query then said iU libnvidia-compute-580 and iHR
  nvidia-driver-580-open. The same command on a deployed host printed nothing.
"""

from __future__ import annotations

from operations import debpkg
from tests.unit.harness import FakeHost, captured, process, run_op

REPAIR = (
    "apt-get -o DPkg::Lock::Timeout=600 check >/dev/null 2>&1;"
    " DEBIAN_FRONTEND=noninteractive dpkg --force-confdef --force-confold --configure -a"
    " && apt-get update -qq"
    " && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -f -y"
    " -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold"
)


def test_audit_names_each_unfinished_package_once_and_the_journal() -> None:
    audit = process(debpkg.DpkgAudit, captured("lab-dpkg-audit-power-cut.txt"))
    assert audit == {
        "packages": ["libnvidia-compute-580", "nvidia-driver-580-open"],
        "journal": True,
    }
    assert process(debpkg.DpkgAudit, "") == {"packages": [], "journal": False}
    assert process(debpkg.DpkgAudit, "journal pending\n") == {"packages": [], "journal": True}
    assert debpkg.DpkgAudit().command().endswith("; true")  # never a failing command


def test_unfinished_packages_are_finished() -> None:
    host = FakeHost({debpkg.DpkgAudit: captured("lab-dpkg-audit-power-cut.txt")})
    assert run_op(debpkg.completed, host=host) == [REPAIR]


def test_a_pending_journal_alone_is_finished_too() -> None:
    host = FakeHost({debpkg.DpkgAudit: "journal pending\n"})
    assert run_op(debpkg.completed, host=host) == [REPAIR]


def test_nothing_unfinished_yields_nothing() -> None:
    host = FakeHost({debpkg.DpkgAudit: ""})
    assert run_op(debpkg.completed, host=host) == []
    assert host.noops == ["dpkg has no package left unfinished"]


def test_installs_wait_for_the_dpkg_lock() -> None:
    install = debpkg.apt_install("nvidia-driver-580-open")
    assert "apt-get -o DPkg::Lock::Timeout=600 install -y" in install
