"""No operations: what any pyinfra run of this repository costs (start, inventory, connect)."""
