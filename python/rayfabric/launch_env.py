"""The environment rayfabric's launcher gives each agent (and the RDT engine), beyond the user's:
decided here, in the library, and reported by `rayfabric doctor`."""
from typing import Mapping

# libfabric 1.17's verbs MR cache registers every region with remote write access and keeps keys
# valid after deregistration: agents run without it unless the user chose a cache setting.
MR_CACHE_VARIABLES = ("FI_MR_CACHE_MAX_COUNT", "FI_MR_CACHE_MONITOR", "FI_EFA_MR_CACHE_ENABLE",
                      "FI_MR_CUDA_CACHE_MONITOR_ENABLED", "FI_MR_ROCR_CACHE_MONITOR_ENABLED",
                      "FI_MR_ZE_CACHE_MONITOR_ENABLED")
# The cache is turned off through its memory monitors (host, and each device kind), not with
# FI_MR_CACHE_MAX_COUNT=0: a zero count stops every cache of libfabric from opening, among them the
# CUDA IPC handle cache that shm opens in fi_domain where libfabric has CUDA (and efa, which opens
# shm inside for peers on the same host): fi_domain then fails with "No space left on device"
# (ofi_ipc_cache_open -> ofi_mr_cache_init; seen with shm on an H200, libfabric 1.22 with CUDA).
# With no monitor the verbs domain registers directly (verbs_mr.c: no monitor for the iface -> no
# cache), which is what the Soft-RoCE suite checks (mr_cache_monitors_off).
MR_CACHE_OFF = {"FI_MR_CACHE_MONITOR": "disabled", "FI_MR_CUDA_CACHE_MONITOR_ENABLED": "0",
                "FI_MR_ROCR_CACHE_MONITOR_ENABLED": "0", "FI_MR_ZE_CACHE_MONITOR_ENABLED": "0"}


def agent_fabric_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment rayfabric's launcher gives an agent: `env` plus MR_CACHE_OFF when the user
    set none of the MR cache variables (never overriding one they set)."""
    out = dict(env)
    if not any(v in out for v in MR_CACHE_VARIABLES):
        out.update(MR_CACHE_OFF)
    return out
