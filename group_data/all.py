"""Defaults for every host; an inventory's host data overrides them key by key.

Every key here is checked by spark/inventory.py (HostSettings) before any host is
contacted. Per host, the inventory sets `spark_role` ("head"/"worker") and
`fabric_addresses` ({ifname: "A.B.C.D/prefix"}).
"""

from stages import preconnect  # pyinfra keeps imported names out of the group data

# Kernels 7.0 and later, as DGX OS 7.6 ships them (7.0.0-1019-nvidia), turn kexec handover on
# at boot, and RDMA memory registration then fails under GPU memory pressure (`ibv_reg_mr_iova2
# failed with error Cannot allocate memory`; 6.17.0-1032 passes): the fabric's NCCL breaks.
# The workaround is the boot option kho=off (NVIDIA/NV-Kernels PRs 590, 591). True: on such a
# box of the fabric the deploy adds it through a GRUB drop-in and says that a reboot is needed
# (the NCCL test fails until then); False: the deploy stops that box with the fix.
fabric_kernel_kho_off = True

# Hold the kernel every box runs, as the driver branch is held: the kernel metapackages held and
# apt pinned to the running kernel's ABI, so that no upgrade moves a fleet off a known-good
# kernel (owners ask fleet tools for kernel holds; DGX OS 7.6 moved boxes to 7.0, above). The
# owner moves it: apt-mark unhold, the pin file removed. Compliance checks that every box runs
# the same kernel. Off: DGX OS updates the kernel as it ships.
kernel_hold = False

# Branch 580 only: 590.x has a confirmed CUDA-graph deadlock on GB10 (seed 001).
driver_branch = 580

# Installed when no 580 driver package is present; DeepOps installs the -open flavour on
# DGX OS 7 (NVIDIA/deepops roles/nvidia-dgx/vars/ubuntu-24.04.yml).
driver_package = "nvidia-driver-580-open"

# None: the build of branch 580 apt installs first, then held (a held box never moves by
# itself: an upgrade under a loaded module leaves nvidia-smi failing with "Driver/library
# version mismatch" until a reboot, oddmario/NVIDIA-Ubuntu-Driver-Guide#4). A newer build of the
# branch (a security fix): its Debian version as `apt-cache madison nvidia-driver-580-open`
# lists it, e.g. "580.159.04-0ubuntu1"; the deploy moves every driver package there, holds them
# again and says the box needs a reboot. Another branch is refused before any box is contacted.
driver_version = None

# The GPU's graphics clock locked to (min, max) MHz at every boot: `nvidia-smi -lgc 300,2200` by
# a oneshot unit after nvidia-persistenced (operations/gpuclock.py). A hot GB10 powers OFF (no
# reboot, no log, standby at the outlet until AC is cycled) seconds into a 131k-token prefill at
# default clocks, boosting to ~2400 MHz: 2 losses in 22 long onsets on one unit, none in 15
# locked; 0 in 66 long-input onsets with the lock on a loaded 7-unit pod. Cost: 1-3% of decode
# at one user, none at 32, equal or faster at 131k once warm (capetron/gb10-cluster-bench
# docs/power-offs-and-clock-lock.md; the same power-offs in tonyd2wild/dgx-spark-hard-poweroff-
# fix and NVIDIA forum threads 373251 and 377478, where a user locks 300,2400; caps of 2100-2400
# are reported). Another cap for a box: e.g. (300, 2100) in its host data; None (or False): no
# lock, the unit removed and the clocks reset (`nvidia-smi -rgc`).
gpu_clock_lock_mhz = (300, 2200)

# Fabric interface -> its RDMA device, both QSFP ports: one QSFP DAC shows two ~200 Gb/s
# twins; NCCL needs every twin in use in NCCL_IB_HCA or runs at ~3 GB/s (seed 001;
# dgx-spark-playbooks#102). Port 0 next to the RJ-45 port, port 1 further away
# (dgx-spark-playbooks connect-three-sparks, Step 2; ibdev2netdev there).
fabric_hcas = {
    "enp1s0f1np1": "rocep1s0f1",
    "enP2p1s0f1np1": "roceP2p1s0f1",
    "enp1s0f0np0": "rocep1s0f0",
    "enP2p1s0f0np0": "roceP2p1s0f0",
}

