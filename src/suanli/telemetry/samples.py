"""One reading of one GPU: what every collector produces and what the server stores, exposes and judges.

Collectors know the hardware only (node, GPU index, UUID); the server tags a sample with the workload and org
holding that GPU when it arrives, so a node agent never needs to know who rents it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuSample:
    node: str  # the node's registered name
    gpu: int  # index on the node (NVML order)
    uuid: str
    t: float  # epoch seconds when it was read
    util: float = 0.0  # % of the time a kernel ran: NVML's samples since the GPU's previous reading, averaged
    mem_used_mib: int = 0
    mem_total_mib: int = 0
    temp_c: float = 0.0
    power_w: float = 0.0
    power_limit_w: float = 0.0
    sm_clock_mhz: int = 0
    throttle: int = 0  # NVML clocks-event (throttle) reason bitmask
    ecc_sbe: int = 0  # volatile single-bit ECC errors since the driver loaded
    ecc_dbe: int = 0  # volatile double-bit ECC errors since the driver loaded
    xid: int = 0  # the last XID error seen since the previous sample; 0: none
    error: str = ""  # why this GPU could not be read ("GPU is lost"); "" when it answered


@dataclass(frozen=True, slots=True)
class Tagged:
    """A stored sample with who held the GPU when it was read ("" when nobody did)."""

    sample: GpuSample
    model: str = ""  # catalog GPU model
    workload: str = ""
    org: str = ""
