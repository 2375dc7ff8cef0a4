"""The FUSE passthrough filesystem and ``burstctl mount`` (docs/fuse.md).

`config` holds every option of the mount (`MountConfig`); `mount` (lifecycle, signals) starts
`fs.PassthroughFS` over a backing directory, whose parts each own one concern (`inodes`,
`directories`, `paced`, `staged`, `ownership`, `xattrs`); `staged` is the mount's side of the
stage-out to the parallel file system. Which job a request belongs to, how it is paced (one
client session per job, all on one client runtime) and the stage-out itself are
`burstctl.node`, which the LD_PRELOAD shim's node agent shares. The FUSE binding is imported
only through `_fuse`.
"""