# How the boxes are cabled (README, "Fabric shapes"): "pair" (one cable on port 1 of both
# boxes, the field's two-box guides), "pair-dual" (both ports of two boxes, two cables),
# "ring3" (three boxes, port 0 of each to port 1 of the next: NVIDIA's connect-three-sparks)
# or "switch" (2 to 8 boxes on one switch: NVIDIA's multi-sparks-through-switch). With no
# fabric_addresses in the inventory, each box's are derived from its place in it
# (spark/topology.py); given ones are checked against the shape.
fabric_topology = "pair"
# The ports cabled to the switch ("switch" only): [1], [0] or [1, 0].
fabric_switch_ports = [1]

# Each twin's link rate as the kernel reports it (/sys/class/net/IF/speed): 200 Gb/s on a
# Spark's ConnectX-7 (ibstat "Rate: 200" on each twin: geerlingguy/sbc-reviews#92). Set 100000
# only for a switch that runs its ports at 100G. A twin below it is the field's known faults:
# a switch port with auto-negotiation on (100G; the field forces 200G on MikroTik CRS8xx),
# a degraded ConnectX start (dgx-spark-playbooks PR#108), a reseated or damaged cable.
fabric_link_speed_mbps = 200000
# What a slower twin does: "refuse" stops that box naming the twin, "warn" says so loudly and
# goes on (a pair behind a 100G switch, say): `make status` and the alerts then show it as a
# warning, not red.
fabric_link_speed_low = "refuse"

# The management port (10 GbE RJ-45): a ring's sockets (NCCL bootstrap, Gloo) use it, as no
# fabric subnet reaches every box (eugr/spark-vllm-docker docs/NETWORKING.md, 3-node mesh;
# NVIDIA's spark_cluster_setup.py run_nccl_test).
management_ifname = "enP7s7"

# A netplan file other than NetworkManager's own 90-NM-* that names a fabric twin, as NVIDIA's
# two-Spark guide writes /etc/netplan/40-cx7.yaml (dgx-spark-playbooks connect-two-sparks,
# Step 3, Option 1): netplan's boot generator makes NetworkManager a profile of its own from it
# for that twin, beside the deploy's (canonical/netplan doc/netplan.md: "During early boot,
# the netplan network renderer ... writes configuration to /run"). True: the deploy moves each
# such file aside once (a dated copy beside it, which netplan's *.yaml no longer reads),
# regenerates netplan's profiles and says so (a file that configures more than twins, or is no
# YAML, stays and stops the box: moved aside, it would take the rest with it); False: that box
# stops, naming the files.
fabric_take_over_netplan = False

# Jumbo frames on every fabric interface, equal on all hosts (seed 001; NVIDIA's own
# two-Spark guide leaves 1500: dgx-spark-playbooks#25).
fabric_mtu = 9000
# A fabric below 9000 is refused unless this says why in one line (a switch without jumbo
# frames, say): NCCL measured 18.9-21 GB/s at 1500 against 23.74 GB/s at 9000
# (dgx-spark-playbooks#25).
fabric_mtu_below_9000_because = None

# Where each box's RoCE v2 + IPv4 GID entry should be (seed 001). NCCL finds the entry itself
# wherever it is (no NCCL_IB_GID_INDEX: it was seen at 4 on one box of two, GLM-5.3-Flash-EXL3-
# 2x-DGX-Sparks PR#26, and moving after a network re-apply, sparkring#186); the deploy checks
# that each twin has exactly one, and says where when it is not at this index.
roce_gid_index = 3

# The cluster environment file units and login shells read (no secrets go in it).
env_file = "/etc/spark/cluster.env"

# nvidia-container-toolkit version, as NVIDIA's install guide pins it (Debian version).
toolkit_version = "1.19.0-1"

# NVIDIA's apt repository and signing key for the container toolkit (NVIDIA's install
# guide); $(ARCH) is left for apt to fill in.
toolkit_repo_url = "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)"
toolkit_repo_key_url = "https://nvidia.github.io/libnvidia-container/gpgkey"

# NCCL_DEBUG=INFO shows whether NCCL uses NET/IB or silently fell back to NET/Socket
# (vllm PR#42075); off by default because it is verbose.
nccl_debug = False

