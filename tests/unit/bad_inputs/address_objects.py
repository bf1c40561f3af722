"""ipaddress objects instead of strings: written as text in the inventory, nothing else."""

from ipaddress import IPv4Interface

CASE = {
    "why": "addresses given as IPv4Interface objects are refused, not guessed",
    "hosts": {
        "spark-1": {
            "spark_role": "head",
            "fabric_addresses": {"enp1s0f1np1": IPv4Interface("192.168.100.10/24")},
        }
    },
    "expect": ["spark-1: fabric_addresses: enp1s0f1np1: Input should be a valid string"],
}
