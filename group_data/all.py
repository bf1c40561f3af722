"""Defaults for every host; an inventory's host data overrides them key by key.

Each key's type, allowed values, scope (may a box differ?) and why, with its source, are declared
once where it is checked, in spark/inventory/'s module of its concern (the router's in
spark/fleet.py), and listed in docs/variables.md, generated from there (`make variables`). Here:
the values, and a pointer each. Per host, the inventory sets `spark_role` ("head"/"worker"),
`fabric_addresses` ({ifname: "A.B.C.D/prefix"}) and, on a ring, `management_address`.
"""

from stages import preconnect  # pyinfra keeps imported names out of the group data

# The host: kernel, driver (branch 580 only), GPU clock, container toolkit.
fabric_kernel_kho_off = True  # kho=off on a fabric box's 7.x kernel (NV-Kernels PRs 590, 591)
kernel_hold = False  # True: kernel metapackages held and apt pinned to the running ABI
driver_branch = 580  # 590 deadlocks CUDA graphs on GB10 (seed 001)
driver_package = "nvidia-driver-580-open"  # as DeepOps installs it on DGX OS 7
driver_version = None  # None: the first build apt installs, held; e.g. "580.159.03-0ubuntu1"
gpu_clock_lock_mhz = (300, 2200)  # against GB10 power-offs under long prefills; None: no lock
toolkit_version = "1.19.0-1"  # nvidia-container-toolkit, pinned and held
toolkit_repo_url = "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)"
toolkit_repo_key_url = "https://nvidia.github.io/libnvidia-container/gpgkey"

# The fabric (docs/reference.md, Fabric shapes).
fabric_hcas = {  # each twin's RDMA device, port 1 then port 0
    "enp1s0f1np1": "rocep1s0f1",
    "enP2p1s0f1np1": "roceP2p1s0f1",
    "enp1s0f0np0": "rocep1s0f0",
    "enP2p1s0f0np0": "roceP2p1s0f0",
}
fabric_topology = "pair"  # pair, pair-dual, ring3, switch or independent
fabric_switch_ports = [1]  # switch only: [1], [0] or [1, 0]
fabric_link_speed_mbps = 200000  # a ConnectX-7 twin's rate
fabric_link_speed_low = "refuse"  # or "warn"
management_ifname = "enP7s7"  # a ring's sockets
fabric_take_over_netplan = False  # True: netplan files naming a twin moved aside once
fabric_mtu = 9000  # jumbo frames, equal on every box
fabric_mtu_below_9000_because = None  # one line of why, to run below 9000
roce_gid_index = 3  # where the RoCE v2 + IPv4 entry should be (NCCL finds it anywhere)

# The cluster: its environment file, the NCCL test, Ray.
env_file = "/etc/spark/cluster.env"
nccl_debug = False  # True: NCCL_DEBUG=INFO (verbose)
nccl_test = True
nccl_test_min_busbw_gbs = None  # None: NVIDIA's mark for the topology
nccl_test_max_bytes = 1 << 30
ray_port = 6379
ray_image = "nvcr.io/nvidia/vllm:26.04-py3"
ray_auth = True  # Ray's token (CVE-2023-48022)

# The lanes and their memory.
unified_memory_gib = 121.69  # what CUDA reports on a Spark