# The NCCL test of a cluster (operations/nccl.py, `spark-nccl-test` on every box): all_gather
# and all_reduce between the boxes, one rank per box in the serving image, from 1 MiB up to
# nccl_test_max_bytes (the "at least 1 GiB"). It fails the deploy on a socket fallback,
# a twin NCCL does not use, or an all_gather bus bandwidth under the mark at the largest size:
# nccl_test_min_busbw_gbs, or None for the topology's, NVIDIA's MIN_NCCL_TEST_BW (21.875 GB/s,
# a ring 10: dgx-spark-playbooks multi-sparks-through-switch spark_cluster_setup.py). It runs
# again only when what it depends on changed, or when it last failed.
nccl_test = True
nccl_test_min_busbw_gbs = None
nccl_test_max_bytes = 1 << 30

# Ray joins the boxes of a cluster over the fabric (operations/ray.py): the head's GCS port
# (Ray's next six ports follow it), the image Ray runs in (the lanes' serving image: NGC's may
# ship without Ray, dgx-spark-playbooks#109, which the deploy refuses), and Ray's token
# authentication (Ray 2.52 and later; the token is made once on this machine and copied to
# every box root-only). Without it only the firewall keeps others off Ray (CVE-2023-48022).
ray_port = 6379
ray_image = "nvcr.io/nvidia/vllm:26.04-py3"
ray_auth = True

# What vLLM's --gpu-memory-utilization is a fraction of: the total CUDA reports, which on a
# Spark's 128 GB LPDDR5X is 121.69 GiB (vLLM asks 105.87 GiB at 0.87:
# MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#47). It is /proc/meminfo's MemTotal byte for byte
# (130663006208: unslothai/unsloth PR 10486): no carve-out.
unified_memory_gib = 121.69

# The vLLM servers of each box, started in this order, one after the other (simultaneous
# starts contend for memory: seed 003). The field's two-lane appliance (seed 003); a host's
# inventory data may replace the whole list. Memory fractions add up to 0.80: at most 0.87 is
# safe, above 0.90 is refused (seed 001). spark/memory.py checks every box.
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
# leave no room for it. Seed 004's, with `lanes: []` for the workers (README, "A cluster, step
# by step"):
#   {"name": "big", "image": "nvcr.io/nvidia/vllm:26.04-py3",
#    "model": "Qwen/Qwen3-235B-A22B-GPTQ-Int4", "served_name": "qwen3-235b-a22b",
#    "port": 10103, "memory_fraction": 0.87, "max_model_len": 40960, "kv_cache_dtype": "fp8",
#    "tensor_parallel_size": 2,
#    "extra_args": ["--quantization", "gptq_marlin", "--enable-expert-parallel"]}

# The memory guard stops the lowest-priority lane when MemAvailable falls below this many GiB.
# On unified memory the box freezes (SSH too) before the OOM killer acts, and cgroup limits do
# not hold CUDA allocations (field facts). The driver itself fails its allocations with ~2.5 GiB
# still free, and the host can then wedge (open-gpu-kernel-modules#1358); MemAvailable has
# fallen ~2.9 GiB/s (vllm#56824): 8.5 stops a lane the two seconds before that which the guard
# needs to see it and free the memory (spark/memory.py GUARD_FLOOR_GIB says how). It stays
# clear of the default appliance at rest (about 14 GiB left: 114 of 128 GB in use, seed 003).
# A floor cannot catch a failure while MemAvailable still counts page cache the driver does not
# get (22.5 GiB "available" at one: vllm#56824); the lanes drop it before each load.
memory_guard_min_available_gib = 8.5

# Minutes a lane may take from `docker run` until /health answers; a 120B model loads in about
# 8 minutes, a 235B one over two boxes in about 15 (seed 004).
lane_start_timeout_min = 20

# A file on this machine holding a Hugging Face token, for gated models (None: no token). The
# deploy copies it to /etc/spark/secrets/hf-token (root 0600) on each box; the lanes read it from
# there, never from their command line or environment.
hf_token_file = None

