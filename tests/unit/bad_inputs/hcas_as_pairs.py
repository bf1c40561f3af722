"""fabric_hcas as a tuple of pairs (a Python-only shape) instead of a mapping."""

CASE = {
    "why": "fabric_hcas must be a mapping ifname -> RDMA device",
    "hosts": {
        "spark-1": {
            "fabric_hcas": (("enp1s0f1np1", "rocep1s0f1"), ("enP2p1s0f1np1", "roceP2p1s0f1")),
        }
    },
    "expect": ["spark-1: fabric_hcas: Input should be a valid dictionary"],
}
