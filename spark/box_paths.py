"""Where the deploy keeps things on a box: one home for each path that the plan, the
operations, compliance and the endpoints report all name."""

SECRETS_DIR = "/etc/spark/secrets"  # root 0700: the lanes' keys, the hub's token, Ray's token
HF_TOKEN = f"{SECRETS_DIR}/hf-token"
MODELS_DIR = "/var/lib/spark/models"  # the Hugging Face cache the lanes share
# Where the lanes mount MODELS_DIR: huggingface_hub's default cache of root (HF_HOME unset).
HF_CACHE_IN_CONTAINER = "/root/.cache/huggingface"
# The NCCL test's kept verdict (files/nccl_check.py report), which the metrics collector reads.
NCCL_RESULT_DIR = "/var/lib/spark/nccl-test"
NCCL_VERDICT = f"{NCCL_RESULT_DIR}/verdict.json"
# Where a box serves its cache's blobs to the boxes copying a model from it (fleet_copy_weights):
# in the kernel's ephemeral range, which the cluster's firewall admits from the fabric only
# (operations/firewall.py), bound to the box's fabric address.
WEIGHTS_PORT = 60991


def key_path(lane: str) -> str:
    """Where a lane's API key lives on its box (root 0600)."""
    return f"{SECRETS_DIR}/{lane}.key"


def fetch_unit(model: str) -> str:
    """The unit that fetches a Hugging Face model (``org/name``) into MODELS_DIR: characters a
    unit name takes, the slash written ``--`` as huggingface_hub's cache writes it."""
    return f"spark-fetch-{model.replace('/', '--')}.service"
