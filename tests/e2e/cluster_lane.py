"""Seed 004's two-box setting as a cluster lane: Qwen3-235B-A22B GPTQ-Int4 at TP=2 (57.64 GiB of
weights per box), fp8 KV cache, gptq_marlin, expert parallelism, 0.87 of each box. The lab's
cluster inventory (cluster_inventory.py) gives it to the head; the tests read it from here."""

CLUSTER_LANE = {
    "name": "big",
    "image": "nvcr.io/nvidia/vllm:26.04-py3",
    "model": "Qwen/Qwen3-235B-A22B-GPTQ-Int4",
    "served_name": "qwen3-235b-a22b",
    "port": 10103,
    "memory_fraction": 0.87,
    "max_model_len": 40960,
    "kv_cache_dtype": "fp8",
    "tensor_parallel_size": 2,
    "extra_args": ["--quantization", "gptq_marlin", "--enable-expert-parallel"],
}
