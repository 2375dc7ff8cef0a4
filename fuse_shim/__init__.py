"""The FUSE passthrough filesystem and ``burstctl mount`` (docs/fuse.md).

`config` holds every option of the mount (`MountConfig`); `mount` (lifecycle, signals) starts
`fs.PassthroughFS` over a backing directory; `attribution` maps each request's pid/uid/gid to a
job and `pacing` paces it through one client session per job, all on one client runtime. The
FUSE binding is imported only through `_fuse`.
"""