# A lane's model missing on a box (checked before the lane starts; a lane itself never
# downloads, HF_HUB_OFFLINE=1): False stops that box with the `hf download` command to run
# there (a ~120 GB model can take hours per box: not a wait to hide in a deploy); True: the
# deploy starts a fetch of it in the background (the unit spark-fetch-<org>--<name>: resumable,
# every file checked against the hub's hash, the token above read from its root-only file) and
# goes on; the lane starts once its model lands, and a deploy meanwhile shows the progress
# (README, "The weights").
fetch_weights = False

# The hub the fetches read: huggingface_hub's default endpoint (constants.py,
# _HF_DEFAULT_ENDPOINT; HF_ENDPOINT overrides it there), or a mirror of it.
hf_endpoint = "https://huggingface.co"

# With fetch_weights, a model that several boxes' own lanes serve comes from the hub once, to the
# first of them in the inventory; the others copy it from that box over the fabric (a shape where
# one address reaches every box), every file checked against the hub's hash. False: every box
# fetches from the hub itself.
fleet_copy_weights = True

# True: each deploy removes the cached models and the serving images no lane of the box uses any
# more, naming each with its size. Never by default: a model is hours of download and an image
# may serve what the owner runs by hand (docker's `image prune -a` asks before it removes an image
# no container uses: docker's reference); False: a box without room names them instead.
prune_unused = False

# The lanes' front (operations/front.py): nginx owns each lane's port and asks the lane's key on
# every path; vLLM itself listens on 127.0.0.1 (its --api-key leaves /invocations, /tokenize and
# /metrics open: vLLM's security guide). Client networks it admits ([] admits any; each lane still
# asks its key), and optional TLS: a PEM certificate (chain) and its unencrypted key, files on
# this machine, copied root-only to each box.
front_allow_networks = []
front_tls_certificate_file = None
front_tls_key_file = None

# Metrics (operations/metrics.py, issue 28): the distribution's Prometheus node exporter on each
# box, with the box's own figures (memory against the guard's floor, the lanes, the fabric, the
# NCCL verdict, drift from the plan) from files/spark_metrics.py every metrics_interval_s
# through its textfile collector. The exporter listens on 127.0.0.1 only; nginx serves it on
# metrics_port (9100, the node exporter's port in Prometheus' default port allocations) and asks
# the box's metrics key (/etc/spark/secrets/_metrics.key, root 0600) on every path, with the
# front's TLS where it has one. Scraper networks it admits ([] admits any; the key is still
# asked), e.g. ["192.168.1.0/24"].
metrics = True
metrics_port = 9100
metrics_interval_s = 30
metrics_allow_networks = []

# The fleet as one endpoint (spark/fleet.py, issue 38): one router serves every lane of every box
# under one URL and one fleet key (/etc/spark/secrets/_fleet.key, root 0600 as a lane's); the
# lanes of one served_name on several boxes are its replicas (docs/router.md; `make plan` shows
# it). Its box: None runs it on the head (of independent
# boxes, the first: where clients already go); a second box for failover, None for none.
router_box = None
router_failover_box = None
# Beside the lanes' ports (10101, 10102: seed 003), outside Ray's and the back-end's
# (spark/ports.py); the router itself listens on 127.0.0.1 at router_port + 1000, as a lane does.
router_port = 10100
# How often the router checks each lane: a lane down is skipped within one interval. 10 s is
# Kubernetes' own for its probes (periodSeconds, "Configure Liveness, Readiness and Startup
# Probes"), what seed 000's swap behind a Kubernetes service got.
router_health_interval_s = 10
# Its share of its box's unified memory, counted in the box's budget beside the lanes. The router
# is LiteLLM's proxy (README: the router): one worker measured 357-362 MiB resident, idle and at
# 16 streams (`python -m bench.router`, loopback, this project's 2-core machine); 1.0 GiB holds
# two workers with room for a longer model list.
router_memory_gib = 1.0
# Where the router's box installs LiteLLM's pinned wheels from (spark/router.py, its whole
# resolved set in spark/data/): None is pip's own default index; or the URL of a PEP 503 simple
# index (a mirror, a proxy of it), for boxes that reach no public index.
router_pip_index = None

# Last: every box's data over the values above, checked before pyinfra connects to any box.
preconnect.check(globals())
