"""kvlab.policies: requests, the KV-cache manager, its four policy families, the scheduler.

Torch-free and simpy-free: the simulator and the real engine both drive these same objects.
"""

from kvlab.policies.arrival_queue import ArrivalQueue
from kvlab.policies.manager import KVCacheManager, StepOrderError
from kvlab.policies.outputs import MemOps, MemoryUsage, ScheduledRequest, SchedulerOutput
from kvlab.policies.request import Request, RequestStatus
from kvlab.policies.scheduler import Scheduler
from kvlab.policies.scheduler_config import SchedulerConfig
from kvlab.policies.spec import PolicySpec, parse_policy
from kvlab.policies.step_loop import LivelockError, StepLoop

__all__ = [
    "ArrivalQueue",
    "KVCacheManager",
    "LivelockError",
    "MemOps",
    "MemoryUsage",
    "PolicySpec",
    "Request",
    "RequestStatus",
    "ScheduledRequest",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "StepLoop",
    "StepOrderError",
    "parse_policy",
]
