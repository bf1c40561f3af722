"""No operations: what any pyinfra run of this repository costs (start, load the inventory, connect)."""
