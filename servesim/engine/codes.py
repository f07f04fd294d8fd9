"""Integer codes shared by the kernel, the reference simulator and the Python side."""

# scheduling policies
VLLM = 0          # continuous batching, chunked prefill under a token budget, running requests in order (vLLM V1)
VLLM_V0 = 1       # prefill-prioritised; an iteration is either all prefill or all decode (vLLM V0 default)
SARATHI = 2       # stall-free batching: decodes first, prefill chunks fill a fixed chunk size (Agrawal et al. OSDI 2024)
ORCA = 3          # iteration-level batching, whole prompts only (Yu et al. OSDI 2022)
STATIC = 4        # request-level batching: a batch runs until all its requests finish
POLICIES = {"vllm": VLLM, "vllm-v0": VLLM_V0, "sarathi": SARATHI, "orca": ORCA, "static": STATIC}

# routers
ROUND_ROBIN = 0
RANDOM = 1
LEAST_REQUESTS = 2
LEAST_KV = 3
POWER_OF_TWO = 4
PREFIX_AWARE = 5   # the replica holding the longest prefix of the request, ties to the least loaded
ROUTERS = {"round-robin": ROUND_ROBIN, "random": RANDOM, "least-requests": LEAST_REQUESTS,
           "least-kv": LEAST_KV, "power-of-two": POWER_OF_TWO, "prefix-aware": PREFIX_AWARE}

# pool roles (engine/POOLS.md)
MIXED = 0          # prefill and decode on the same replicas
PREFILL = 1        # prompts only; the KV cache then moves to a decode pool
DECODE = 2         # takes requests only through KV transfers
ROLES = {"mixed": MIXED, "prefill": PREFILL, "decode": DECODE}

# preemption
RECOMPUTE = 0
SWAP = 1
PREEMPTION = {"recompute": RECOMPUTE, "swap": SWAP}

# request states (final states: DONE, REJECTED; others mean the run stopped first)
NOT_ARRIVED = 0
WAITING = 1
RUNNING = 2
SWAPPED = 3
DONE = 4
REJECTED = 5
TRANSFER = 6       # prompt done on a prefill replica: waiting for a decode replica or moving its KV
STATUS_NAMES = {NOT_ARRIVED: "not_arrived", WAITING: "waiting", RUNNING: "running", SWAPPED: "swapped",
                DONE: "done", REJECTED: "rejected", TRANSFER: "transfer"}

# prefix-cache counters (EngineOutput.prefix)
HIT_GPU_TOKENS = 0
HIT_CPU_TOKENS = 1
LOOKUP_TOKENS = 2
GPU_EVICTIONS = 3
CPU_EVICTIONS = 4
CPU_RELOAD_TIME = 5
N_PREFIX = 6

# inter-token gap histogram: log10-spaced bins from 1 us to 1000 s
GAP_LOG10_MIN = -6.0
GAP_LOG10_MAX = 3.0
GAP_BINS = 4500
