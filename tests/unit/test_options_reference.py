"""docs/variables.md is what tools/options_reference.py writes from the keys' declarations and
group_data/all.py's values (issue 40: "the variables reference generated from it, a test fails
when they differ"), and every key is declared with its scope and why."""

from __future__ import annotations

import ast
from pathlib import Path

from spark.inventory import HostSettings
from tools import options_reference

REPO = Path(__file__).resolve().parents[2]


def test_the_committed_reference_is_what_the_declarations_give() -> None:
    committed = (REPO / "docs" / "variables.md").read_text()
    assert committed == options_reference.reference(), (
        "docs/variables.md differs from the declarations: run make variables and commit it"
    )


def test_every_key_is_declared_with_its_scope_and_why() -> None:
    for name, field in HostSettings.model_fields.items():
        extra = field.json_schema_extra
        assert isinstance(extra, dict), name
        assert extra["scope"] in ("host", "box", "fleet"), name
        assert len(str(extra["why"])) > 20, name
        assert field.description, name


def test_group_data_holds_a_value_for_every_key_but_the_per_host_ones() -> None:
    tree = ast.parse((REPO / "group_data" / "all.py").read_text())
    assigned = {
        node.targets[0].id
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
    }
    declared = HostSettings.model_fields
    host_only = {n for n, f in declared.items() if f.json_schema_extra["scope"] == "host"}  # type: ignore[index]
    assert host_only == {"spark_role", "fabric_addresses", "management_address"}
    assert assigned - set(declared) == set()  # no value without its declaration
    assert set(declared) - host_only - assigned == set()  # no key without its default


def test_defaults_are_read_as_written() -> None:
    source = (
        "nccl_test_max_bytes = 1 << 30\n"
        'fabric_topology = "pair"\n'
        "gpu_clock_lock_mhz = (300, 2200)\n"
        'lanes = [\n    {"name": "coder", "port": 10101},\n    {"name": "fast"},\n]\n'
        "preconnect_check = print(1)\n"
    )
    assert options_reference.group_data_defaults(source) == {
        "nccl_test_max_bytes": "1 << 30",
        "fabric_topology": '"pair"',
        "gpu_clock_lock_mhz": "(300, 2200)",
        "lanes": "2 entries: coder, fast (see group_data/all.py)",
        "preconnect_check": "print(1)",
    }


def test_types_read_as_an_owner_writes_values() -> None:
    fields = HostSettings.model_fields
    assert options_reference.type_name(fields["fabric_link_speed_low"].annotation) == (
        "'refuse' | 'warn'"
    )
    assert options_reference.type_name(fields["gpu_clock_lock_mhz"].annotation) == (
        "tuple[int, int] | None"
    )
    assert options_reference.type_name(fields["lanes"].annotation) == "list[lane]"
    assert options_reference.type_name(fields["toolkit_version"].annotation) == "str"


def test_the_reference_shows_a_key_whole() -> None:
    text = options_reference.reference()
    assert (
        "### fabric_mtu\n\n- type: `int`; default: `9000` (group_data/all.py); scope: fleet\n"
        "- allowed: an integer 9000..9216, the same on every host (9000); lower only with"
        " fabric_mtu_below_9000_because\n"
    ) in text
    assert "| `on_demand_idle_s` | `int | None` |" not in text  # pipes escaped in tables
    assert "| `on_demand_idle_s` | `int \\| None` | `None` |" in text
