"""The compute node's side that both shims share (docs/architecture.md, "The shims").

The FUSE mount (`burstctl.fuse_shim`) and the LD_PRELOAD library's node agent
(`burstctl.preload_shim`) differ only in how they intercept an application's bytes. What they
do with them is here, and both import it (neither imports the other):

- `attribution`: which job a request's process works for (pid → job, the uid vouched for, the
  controller's refusals);
- `pacer`: per-job pacing: the client session per (job, user) on one runtime, the attach wait
  for a named job, phases, the idle sweep;
- `sessions`: what the pacer needs of a job's client session, and how one is made and closed;
- `options`: the options both shims share, spelled once, and the command line generated from a
  shim's configuration;
- `stageout` (with `stageout_copy`, `stageout_marks`, `stageout_schedule`, `stageout_journal`):
  the drain of the
  files the jobs wrote on the burst buffer to the parallel file system, and their eviction.
"""
