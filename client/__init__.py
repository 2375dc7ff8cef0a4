"""burstctl client runtime: job identity, the paced sessions (sync and asyncio), throttled files.

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
from burstctl.client.session import AsyncOperation, AsyncSession, Operation, Session

__all__ = [
    "AsyncOperation",
    "AsyncSession",
    "Fallback",
    "JobInfo",
    "Operation",
    "Session",
    "Throttle",
    "ThrottledFile",
    "TokenBucket",
    "throttled_open",
]
