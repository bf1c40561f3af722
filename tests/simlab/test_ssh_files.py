"""The ssh files the lab writes for its tests' ssh calls, read back by OpenSSH's own client
(`ssh -G` prints the configuration it would use for a host, ssh(1))."""

from __future__ import annotations

import subprocess

from tests.simlab import lab as simlab


def test_each_host_is_reached_by_its_address_as_admin_with_the_cheaper_key_exchange(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(simlab, "STATE", tmp_path)
    lab = simlab.Lab([simlab.Host("spark-1", 1), simlab.Host("spark-2", 2)])
    for host in lab.hosts:
        keys = host.dir / "upper/etc/ssh"
        keys.mkdir(parents=True)
        (keys / "ssh_host_ed25519_key.pub").write_text(f"ssh-ed25519 AAAA{host.index} root@x\n")
    simlab.write_ssh_files(lab)
    used = subprocess.run(
        ["ssh", "-G", "-F", str(tmp_path / "ssh_config"), "spark-2"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    # The lab's management network is MGMT_PREFIX.(10 + index); its admin user is "spark".
    assert f"hostname {simlab.MGMT_PREFIX}.12" in used
    assert "user spark" in used
    assert "kexalgorithms curve25519-sha256" in used
    assert "stricthostkeychecking true" in used
    assert (tmp_path / "known_hosts").read_text().splitlines() == [
        f"{simlab.MGMT_PREFIX}.11 ssh-ed25519 AAAA1",
        f"{simlab.MGMT_PREFIX}.12 ssh-ed25519 AAAA2",
    ]