# The field's two-lane appliance (seed 003), started in this order (a lane's keys:
# docs/variables.md).
lanes = [
    {
        # Lane A: trusted work (tool calls, code, review); 54 tok/s (seed 003).
        "name": "coder",
        # NGC vLLM 0.19.0 (seed 004), the release every option here is checked against; seed 003
        # ran 26.05.post1-py3.
        "image": "nvcr.io/nvidia/vllm:26.04-py3",
        # AWQ INT4 runs on Marlin's INT4 kernels, no NVFP4 path at all; ~40 GB (seed 003).
        "model": "bullpoint/Qwen3-Coder-Next-AWQ-4bit",
        "served_name": "qwen3-coder-next",
        "port": 10101,  # seed 003
        "memory_fraction": 0.45,  # seed 003
        # 128K of its 256K: a long repository fits, and clients need >= 64K (seed 003). vLLM
        # gives the rest of the share to the KV cache for more requests at once.
        "max_model_len": 131072,
        # KV cache in the model's bf16: FP8 KV turned Qwen3.5's hybrid attention into gibberish
        # (ig1/Qwen3.5-35B-A3B-NVFP4 model card); bf16 costs 3 GiB here.
        "kv_cache_dtype": None,
        # Qwen3-Coder's XML tool calls (vLLM's parser for Qwen3-Coder and Qwen3.5/3.6).
        "tool_call_parser": "qwen3_coder",
        "extra_args": [],
        "environment": {},
        "api_key": True,  # generated and kept on the box; clients send it as a Bearer token
    },
    {
        # Lane B: fast read-only work (triage, summaries); 30 tok/s (seed 003).
        "name": "fast",
        "image": "nvcr.io/nvidia/vllm:26.04-py3",
        # Compressed-tensors NVFP4 (ModelOpt NVFP4 gives gibberish on SM121, seed 003); the
        # lane adds VLLM_NVFP4_GEMM_BACKEND=marlin. ~20 GB (seed 003).
        "model": "inference-optimization/Qwen3.6-35B-A3B-NVFP4",
        "served_name": "qwen3.6-35b-a3b",
        "port": 10102,  # seed 003
        "memory_fraction": 0.35,  # seed 003
        "max_model_len": 65536,  # the least clients like Hermes Agent accept (seed 003)
        "kv_cache_dtype": None,  # as lane A
        "tool_call_parser": "qwen3_coder",
        "extra_args": [],
        "environment": {},
        "api_key": True,
    },
]

# A cluster lane serves one model from the head with a rank on every box (Ray over the fabric):
# `tensor_parallel_size` = the number of boxes. It goes in the head's own `lanes` (host data of
# the inventory), not here: it takes its memory_fraction of every box, and the two lanes above
# leave no room for it. Seed 004's, with `lanes: []` for the workers (docs/reference.md, "A
# cluster, step by step"):
#   {"name": "big", "image": "nvcr.io/nvidia/vllm:26.04-py3",
#    "model": "Qwen/Qwen3-235B-A22B-GPTQ-Int4", "served_name": "qwen3-235b-a22b",
#    "port": 10103, "memory_fraction": 0.87, "max_model_len": 40960, "kv_cache_dtype": "fp8",
#    "tensor_parallel_size": 2,
#    "extra_args": ["--quantization", "gptq_marlin", "--enable-expert-parallel"]}

memory_guard_min_available_gib = 8.5
lane_start_timeout_min = 20

# The weights.
hf_token_file = None  # a file on this machine, for gated models
fetch_weights = False  # True: a missing model is fetched in the background
hf_endpoint = "https://huggingface.co"
fleet_copy_weights = True  # from the hub once per fleet, then over the fabric
prune_unused = False  # True: unused cached models and images removed

# The front (nginx asking each lane's key) and the metrics endpoint.
front_allow_networks = []  # [] admits any client (each lane still asks its key)
front_tls_certificate_file = None
front_tls_key_file = None
front_tls_ca_file = None  # None: each front's own certificate is trusted (self-signed)
metrics = True
metrics_port = 9100
metrics_interval_s = 30
metrics_allow_networks = []

# The fleet as one endpoint (spark/fleet.py, docs/router.md): LiteLLM's proxy on the router box.
fleet_router = True
router_box = None  # None: the head (of independent boxes, the first)
router_failover_box = None
router_port = 10100
router_health_interval_s = 10
router_memory_gib = 1.0
router_pip_index = None  # None: pip's own default index

# Every box's data, as pyinfra reads it (this file whole, wherever this line is, every other
# group_data file, the command line's --data), checked before pyinfra connects to any box.
preconnect.check()
