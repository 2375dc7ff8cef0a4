#!/usr/bin/env bash
# The compose demo (deploy/container/compose.yaml): mount DEMO_BACKING on DEMO_MOUNT through
# burstctl, register two Slurm jobs with the prolog, run one fio writer per job at once through
# the mount, show each job's bandwidth and the controller's view, then retire and unmount.
# Job 101 has 1 node and job 102 has 4: under size-fair on r1 (B = 40 MiB/s) they should get
# about 8 and 32 MiB/s (b_i = min(p_i·b, B), shares ∝ nodes).
set -euo pipefail
backing=${DEMO_BACKING:-/bb-backing}
mnt=${DEMO_MOUNT:-/bb}
seconds=${DEMO_SECONDS:-10}
libexec=/usr/local/libexec/burstctl
first_url=${BURSTCTL_URLS%%,*}

mkdir -p "$backing" "$mnt"
burstctl mount "$backing" "$mnt" --log-file /tmp/mount.log   # returns once the mount answers
trap 'burstctl umount --lazy "$mnt" || true' EXIT

for job in 101:1 102:4; do
  SLURM_JOB_ID=${job%%:*} SLURM_JOB_NUM_NODES=${job##*:} SLURM_JOB_USER=root SLURM_JOB_GID=0 \
    BURSTCTL_SLURM_SYSLOG=0 "$libexec/burstctl-prolog"
done

pids=()
for job in 101:1 102:4; do
  id=${job%%:*} nodes=${job##*:}
  SLURM_JOB_ID=$id SLURM_NNODES=$nodes fio --name="job$id" --directory="$mnt" \
    --rw=write --bs=1M --size=1G --time_based --runtime="$seconds" --ioengine=psync \
    --end_fsync=0 --output="/tmp/fio-$id.txt" &
  pids+=($!)
done
sleep $((seconds / 2))
echo "--- jobs on r1 halfway through (burstctl jobs --url $first_url)"
burstctl jobs --url "$first_url"
wait "${pids[@]}"

for id in 101 102; do
  echo "--- fio, job $id ($(grep -c . /tmp/fio-"$id".txt) lines; summary):"
  grep -E '^ +(WRITE|write):' "/tmp/fio-$id.txt" || cat "/tmp/fio-$id.txt"
done

for id in 101 102; do
  SLURM_JOB_ID=$id BURSTCTL_SLURM_SYSLOG=0 "$libexec/burstctl-epilog"
done
echo "--- done"
