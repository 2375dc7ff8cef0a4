"""burstctl client runtime: job identity, the paced sessions (sync and asyncio), throttled files.

Many blocking sessions can share one `ClientRuntime` (one loop thread, one channel per
controller): ``Session(..., runtime=runtime)``.

```python
from burstctl.client import Session

with Session("controller:50051", fallback="fixed:100MiB/s") as session:
    with session.operation("write", volume=len(data)):
        session.acquire(len(data), "write")
        out.write(data)
```
"""

from burstctl.client.bucket import Throttle, TokenBucket
from burstctl.client.fallback import Fallback
from burstctl.client.files import ThrottledFile, throttled_open
from burstctl.client.job import JobInfo
from burstctl.client.runtime import ClientRuntime
from burstctl.client.session import AsyncOperation, AsyncSession, Operation, Session
from burstctl.common.channels import ChannelSecurity

__all__ = [
    "AsyncOperation",
    "AsyncSession",
    "ChannelSecurity",
    "ClientRuntime",
    "Fallback",
    "JobInfo",
    "Operation",
    "Session",
    "Throttle",
    "ThrottledFile",
    "TokenBucket",
    "throttled_open",
]
