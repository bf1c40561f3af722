"""Where the deploy keeps things on a box: one home for each path that the plan, the
operations, compliance and the endpoints report all name."""

SECRETS_DIR = "/etc/spark/secrets"  # root 0700: the lanes' keys, the hub's token, Ray's token
HF_TOKEN = f"{SECRETS_DIR}/hf-token"
MODELS_DIR = "/var/lib/spark/models"  # the Hugging Face cache the lanes share
# Where the lanes mount MODELS_DIR: huggingface_hub's default cache of root (HF_HOME unset).
HF_CACHE_IN_CONTAINER = "/root/.cache/huggingface"
# Where a lane's container reads the hub's token and Ray's: mounted read-only, never values.
HF_TOKEN_IN_CONTAINER = "/run/secrets/hf-token"
RAY_TOKEN_IN_CONTAINER = "/run/secrets/ray-auth-token"
# The NCCL test's kept verdict (files/nccl_check.py report), which the metrics collector reads.
NCCL_RESULT_DIR = "/var/lib/spark/nccl-test"
NCCL_VERDICT = f"{NCCL_RESULT_DIR}/verdict.json"
# Where a box serves its cache's blobs to the boxes copying a model from it (fleet_copy_weights):
# in the kernel's ephemeral range, which the cluster's firewall admits from the fabric only
# (operations/firewall.py), bound to the box's fabric address.
WEIGHTS_PORT = 60991
# The oneshot unit locking the GPU's graphics clock at boot (operations/gpuclock.py), whose
# journal the metrics collector and compliance read (the lock has no getter in NVML).
GPU_CLOCK_UNIT = "spark-gpu-clock-lock.service"
NVIDIA_SMI = "/usr/bin/nvidia-smi"  # the driver's (nvidia-utils), where the unit runs it


def key_path(lane: str) -> str:
    """Where a lane's API key lives on its box (root 0600)."""
    return f"{SECRETS_DIR}/{lane}.key"


# The fleet key clients send the router (spark/fleet.py), kept as a lane's; the "_" keeps its
# name apart from every lane's (a slug: spark/lane.py), as the metrics key's (_metrics).
FLEET_KEY = key_path("_fleet")


def fetch_unit(model: str) -> str:
    """The unit that fetches a Hugging Face model (``org/name``) into MODELS_DIR: characters a
    unit name takes, the slash written ``--`` as huggingface_hub's cache writes it."""
    return f"spark-fetch-{model.replace('/', '--')}.service"


# Each image pull's status (files/spark_pull.py --status), which the deploy and the metrics
# collector (files/spark_metrics.py PULL_STATUS_DIR) read.
PULL_STATUS_DIR = "/var/lib/spark/pull"


def pull_slug(image: str) -> str:
    """An image's name in characters a unit name takes (systemd.unit: letters, digits, ":",
    "-", "_", "."), the slashes written ``--`` as fetch_unit writes a model's, "@" as "-"."""
    return "".join(c if c.isalnum() or c in ":-_." else "-" for c in image.replace("/", "--"))


def pull_unit(image: str) -> str:
    """The transient unit that pulls ``image`` (operations/images.py)."""
    return f"spark-pull-{pull_slug(image)}.service"


def pull_status(image: str) -> str:
    """Where the pull of ``image`` keeps its status."""
    return f"{PULL_STATUS_DIR}/{pull_slug(image)}.json"


def hf_cache_dir(models_dir: str, model: str) -> str:
    """Where huggingface_hub keeps ``org/name`` under a cache (``models--org--name``)."""
    return f"{models_dir}/hub/models--{model.replace('/', '--')}"
