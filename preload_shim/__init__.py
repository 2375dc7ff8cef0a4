"""The LD_PRELOAD shim: a C library that paces an application's I/O under the burst-buffer
paths from inside the process, and the node agent that holds the jobs' sessions and hands each
process its job's shared pacing page (docs/preload.md). The agent attributes and paces with
`burstctl.node`, as the FUSE mount does; it imports nothing of the mount."""
